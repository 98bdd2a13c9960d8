/* support_cli.c: runs the flashgen command for the CLI tests and captures what it prints. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_runner.h"

char fg_test_out[1 << 16], fg_test_err[1 << 16];

void fg_test_slurp(const char *path, char *buf, size_t len) {
  buf[0] = '\0';
  FILE *f = fopen(path, "rb");
  if (!f) return;
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = '\0';
  fclose(f);
}

/* A command that never ends fails its test after this many seconds (coreutils timeout, exit 124)
 * instead of holding the run up for good: criterion's per-test timeout ends the test's worker but
 * not the command it started (a check hung in a stream synchronisation held ctest up until
 * killed). */
#define FG_TEST_CLI_TIMEOUT_S 900

int fg_test_run_cli(const char *dir, const char *env, const char *args) {
  const char *cli = getenv("FLASHGEN_CLI");
  if (!cli || !*cli) cr_skip_test("FLASHGEN_CLI is not set (run through ctest)");
  char cmd[4096], o[] = "/tmp/fg_test_out_XXXXXX", e[] = "/tmp/fg_test_err_XXXXXX";
  int fo = mkstemp(o), fe = mkstemp(e);
  cr_assert(fo >= 0 && fe >= 0, "cannot create temporary files");
  close(fo);
  close(fe);
  snprintf(cmd, sizeof cmd, "%s%s%s%s timeout -k 10 %d '%s' %s >%s 2>%s", dir ? "cd '" : "",
           dir ? dir : "", dir ? "' && " : "", env ? env : "", FG_TEST_CLI_TIMEOUT_S, cli, args, o, e);
  int st = system(cmd);
  fg_test_slurp(o, fg_test_out, sizeof fg_test_out);
  fg_test_slurp(e, fg_test_err, sizeof fg_test_err);
  unlink(o);
  unlink(e);
  cr_assert(WIFEXITED(st), "'%s' did not exit", cmd);
  cr_assert_neq(WEXITSTATUS(st), 124, "'%s' did not finish (a hang?):\n%s", cmd, fg_test_err);
  /* In the Asan build a sanitizer report is a failure whatever the exit status the test
   * expects (a leak at exit would otherwise hide behind an expected exit status of 1). */
  static const char *const reports[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                        "runtime error: "};
  for (size_t i = 0; i < sizeof reports / sizeof reports[0]; i++)
    cr_assert(strstr(fg_test_err, reports[i]) == NULL, "'%s' printed a sanitizer report:\n%s", cmd,
              fg_test_err);
  return WEXITSTATUS(st);
}
