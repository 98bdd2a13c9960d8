/* support_fake.c: building the fake CUDA driver for the runtime tests, reading back its records,
 * tensors in its device memory (fake_support.h). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_support.h"
#include "fake_support.h"
#include "fg_runtime_internal.h"

void fgt_fake_driver_build(const char *dir, const char *defines, char *lib, size_t lib_len) {
  const char *src = getenv("FLASHGEN_TEST_SOURCE_DIR");
  if (!src) cr_skip_test("FLASHGEN_TEST_SOURCE_DIR is not set (run through ctest)");
  const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
  snprintf(lib, lib_len, "%s/libcuda_fake.so", dir);
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "%s -std=c11 -D_POSIX_C_SOURCE=200809L -O1 %s -shared -fPIC -o '%s' "
           "'%s/tests/fake_cuda/libcuda.c' -lm",
           cc, defines, lib, src);
  if (system(cmd) != 0) cr_skip_test("cannot build the fake driver with '%s'", cc);
  setenv("FLASHGEN_CUDA_LIBRARY", lib, 1);
}

fg_context *fgt_exported_only_context(void) {
  fg_context_options o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.policy = FG_POLICY_EXPORTED_ONLY;
  o.quiet = 1;
  fg_context *ctx = NULL;
  cr_assert_eq(fg_context_create(&ctx, &o), FG_OK, "%s", fg_last_create_error());
  return ctx;
}

fg_context *fgt_fake_context(const char *lib, void **handle) {
  fg_context *ctx = fgt_exported_only_context();
  *handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL); /* the instance the runtime loaded */
  cr_assert_not_null(*handle, "%s", dlerror());
  return ctx;
}

void *fgt_fake_sym(void *handle, const char *name) {
  void *f = dlsym(handle, name);
  cr_assert_not_null(f, "the fake driver lacks its recording function %s", name);
  return f;
}

void fgt_fake_teardown(fg_context *ctx, void *handle, const char *dir) {
  if (ctx) fg_context_destroy(ctx);
  if (handle) dlclose(handle);
  fgt_rm_rf(dir);
}

fg_context *fgt_fake_open(fgt_fake *f, const char *tmpl, const char *defines,
                          void (*register_tables)(void)) {
  memset(f, 0, sizeof *f);
  cr_assert_lt(strlen(tmpl), sizeof f->dir, "directory template too long: %s", tmpl);
  strcpy(f->dir, tmpl);
  cr_assert_not_null(mkdtemp(f->dir));
  char lib[160];
  fgt_fake_driver_build(f->dir, defines, lib, sizeof lib);
  register_tables();
  fg_context *ctx = fgt_fake_context(lib, &f->handle);
  *(void **)&f->reset = fgt_fake_sym(f->handle, "fake_reset");
  *(void **)&f->tmap_count = fgt_fake_sym(f->handle, "fake_tmap_count");
  *(void **)&f->tmap_get = fgt_fake_sym(f->handle, "fake_tmap_get");
  *(void **)&f->tmap_encoded = fgt_fake_sym(f->handle, "fake_tmap_encoded");
  *(void **)&f->launch_count = fgt_fake_sym(f->handle, "fake_launch_count");
  *(void **)&f->launch_get = fgt_fake_sym(f->handle, "fake_launch_get");
  *(void **)&f->tma_launch_count = fgt_fake_sym(f->handle, "fake_tma_launch_count");
  *(void **)&f->tma_launch_get = fgt_fake_sym(f->handle, "fake_tma_launch_get");
  *(void **)&f->bwd_tma_launch_count = fgt_fake_sym(f->handle, "fake_bwd_tma_launch_count");
  *(void **)&f->bwd_tma_launch_get = fgt_fake_sym(f->handle, "fake_bwd_tma_launch_get");
  *(void **)&f->mem_counts = fgt_fake_sym(f->handle, "fake_mem_counts");
  f->reset();
  return ctx;
}

void fgt_fake_close(fgt_fake *f, fg_context *ctx) {
  fgt_fake_teardown(ctx, f->handle, f->dir);
  memset(f, 0, sizeof *f);
}

void fgt_expect_map(const fgt_fake *f, int i, int type, const void *base,
                    const unsigned long long dims[4], const unsigned long long strides[3],
                    unsigned rows) {
  const fake_tmap *t = f->tmap_get(i);
  cr_assert_not_null(t, "encode %d was not recorded (%d)", i, f->tmap_count());
  cr_assert_eq(t->data_type, type, "map %d: data type %d, want %d", i, t->data_type, type);
  cr_assert_eq(t->rank, 4u);
  cr_assert_eq(t->address, (unsigned long long)(uintptr_t)base, "map %d: base address", i);
  for (int j = 0; j < 4; j++)
    cr_assert_eq(t->dims[j], dims[j], "map %d: dims[%d] = %llu, want %llu", i, j, t->dims[j],
                 dims[j]);
  for (int j = 0; j < 3; j++)
    cr_assert_eq(t->strides[j], strides[j], "map %d: strides[%d] = %llu B, want %llu B", i, j,
                 t->strides[j], strides[j]);
  cr_assert(t->box[0] == 64 && t->box[1] == rows && t->box[2] == 1 && t->box[3] == 1,
            "map %d: box {%u, %u, %u, %u}, want {64, %u, 1, 1}", i, t->box[0], t->box[1],
            t->box[2], t->box[3], rows);
  cr_assert(t->interleave == 0 && t->swizzle == 3 && t->l2_promotion == 3 && t->oob_fill == 0,
            "map %d: interleave %d swizzle %d l2 %d oob %d; want none, 128B, 256B, none", i,
            t->interleave, t->swizzle, t->l2_promotion, t->oob_fill);
}

size_t fgt_span(int64_t n0, int64_t n1, int64_t n2, int64_t d, const int64_t s[3]) {
  if (!s[0] && !s[1] && !s[2]) return (size_t)(n0 * n1 * n2 * d);
  return (size_t)fg_tensor_extent(n0, n1, n2, d, s);
}

void *fgt_fake_alloc(size_t bytes) {
  const size_t size = (bytes + 256) / 256 * 256;
  void *p = aligned_alloc(256, size);
  cr_assert_not_null(p);
  memset(p, 0, size);
  return p;
}

void fgt_fill_random(uint16_t *x, size_t n, fg_dtype t, unsigned *seed) {
  for (size_t j = 0; j < n; j++) {
    *seed = *seed * 1103515245u + 12345u;
    const float f = (float)((int)((*seed >> 16) % 32) - 16) / 8.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (t == FG_DTYPE_BF16) {
      x[j] = (uint16_t)(u >> 16); /* exact: 3 fraction bits at most */
    } else { /* f16: the sign, the exponent rebiased from 127 to 15, the top 10 fraction bits */
      const int e = f == 0 ? 0 : (int)((u >> 23) & 0xff) - 127 + 15;
      x[j] = f == 0 ? 0 : (uint16_t)((u >> 16 & 0x8000u) | (unsigned)e << 10 | (u >> 13 & 0x3ffu));
    }
  }
}
