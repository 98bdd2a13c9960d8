/* tune_compile.c: the compile stage of a tuning run: every kernel of the run (the candidates to
 * measure, the forward that feeds the backward's check, the reference kernels) compiled in
 * parallel on the compile pool before anything is timed, each from the kernel cache or built and
 * stored there; candidates that spill beyond their op's limit failed; the progress line (a bar on
 * a terminal, deciles otherwise); and the images the cache could not store kept in memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tune_internal.h"

/* A candidate that spills more registers to local memory than its op allows is not timed
 * (fg_variant_spill_limit: none for the forward, where the fit rule's register estimate should
 * have pruned it; a little for the backward, whose fastest kernels spill 8-88 B). */
static void reject_spills(tjob *j, const fg_kernel_meta *m) {
  const int limit = fg_variant_spill_limit(&j->v);
  if (m->spill_store_bytes > limit || m->spill_load_bytes > limit) {
    snprintf(j->reason, sizeof j->reason,
             "spills registers to local memory (%d B stored, %d B loaded, %d registers; "
             "%d B allowed)",
             m->spill_store_bytes, m->spill_load_bytes, m->regs, limit);
    j->state = -1;
  }
}

/* The compile pool's state: the jobs, where they go, the counts of the progress line. */
typedef struct tpool {
  fg_generator *g;
  fg_cache *cache;
  fg_cache_key base;
  fg_arch arch;
  tjob *jobs;
  int n, done, failed, cached;
  int quiet, tty, last_decile;
  double t0;
} tpool;

/* The first line of an NVRTC log that says "error", else its first non-empty line. */
static void summarize_log(const char *log, char *out, size_t len) {
  if (!log || !*log) {
    snprintf(out, len, "compilation failed (no log)");
    return;
  }
  const char *pick = NULL, *first = NULL;
  for (const char *l = log; *l;) {
    const char *e = strchr(l, '\n');
    size_t ll = e ? (size_t)(e - l) : strlen(l);
    if (ll > 0 && !first) first = l;
    if (!pick) {
      for (size_t i = 0; i + 5 <= ll; i++)
        if (strncmp(l + i, "error", 5) == 0) {
          pick = l;
          break;
        }
    }
    if (!e) break;
    l = e + 1;
  }
  if (!pick) pick = first ? first : log;
  const char *e = strchr(pick, '\n');
  int ll = e ? (int)(e - pick) : (int)strlen(pick);
  snprintf(out, len, "compile error: %.*s", ll, pick);
}

static void progress(tpool *p) {
  if (p->quiet || p->n == 0) return;
  const double el = fg_tune_now() - p->t0;
  const int done = p->done, total = p->n;
  const double left = done ? el / done * (total - done) : 0.0;
  if (p->tty) {
    enum { W = 30 };
    char bar[W + 1];
    const int fill = (int)((long long)done * W / total);
    for (int i = 0; i < W; i++) bar[i] = i < fill ? '#' : '.';
    bar[W] = '\0';
    if (done < total)
      fprintf(stderr, "\r[%s] %d/%d compiled, %d failed, ~%.0f s left   ", bar, done, total,
              p->failed, left);
    else
      fprintf(stderr, "\r[%s] %d/%d compiled, %d failed, %.1f s          \n", bar, done, total,
              p->failed, el);
    fflush(stderr);
  } else {
    const int decile = (int)((long long)done * 10 / total);
    if (decile > p->last_decile || done == total) {
      p->last_decile = decile;
      fprintf(stderr, "flashgen tune: %d/%d compiled, %d failed, %s%.0f s %s\n", done, total,
              p->failed, done < total ? "~" : "", done < total ? left : el,
              done < total ? "left" : "elapsed");
    }
  }
}

