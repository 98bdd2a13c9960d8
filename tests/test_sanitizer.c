/* test_sanitizer.c: proves that the Asan build type is instrumented (issue 11, item 2). Built
 * with FG_EXPECT_ASAN=1 in that build (tests/CMakeLists.txt): it then requires
 * __SANITIZE_ADDRESS__, AddressSanitizer and UndefinedBehaviorSanitizer reports that stop a
 * deliberately broken child process, and -fsanitize=address,undefined on every object of the
 * build (compile_commands.json). In other builds it checks the opposite, so sanitizer flags
 * cannot leak into a release build either. */
#include <criterion/criterion.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef FG_EXPECT_ASAN
#define FG_EXPECT_ASAN 0
#endif
#ifdef __SANITIZE_ADDRESS__
#define FG_HAVE_ASAN 1
#else
#define FG_HAVE_ASAN 0
#endif

/* Runs fn in a forked child with its stderr captured into buf; returns the wait status. */
static int run_child(void (*fn)(void), char *buf, size_t len) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0, "fork failed");
  if (pid == 0) {
    close(p[0]);
    dup2(p[1], 2);
    fn();
    _exit(0);
  }
  close(p[1]);
  size_t n = 0;
  ssize_t r;
  while ((r = read(p[0], buf + n, len - 1 - n)) > 0 && n + (size_t)r < len - 1) n += (size_t)r;
  if (r > 0) n += (size_t)r;
  buf[n] = '\0';
  close(p[0]);
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  return st;
}

static volatile int g_index = 16;
static volatile int g_big = INT_MAX;

static char *volatile g_buf; /* volatile: the store below cannot be optimised away */

static void heap_overflow(void) {
  g_buf = calloc(16, 1);
  memset(g_buf, 1, (size_t)g_index + 1); /* one past the end (memset: ASan's own check) */
  free(g_buf);
}

static void signed_overflow(void) {
  volatile int x = g_big + 1; /* undefined: UBSan must stop here */
  (void)x;
}

static int exited_cleanly(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; }

Test(sanitizer, build_type_matches_the_instrumentation) {
  if (FG_EXPECT_ASAN)
    cr_assert(FG_HAVE_ASAN, "the Asan build type compiled this test without -fsanitize=address "
                            "(__SANITIZE_ADDRESS__ is not defined): the sanitizer flags are not "
                            "applied (see CMakeLists.txt)");
  else
    cr_assert(!FG_HAVE_ASAN, "a non-Asan build compiled this test with -fsanitize=address");
}

Test(sanitizer, address_sanitizer_stops_a_heap_overflow) {
  if (!FG_EXPECT_ASAN) cr_skip_test("not the Asan build type");
  char out[8192];
  int st = run_child(heap_overflow, out, sizeof out);
  cr_assert(!exited_cleanly(st), "a heap-buffer-overflow ran to the end unnoticed");
  cr_assert(strstr(out, "AddressSanitizer: heap-buffer-overflow"), "no ASan report: %s", out);
}

Test(sanitizer, undefined_behavior_sanitizer_stops_a_signed_overflow) {
  if (!FG_EXPECT_ASAN) cr_skip_test("not the Asan build type");
  char out[8192];
  int st = run_child(signed_overflow, out, sizeof out);
  cr_assert(!exited_cleanly(st), "a signed overflow ran to the end: UBSan is not active or recovers");
  cr_assert(strstr(out, "signed integer overflow"), "no UBSan report: %s", out);
}

/* Criterion runs each test in a forked worker and records the result before the worker exits,
 * where LeakSanitizer reports: tests/support_sanitizer.c makes that report fail the program.
 * The probe leaks only when this test runs it in a child program. */
static void *volatile g_leak;

Test(sanitizer_probe, leaks_when_asked) {
  if (!getenv("FG_SANITIZER_PROBE")) cr_skip_test("run by sanitizer::a_leak_in_a_test_fails_the_program");
  g_leak = malloc(4096);
  g_leak = NULL;
}

Test(sanitizer, a_leak_in_a_test_fails_the_program) {
  if (!FG_EXPECT_ASAN) cr_skip_test("not the Asan build type");
  char cmd[512], out[1 << 14];
  /* The environment's ASAN_OPTIONS (scripts/test: detect_leaks=1, intercept_tls_get_addr=0) are kept; BXFI_MAP
   * would make the child believe it is a Criterion worker. */
  snprintf(cmd, sizeof cmd,
           "env -u BXFI_MAP FG_SANITIZER_PROBE=1 /proc/%ld/exe --jobs 1 --filter 'sanitizer_probe/*' 2>&1",
           (long)getpid());
  FILE *p = popen(cmd, "r");
  cr_assert(p != NULL);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  cr_assert(strstr(out, "LeakSanitizer"), "the probe's leak was not reported: %s", out);
  cr_assert(!exited_cleanly(st), "a leak in a test was reported but the program exited 0: %s", out);
}

/* Every object of the build (the library, the command, the tests) was compiled with both
 * sanitizers in the Asan build, and none was in another build. */
Test(sanitizer, every_object_is_compiled_with_the_flags) {
  char path[4096];
  snprintf(path, sizeof path, "%s/compile_commands.json", FG_BINARY_DIR);
  FILE *f = fopen(path, "r");
  cr_assert(f != NULL, "cannot read %s (CMAKE_EXPORT_COMPILE_COMMANDS is ON in CMakeLists.txt)", path);
  static char line[1 << 16];
  int commands = 0, instrumented = 0;
  char first_plain[512] = "";
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, "\"command\":")) continue;
    commands++;
    int has = strstr(line, "-fsanitize=address,undefined") != NULL &&
              strstr(line, "-fno-sanitize-recover=all") != NULL;
    instrumented += has;
    if (!has && !first_plain[0]) snprintf(first_plain, sizeof first_plain, "%.400s", line);
  }
  fclose(f);
  cr_assert_gt(commands, 10, "%s lists only %d compile commands", path, commands);
  if (FG_EXPECT_ASAN)
    cr_assert_eq(instrumented, commands, "%d of %d objects lack the sanitizer flags, e.g. %s",
                 commands - instrumented, commands, first_plain);
  else
    cr_assert_eq(instrumented, 0, "%d objects of a non-Asan build have sanitizer flags", instrumented);
}
