/* tune.c: a tuning run on the live GPU (`flashgen tune`), the same for every pass (forward,
 * backward): the candidates of each (pass, d, dtype, causal) from the device limits; every
 * candidate compiled in parallel into the kernel cache before anything is timed; each checked on
 * fresh random inputs (fg_fill_random; correct before fast, through the gate that `flashgen check`
 * applies too: the forward's O and LSE against the fp64 reference kernel through
 * fg_gate_forward, the backward's dQ, dK, dV against the host's fp64 reference through
 * fg_gate_backward); the
 * correct ones timed with CUDA events over input sets rotated past the L2 (warm-up, early stop,
 * median, runoff and hysteresis shared by both passes); the records stored in the cache under
 * the pass's key; and the report. */
#include <stdarg.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fg_autotune.h"
#include "fg_jit.h"

#define MAX_CANDS 256     /* candidates of one (d, dtype, causal) */
#define CHECK_N_MAX 2048  /* the correctness check runs batch 1, 2 heads, min(N, 2048) */
#define CHECK_HEADS 2
/* The backward's check: one batch, 2 query heads on 1 KV head (GQA: dK, dV summed over both), N
 * = 257 queries and keys (a partial tile for every Br and Bc), whatever the problem's N. */
#define BWD_CHECK_N 257
#define BWD_CHECK_HQ 2
#define BWD_CHECK_HKV 1
#define WARMUP_RUNS 3
#define FIRST_RUNS 3      /* timed runs before the early stop is considered */
#define TIMED_RUNS 10     /* the median of this many */
#define SLOWER_FACTOR 3.0 /* stop timing a candidate this much slower than the best so far */
#define RUN_MIN_MS 0.5    /* a timed run repeats a short kernel to last at least this long */
#define INNER_MAX 32
#define RUNOFF_WITHIN 1.03 /* candidates this close to the best are timed again, taking turns */
#define RUNOFF_MAX 4
#define RUNOFF_ROUNDS 4
#define RUNOFF_RUNS 5      /* per candidate and round (<= TIMED_RUNS: the events are reused) */
/* Random values uploaded repeatedly to fill the timing buffers: a prime count, so that Q, K and V
 * (whose sizes are multiples of large powers of two) do not hold the same values. */
#define TILE_ELEMS 1048573u

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------------------------------ */
/* The state of a run. */

/* A kernel to compile: a candidate or a reference kernel. */
typedef struct tjob {
  int is_ref;
  fg_variant v;                 /* is_ref = 0 */
  fg_dtype ref_dtype;           /* is_ref = 1 */
  int ref_exact;
  char name[FG_VARIANT_NAME_MAX];
  int state;                    /* 0 pending, 1 available, -1 failed */
  int from_cache;
  char reason[256];             /* why it failed */
  int kept;                     /* img holds the image: the cache could not store it */
  fg_kernel_image img;
} tjob;

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

/* The candidates of one (pass, d, dtype, causal). */
typedef struct ttriple {
  fg_pass pass;
  int d, causal;
  fg_dtype dtype;
  fg_variant fwd_v;             /* backward: the forward variant that makes O and LSE */
  fg_variant cands[MAX_CANDS];
  int job[MAX_CANDS];           /* index into the job list, -1 when not compiled */
  int n;
  fg_prune_counts pruned;
  int seed;                     /* index of the baseline (fg_baseline_variant), -1 if it does
                                   not fit */
  fg_variant seed_v;
  int last_winner;              /* index of the winner of the previous bucket, -1 */
  double last_ratio[MAX_CANDS]; /* time / the winner's time at the previous bucket; 0: unknown */
} ttriple;

/* What one problem needs. */
typedef struct tprob {
  int tri;                      /* index of its triple, -1 when it has none */
  int dup_of;                   /* an earlier problem with the same key, or -1 */
  fg_tune_candidate *rec;       /* the cache's record of this bucket (malloc'd), or NULL */
  int nrec;
  char rec_winner[FG_VARIANT_NAME_MAX];
  unsigned char measure[MAX_CANDS];
  int n_measure;
  fg_tune_candidate res[MAX_CANDS]; /* this run's results, by candidate index */
  unsigned char have_res[MAX_CANDS];
} tprob;

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

/* ------------------------------------------------------------------------------------------ */
/* Compiling in parallel (fg_pool_run): each job from the cache, or built and stored there. */

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
  const double el = now_s() - p->t0;
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

/* ------------------------------------------------------------------------------------------ */
/* Helpers of the checking and timing stages. */

typedef struct tdev {
  fg_context *ctx;
  CUstream stream;
  CUevent ev[2 * TIMED_RUNS];
  /* correctness check: Q, K, V, O, LSE of the candidate; O and LSE of a reference kernel */
  CUdeviceptr cq, ck, cv, co, clse, cref, creflse;
  size_t check_elems, check_rows;
  uint16_t *hq, *hk, *hv, *ho;
  float *hlse;
  double *href, *hreflse, *hlowp;
  /* timing */
  CUdeviceptr pool;
  size_t pool_bytes;
  fg_dtype pool_dtype;          /* what the pool's values are (0: not filled) */
  fg_rng rng;
} tdev;

/* Rounds a byte count up to 256 (every tensor of an input set starts aligned). */
static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

/* Whether the CUDA context still works after a failure (a sticky error breaks it for good). */
static int context_alive(fg_context *ctx) { return fg_dev_synchronize(ctx) == FG_OK; }

/* Releases the buffers of the correctness check (device and host); they can be made again. */
static void free_check_buffers(tdev *D) {
  fg_context *ctx = D->ctx;
  fg_dev_free(ctx, D->cq);
  fg_dev_free(ctx, D->ck);
  fg_dev_free(ctx, D->cv);
  fg_dev_free(ctx, D->co);
  fg_dev_free(ctx, D->cref);
  fg_dev_free(ctx, D->clse);
  fg_dev_free(ctx, D->creflse);
  D->cq = D->ck = D->cv = D->co = D->cref = D->clse = D->creflse = 0;
  free(D->hq);
  free(D->hk);
  free(D->hv);
  free(D->ho);
  free(D->hlse);
  free(D->href);
  free(D->hreflse);
  free(D->hlowp);
  D->hq = D->hk = D->hv = D->ho = NULL;
  D->hlse = NULL;
  D->href = D->hreflse = D->hlowp = NULL;
  D->check_elems = D->check_rows = 0;
}

/* Makes the check buffers hold elems elements of Q, K, V, O and rows rows of LSE. */
static fg_status check_buffers(tdev *D, size_t elems, size_t rows) {
  if (D->check_elems >= elems && D->check_rows >= rows) return FG_OK;
  fg_context *ctx = D->ctx;
  free_check_buffers(D);
  D->hq = malloc(elems * 2);
  D->hk = malloc(elems * 2);
  D->hv = malloc(elems * 2);
  D->ho = malloc(elems * 2);
  D->hlse = malloc(rows * 4);
  D->href = malloc(elems * 8);
  D->hreflse = malloc(rows * 8);
  D->hlowp = malloc(elems * 8);
  if (!D->hq || !D->hk || !D->hv || !D->ho || !D->hlse || !D->href || !D->hreflse || !D->hlowp)
    return fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "tune: out of host memory for the check buffers");
  fg_status st;
  if ((st = fg_dev_alloc(ctx, &D->cq, elems * 2)) || (st = fg_dev_alloc(ctx, &D->ck, elems * 2)) ||
      (st = fg_dev_alloc(ctx, &D->cv, elems * 2)) || (st = fg_dev_alloc(ctx, &D->co, elems * 2)) ||
      (st = fg_dev_alloc(ctx, &D->clse, rows * 4)) || (st = fg_dev_alloc(ctx, &D->cref, elems * 8)) ||
      (st = fg_dev_alloc(ctx, &D->creflse, rows * 8)))
    return st;
  D->check_elems = elems;
  D->check_rows = rows;
  return FG_OK;
}

static void free_dev(tdev *D) {
  fg_context *ctx = D->ctx;
  free_check_buffers(D);
  fg_dev_free(ctx, D->pool);
  for (int i = 0; i < 2 * TIMED_RUNS; i++) fg_event_destroy(ctx, D->ev[i]);
  fg_stream_destroy(ctx, D->stream);
}

/* Runs the reference kernel (exact or naive) on the check inputs; fp64 O into out and, when
 * out_lse is not NULL, fp64 LSE into out_lse. */
