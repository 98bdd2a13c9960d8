/* support_fake.c: building the fake CUDA driver for the runtime tests (fake_support.h). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_support.h"
#include "fake_support.h"

void fgt_fake_driver_build(const char *dir, const char *defines, char *lib, size_t lib_len) {
  const char *src = getenv("FLASHGEN_TEST_SOURCE_DIR");
  if (!src) cr_skip_test("FLASHGEN_TEST_SOURCE_DIR is not set (run through ctest)");
  const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
  snprintf(lib, lib_len, "%s/libcuda_fake.so", dir);
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "%s -std=c11 -D_POSIX_C_SOURCE=200809L %s -O1 -shared -fPIC -o '%s' "
           "'%s/tests/fake_cuda/libcuda.c' -lm",
           cc, defines, lib, src);
  if (system(cmd) != 0) cr_skip_test("cannot build the fake driver with '%s'", cc);
  setenv("FLASHGEN_CUDA_LIBRARY", lib, 1);
}

fg_context *fgt_fake_context(const char *lib, void **handle) {
  fg_context_options o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.policy = FG_POLICY_EXPORTED_ONLY;
  o.quiet = 1;
  fg_context *ctx = NULL;
  cr_assert_eq(fg_context_create(&ctx, &o), FG_OK, "%s", fg_last_create_error());
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