static void compile_job(void *arg, int i) {
  tpool *p = arg;
  tjob *j = &p->jobs[i];
  fg_cache_key key = p->base;
  key.variant = j->name;
  key.arch = p->arch;
  char warn[1024] = "";
  fg_kernel_image img;
  memset(&img, 0, sizeof img);
  int hit = p->cache ? fg_cache_get_kernel(p->cache, &key, &img, warn, sizeof warn) : 0;
  if (hit == 1) {
    j->state = 1;
    j->from_cache = 1;
    if (!j->is_ref) reject_spills(j, &img.meta);
    fg_kernel_image_free(&img);
    return;
  }
  memset(&img, 0, sizeof img);
  char *log = NULL;
  int rc = j->is_ref ? fg_generator_build_reference(p->g, j->ref_dtype, j->ref_exact, p->arch,
                                                    &img, &log)
                     : fg_generator_build(p->g, &j->v, &img, &log);
  if (rc != 0) {
    summarize_log(log, j->reason, sizeof j->reason);
    j->state = -1;
    fg_kernel_image_free(&img);
  } else {
    j->state = 1;
    if (!j->is_ref) reject_spills(j, &img.meta);
    warn[0] = '\0';
    key.arch = img.arch;
    if (p->cache && fg_cache_put_kernel(p->cache, &key, &img, warn, sizeof warn) == 0) {
      fg_kernel_image_free(&img);
    } else {
      j->img = img; /* kept in memory: registered as an exported table after the pool */
      j->kept = 1;
    }
  }
  free(log);
}

/* After each job, under the pool's lock: the counts and the progress line. */
static void compile_job_done(void *arg, int i, int ndone) {
  tpool *p = arg;
  const tjob *j = &p->jobs[i];
  p->done = ndone;
  if (j->state < 0) p->failed++;
  if (j->from_cache) p->cached++;
  progress(p);
}

void fg_tune_compile_all(trun *R, fg_generator *g, const fg_cache_key *base, fg_arch arch) {
  const fg_tune_options *opt = R->opt;
  fg_tune_report *rep = R->rep;
  char err[2048];
  const double t_compile = fg_tune_now();
  tpool pool;
  memset(&pool, 0, sizeof pool);
  pool.g = g;
  pool.cache = R->cache;
  pool.base = *base;
  pool.arch = arch;
  pool.jobs = R->jobs;
  pool.n = R->njobs;
  pool.quiet = opt->quiet;
  pool.tty = isatty(2);
  pool.t0 = t_compile;
  rep->jobs = opt->jobs > 0 ? opt->jobs : fg_online_cpus();
  if (rep->jobs > FG_POOL_MAX_THREADS) rep->jobs = FG_POOL_MAX_THREADS;
  if (rep->jobs > R->njobs) rep->jobs = R->njobs;
  if (R->njobs > 0) {
    fg_tune_note(R, "compiling %d kernels on %d threads", R->njobs, rep->jobs);
    fg_pool_run(R->njobs, rep->jobs, compile_job, compile_job_done, &pool);
  }
  rep->kernels = R->njobs;
  rep->kernels_cached = pool.cached;
  rep->kernels_failed = pool.failed;
  rep->compile_s = fg_tune_now() - t_compile;
  for (int j = 0; j < R->njobs; j++)
    if (R->jobs[j].state < 0) fg_tune_note(R, "%s: %s", R->jobs[j].name, R->jobs[j].reason);

  /* Images the cache could not store: an exported table, so the registry does not compile them
   * again one by one. It stays registered for the life of the process. */
  int kept = 0;
  for (int j = 0; j < R->njobs; j++) kept += R->jobs[j].kept && !R->jobs[j].is_ref;
  if (kept) {
    fg_kernel_image *imgs = calloc((size_t)kept, sizeof *imgs);
    fg_exported_table *tab = calloc(1, sizeof *tab);
    if (imgs && tab) {
      int k = 0;
      for (int j = 0; j < R->njobs; j++)
        if (R->jobs[j].kept && !R->jobs[j].is_ref) {
          imgs[k++] = R->jobs[j].img;
          R->jobs[j].kept = 0;
        }
      tab->description = "flashgen tune: kernels compiled in this run (kept in memory)";
      tab->kernels = imgs;
      tab->n_kernels = (size_t)kept;
      if (fg_register_exported(tab, err, sizeof err) != FG_OK)
        fg_tune_note(R,
                     "warning: keeping the compiled kernels in memory failed (%s); they are "
                     "compiled again when checked",
                     err);
      else
        fg_tune_note(R, "%d kernels could not be stored in the kernel cache and are kept in memory",
                     kept);
    } else {
      free(imgs);
      free(tab);
    }
  }
}