static fg_status run_reference(tdev *D, const fg_attention_args *a, int exact, double *out,
                               double *out_lse, char *why, size_t whylen) {
  fg_context *ctx = D->ctx;
  const fg_loaded_kernel *ref;
  fg_status st = fg_registry_get_reference(ctx, a->dtype, exact, &ref);
  if (st != FG_OK) {
    snprintf(why, whylen, "the %s reference kernel is unavailable: %s", exact ? "fp64" : "naive",
             fg_context_last_error(ctx));
    return st;
  }
  fg_attention_args r = *a, norm;
  r.o = (void *)(uintptr_t)D->cref;
  r.lse = NULL;
  char err[512];
  if ((st = fg_validate_args(&r, FG_VALIDATE_CALL, &norm, err, sizeof err)) != FG_OK) {
    snprintf(why, whylen, "reference arguments: %s", err);
    return st;
  }
  fg_fwd_params p;
  fg_params_from_args(&norm, &p);
  p.lse = out_lse ? D->creflse : 0; /* fp64, [B, H, N] */
  const size_t rows = (size_t)(a->batch * a->heads_q * a->seqlen_q);
  const size_t elems = rows * (size_t)a->head_dim;
  if ((st = fg_dev_fill32(ctx, D->cref, 0xFFFFFFFFu, elems * 2)) != FG_OK || /* NaN */
      (st = fg_dev_fill32(ctx, D->creflse, 0xFFFFFFFFu, rows * 2)) != FG_OK ||
      (st = fg_dev_synchronize(ctx)) != FG_OK ||
      (st = fg_kernel_launch(ctx, ref, &p, FG_ELEMS_REFERENCE, D->stream)) != FG_OK ||
      (st = fg_stream_synchronize(ctx, D->stream)) != FG_OK ||
      (st = fg_dev_download(ctx, out, D->cref, elems * 8)) != FG_OK ||
      (out_lse && (st = fg_dev_download(ctx, out_lse, D->creflse, rows * 8)) != FG_OK)) {
    snprintf(why, whylen, "running the %s reference kernel failed: %s",
             exact ? "fp64" : "naive", fg_context_last_error(ctx));
    return st;
  }
  return FG_OK;
}

/* Fills the timing pool with normal random values of dtype t (repeating a tile of TILE_ELEMS), like
 * torch.randn and typical activations (it was uniform, with Q = K = V: a diagonal-heavy S that
 * no user has). */
static fg_status fill_pool(tdev *D, fg_dtype t) {
  if (D->pool_dtype == t) return FG_OK;
  uint16_t *tile = malloc(TILE_ELEMS * 2);
  if (!tile) return fg_fail(D->ctx, FG_ERROR_OUT_OF_MEMORY, "tune: out of host memory");
  fg_fill_random(tile, TILE_ELEMS, &D->rng, t, 1);
  fg_status st = FG_OK;
  for (size_t off = 0; off < D->pool_bytes && st == FG_OK; off += TILE_ELEMS * 2) {
    size_t n = D->pool_bytes - off < TILE_ELEMS * 2 ? D->pool_bytes - off : TILE_ELEMS * 2;
    st = fg_dev_upload(D->ctx, D->pool + off, tile, n);
  }
  free(tile);
  if (st == FG_OK) st = fg_dev_synchronize(D->ctx);
  D->pool_dtype = st == FG_OK ? t : (fg_dtype)0;
  return st;
}

/* Makes the timing pool at least bytes large; 0, or -1 when the device has no room. */
static int ensure_pool(tdev *D, size_t bytes) {
  if (D->pool_bytes >= bytes) return 0;
  fg_dev_free(D->ctx, D->pool);
  D->pool = 0;
  D->pool_bytes = 0;
  D->pool_dtype = (fg_dtype)0;
  if (fg_dev_alloc(D->ctx, &D->pool, bytes) != FG_OK) return -1;
  D->pool_bytes = bytes;
  return 0;
}

/* What a timed launch of a problem runs, on one of `sets` input sets: the forward kernel with a
 * parameter block, or the backward plan (three kernels, fg_attention_backward_variant) with an
 * argument block whose workspace is preallocated. */
typedef struct tlaunch {
  fg_pass pass;
  int sets;
  fg_fwd_params prm[8];                     /* forward */
  fg_attention_backward_args bargs[8];      /* backward */
} tlaunch;

/* One candidate to time: its loaded kernel (forward) and its variant (backward). */
typedef struct tcand {
  const fg_loaded_kernel *k;
  const fg_variant *v;
} tcand;

static fg_status launch_once(tdev *D, const tlaunch *L, const tcand *c, int set) {
  if (L->pass == FG_PASS_BWD)
    return fg_attention_backward_variant(D->ctx, &L->bargs[set], D->stream, c->v);
  return fg_kernel_launch(D->ctx, c->k, &L->prm[set], FG_ELEMS_FORWARD, D->stream);
}

