/* fake_support.h: building the fake CUDA driver (tests/fake_cuda/libcuda.c) for the tests that run
 * the runtime without a GPU, reading back what it recorded, and tensors in its device memory
 * (tests/support_fake.c). */
#ifndef FG_FAKE_SUPPORT_H
#define FG_FAKE_SUPPORT_H
#include <stddef.h>
#include <stdint.h>

#include "flashgen.h"
#include "fg_params.h"
#include "fake_cuda/fake_records.h"

/* Compiles the fake driver (-O1), with the extra compiler arguments `defines` after it (e.g.
 * "-DFAKE_CUDA_NO_TENSOR_MAP", "-O2", or ""), into dir/libcuda_fake.so (dir: an existing directory), writes that path
 * into lib (lib_len bytes) and points FLASHGEN_CUDA_LIBRARY at it. Skips the calling test
 * (cr_skip_test) when FLASHGEN_TEST_SOURCE_DIR is not set (run through ctest) or the compiler ($CC,
 * else cc) fails. */
void fgt_fake_driver_build(const char *dir, const char *defines, char *lib, size_t lib_len);

/* A context that takes only exported kernels, quietly (never compiles, never touches the disk),
 * on the driver FLASHGEN_CUDA_LIBRARY names; asserted created. */
fg_context *fgt_exported_only_context(void);
/* fgt_exported_only_context on the fake driver at lib (fgt_fake_driver_build's;
 * FLASHGEN_CUDA_LIBRARY points at it), and in
 * *handle the instance of the driver the runtime loaded (dlopen of the same file), for
 * fgt_fake_sym. Asserts both. */
fg_context *fgt_fake_context(const char *lib, void **handle);
/* The fake driver's function `name` (one of its recording fake_* functions), asserted present. */
void *fgt_fake_sym(void *handle, const char *name);
/* Destroys ctx (NULL: none), closes handle (NULL: none) and removes dir with all in it. */
void fgt_fake_teardown(fg_context *ctx, void *handle, const char *dir);

/* A fake driver built for one test (fgt_fake_open) and its recording functions, resolved in the
 * instance the runtime loaded; the layouts of their records are fake_cuda/fake_records.h's. */
typedef struct fgt_fake {
  char dir[64]; /* where the driver was built; fgt_fake_close removes it */
  void *handle;
  void (*reset)(void);
  int (*tmap_count)(void);
  const fake_tmap *(*tmap_get)(int);
  const fake_tmap *(*tmap_encoded)(const fg_tmap *);
  int (*launch_count)(void);
  const fake_launch *(*launch_get)(int);
  int (*tma_launch_count)(void);
  const fake_tma_launch *(*tma_launch_get)(int);
  int (*bwd_tma_launch_count)(void);
  const fake_bwd_tma_launch *(*bwd_tma_launch_get)(int);
  void (*mem_counts)(int *allocs, int *frees, size_t *last_alloc_bytes);
} fgt_fake;

/* The set-up of a test on the fake driver: builds it (fgt_fake_driver_build, with `defines`) in a
 * new directory made from the mkdtemp template tmpl, calls register_tables (exported tables must
 * be registered before the context that takes them is created), creates the context
 * (fgt_fake_context) and resolves the recording functions into *f, whose records it clears.
 * Returns the context. */
fg_context *fgt_fake_open(fgt_fake *f, const char *tmpl, const char *defines,
                          void (*register_tables)(void));
/* fgt_fake_teardown of ctx (NULL: none) and of f's driver and directory; clears *f. */
void fgt_fake_close(fgt_fake *f, fg_context *ctx);

/* Asserts what the fake recorded of encode i (cuTensorMapEncodeTiled): CUDA data type `type`
 * (9 bf16, 6 f16), rank 4 from base, the dims and the byte strides given, a box of 64 columns by
 * `rows` rows, no interleave, a 128-byte swizzle, 256-byte L2 promotion and no out-of-bounds fill
 * (what the runtime encodes every map with). */
void fgt_expect_map(const fgt_fake *f, int i, int type, const void *base,
                    const unsigned long long dims[4], const unsigned long long strides[3],
                    unsigned rows);

/* The elements a tensor of (n0, n1, n2, d) elements with strides s (all zero: contiguous) spans. */
size_t fgt_span(int64_t n0, int64_t n1, int64_t n2, int64_t d, const int64_t s[3]);
/* bytes of host memory, which is the fake driver's device memory: zeroed, 256-byte aligned as a
 * tensor map's base must be, and at least 256 bytes so that an empty tensor has an address too.
 * Asserted; free() it. */
void *fgt_fake_alloc(size_t bytes);
/* Fills x[0..n) with elements of dtype t (bf16 or f16) in [-2, 2), small integers over 8, which
 * both types hold exactly, drawn from the linear congruential generator at *seed (which moves on,
 * so that successive tensors differ). */
void fgt_fill_random(uint16_t *x, size_t n, fg_dtype t, unsigned *seed);
#endif
