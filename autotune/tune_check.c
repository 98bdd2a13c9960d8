/* tune_check.c: the correctness stage of a tuning run: each candidate to measure run on fresh
 * random inputs (fg_fill_random; correct before fast) and judged by the gate that `flashgen
 * check` applies too: the forward's O and LSE against the fp64 reference kernel
 * (fg_gate_forward), the backward's dQ, dK, dV against the host's fp64 reference
 * (fg_gate_backward); the buffers of the check. A wrong candidate gets its result here. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tune_internal.h"

#define CHECK_N_MAX 2048  /* the correctness check runs batch 1, 2 heads, min(N, 2048) */
#define CHECK_HEADS 2
/* The backward's check: one batch, 2 query heads on 1 KV head (GQA: dK, dV summed over both), N
 * = 257 queries and keys (a partial tile for every Br and Bc), whatever the problem's N. */
#define BWD_CHECK_N 257
#define BWD_CHECK_HQ 2
#define BWD_CHECK_HKV 1

/* Releases the buffers of the correctness check (device and host); they can be made again. */
void fg_tune_check_free(tdev *D) {
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
  fg_tune_check_free(D);
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

/* Whether candidate c of problem P was decided by an earlier bucket's check of its triple (a
 * failure is recorded for P again, with the same reason). */
static int checked_before(tprob *P, const ttriple *T, int c) {
  if (T->checked[c] == 2) fg_tune_set_result(P, T, c, 0, 0, 0, "%s", T->check_reason[c]);
  return T->checked[c] != 0;
}

/* The candidates of problem P still to check: measured here, without a result, and checked by
 * no earlier bucket of the triple (whose verdicts checked_before carries over). */
static int todo_count(tprob *P, const ttriple *T) {
  int todo = 0;
  for (int c = 0; c < T->n; c++) todo += P->measure[c] && !P->have_res[c] && !checked_before(P, T, c);
  return todo;
}

/* Keeps the verdict of candidate c's check for the triple's later buckets. */
static void keep_verdict(const tprob *P, ttriple *T, int c) {
  T->checked[c] = P->have_res[c] ? 2 : 1;
  if (P->have_res[c]) snprintf(T->check_reason[c], sizeof T->check_reason[c], "%s", P->res[c].reason);
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

/* A candidate's launch returned st: when it launched, waits for its kernels. *stage names where
 * it failed ("launch failed", "kernel failed"), for the candidate's record. */
static fg_status launched(fg_context *ctx, tdev *D, fg_status st, const char **stage) {
  *stage = "launch failed";
  if (st != FG_OK) return st;
  *stage = "kernel failed";
  return fg_stream_synchronize(ctx, D->stream);
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
  if (todo_count(P, T) == 0) return FG_OK;
  const fg_tune_problem *pb = &R->problems[pi];
  tdev *D = &R->D;
  const int64_t N = BWD_CHECK_N, d = pb->d;
  const size_t nq = (size_t)(BWD_CHECK_HQ * N * d), nk = (size_t)(BWD_CHECK_HKV * N * d);
  const size_t rows = (size_t)(BWD_CHECK_HQ * N);
  /* Device: Q, O, dO, dQ (nq each), K, V, dK, dV (nk each), LSE; each 256-byte aligned. */
  const size_t bq = fg_tune_align256(nq * 2), bk = fg_tune_align256(nk * 2),
               bl = fg_tune_align256(rows * 4);
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
    if (!fg_tune_context_alive(ctx)) {
      st = fg_fail(ctx, FG_ERROR_CUDA, "%s", why);
      goto out;
    }
    fg_tune_not_checked(R, pi, why);
    st = FG_OK;
    goto out;
  }
  const fg_bwd_host_problem hp = {pb->dtype, pb->causal, 1, BWD_CHECK_HQ, BWD_CHECK_HKV, N, N, d,
                                  1.0 / sqrt((double)d), hq, hk, hv, hdo};
  const int threads = R->opt->jobs > 0 ? R->opt->jobs : fg_online_cpus();
  if (fg_reference_backward(&hp, 1, ref, ref + nq, ref + nq + nk, NULL, threads) != 0 ||
      fg_reference_backward(&hp, 0, naive, naive + nq, naive + nq + nk, NULL, threads) != 0) {
    fg_tune_not_checked(R, pi, "the host's backward reference failed (out of memory?)");
    goto out;
  }
  const char *dist = normal ? "normal" : "uniform";
  for (int c = 0; c < T->n; c++) {
    if (!P->measure[c] || P->have_res[c] || T->checked[c]) continue; /* compile failures are set */
    const fg_variant *cv = &T->cands[c];
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(cv, name, sizeof name);
    if ((st = fg_dev_fill16(ctx, dq, 0xFFFF, nq)) != FG_OK || /* NaN */
        (st = fg_dev_fill16(ctx, dk, 0xFFFF, nk)) != FG_OK ||
        (st = fg_dev_fill16(ctx, dv, 0xFFFF, nk)) != FG_OK ||
        (st = fg_dev_synchronize(ctx)) != FG_OK)
      goto out;
    const char *stage;
    st = launched(ctx, D, fg_attention_backward_variant(ctx, &b, D->stream, cv), &stage);
    if (st != FG_OK) {
      if ((st = fg_tune_candidate_failed(R, P, T, c, name, "checking", stage)) != FG_OK) goto out;
      continue;
    }
    if ((st = fg_dev_download(ctx, gq, dq, nq * 2)) != FG_OK ||
        (st = fg_dev_download(ctx, gk, dk, nk * 2)) != FG_OK ||
        (st = fg_dev_download(ctx, gv, dv, nk * 2)) != FG_OK)
      goto out;
    fg_gate_result g;
    if (!fg_gate_backward(pb->dtype, gq, gk, gv, ref, naive, (int64_t)nq, (int64_t)nk, &g))
      fg_tune_set_result(P, T, c, 0, 0, 0,
                 "wrong: %s; %s inputs, seed %llu, B=1 Hq=%d Hkv=%d N=%lld", g.reason, dist,
                 (unsigned long long)seed, BWD_CHECK_HQ, BWD_CHECK_HKV, (long long)N);
    /* A correct candidate gets its result in the timing stage. */
  }
  for (int c = 0; c < T->n; c++)
    if (P->measure[c] && !T->checked[c]) keep_verdict(P, T, c);
out:
  fg_dev_free(ctx, mem);
  free(h), free(ref), free(naive);
  return st;
}

fg_status fg_tune_check_problem(trun *R, int pi, uint64_t seed) {
  if (R->problems[pi].pass == FG_PASS_BWD) return check_problem_bwd(R, pi, seed);
  fg_context *ctx = R->ctx;
  tprob *P = &R->pr[pi];
  ttriple *T = &R->tri[P->tri];
  if (todo_count(P, T) == 0) return FG_OK;
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
    if (!fg_tune_context_alive(ctx)) return fg_fail(ctx, FG_ERROR_CUDA, "%s", why);
    fg_tune_not_checked(R, pi, why);
    return FG_OK;
  }
  for (size_t i = 0; i < elems; i++) {
    if (!isfinite(D->href[i]) || !isfinite(D->hlowp[i])) {
      snprintf(R->rep->rows[pi].note, sizeof R->rep->rows[pi].note,
               "the reference kernel wrote a non-finite value at %zu", i);
      for (int c = 0; c < T->n; c++)
        if (P->measure[c] && !P->have_res[c])
          fg_tune_set_result(P, T, c, 0, 0, 0, "not checked: the reference is not finite");
      return FG_OK;
    }
  }
  const char *dist = normal ? "normal" : "uniform";
  const fg_gate_fwd gf = {pb->dtype, pb->causal, 1, CHECK_HEADS, n, n, pb->d, D->ho, {0, 0, 0},
                          D->hlse, D->href, D->hreflse, D->hlowp};

  for (int c = 0; c < T->n; c++) {
    if (!P->measure[c] || P->have_res[c] || T->checked[c]) continue; /* compile failures are set */
    const fg_variant *v = &T->cands[c];
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(v, name, sizeof name);
    if ((st = fg_dev_fill16(ctx, D->co, 0xFFFF, elems)) != FG_OK || /* NaN */
        (st = fg_dev_fill32(ctx, D->clse, 0xFFFFFFFFu, rows)) != FG_OK ||
        (st = fg_dev_synchronize(ctx)) != FG_OK)
      return st;
    const char *stage;
    st = launched(ctx, D, fg_attention_forward_variant(ctx, &a, D->stream, v), &stage);
    if (st != FG_OK) {
      if ((st = fg_tune_candidate_failed(R, P, T, c, name, "checking", stage)) != FG_OK) return st;
      continue;
    }
    if ((st = fg_dev_download(ctx, D->ho, D->co, elems * 2)) != FG_OK ||
        (st = fg_dev_download(ctx, D->hlse, D->clse, rows * 4)) != FG_OK)
      return st;
    fg_gate_result g;
    if (!fg_gate_forward(&gf, &g)) {
      const size_t w = (size_t)g.worst[0], row = w / (size_t)pb->d;
      fg_tune_set_result(P, T, c, 0, 0, 0,
                 "wrong: %s (largest O error at head %zu, row %zu, col %zu); %s inputs, seed "
                 "%llu, B=1 H=%d N=%lld",
                 g.reason, row / (size_t)n, row % (size_t)n, w % (size_t)pb->d, dist,
                 (unsigned long long)seed, CHECK_HEADS, (long long)n);
    }
    /* A correct candidate gets its result in the timing stage. */
  }
  for (int c = 0; c < T->n; c++)
    if (P->measure[c] && !T->checked[c]) keep_verdict(P, T, c);
  return FG_OK;
}
