/* tune_time.c: the timing stage of a tuning run, the same for every pass: the input sets of a
 * problem at full size rotated past the L2 in a pool of device memory (normal random values;
 * the backward's O and LSE from its forward), CUDA-event timing with warm-up, an early stop for
 * candidates far behind, the median of the timed runs, and the runoff of the closest ones. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tune_internal.h"

#define WARMUP_RUNS 3
#define FIRST_RUNS 3      /* timed runs before the early stop is considered */
#define SLOWER_FACTOR 3.0 /* stop timing a candidate this much slower than the best so far */
/* Not timed at all when it was this much slower than the winner at the previous (smaller) bucket
 * of the same triple. A candidate's speed relative to the others changes little from one length
 * bucket to the next (twice as long; on an H100 the default set's winner changed between
 * buckets at 5 of its 40 steps, bench/latest/tune_report.md), and timing clear losers again
 * at every bucket took the default set's tune past its 60 s budget (68 s). */
#define CARRY_SLOWER 1.6
#define RUN_MIN_MS 0.5    /* a timed run repeats a short kernel to last at least this long */
#define INNER_MAX 32
#define RUNOFF_MAX 4
#define RUNOFF_ROUNDS 4
#define RUNOFF_RUNS 5      /* per candidate and round (<= TIMED_RUNS: the events are reused) */
/* Random values uploaded repeatedly to fill the timing buffers: a prime count, so that Q, K and V
 * (whose sizes are multiples of large powers of two) do not hold the same values. */
#define TILE_ELEMS 1048573u

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
  fg_tune_eligible_times(P, T, ms, ok);
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
      if (st != FG_OK) return fg_tune_context_alive(R->ctx) ? FG_OK : st;
    }
  for (int i = 0; i < nf; i++) {
    const double m = fg_tune_median(t[i], RUNOFF_ROUNDS * RUNOFF_RUNS);
    fg_tune_set_result(P, T, fin[i], 1, m, fg_tune_tflops(pb, m), NULL);
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
 * dV and LSE. The backward's fp32 workspace comes from the context's pool (args->workspace NULL):
 * each candidate's plan sizes its own (templates/bwd.lua; kv_tma rounds each head's query rows up
 * to its Br), which one formula here could not follow. */
static size_t set_bytes_of(const fg_tune_problem *pb) {
  const size_t rows = (size_t)(pb->batch * pb->heads * pb->n);
  const size_t tensor = fg_tune_align256(rows * (size_t)pb->d * 2);
  if (pb->pass != FG_PASS_BWD) return 4 * tensor;
  return 8 * tensor + fg_tune_align256(rows * 4);
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
  const size_t tensor = fg_tune_align256(rows * (size_t)pb->d * 2), set_bytes = set_bytes_of(pb);
  char err[512];
  fg_status st;
  L->pass = pb->pass;
  L->sets = sets;
  for (int s = 0; s < sets; s++) {
    const CUdeviceptr base = D->pool + (CUdeviceptr)s * set_bytes;
    CUdeviceptr t[8];
    for (int i = 0; i < 8; i++) t[i] = base + (CUdeviceptr)i * tensor;
    const CUdeviceptr lse = base + 8 * tensor;
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
    b->workspace = NULL; /* the plan's own size, from the context's pool (set_bytes_of) */
    fg_attention_backward_args bn;
    if ((st = fg_validate_backward_args(b, FG_VALIDATE_CALL, &bn, err, sizeof err)) != FG_OK)
      return fg_fail(ctx, st, "tune: backward problem %lldx%lldx%lldx%d: %s",
                     (long long)pb->batch, (long long)pb->heads, (long long)pb->n, pb->d, err);
  }
  if (pb->pass == FG_PASS_BWD) D->pool_dtype = (fg_dtype)0;
  return FG_OK;
}

/* Times every candidate of problem pi that passed the check. */
fg_status fg_tune_time_problem(trun *R, int pi) {
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
        if (P->measure[c] && !P->have_res[c])
          fg_tune_set_result(P, T, c, 0, 0, 0, "not timed: %s", msg);
      return fg_tune_context_alive(ctx) ? FG_OK : fg_fail(ctx, FG_ERROR_CUDA, "%s", msg);
    }
    sets /= 2;
  }
  if ((st = fill_pool(D, pb->dtype)) != FG_OK) return st;
  tlaunch L;
  if ((st = make_sets(R, pi, sets, &L)) != FG_OK) {
    if (!fg_tune_context_alive(ctx)) return st;
    snprintf(R->rep->rows[pi].note, sizeof R->rep->rows[pi].note, "%.250s",
             fg_context_last_error(ctx));
    for (int c = 0; c < T->n; c++)
      if (P->measure[c] && !P->have_res[c])
        fg_tune_set_result(P, T, c, 0, 0, 0, "not timed: %s", fg_context_last_error(ctx));
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
    /* Lost by more than CARRY_SLOWER at the previous (smaller) bucket of the same (d, dtype,
     * causal): it will not win here, and at large N one run can cost a second (kv_outer runs one
     * block per head). Not timed, not recorded for this bucket; --retune does not change this. */
    if (c != T->seed && T->last_ratio[c] > CARRY_SLOWER) {
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
      fg_tune_set_result(P, T, c, 1, w[0], fg_tune_tflops(pb, w[0]),
                 "slower: timing stopped after one run at %.1fx the best so far", w[0] / best);
      continue;
    }
    if (st == FG_OK) st = run_batch(D, &L, &k, &rot, WARMUP_RUNS - 1, 1, w + 1);
    if (st == FG_OK) {
      double wmin = w[0];
      for (int i = 1; i < WARMUP_RUNS; i++) wmin = fmin(wmin, w[i]);
      if (best > 0 && wmin > SLOWER_FACTOR * best) {
        fg_tune_set_result(P, T, c, 1, wmin, fg_tune_tflops(pb, wmin),
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
          fg_tune_set_result(P, T, c, 1, m, fg_tune_tflops(pb, m),
                     "slower: timing stopped after %d runs at %.1fx the best so far", FIRST_RUNS,
                     m / best);
          continue;
        }
        st = run_batch(D, &L, &k, &rot, TIMED_RUNS - FIRST_RUNS, inner, t + FIRST_RUNS);
      }
      if (st == FG_OK) {
        const double m = fg_tune_median(t, TIMED_RUNS);
        fg_tune_set_result(P, T, c, 1, m, fg_tune_tflops(pb, m), NULL);
        if (best == 0 || m < best) best = m;
        continue;
      }
    }
    if ((st = fg_tune_candidate_failed(R, P, T, c, name, "timing",
                                       "failed while timing at full size")) != FG_OK)
      return st;
  }
  return runoff(R, pi, &L, &rot, inner_of);
}