/* `runs` timed runs of `inner` launches each, rotating the input sets; ms per launch into t. */
static fg_status run_batch(tdev *D, const tlaunch *L, const tcand *c, int *rot, int runs,
                           int inner, double *t) {
  fg_context *ctx = D->ctx;
  fg_status st;
  for (int r = 0; r < runs; r++) {
    if ((st = fg_event_record(ctx, D->ev[2 * r], D->stream)) != FG_OK) return st;
    for (int i = 0; i < inner; i++) {
      st = launch_once(D, L, c, *rot % L->sets);
      ++*rot;
      if (st != FG_OK) return st;
    }
    if ((st = fg_event_record(ctx, D->ev[2 * r + 1], D->stream)) != FG_OK) return st;
  }
  for (int r = 0; r < runs; r++) {
    float ms;
    if ((st = fg_event_elapsed_ms(ctx, D->ev[2 * r], D->ev[2 * r + 1], &ms)) != FG_OK) return st;
    t[r] = (double)ms / inner;
  }
  return FG_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The report. */

/* "d=128 bf16 causal N=4096" (forward), "bwd d=128 bf16 causal N=4096" (backward). */
static void row_problem(const fg_tune_row *r, char *buf, size_t len) {
  snprintf(buf, len, "%sd=%d %s %s N=%lld", r->problem.pass == FG_PASS_BWD ? "bwd " : "",
           r->problem.d, fg_dtype_name(r->problem.dtype),
           r->problem.causal ? "causal" : "noncausal", (long long)r->problem.n);
}

void fg_tune_report_print(const fg_tune_report *rep, FILE *out, int md) {
  if (!rep || !out) return;
  if (md) {
    fprintf(out, "# flashgen tune: %s (%s)\n\n", rep->device, rep->arch);
    fprintf(out, "| problem | B x H | winner | TFLOP/s | seed rule TFLOP/s | winner / seed | "
                 "tried | pruned | rejected |\n");
    fprintf(out, "|---|---|---|---:|---:|---:|---:|---:|---:|\n");
  } else {
    fprintf(out, "%-34s %-9s %-56s %8s %8s %7s %5s %6s %8s\n", "PROBLEM", "B x H", "WINNER",
            "TFLOP/s", "SEED", "RATIO", "TRIED", "PRUNED", "REJECTED");
  }
  for (int i = 0; i < rep->n_rows; i++) {
    const fg_tune_row *r = &rep->rows[i];
    char prob[96], bh[32], win[FG_VARIANT_NAME_MAX + 64], tf[32], sd[32], ratio[32];
    row_problem(r, prob, sizeof prob);
    snprintf(bh, sizeof bh, "%lldx%lld", (long long)r->problem.batch, (long long)r->problem.heads);
    if (r->winner[0]) {
      snprintf(win, sizeof win, md ? "`%s`%s" : "%s%s", r->winner, r->measured ? "" : " *");
      snprintf(tf, sizeof tf, r->winner_tflops >= 1 ? "%.1f" : "%.3g", r->winner_tflops);
    } else {
      snprintf(win, sizeof win, "none: %.150s", r->note[0] ? r->note : "no correct candidate");
      snprintf(tf, sizeof tf, "-");
    }
    if (r->seed_tflops > 0)
      snprintf(sd, sizeof sd, r->seed_tflops >= 1 ? "%.1f" : "%.3g", r->seed_tflops);
    else snprintf(sd, sizeof sd, "%s", r->seed_variant[0] ? "rejected" : "-");
    if (r->winner[0] && r->seed_tflops > 0)
      snprintf(ratio, sizeof ratio, "%.2fx", r->winner_tflops / r->seed_tflops);
    else snprintf(ratio, sizeof ratio, "-");
    if (md)
      fprintf(out, "| %s | %s | %s | %s | %s | %s | %d | %d | %d |\n", prob, bh, win, tf, sd,
              ratio, r->tried, r->pruned, r->rejected);
    else
      fprintf(out, "%-34s %-9s %-56s %8s %8s %7s %5d %6d %8d\n", prob, bh, win, tf, sd, ratio,
              r->tried, r->pruned, r->rejected);
  }
  const char *sep = md ? "\n" : "";
  int recorded = 0;
  for (int i = 0; i < rep->n_rows; i++) recorded |= rep->rows[i].winner[0] && !rep->rows[i].measured;
  if (recorded)
    fprintf(out, "%s* already tuned: from the record of an earlier run (--retune measures again)\n",
            sep);
  /* The baseline ("SEED") of each (pass, d, dtype, causal), once: the forward's seed rule, the
   * backward's built-in rule. */
  for (int pass = FG_PASS_FWD; pass <= FG_PASS_BWD; pass++) {
    int header = 0;
    for (int i = 0; i < rep->n_rows; i++) {
      const fg_tune_row *r = &rep->rows[i];
      int seen = (int)r->problem.pass != pass;
      for (int j = 0; j < i && !seen; j++)
        seen = rep->rows[j].problem.pass == r->problem.pass &&
               rep->rows[j].problem.d == r->problem.d &&
               rep->rows[j].problem.dtype == r->problem.dtype &&
               rep->rows[j].problem.causal == r->problem.causal;
      if (seen || !r->seed_variant[0]) continue;
      if (!header++)
        fprintf(out, "%s%s:%s\n", sep,
                pass == FG_PASS_FWD
                    ? "seed-rule candidates (Bc = ceil(M/4d), Br = min(ceil(M/4d), d))"
                    : "backward baseline (SEED): the built-in rule, what runs without a record",
                md ? "\n" : "");
      fprintf(out, "%s %sd=%d %s %s: %s\n", md ? "-" : " ", pass == FG_PASS_BWD ? "bwd " : "",
              r->problem.d, fg_dtype_name(r->problem.dtype),
              r->problem.causal ? "causal" : "noncausal", r->seed_variant);
    }
  }
  fprintf(out, "%skernels: %d (%d from the cache, %d failed to compile or spilled) on %d threads in %.1f s; "
               "checks %.1f s; timing %.1f s; total tune time %.1f s%s\n",
          sep, rep->kernels, rep->kernels_cached, rep->kernels_failed, rep->jobs, rep->compile_s,
          rep->check_s, rep->timing_s, rep->total_s, md ? "  " : "");
  fprintf(out, "records: %s; input seed %llu (--seed to repeat)\n",
          rep->cache_path[0] ? rep->cache_path : "not stored (no kernel cache)",
          (unsigned long long)rep->seed);
}

void fg_tune_report_free(fg_tune_report *rep) {
  if (!rep) return;
  free(rep->rows);
  rep->rows = NULL;
  rep->n_rows = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The run. */

typedef struct trun {
  fg_context *ctx;
  const fg_tune_options *opt;
  const fg_tune_problem *problems;
  int n;
  fg_tune_report *rep;
  fg_cache *cache;
  fg_device_id devid;
  ttriple *tri;
  int ntri;
  tprob *pr;
  tjob *jobs;
  int njobs;
  tdev D;
  int fatal;                    /* the CUDA context is unusable */
  int broken_tri, broken_cand;  /* the candidate that made it so */
} trun;

static int sort_problem_cmp(const fg_tune_problem *a, const fg_tune_problem *b) {
  if (a->pass != b->pass) return a->pass < b->pass ? -1 : 1;
  if (a->dtype != b->dtype) return a->dtype < b->dtype ? -1 : 1;
  if (a->d != b->d) return a->d < b->d ? -1 : 1;
  if (a->causal != b->causal) return a->causal < b->causal ? -1 : 1;
  if (a->n != b->n) return a->n < b->n ? -1 : 1;
  return 0;
}

static void note(const trun *R, const char *fmt, ...) FG_PRINTF(2, 3);
static void note(const trun *R, const char *fmt, ...) {
  if (R->opt->quiet) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "flashgen tune: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

static int find_job(const trun *R, const char *name) {
  for (int j = 0; j < R->njobs; j++)
    if (strcmp(R->jobs[j].name, name) == 0) return j;
  return -1;
}

static int add_job(trun *R, const tjob *j) {
  int k = find_job(R, j->name);
  if (k >= 0) return k;
  R->jobs[R->njobs] = *j;
  return R->njobs++;
}

static void set_result(tprob *P, const ttriple *T, int c, int ok, double ms, double tflops,
                       const char *fmt, ...) FG_PRINTF(7, 8);
static void set_result(tprob *P, const ttriple *T, int c, int ok, double ms, double tflops,
                       const char *fmt, ...) {
  fg_tune_candidate *r = &P->res[c];
  memset(r, 0, sizeof *r);
  fg_variant_name(&T->cands[c], r->variant, sizeof r->variant);
  r->ok = ok;
  r->ms = ms;
  r->tflops = tflops;
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof r->reason, fmt, ap);
    va_end(ap);
  }
  P->have_res[c] = 1;
}

/* The correctness check of every candidate to measure for problem pi. Returns FG_OK, or a
 * failure that stops the whole run (the context is broken). */
/* A candidate failed while `doing` (checking, timing): records why (prefix: the context's last
 * error) and, when the failure left the CUDA context unusable, stops the run. Returns FG_OK to
 * go on with the next candidate, or the status that ends tuning in this process. */
static fg_status candidate_failed(trun *R, tprob *P, ttriple *T, int c, const char *name,
                                  const char *doing, const char *prefix) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", fg_context_last_error(R->ctx));
  set_result(P, T, c, 0, 0, 0, "%s: %s", prefix, msg);
  if (context_alive(R->ctx)) return FG_OK;
  R->fatal = 1;
  R->broken_tri = P->tri;
  R->broken_cand = c;
  return fg_fail(R->ctx, FG_ERROR_CUDA,
                 "the CUDA context became unusable while %s %s (%s); tuning cannot continue in "
                 "this process",
                 doing, name, msg);
}

/* Marks every candidate of problem pi not decided yet as not checked, and why (the row's note). */
static void not_checked(trun *R, int pi, const char *why) {
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  snprintf(R->rep->rows[pi].note, sizeof R->rep->rows[pi].note, "%.250s", why);
  for (int c = 0; c < T->n; c++)
    if (P->measure[c] && !P->have_res[c]) set_result(P, T, c, 0, 0, 0, "not checked: %s", why);
}

/* The backward's check of every candidate to measure for problem pi: fresh random Q, K, V, dO
 * (never zeros) of BWD_CHECK_HQ/BWD_CHECK_HKV heads and BWD_CHECK_N rows, O and LSE from the
 * forward (T->fwd_v), the gradients poisoned with NaN before each candidate, and
 * fg_gate_backward against the host's fp64 reference and naive computation (computed once).
 * Returns FG_OK, or a failure that stops the whole run (the context is broken). */
