/* cli_runner.h: runs the flashgen command from a test (tests/support_cli.c). */
#ifndef FG_CLI_RUNNER_H
#define FG_CLI_RUNNER_H
#include <stddef.h>
/* Standard output and error of the last fg_test_run_cli, NUL-terminated (truncated at 64 KiB). */
extern char fg_test_out[1 << 16], fg_test_err[1 << 16];
/* Runs `env $FLASHGEN_CLI args` (args is a shell fragment) in dir (NULL: the current directory)
 * and returns its exit status. Skips the test when FLASHGEN_CLI is unset (it is set by ctest);
 * fails it when the command did not exit (a crash) or ran past 15 minutes (timeout's 124). */
int fg_test_run_cli(const char *dir, const char *env, const char *args);
/* Asserts that `flashgen args` (fg_test_run_cli) exits with status rc and says needle on standard
 * error. A macro, so that a failure points at the test's line. */
#define FG_EXPECT_CLI_ERR(dir, env, args, rc, needle)                         \
  do {                                                                         \
    cr_assert_eq(fg_test_run_cli((dir), (env), (args)), (rc));                 \
    cr_assert(strstr(fg_test_err, (needle)), "%s", fg_test_err);               \
  } while (0)
/* Reads the file at path into buf (at most len - 1 bytes, NUL-terminated; "" if unreadable). */
void fg_test_slurp(const char *path, char *buf, size_t len);
#endif
