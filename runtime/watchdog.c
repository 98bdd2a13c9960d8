/* watchdog.c: the hang watchdog of the command-line tools. A kernel that never finishes (a
 * deadlock in a kernel under test, a GPU fault) blocks every later wait for the GPU forever, and a
 * CUDA context cannot be recovered from it in the same process. `flashgen check` and `flashgen
 * tune` arm this watchdog (fg_watchdog_arm): the runtime's blocking waits (synchronize, event
 * waits, copies to the host) mark when they begin and end, its launches note the kernel's name,
 * and a thread of its own ends the process, naming the last kernel launched, once a single wait
 * has lasted longer than the limit. The library's own callers never arm it: for them the marks
 * cost an atomic load. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "fg_runtime_internal.h"

static atomic_int armed;
static atomic_llong wait_since_ms; /* when the wait in progress began; 0: none */
/* The entry of the last launch: a plan step's, which lives as long as its loaded kernel (the
 * context's registry), so past every wait the tools make. */
static _Atomic(const char *) last_kernel;
static char tool_name[32];
static double limit_s;

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fg_watchdog_launched(const char *entry) {
  if (atomic_load_explicit(&armed, memory_order_relaxed)) atomic_store(&last_kernel, entry);
}

void fg_watchdog_wait_begin(void) {
  if (atomic_load_explicit(&armed, memory_order_relaxed)) atomic_store(&wait_since_ms, now_ms());
}

void fg_watchdog_wait_end(void) {
  if (atomic_load_explicit(&armed, memory_order_relaxed)) atomic_store(&wait_since_ms, 0);
}

static void *watch(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec nap = {0, 200 * 1000 * 1000};
    nanosleep(&nap, NULL);
    const long long since = atomic_load(&wait_since_ms);
    if (since == 0 || (double)(now_ms() - since) < limit_s * 1000.0) continue;
    const char *k = atomic_load(&last_kernel);
    fprintf(stderr,
            "%s: the GPU has not finished after %.0f s (the last kernel launched: %s): it hangs, "
            "a deadlock in that kernel or a GPU fault. Stopping here: a CUDA context cannot be "
            "recovered from a kernel that does not end. If the work is really that long, set "
            "FLASHGEN_HANG_TIMEOUT to more seconds (0 turns this watchdog off).\n",
            tool_name, limit_s, k && k[0] ? k : "none yet");
    fflush(stderr);
    fflush(stdout);
    _exit(FG_WATCHDOG_EXIT);
  }
  return NULL;
}

int fg_watchdog_arm(const char *tool, double default_s) {
  double s = default_s;
  const char *env = getenv("FLASHGEN_HANG_TIMEOUT");
  if (env && *env) {
    char *end;
    const double v = strtod(env, &end);
    if (end == env || *end || !(v >= 0)) {
      fprintf(stderr, "%s: FLASHGEN_HANG_TIMEOUT='%s' is not a number of seconds (0: off)\n", tool,
              env);
      return -1;
    }
    s = v;
  }
  if (s <= 0 || atomic_load(&armed)) return 0;
  snprintf(tool_name, sizeof tool_name, "%s", tool);
  limit_s = s;
  pthread_t th;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  const int rc = pthread_create(&th, &at, watch, NULL);
  pthread_attr_destroy(&at);
  if (rc != 0) return 0; /* no watchdog: the tool runs as before */
  atomic_store(&armed, 1);
  return 0;
}