static fg_status check_problem_bwd(trun *R, int pi, uint64_t seed) {
  fg_context *ctx = R->ctx;
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  const fg_tune_problem *pb = &R->problems[pi];
  tdev *D = &R->D;
  const int64_t N = BWD_CHECK_N, d = pb->d;
  const size_t nq = (size_t)(BWD_CHECK_HQ * N * d), nk = (size_t)(BWD_CHECK_HKV * N * d);
  const size_t rows = (size_t)(BWD_CHECK_HQ * N);
  /* Device: Q, O, dO, dQ (nq each), K, V, dK, dV (nk each), LSE; each 256-byte aligned. */
  const size_t bq = align256(nq * 2), bk = align256(nk * 2), bl = align256(rows * 4);
  const size_t total = 4 * bq + 4 * bk + bl;
  uint16_t *h = malloc((2 * nq + 2 * nk) * 2 + (nq + 2 * nk) * 2); /* q, do, k, v; gq, gk, gv */
  double *ref = malloc((nq + 2 * nk) * sizeof *ref), *naive = malloc((nq + 2 * nk) * sizeof *naive);
  CUdeviceptr mem = 0;
  fg_status st = FG_OK;
  char why[1024];
  if (!h || !ref || !naive) {
    free(h), free(ref), free(naive);
    return fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "tune: out of host memory for the backward check");
  }
  uint16_t *hq = h, *hdo = hq + nq, *hk = hdo + nq, *hv = hk + nk, *gq = hv + nk, *gk = gq + nq,
           *gv = gk + nk;
  if ((st = fg_dev_alloc(ctx, &mem, total)) != FG_OK) goto out;
  const CUdeviceptr q = mem, o = q + bq, dout = o + bq, dq = dout + bq, k = dq + bq, v = k + bk,
                    dk = v + bk, dv = dk + bk, lse = dv + bk;
  fg_rng s = {seed};
  const int normal = (int)(fg_rng_next(&s) & 1);
  fg_fill_random(hq, (int64_t)nq, &s, pb->dtype, normal);
  fg_fill_random(hk, (int64_t)nk, &s, pb->dtype, normal);
  fg_fill_random(hv, (int64_t)nk, &s, pb->dtype, normal);
  fg_fill_random(hdo, (int64_t)nq, &s, pb->dtype, normal);
  if ((st = fg_dev_upload(ctx, q, hq, nq * 2)) != FG_OK ||
      (st = fg_dev_upload(ctx, k, hk, nk * 2)) != FG_OK ||
      (st = fg_dev_upload(ctx, v, hv, nk * 2)) != FG_OK ||
      (st = fg_dev_upload(ctx, dout, hdo, nq * 2)) != FG_OK ||
      (st = fg_dev_synchronize(ctx)) != FG_OK)
    goto out;
  fg_attention_backward_args b;
  memset(&b, 0, sizeof b);
  b.size = sizeof b;
  b.dtype = pb->dtype;
  b.causal = pb->causal;
  b.batch = 1;
  b.heads_q = BWD_CHECK_HQ;
  b.heads_kv = BWD_CHECK_HKV;
  b.seqlen_q = b.seqlen_k = N;
  b.head_dim = d;
  b.q = (const void *)(uintptr_t)q, b.k = (const void *)(uintptr_t)k;
  b.v = (const void *)(uintptr_t)v, b.o = (const void *)(uintptr_t)o;
  b.d_o = (const void *)(uintptr_t)dout, b.lse = (const float *)(uintptr_t)lse;
  b.dq = (void *)(uintptr_t)dq, b.dk = (void *)(uintptr_t)dk, b.dv = (void *)(uintptr_t)dv;
  fg_attention_args f;
  fg_backward_forward_args(&b, &f);
  if ((st = fg_attention_forward_variant(ctx, &f, D->stream, &T->fwd_v)) != FG_OK ||
      (st = fg_stream_synchronize(ctx, D->stream)) != FG_OK) {
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(&T->fwd_v, name, sizeof name);
    snprintf(why, sizeof why, "the forward %s that makes O and LSE failed: %s", name,
             fg_context_last_error(ctx));
    if (!context_alive(ctx)) {
      st = fg_fail(ctx, FG_ERROR_CUDA, "%s", why);
      goto out;
    }
    not_checked(R, pi, why);
    st = FG_OK;
    goto out;
  }
  const fg_bwd_host_problem hp = {pb->dtype, pb->causal, 1, BWD_CHECK_HQ, BWD_CHECK_HKV, N, N, d,
                                  1.0 / sqrt((double)d), hq, hk, hv, hdo};
  const int threads = R->opt->jobs > 0 ? R->opt->jobs : fg_online_cpus();
  if (fg_reference_backward(&hp, 1, ref, ref + nq, ref + nq + nk, NULL, threads) != 0 ||
      fg_reference_backward(&hp, 0, naive, naive + nq, naive + nq + nk, NULL, threads) != 0) {
    not_checked(R, pi, "the host's backward reference failed (out of memory?)");
    goto out;
  }
  const char *dist = normal ? "normal" : "uniform";
  for (int c = 0; c < T->n; c++) {
    if (!P->measure[c] || P->have_res[c]) continue; /* compile failures are already set */
    const fg_variant *cv = &T->cands[c];
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(cv, name, sizeof name);
    if ((st = fg_dev_fill16(ctx, dq, 0xFFFF, nq)) != FG_OK || /* NaN */
        (st = fg_dev_fill16(ctx, dk, 0xFFFF, nk)) != FG_OK ||
        (st = fg_dev_fill16(ctx, dv, 0xFFFF, nk)) != FG_OK ||
        (st = fg_dev_synchronize(ctx)) != FG_OK)
      goto out;
    st = fg_attention_backward_variant(ctx, &b, D->stream, cv);
    const char *stage = "launch failed";
    if (st == FG_OK) {
      stage = "kernel failed";
      st = fg_stream_synchronize(ctx, D->stream);
    }
    if (st != FG_OK) {
      if ((st = candidate_failed(R, P, T, c, name, "checking", stage)) != FG_OK) goto out;
      continue;
    }
    if ((st = fg_dev_download(ctx, gq, dq, nq * 2)) != FG_OK ||
        (st = fg_dev_download(ctx, gk, dk, nk * 2)) != FG_OK ||
        (st = fg_dev_download(ctx, gv, dv, nk * 2)) != FG_OK)
      goto out;
    fg_gate_result g;
    if (!fg_gate_backward(pb->dtype, gq, gk, gv, ref, naive, (int64_t)nq, (int64_t)nk, &g))
      set_result(P, T, c, 0, 0, 0,
                 "wrong: %s; %s inputs, seed %llu, B=1 Hq=%d Hkv=%d N=%lld", g.reason, dist,
                 (unsigned long long)seed, BWD_CHECK_HQ, BWD_CHECK_HKV, (long long)N);
    /* A correct candidate gets its result in the timing stage. */
  }
out:
  fg_dev_free(ctx, mem);
  free(h), free(ref), free(naive);
  return st;
}

static fg_status check_problem(trun *R, int pi, uint64_t seed) {
  if (R->problems[pi].pass == FG_PASS_BWD) return check_problem_bwd(R, pi, seed);
  fg_context *ctx = R->ctx;
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  const fg_tune_problem *pb = &R->problems[pi];
  tdev *D = &R->D;
  const int64_t n = pb->n < CHECK_N_MAX ? pb->n : CHECK_N_MAX;
  const size_t rows = (size_t)(CHECK_HEADS * n), elems = rows * (size_t)pb->d;
  fg_status st = check_buffers(D, elems, rows);
  if (st != FG_OK) return st;
  fg_rng s = {seed};
  const int normal = (int)(fg_rng_next(&s) & 1);
  fg_fill_random(D->hq, (int64_t)elems, &s, pb->dtype, normal);
  fg_fill_random(D->hk, (int64_t)elems, &s, pb->dtype, normal);
  fg_fill_random(D->hv, (int64_t)elems, &s, pb->dtype, normal);
  if ((st = fg_dev_upload(ctx, D->cq, D->hq, elems * 2)) != FG_OK ||
      (st = fg_dev_upload(ctx, D->ck, D->hk, elems * 2)) != FG_OK ||
      (st = fg_dev_upload(ctx, D->cv, D->hv, elems * 2)) != FG_OK ||
      (st = fg_dev_synchronize(ctx)) != FG_OK) /* copies and fills are not on D->stream */
    return st;
  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = pb->dtype;
  a.causal = pb->causal;
  a.batch = 1;
  a.heads_q = a.heads_kv = CHECK_HEADS;
  a.seqlen_q = a.seqlen_k = n;
  a.head_dim = pb->d;
  a.q = (const void *)(uintptr_t)D->cq;
  a.k = (const void *)(uintptr_t)D->ck;
  a.v = (const void *)(uintptr_t)D->cv;
  a.o = (void *)(uintptr_t)D->co;
  a.lse = (float *)(uintptr_t)D->clse;
  char why[1024];
  if (run_reference(D, &a, 1, D->href, D->hreflse, why, sizeof why) != FG_OK ||
      run_reference(D, &a, 0, D->hlowp, NULL, why, sizeof why) != FG_OK) {
    if (!context_alive(ctx)) return fg_fail(ctx, FG_ERROR_CUDA, "%s", why);
    not_checked(R, pi, why);
    return FG_OK;
  }
  for (size_t i = 0; i < elems; i++) {
    if (!isfinite(D->href[i]) || !isfinite(D->hlowp[i])) {
      snprintf(R->rep->rows[pi].note, sizeof R->rep->rows[pi].note,
               "the reference kernel wrote a non-finite value at %zu", i);
      for (int c = 0; c < T->n; c++)
        if (P->measure[c] && !P->have_res[c])
          set_result(P, T, c, 0, 0, 0, "not checked: the reference is not finite");
      return FG_OK;
    }
  }
  const char *dist = normal ? "normal" : "uniform";
  const fg_gate_fwd gf = {pb->dtype, pb->causal, 1, CHECK_HEADS, n, n, pb->d, D->ho, {0, 0, 0},
                          D->hlse, D->href, D->hreflse, D->hlowp};

  for (int c = 0; c < T->n; c++) {
    if (!P->measure[c] || P->have_res[c]) continue; /* compile failures are already set */
    const fg_variant *v = &T->cands[c];
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(v, name, sizeof name);
    if ((st = fg_dev_fill16(ctx, D->co, 0xFFFF, elems)) != FG_OK || /* NaN */
        (st = fg_dev_fill32(ctx, D->clse, 0xFFFFFFFFu, rows)) != FG_OK ||
        (st = fg_dev_synchronize(ctx)) != FG_OK)
      return st;
    st = fg_attention_forward_variant(ctx, &a, D->stream, v);
    const char *stage = "launch failed";
    if (st == FG_OK) {
      stage = "kernel failed";
      st = fg_stream_synchronize(ctx, D->stream);
    }
    if (st != FG_OK) {
      if ((st = candidate_failed(R, P, T, c, name, "checking", stage)) != FG_OK) return st;
      continue;
    }
    if ((st = fg_dev_download(ctx, D->ho, D->co, elems * 2)) != FG_OK ||
        (st = fg_dev_download(ctx, D->hlse, D->clse, rows * 4)) != FG_OK)
      return st;
    fg_gate_result g;
    if (!fg_gate_forward(&gf, &g)) {
      const size_t w = (size_t)g.worst[0], row = w / (size_t)pb->d;
      set_result(P, T, c, 0, 0, 0,
                 "wrong: %s (largest O error at head %zu, row %zu, col %zu); %s inputs, seed "
                 "%llu, B=1 H=%d N=%lld",
                 g.reason, row / (size_t)n, row % (size_t)n, w % (size_t)pb->d, dist,
                 (unsigned long long)seed, CHECK_HEADS, (long long)n);
    }
    /* A correct candidate gets its result in the timing stage. */
  }
  return FG_OK;
}

