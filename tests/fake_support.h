/* fake_support.h: building the fake CUDA driver (tests/fake_cuda/libcuda.c) for the tests that run
 * the runtime without a GPU (tests/support_fake.c). */
#ifndef FG_FAKE_SUPPORT_H
#define FG_FAKE_SUPPORT_H
#include <stddef.h>

#include "flashgen.h"

/* Compiles the fake driver, with the extra compiler arguments `defines` (e.g. "-DFAKE_CUDA_NO_
 * TENSOR_MAP", or ""), into dir/libcuda_fake.so (dir: an existing directory), writes that path
 * into lib (lib_len bytes) and points FLASHGEN_CUDA_LIBRARY at it. Skips the calling test
 * (cr_skip_test) when FLASHGEN_TEST_SOURCE_DIR is not set (run through ctest) or the compiler ($CC,
 * else cc) fails. */
void fgt_fake_driver_build(const char *dir, const char *defines, char *lib, size_t lib_len);

/* A context on the fake driver at lib (fgt_fake_driver_build's; FLASHGEN_CUDA_LIBRARY points at
 * it) that takes only exported kernels, quietly (never compiles, never touches the disk), and in
 * *handle the instance of the driver the runtime loaded (dlopen of the same file), for
 * fgt_fake_sym. Asserts both. */
fg_context *fgt_fake_context(const char *lib, void **handle);
/* The fake driver's function `name` (one of its recording fake_* functions), asserted present. */
void *fgt_fake_sym(void *handle, const char *name);
/* Destroys ctx (NULL: none), closes handle (NULL: none) and removes dir with all in it. */
void fgt_fake_teardown(fg_context *ctx, void *handle, const char *dir);
#endif
