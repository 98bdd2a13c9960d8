/* pool.c: the one parallel work pool of flashgen: compiling (or loading) a list of kernels on
 * several threads, for `flashgen tune` (candidates into the cache), `flashgen check` (the
 * kernels of the selected cases, forward and backward), `flashgen export` and
 * `flashgen build-default`; and the host's backward reference (reference_bwd.c: its chunks of
 * query rows). fg_pool_run hands out indices; fg_compile_pool is its most common use:
 * fg_generator_build on every item. Progress lines and counters are the callers', from the
 * done callback, which runs under the pool's lock. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "fg_autotune.h"

typedef struct pool {
  int n, next, ndone;
  void (*work)(void *ud, int i);
  void (*done)(void *ud, int i, int ndone);
  void *ud;
  pthread_mutex_t mu;
} pool;

static void *pool_worker(void *arg) {
  pool *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    const int i = p->next++;
    pthread_mutex_unlock(&p->mu);
    if (i >= p->n) return NULL;
    p->work(p->ud, i);
    pthread_mutex_lock(&p->mu);
    const int nd = ++p->ndone;
    if (p->done) p->done(p->ud, i, nd);
    pthread_mutex_unlock(&p->mu);
  }
}

int fg_online_cpus(void) {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)(n > FG_POOL_MAX_THREADS ? FG_POOL_MAX_THREADS : n) : 1;
}

void fg_pool_run(int n, int threads, void (*work)(void *ud, int i),
                 void (*done)(void *ud, int i, int ndone), void *ud) {
  if (n <= 0) return;
  if (threads <= 0) threads = fg_online_cpus();
  if (threads > FG_POOL_MAX_THREADS) threads = FG_POOL_MAX_THREADS;
  if (threads > n) threads = n;
  pool p = {n, 0, 0, work, done, ud, PTHREAD_MUTEX_INITIALIZER};
  pthread_t *th = threads > 1 ? calloc((size_t)threads, sizeof *th) : NULL;
  int started = 0;
  for (int t = 1; t < threads && th; t++) { /* the calling thread is the first worker */
    if (pthread_create(&th[t], NULL, pool_worker, &p) != 0) break;
    started++;
  }
  pool_worker(&p);
  for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
  free(th);
  pthread_mutex_destroy(&p.mu);
}

typedef struct compile_job {
  fg_generator *g;
  fg_compile_item *items;
  void (*done)(void *ud, int i, int ndone);
  void *ud;
} compile_job;

static void compile_one(void *ud, int i) {
  compile_job *j = ud;
  fg_compile_item *it = &j->items[i];
  it->ok = fg_generator_build(j->g, &it->v, &it->img, &it->log) == 0;
}

static void compile_done(void *ud, int i, int ndone) {
  compile_job *j = ud;
  if (j->done) j->done(j->ud, i, ndone);
}

int fg_compile_pool(fg_generator *g, fg_compile_item *items, int n, int threads,
                    void (*done)(void *ud, int i, int ndone), void *ud) {
  compile_job j = {g, items, done, ud};
  fg_pool_run(n, threads, compile_one, compile_done, &j);
  int failed = 0;
  for (int i = 0; i < n; i++) failed += !items[i].ok;
  return failed;
}