/* The times of problem P's candidates that were fully timed and correct (eligible to win), for
 * fg_tune_finalists and fg_tune_pick_winner; ms is 0 for the others. */
static void eligible_times(const tprob *P, const ttriple *T, double *ms, int *ok) {
  for (int c = 0; c < T->n; c++) {
    const fg_tune_candidate *r = &P->res[c];
    ok[c] = P->have_res[c] && r->ok && !r->reason[0];
    ms[c] = ok[c] ? r->ms : 0;
  }
}

/* The runoff: the (up to RUNOFF_MAX) fully timed candidates within RUNOFF_WITHIN of the best
 * time are timed again in RUNOFF_ROUNDS rounds that take turns, and each keeps the median of its
 * runoff runs. Timed one after another, near-equal candidates were decided by the drift of the
 * clock (an H100 under sustained tensor load lowers it within a second): the tuner picked a
 * kernel 3% slower than another for one bucket. Taking turns shares the drift out evenly. */
static fg_status runoff(trun *R, int pi, const tlaunch *L, int *rot, const int *inner_of) {
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  const fg_tune_problem *pb = &R->problems[pi];
  double ms[MAX_CANDS];
  int ok[MAX_CANDS], fin[RUNOFF_MAX];
  eligible_times(P, T, ms, ok);
  const int nf = fg_tune_finalists(ms, ok, T->n, RUNOFF_WITHIN, RUNOFF_MAX, fin);
  if (nf < 2) return FG_OK;
  tcand k[RUNOFF_MAX];
  for (int i = 0; i < nf; i++) {
    k[i].v = &T->cands[fin[i]];
    fg_status st = fg_registry_get(R->ctx, k[i].v, &k[i].k);
    if (st != FG_OK) return FG_OK; /* timed a moment ago: keep the first timings */
  }
  double t[RUNOFF_MAX][RUNOFF_ROUNDS * RUNOFF_RUNS];
  for (int round = 0; round < RUNOFF_ROUNDS; round++)
    for (int i = 0; i < nf; i++) {
      fg_status st = run_batch(&R->D, L, &k[i], rot, RUNOFF_RUNS, inner_of[fin[i]],
                               t[i] + round * RUNOFF_RUNS);
      if (st != FG_OK) return context_alive(R->ctx) ? FG_OK : st;
    }
  for (int i = 0; i < nf; i++) {
    const double m = fg_tune_median(t[i], RUNOFF_ROUNDS * RUNOFF_RUNS);
    set_result(P, T, fin[i], 1, m, fg_tune_tflops(pb, m), NULL);
  }
  return FG_OK;
}

/* The forward arguments of problem pb on the tensors at q, k, v, o (and lse when not 0). */
static fg_attention_args problem_args(const fg_tune_problem *pb, CUdeviceptr q, CUdeviceptr k,
                                      CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse) {
  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = pb->dtype;
  a.causal = pb->causal;
  a.batch = pb->batch;
  a.heads_q = a.heads_kv = pb->heads;
  a.seqlen_q = a.seqlen_k = pb->n;
  a.head_dim = pb->d;
  a.q = (const void *)(uintptr_t)q;
  a.k = (const void *)(uintptr_t)k;
  a.v = (const void *)(uintptr_t)v;
  a.o = (void *)(uintptr_t)o;
  a.lse = (float *)(uintptr_t)lse;
  return a;
}

/* Bytes of one input set of problem pb: forward Q, K, V, O; backward Q, K, V, O, dO, dQ, dK,
 * dV, LSE and the fp32 workspace. */
static size_t set_bytes_of(const fg_tune_problem *pb) {
  const size_t rows = (size_t)(pb->batch * pb->heads * pb->n);
  const size_t tensor = align256(rows * (size_t)pb->d * 2);
  if (pb->pass != FG_PASS_BWD) return 4 * tensor;
  return 8 * tensor + align256(rows * 4) + align256(rows * (size_t)(pb->d + 1) * 4);
}

/* Fills L with the input sets of problem pi in the timing pool. The backward's O and LSE come
 * from the forward (T->fwd_v) on each set; the pool is then marked for refilling, since the
 * fp32 LSE and workspace are no inputs for the next problem. */
static fg_status make_sets(trun *R, int pi, int sets, tlaunch *L) {
  fg_context *ctx = R->ctx;
  const fg_tune_problem *pb = &R->problems[pi];
  const ttriple *T = &R->tri[R->pr[pi].tri];
  tdev *D = &R->D;
  const size_t rows = (size_t)(pb->batch * pb->heads * pb->n);
  const size_t tensor = align256(rows * (size_t)pb->d * 2), set_bytes = set_bytes_of(pb);
  char err[512];
  fg_status st;
  L->pass = pb->pass;
  L->sets = sets;
  for (int s = 0; s < sets; s++) {
    const CUdeviceptr base = D->pool + (CUdeviceptr)s * set_bytes;
    CUdeviceptr t[8];
    for (int i = 0; i < 8; i++) t[i] = base + (CUdeviceptr)i * tensor;
    const CUdeviceptr lse = base + 8 * tensor, ws = lse + align256(rows * 4);
    fg_attention_args a = problem_args(pb, t[0], t[1], t[2], t[3], pb->pass == FG_PASS_BWD ? lse : 0),
                      norm;
    if ((st = fg_validate_args(&a, FG_VALIDATE_CALL, &norm, err, sizeof err)) != FG_OK)
      return fg_fail(ctx, st, "tune: problem %lldx%lldx%lldx%d: %s", (long long)pb->batch,
                     (long long)pb->heads, (long long)pb->n, pb->d, err);
    if (pb->pass != FG_PASS_BWD) {
      fg_params_from_args(&norm, &L->prm[s]);
      continue;
    }
    if ((st = fg_attention_forward_variant(ctx, &a, D->stream, &T->fwd_v)) != FG_OK ||
        (st = fg_stream_synchronize(ctx, D->stream)) != FG_OK) {
      char name[FG_VARIANT_NAME_MAX];
      fg_variant_name(&T->fwd_v, name, sizeof name);
      return fg_fail(ctx, st, "tune: the forward %s that makes the backward's O and LSE failed: %s",
                     name, fg_context_last_error(ctx));
    }
    fg_attention_backward_args *b = &L->bargs[s];
    memset(b, 0, sizeof *b);
    b->size = sizeof *b;
    b->dtype = pb->dtype;
    b->causal = pb->causal;
    b->batch = pb->batch;
    b->heads_q = b->heads_kv = pb->heads;
    b->seqlen_q = b->seqlen_k = pb->n;
    b->head_dim = pb->d;
    b->q = a.q, b->k = a.k, b->v = a.v, b->o = a.o;
    b->lse = a.lse;
    b->d_o = (const void *)(uintptr_t)t[4];
    b->dq = (void *)(uintptr_t)t[5];
    b->dk = (void *)(uintptr_t)t[6];
    b->dv = (void *)(uintptr_t)t[7];
    b->workspace = (void *)(uintptr_t)ws;
    b->workspace_size = align256(rows * (size_t)(pb->d + 1) * 4);
    fg_attention_backward_args bn;
    if ((st = fg_validate_backward_args(b, FG_VALIDATE_CALL, &bn, err, sizeof err)) != FG_OK)
      return fg_fail(ctx, st, "tune: backward problem %lldx%lldx%lldx%d: %s",
                     (long long)pb->batch, (long long)pb->heads, (long long)pb->n, pb->d, err);
  }
  if (pb->pass == FG_PASS_BWD) D->pool_dtype = (fg_dtype)0;
  return FG_OK;
}

