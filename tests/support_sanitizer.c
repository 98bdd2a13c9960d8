/* support_sanitizer.c: linked into every test program; in the Asan build it makes sanitizer
 * reports fail the test program. Criterion runs each test in a forked worker and has already
 * recorded the test as passed when LeakSanitizer reports at the worker's exit, so a leak would
 * only print (exit status 0). With abort_on_error the worker dies instead and Criterion reports
 * the test as crashed in its teardown, which fails the program. ASAN_OPTIONS/UBSAN_OPTIONS in
 * the environment still override these defaults key by key. */
#ifdef __SANITIZE_ADDRESS__
const char *__asan_default_options(void);
const char *__ubsan_default_options(void);

/* Default visibility: the build hides symbols, and the sanitizer runtime (a shared library)
 * finds these by dynamic lookup. */
#define FG_EXPORTED __attribute__((visibility("default")))
FG_EXPORTED const char *__asan_default_options(void) { return "abort_on_error=1:detect_leaks=1"; }
FG_EXPORTED const char *__ubsan_default_options(void) { return "print_stacktrace=1:halt_on_error=1"; }
#endif
