/* support_fake.c: building the fake CUDA driver for the runtime tests (fake_support.h). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

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