/* Times every candidate of problem pi that passed the check. */
static fg_status time_problem(trun *R, int pi) {
  fg_context *ctx = R->ctx;
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  const fg_tune_problem *pb = &R->problems[pi];
  tdev *D = &R->D;
  fg_status st;
  int any = 0;
  for (int c = 0; c < T->n; c++) any |= P->measure[c] && !P->have_res[c];
  if (!any) return FG_OK; /* every candidate was rejected before */
  const size_t set_bytes = set_bytes_of(pb);
  int sets = fg_tune_rotation_sets(set_bytes, (size_t)fg_context_limits(ctx)->l2_bytes);
  while (ensure_pool(D, (size_t)sets * set_bytes) != 0) {
    if (sets == 1) {
      char msg[256];
      snprintf(msg, sizeof msg, "no device memory for the timing inputs (%.1f MiB)",
               set_bytes / 1048576.0);
      snprintf(R->rep->rows[pi].note, sizeof R->rep->rows[pi].note, "%s", msg);
      for (int c = 0; c < T->n; c++)
        if (P->measure[c] && !P->have_res[c]) set_result(P, T, c, 0, 0, 0, "not timed: %s", msg);
      return context_alive(ctx) ? FG_OK : fg_fail(ctx, FG_ERROR_CUDA, "%s", msg);
    }
    sets /= 2;
  }
  if ((st = fill_pool(D, pb->dtype)) != FG_OK) return st;
  tlaunch L;
  if ((st = make_sets(R, pi, sets, &L)) != FG_OK) {
    if (!context_alive(ctx)) return st;
    snprintf(R->rep->rows[pi].note, sizeof R->rep->rows[pi].note, "%.250s",
             fg_context_last_error(ctx));
    for (int c = 0; c < T->n; c++)
      if (P->measure[c] && !P->have_res[c])
        set_result(P, T, c, 0, 0, 0, "not timed: %s", fg_context_last_error(ctx));
    return FG_OK;
  }

  /* The previous bucket's winner first, then the seed: a good early best stops slow ones. */
  int order[MAX_CANDS], no = 0;
  if (T->last_winner >= 0) order[no++] = T->last_winner;
  if (T->seed >= 0 && T->seed != T->last_winner) order[no++] = T->seed;
  for (int c = 0; c < T->n; c++)
    if (c != T->last_winner && c != T->seed) order[no++] = c;

  double best = 0;
  int rot = 0;
  int inner_of[MAX_CANDS];
  for (int c = 0; c < MAX_CANDS; c++) inner_of[c] = 1;
  for (int oi = 0; oi < no; oi++) {
    const int c = order[oi];
    if (!P->measure[c] || P->have_res[c]) continue;
    const fg_variant *v = &T->cands[c];
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(v, name, sizeof name);
    /* Lost by more than SLOWER_FACTOR at the previous (smaller) bucket of the same (d, dtype,
     * causal): it will not win here, and at large N one run can cost a second (kv_outer runs one
     * block per head). Not timed, not recorded for this bucket; --retune does not change this. */
    if (c != T->seed && T->last_ratio[c] > SLOWER_FACTOR) {
      P->measure[c] = 0;
      continue;
    }
    tcand k = {NULL, v};
    double w[WARMUP_RUNS], t[TIMED_RUNS];
    st = fg_registry_get(ctx, v, &k.k);
    /* One run first: a candidate already far behind (kv_outer at large N runs one block per
     * head and can take 100x the best) stops before the rest of its warm-up. */
    if (st == FG_OK) st = run_batch(D, &L, &k, &rot, 1, 1, w);
    if (st == FG_OK && best > 0 && w[0] > SLOWER_FACTOR * best) {
      set_result(P, T, c, 1, w[0], fg_tune_tflops(pb, w[0]),
                 "slower: timing stopped after one run at %.1fx the best so far", w[0] / best);
      continue;
    }
    if (st == FG_OK) st = run_batch(D, &L, &k, &rot, WARMUP_RUNS - 1, 1, w + 1);
    if (st == FG_OK) {
      double wmin = w[0];
      for (int i = 1; i < WARMUP_RUNS; i++) wmin = fmin(wmin, w[i]);
      if (best > 0 && wmin > SLOWER_FACTOR * best) {
        set_result(P, T, c, 1, wmin, fg_tune_tflops(pb, wmin),
                   "slower: timing stopped after warm-up at %.1fx the best so far",
                   wmin / best);
        continue;
      }
      int inner = 1;
      if (wmin > 0 && wmin < RUN_MIN_MS) {
        inner = (int)ceil(RUN_MIN_MS / wmin);
        if (inner > INNER_MAX) inner = INNER_MAX;
      }
      inner_of[c] = inner;
      st = run_batch(D, &L, &k, &rot, FIRST_RUNS, inner, t);
      if (st == FG_OK) {
        const double m = fg_tune_median(t, FIRST_RUNS);
        if (best > 0 && m > SLOWER_FACTOR * best) {
          set_result(P, T, c, 1, m, fg_tune_tflops(pb, m),
                     "slower: timing stopped after %d runs at %.1fx the best so far", FIRST_RUNS,
                     m / best);
          continue;
        }
        st = run_batch(D, &L, &k, &rot, TIMED_RUNS - FIRST_RUNS, inner, t + FIRST_RUNS);
      }
      if (st == FG_OK) {
        const double m = fg_tune_median(t, TIMED_RUNS);
        set_result(P, T, c, 1, m, fg_tune_tflops(pb, m), NULL);
        if (best == 0 || m < best) best = m;
        continue;
      }
    }
    if ((st = candidate_failed(R, P, T, c, name, "timing", "failed while timing at full size")) !=
        FG_OK)
      return st;
  }
  return runoff(R, pi, &L, &rot, inner_of);
}

/* Stores problem pi's record and fills its report row from the record merged with this run. */
static void finish_problem(trun *R, int pi) {
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  fg_tune_row *row = &R->rep->rows[pi];
  fg_tune_candidate cands[MAX_CANDS];
  double ms[MAX_CANDS];
  int ok[MAX_CANDS], nc = 0;
  for (int c = 0; c < T->n; c++)
    if (P->have_res[c]) cands[nc++] = P->res[c];
  eligible_times(P, T, ms, ok);
  /* Hysteresis: the previous (smaller) bucket's winner stays the winner unless beaten by more than
   * RUNOFF_WITHIN, the tuner's own run-to-run spread. Near-equals otherwise flipped with the
   * noise: at d=64, N=8k, Bc 32 beat the Bc 64 winner of 4k and 16k by 2-3% here and then ran
   * 5% slower than it in bench/bench.py. */
  int win = fg_tune_pick_winner(ms, ok, T->n, T->last_winner, RUNOFF_WITHIN);
  row->measured = nc;
  const char *keep = NULL; /* the recorded winner, when this run did not measure it */
  if (win < 0 && P->rec_winner[0]) {
    keep = P->rec_winner;
    for (int c = 0; c < T->n; c++)
      if (P->have_res[c] && strcmp(P->res[c].variant, P->rec_winner) == 0) keep = NULL;
    if (keep) {
      snprintf(row->winner, sizeof row->winner, "%s", keep);
      for (int k = 0; k < P->nrec; k++)
        if (strcmp(P->rec[k].variant, keep) == 0) {
          row->winner_ms = P->rec[k].ms;
          row->winner_tflops = P->rec[k].tflops;
        }
    }
  }
  if (win >= 0) {
    fg_variant_name(&T->cands[win], row->winner, sizeof row->winner);
    row->winner_ms = P->res[win].ms;
    row->winner_tflops = P->res[win].tflops;
    T->last_winner = win;
    for (int c = 0; c < T->n; c++)
      if (P->have_res[c] && P->res[c].ok && P->res[c].ms > 0 && P->res[win].ms > 0)
        T->last_ratio[c] = P->res[c].ms / P->res[win].ms;
  }
  if (nc > 0 && R->cache) {
    char warn[1024] = "";
    if (fg_cache_put_tuning(R->cache, &R->devid, row->key, cands, nc,
                            win >= 0 || keep ? row->winner : NULL, warn, sizeof warn) == 0)
      row->stored = 1;
    else
      note(R, "could not store the record of %s: %s", row->key, warn[0] ? warn : "cache not writable");
  }
  /* The merged view: this run's results over the record's. */
  int tried = 0, rejected = 0;
  for (int c = 0; c < T->n; c++) {
    const fg_tune_candidate *r = P->have_res[c] ? &P->res[c] : NULL;
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(&T->cands[c], name, sizeof name);
    for (int k = 0; !r && k < P->nrec; k++)
      if (strcmp(P->rec[k].variant, name) == 0) r = &P->rec[k];
    if (!r) continue;
    tried++;
    if (!r->ok) rejected++;
    if (c == T->seed) row->seed_tflops = r->ok ? r->tflops : 0;
  }
  row->tried = tried;
  row->rejected = rejected;
  if (!row->winner[0] && !row->note[0])
    snprintf(row->note, sizeof row->note, "every candidate was rejected");
}

/* Fills the row of a problem that needs no measuring from its record. */
static void row_from_record(trun *R, int pi) {
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  fg_tune_row *row = &R->rep->rows[pi];
  int rejected = 0;
  for (int k = 0; k < P->nrec; k++) {
    if (!P->rec[k].ok) rejected++;
    if (strcmp(P->rec[k].variant, P->rec_winner) == 0) {
      row->winner_ms = P->rec[k].ms;
      row->winner_tflops = P->rec[k].tflops;
    }
    if (strcmp(P->rec[k].variant, row->seed_variant) == 0)
      row->seed_tflops = P->rec[k].ok ? P->rec[k].tflops : 0;
  }
  snprintf(row->winner, sizeof row->winner, "%s", P->rec_winner);
  row->tried = P->nrec;
  row->rejected = rejected;
  row->stored = 1;
  for (int c = 0; c < T->n; c++) {
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(&T->cands[c], name, sizeof name);
    if (strcmp(name, P->rec_winner) == 0) T->last_winner = c;
  }
  if (!row->winner[0]) snprintf(row->note, sizeof row->note, "recorded without a winner (--retune)");
}

fg_status fg_tune_run(fg_context *ctx, const fg_tune_problem *problems, int n,
                      const fg_tune_options *opt_in, fg_tune_report *rep) {
  const double t_start = now_s();
  fg_tune_options opt0;
  memset(&opt0, 0, sizeof opt0);
  const fg_tune_options *opt = opt_in ? opt_in : &opt0;
  memset(rep, 0, sizeof *rep);
  if (!ctx || n < 0 || (n > 0 && !problems)) return FG_ERROR_INVALID_ARGUMENT;
  rep->rows = calloc((size_t)(n ? n : 1), sizeof *rep->rows);
  if (!rep->rows) return fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "tune: out of memory");
  rep->n_rows = n;
  const fg_rt_limits *L = fg_context_limits(ctx);
  const fg_arch arch = fg_context_arch(ctx);
  snprintf(rep->device, sizeof rep->device, "%.200s, %d SMs, cc %d.%d", L->name, L->sm_count,
           L->cc_major, L->cc_minor);
  snprintf(rep->arch, sizeof rep->arch, "%s", fg_arch_name(arch));
  rep->seed = opt->seed ? opt->seed : ((uint64_t)time(NULL) * 1000003u) ^ (uint64_t)getpid();
  for (int i = 0; i < n; i++) {
    rep->rows[i].problem = problems[i];
    const fg_problem key = fg_problem_make(problems[i].pass, problems[i].d, problems[i].dtype,
                                           problems[i].causal, problems[i].n);
    fg_problem_format(&key, rep->rows[i].key, sizeof rep->rows[i].key);
    snprintf(rep->rows[i].note, sizeof rep->rows[i].note, "not reached");
  }

  char err[2048];
  if (!fg_policy_allows_jit(ctx))
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                   "tuning compiles every candidate, but the context's policy '%s' forbids "
                   "compiling; use the JIT policy",
                   fg_policy_name(fg_context_policy(ctx)));
  if (fg_nvrtc_load(err, sizeof err) != 0)
    return fg_fail(ctx, FG_ERROR_NO_COMPILER,
                   "tuning compiles every candidate with NVRTC, which could not be loaded: %s",
                   err);
  fg_generator *g;
  fg_status st = fg_context_generator(ctx, &g);
  if (st != FG_OK) return st;

  trun R;
  memset(&R, 0, sizeof R);
  R.ctx = ctx;
  R.opt = opt;
  R.problems = problems;
  R.n = n;
  R.rep = rep;
  R.D.ctx = ctx;
  R.broken_tri = R.broken_cand = -1;
  R.D.rng.s = rep->seed ^ 0x5DEECE66Dull;
  fg_device_limits lim;
  fg_context_device_limits(ctx, &lim);
  fg_context_device_id(ctx, &R.devid);
  R.cache = fg_context_cache(ctx); /* warns once itself when it cannot be used */
  if (R.cache) snprintf(rep->cache_path, sizeof rep->cache_path, "%s", fg_cache_path(R.cache));
  fg_cache_key base;
  if (fg_context_cache_key(ctx, &base, err, sizeof err) != 0)
    return fg_fail(ctx, FG_ERROR_INTERNAL, "tune: %s", err);

  R.tri = calloc((size_t)(n ? n : 1), sizeof *R.tri);
  R.pr = calloc((size_t)(n ? n : 1), sizeof *R.pr);
  int *order = calloc((size_t)(n ? n : 1), sizeof *order);
  if (!R.tri || !R.pr || !order) {
    free(R.tri);
    free(R.pr);
    free(order);
    return fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "tune: out of memory");
  }

  /* Processing order: grouped by (pass, dtype, d, causal), N ascending. */
  for (int i = 0; i < n; i++) { /* a stable insertion sort: n is small */
    int j = i;
    while (j > 0 && sort_problem_cmp(&problems[order[j - 1]], &problems[i]) > 0) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = i;
  }

  /* Triples and their candidates; duplicates of a bucket; what each problem must measure. */
  int total_measure = 0;
  for (int oi = 0; oi < n; oi++) {
    const int pi = order[oi];
    const fg_tune_problem *pb = &problems[pi];
    tprob *P = &R.pr[pi];
    fg_tune_row *row = &rep->rows[pi];
    P->dup_of = -1;
    for (int oj = 0; oj < oi && P->dup_of < 0; oj++)
      if (strcmp(rep->rows[order[oj]].key, row->key) == 0) P->dup_of = order[oj];
    int t = 0;
    while (t < R.ntri && !(R.tri[t].pass == pb->pass && R.tri[t].d == pb->d &&
                           R.tri[t].dtype == pb->dtype && R.tri[t].causal == pb->causal))
      t++;
    if (t == R.ntri) {
      ttriple *T = &R.tri[R.ntri++];
      T->pass = pb->pass;
      T->d = pb->d;
      T->dtype = pb->dtype;
      T->causal = pb->causal;
      T->n = fg_candidates_pass(g, pb->pass, pb->d, pb->dtype, pb->causal, arch, &lim, T->cands,
                                MAX_CANDS, &T->pruned);
      T->seed_v = fg_baseline_variant(g, pb->pass, pb->d, pb->dtype, pb->causal, arch, &lim);
      T->fwd_v = fg_builtin_variant(pb->d, pb->dtype, pb->causal, arch);
      T->seed = -1;
      T->last_winner = -1;
      for (int c = 0; c < T->n; c++) {
        T->job[c] = -1;
        if (T->seed < 0 && memcmp(&T->cands[c], &T->seed_v, sizeof T->seed_v) == 0) T->seed = c;
      }
    }
    P->tri = t;
    ttriple *T = &R.tri[t];
    row->pruned = T->pruned.smem + T->pruned.regs + T->pruned.threads + T->pruned.rules;
    fg_variant_name(&T->seed_v, row->seed_variant, sizeof row->seed_variant);
    if (P->dup_of >= 0) {
      snprintf(row->note, sizeof row->note, "same bucket as an earlier problem");
      continue;
    }
    if (T->n == 0) {
      snprintf(row->note, sizeof row->note,
               "no candidate fits %.120s (%d pruned: %d shared memory, %d registers, %d threads, "
               "%d rules)",
               L->name, row->pruned, T->pruned.smem, T->pruned.regs, T->pruned.threads,
               T->pruned.rules);
      continue;
    }
    if (R.cache && !opt->retune &&
        fg_cache_get_tuning(R.cache, &R.devid, row->key, &P->rec, &P->nrec, P->rec_winner,
                            sizeof P->rec_winner) != 1) {
      free(P->rec);
      P->rec = NULL;
      P->nrec = 0;
      P->rec_winner[0] = '\0';
    }
    /* Measure what the record lacks (everything without a record or with --retune), and then
     * the recorded winner again, so that the comparison is of one run. */
    int any_new = 0, winner_cand = -1;
    for (int c = 0; c < T->n; c++) {
      char name[FG_VARIANT_NAME_MAX];
      fg_variant_name(&T->cands[c], name, sizeof name);
      int recorded = 0;
      for (int k = 0; k < P->nrec && !recorded; k++) recorded = strcmp(P->rec[k].variant, name) == 0;
      P->measure[c] = (unsigned char)!recorded;
      any_new |= !recorded;
      if (strcmp(name, P->rec_winner) == 0) winner_cand = c;
    }
    if (any_new && winner_cand >= 0) P->measure[winner_cand] = 1;
    for (int c = 0; c < T->n; c++) P->n_measure += P->measure[c];
    total_measure += P->n_measure;
  }

  /* Every kernel to compile: the candidates measured, and the reference kernels. */
  int max_jobs = 4;
  for (int t = 0; t < R.ntri; t++) max_jobs += R.tri[t].n + 1; /* + the backward's forward */
  R.jobs = calloc((size_t)max_jobs, sizeof *R.jobs);
  if (!R.jobs) {
    st = fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "tune: out of memory");
    goto done;
  }
  int need_ref[3] = {0, 0, 0};
  for (int pi = 0; pi < n; pi++) {
    tprob *P = &R.pr[pi];
    if (P->dup_of >= 0 || P->n_measure == 0) continue;
    ttriple *T = &R.tri[P->tri];
    if (T->pass == FG_PASS_FWD) { /* the forward's check runs the reference kernels */
      need_ref[T->dtype] = 1;
    } else { /* the backward's check and timing take O and LSE from the built-in forward */
      tjob j;
      memset(&j, 0, sizeof j);
      j.v = T->fwd_v;
      fg_variant_name(&j.v, j.name, sizeof j.name);
      add_job(&R, &j);
    }
    for (int c = 0; c < T->n; c++) {
      if (!P->measure[c] || T->job[c] >= 0) continue;
      tjob j;
      memset(&j, 0, sizeof j);
      j.v = T->cands[c];
      fg_variant_name(&j.v, j.name, sizeof j.name);
      T->job[c] = add_job(&R, &j);
    }
  }
  if (R.cache) /* without a cache the registry compiles the reference kernels itself */
    for (int dt = FG_DTYPE_F16; dt <= FG_DTYPE_BF16; dt++)
      for (int exact = 0; exact <= 1 && need_ref[dt]; exact++) {
        tjob j;
        memset(&j, 0, sizeof j);
        j.is_ref = 1;
        j.ref_dtype = (fg_dtype)dt;
        j.ref_exact = exact;
        snprintf(j.name, sizeof j.name, "ref_%s_%s", exact ? "f64" : "lowp",
                 fg_dtype_name((fg_dtype)dt));
        add_job(&R, &j);
      }

  for (int t = 0; t < R.ntri; t++) {
    const ttriple *T = &R.tri[t];
    note(&R, "%s d=%d %s %s on %s: %d candidates fit; pruned %d by shared memory, %d by "
             "registers, %d by threads, %d by rules",
         fg_pass_name(T->pass), T->d, fg_dtype_name(T->dtype), T->causal ? "causal" : "noncausal",
         L->name, T->n,
         T->pruned.smem, T->pruned.regs, T->pruned.threads, T->pruned.rules);
  }
  if (!R.cache)
    note(&R, "warning: no kernel cache: the tuning results will not be remembered");

  /* Compile everything before timing anything. */
  const double t_compile = now_s();
  tpool pool;
  memset(&pool, 0, sizeof pool);
  pool.g = g;
  pool.cache = R.cache;
  pool.base = base;
  pool.arch = arch;
  pool.jobs = R.jobs;
  pool.n = R.njobs;
  pool.quiet = opt->quiet;
  pool.tty = isatty(2);
  pool.t0 = t_compile;
  rep->jobs = opt->jobs > 0 ? opt->jobs : fg_online_cpus();
  if (rep->jobs > FG_POOL_MAX_THREADS) rep->jobs = FG_POOL_MAX_THREADS;
  if (rep->jobs > R.njobs) rep->jobs = R.njobs;
  if (R.njobs > 0) {
    note(&R, "compiling %d kernels on %d threads", R.njobs, rep->jobs);
    fg_pool_run(R.njobs, rep->jobs, compile_job, compile_job_done, &pool);
  }
  rep->kernels = R.njobs;
  rep->kernels_cached = pool.cached;
  rep->kernels_failed = pool.failed;
  rep->compile_s = now_s() - t_compile;
  for (int j = 0; j < R.njobs; j++)
    if (R.jobs[j].state < 0) note(&R, "%s: %s", R.jobs[j].name, R.jobs[j].reason);

  /* Images the cache could not store: an exported table, so the registry does not compile them
   * again one by one. It stays registered for the life of the process. */
  {
    int kept = 0;
    for (int j = 0; j < R.njobs; j++) kept += R.jobs[j].kept && !R.jobs[j].is_ref;
    if (kept) {
      fg_kernel_image *imgs = calloc((size_t)kept, sizeof *imgs);
      fg_exported_table *tab = calloc(1, sizeof *tab);
      if (imgs && tab) {
        int k = 0;
        for (int j = 0; j < R.njobs; j++)
          if (R.jobs[j].kept && !R.jobs[j].is_ref) {
            imgs[k++] = R.jobs[j].img;
            R.jobs[j].kept = 0;
          }
        tab->description = "flashgen tune: kernels compiled in this run (kept in memory)";
        tab->kernels = imgs;
        tab->n_kernels = (size_t)kept;
        if (fg_register_exported(tab, err, sizeof err) != FG_OK)
          note(&R, "warning: keeping the compiled kernels in memory failed (%s); they are "
                   "compiled again when checked", err);
        else
          note(&R, "%d kernels could not be stored in the kernel cache and are kept in memory",
               kept);
      } else {
        free(imgs);
        free(tab);
      }
    }
  }

  /* Compile failures are rejections. */
  for (int pi = 0; pi < n; pi++) {
    tprob *P = &R.pr[pi];
    if (P->dup_of >= 0) continue;
    ttriple *T = &R.tri[P->tri];
    for (int c = 0; c < T->n; c++)
      if (P->measure[c] && T->job[c] >= 0 && R.jobs[T->job[c]].state < 0)
        set_result(P, T, c, 0, 0, 0, "%s", R.jobs[T->job[c]].reason);
  }

  /* Check, then time, one problem at a time. */
  if (total_measure > 0) {
    if ((st = fg_stream_create(ctx, &R.D.stream)) != FG_OK) goto done;
    for (int i = 0; i < 2 * TIMED_RUNS; i++)
      if ((st = fg_event_create(ctx, &R.D.ev[i])) != FG_OK) goto done;
  }
  int done_count = 0, todo = 0;
  for (int pi = 0; pi < n; pi++) todo += R.pr[pi].dup_of < 0 && R.pr[pi].n_measure > 0;
  for (int oi = 0; oi < n; oi++) {
    const int pi = order[oi];
    tprob *P = &R.pr[pi];
    fg_tune_row *row = &rep->rows[pi];
    if (P->dup_of >= 0 || R.tri[P->tri].n == 0) continue;
    row->note[0] = '\0';
    if (P->n_measure == 0) {
      row_from_record(&R, pi);
      continue;
    }
    const double t0 = now_s();
    uint64_t seed = rep->seed + 0x9E3779B97F4A7C15ull * (uint64_t)(pi + 1);
    fg_rng sr = {seed};
    seed = fg_rng_next(&sr);
    st = check_problem(&R, pi, seed);
    const double t1 = now_s();
    rep->check_s += t1 - t0;
    if (st == FG_OK) st = time_problem(&R, pi);
    rep->timing_s += now_s() - t1;
    finish_problem(&R, pi);
    done_count++;
    if (st != FG_OK) goto done;
    char pname[96];
    row_problem(row, pname, sizeof pname);
    if (row->winner[0])
      note(&R, "[%d/%d] %s: %s %.1f TFLOP/s (seed rule %.1f), %d measured, %d rejected, %.1f s",
           done_count, todo, pname, row->winner, row->winner_tflops, row->seed_tflops,
           row->measured, row->rejected, now_s() - t0);
    else
      note(&R, "[%d/%d] %s: no correct candidate (%s)", done_count, todo, pname, row->note);
  }
  st = FG_OK;

done:
  /* A broken context: the candidate that broke it is recorded as rejected for every problem of
   * its triple not measured yet, so that the next run (which skips what is recorded) goes on. */
  if (st != FG_OK && R.fatal && R.cache && R.broken_tri >= 0) {
    ttriple *T = &R.tri[R.broken_tri];
    fg_tune_candidate bc;
    memset(&bc, 0, sizeof bc);
    fg_variant_name(&T->cands[R.broken_cand], bc.variant, sizeof bc.variant);
    snprintf(bc.reason, sizeof bc.reason, "broke the CUDA context: %.200s",
             fg_context_last_error(ctx));
    for (int pi = 0; pi < n; pi++) {
      tprob *P = &R.pr[pi];
      if (P->dup_of >= 0 || P->tri != R.broken_tri || rep->rows[pi].measured || !P->n_measure)
        continue;
      char warn[1024] = "";
      const char *w = P->rec_winner[0] && strcmp(P->rec_winner, bc.variant) ? P->rec_winner : NULL;
      if (fg_cache_put_tuning(R.cache, &R.devid, rep->rows[pi].key, &bc, 1, w, warn,
                              sizeof warn) != 0)
        note(&R, "could not store the record of %s: %s", rep->rows[pi].key, warn);
    }
  }
  for (int pi = 0; pi < n; pi++) {
    tprob *P = &R.pr[pi];
    if (P->dup_of >= 0) {
      fg_tune_row keep = rep->rows[pi];
      rep->rows[pi] = rep->rows[P->dup_of];
      rep->rows[pi].problem = keep.problem;
    }
  }
  if (R.cache) fg_dispatch_forget(ctx);
  if (R.D.stream || R.D.pool || R.D.check_elems) free_dev(&R.D);
  for (int j = 0; j < R.njobs; j++)
    if (R.jobs[j].kept) fg_kernel_image_free(&R.jobs[j].img);
  for (int pi = 0; pi < n; pi++) free(R.pr[pi].rec);
  free(R.jobs);
  free(R.tri);
  free(R.pr);
  free(order);
  rep->total_s = now_s() - t_start;
  return st;
}
