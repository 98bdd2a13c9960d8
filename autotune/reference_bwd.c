/* reference_bwd.c: the backward pass on the host, in fp64 (the yardstick) and as the naive
 * same-dtype computation (every matrix product and elementwise result rounded to f16/bf16, as
 * an eager framework computes it), whose error sets the tolerance of `flashgen check`. Work is
 * split over threads by (batch, KV head), and a KV head's query rows (all its query heads' rows,
 * in order) in chunks of CHUNK_ROWS, or the smallest power-of-two multiple of it whose partial
 * dK/dV sums fit in PARTIAL_BYTES (else one chunk): a long GQA group or one head is then no
 * longer one thread's work (`flashgen check`'s single-head cases took one thread 20-130 s). The
 * chunks' fp64 sums are added in chunk order, and the chunking depends on the problem only, so
 * the result does not depend on the thread count. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fg_autotune.h"

#define CHUNK_ROWS 256
#define PARTIAL_BYTES (64ull << 20)

typedef struct job {
  const fg_bwd_host_problem *p;
  const float *lut; /* fg_half_to_f32 of every 16-bit pattern in p->dtype */
  int exact;
  double *dq, *dk, *dv, *lse;
  int64_t total;          /* work items (fg_pool_run): (batch, KV head) pairs x chunks */
  int64_t chunks;         /* chunks per pair; 1: dK, dV summed in place */
  int64_t chunk_rows;     /* query rows per chunk */
  double *partial;        /* chunks > 1: per item, its dK then its dV sums (Nk x d each) */
  unsigned char *failed;  /* per item: its scratch could not be allocated */
} job;

static double rnd(double x, fg_dtype t, int exact) {
  return exact ? x : (double)fg_half_to_f32(fg_f32_to_half((float)x, t), t);
}

/* Rows [i0, i1) of one (batch, query head) against all keys of KV head hk, adding their dK and
 * dV contributions to dK, dV (Nk x d). The inputs' values come from the job's table, the row's Q
 * and dO converted once into qd, dod (d each): the same values as fg_half_to_f32's, without two
 * calls per product (those took 90% of the time: one pass over 1100 x 4200 x 136, 35 s -> 3 s). */
static void one_head(const job *j, int64_t b, int64_t h, int64_t hk, int64_t i0, int64_t i1,
                     double *dK, double *dV, double *s, double *pr, double *dp, double *qd, double *dod) {
  const fg_bwd_host_problem *p = j->p;
  const int64_t Nq = p->seqlen_q, Nk = p->seqlen_k, d = p->head_dim;
  const int ex = j->exact;
  const fg_dtype t = p->dtype;
  const float *lut = j->lut;
  const uint16_t *Q = p->q + ((b * p->heads_q + h) * Nq) * d;
  const uint16_t *dO = p->d_o + ((b * p->heads_q + h) * Nq) * d;
  const uint16_t *K = p->k + ((b * p->heads_kv + hk) * Nk) * d;
  const uint16_t *V = p->v + ((b * p->heads_kv + hk) * Nk) * d;
  double *dQ = j->dq + ((b * p->heads_q + h) * Nq) * d;
  for (int64_t i = i0; i < i1; i++) {
    int64_t n = Nk;
    if (p->causal) n = i + Nk - Nq + 1 < Nk ? i + Nk - Nq + 1 : Nk;
    if (n < 0) n = 0;
    double *dqi = dQ + i * d;
    memset(dqi, 0, (size_t)d * sizeof *dqi);
    if (j->lse) j->lse[(b * p->heads_q + h) * Nq + i] = -INFINITY;
    if (n == 0) continue;
    const uint16_t *qi = Q + i * d, *doi = dO + i * d;
    for (int64_t x = 0; x < d; x++) qd[x] = lut[qi[x]], dod[x] = lut[doi[x]];
    double mx = -INFINITY;
    for (int64_t c = 0; c < n; c++) {
      double acc = 0;
      const uint16_t *kc = K + c * d;
      for (int64_t x = 0; x < d; x++) acc += qd[x] * (double)lut[kc[x]];
      s[c] = rnd(acc * p->scale, t, ex);
      if (s[c] > mx) mx = s[c];
    }
    double sum = 0;
    for (int64_t c = 0; c < n; c++) sum += exp(s[c] - mx);
    if (j->lse) j->lse[(b * p->heads_q + h) * Nq + i] = mx + log(sum);
    for (int64_t c = 0; c < n; c++) pr[c] = rnd(exp(s[c] - mx) / sum, t, ex);
    /* dP = dO V^T, D = sum_c P dP (= rowsum(dO * O)). */
    double D = 0;
    for (int64_t c = 0; c < n; c++) {
      double acc = 0;
      const uint16_t *vc = V + c * d;
      for (int64_t x = 0; x < d; x++) acc += dod[x] * (double)lut[vc[x]];
      dp[c] = rnd(acc, t, ex);
      D += pr[c] * dp[c];
    }
    D = rnd(D, t, ex);
    for (int64_t c = 0; c < n; c++) {
      const double ds = rnd(pr[c] * (dp[c] - D), t, ex);
      const uint16_t *kc = K + c * d;
      double *dkc = dK + c * d, *dvc = dV + c * d;
      for (int64_t x = 0; x < d; x++) {
        dqi[x] += ds * (double)lut[kc[x]];
        dkc[x] += ds * qd[x];
        dvc[x] += pr[c] * dod[x];
      }
    }
    for (int64_t x = 0; x < d; x++) dqi[x] = rnd(dqi[x] * p->scale, t, ex);
  }
}

/* dK times the scale and dV, rounded as the computation's result. */
static void finish_kv(const job *j, double *dK, double *dV) {
  const fg_bwd_host_problem *p = j->p;
  for (int64_t x = 0; x < p->seqlen_k * p->head_dim; x++) {
    dK[x] = rnd(dK[x] * p->scale, p->dtype, j->exact);
    dV[x] = rnd(dV[x], p->dtype, j->exact);
  }
}

/* Work item w (fg_pool_run): chunk w % chunks of (batch, KV head) pair w / chunks. */
static void work_item(void *ud, int w) {
  job *j = ud;
  const fg_bwd_host_problem *p = j->p;
  const int64_t Nq = p->seqlen_q, Nk = p->seqlen_k, d = p->head_dim, g = p->heads_q / p->heads_kv;
  double *s = malloc((size_t)((Nk > 0 ? Nk : 1) * 3 + 2 * d) * sizeof *s);
  if (!s) {
    j->failed[w] = 1;
    return;
  }
  const int64_t pair = w / j->chunks, c = w % j->chunks;
  const int64_t b = pair / p->heads_kv, hk = pair % p->heads_kv;
  double *dK, *dV;
  if (j->chunks == 1) {
    dK = j->dk + ((b * p->heads_kv + hk) * Nk) * d;
    dV = j->dv + ((b * p->heads_kv + hk) * Nk) * d;
  } else {
    dK = j->partial + (size_t)w * 2 * (size_t)(Nk * d);
    dV = dK + Nk * d;
  }
  memset(dK, 0, (size_t)(Nk * d) * sizeof *dK);
  memset(dV, 0, (size_t)(Nk * d) * sizeof *dV);
  /* The chunk's rows of the group (query head hk * g + r / Nq, row r % Nq). */
  const int64_t cr = j->chunk_rows, r0 = c * cr, r1 = j->chunks == 1 ? g * Nq : (c + 1) * cr < g * Nq ? (c + 1) * cr : g * Nq;
  for (int64_t r = r0; r < r1;) {
    const int64_t h = r / Nq, i0 = r % Nq, i1 = i0 + (r1 - r) < Nq ? i0 + (r1 - r) : Nq;
    one_head(j, b, hk * g + h, hk, i0, i1, dK, dV, s, s + Nk, s + 2 * Nk, s + 3 * Nk, s + 3 * Nk + d);
    r += i1 - i0;
  }
  if (j->chunks == 1) finish_kv(j, dK, dV);
  free(s);
}

int fg_reference_backward(const fg_bwd_host_problem *p, int exact, double *dq, double *dk,
                          double *dv, double *lse, int threads) {
  job j;
  memset(&j, 0, sizeof j);
  j.p = p;
  j.exact = exact;
  j.dq = dq;
  j.dk = dk;
  j.dv = dv;
  j.lse = lse;
  if (p->heads_kv <= 0 || p->heads_q % p->heads_kv) return -1;
  float *lut = malloc(65536 * sizeof *lut);
  if (!lut) return -1;
  for (uint32_t u = 0; u < 65536; u++) lut[u] = fg_half_to_f32((uint16_t)u, p->dtype);
  j.lut = lut;
  const int64_t pairs = p->batch * p->heads_kv, rows = p->heads_q / p->heads_kv * p->seqlen_q;
  const int64_t kv_el = p->seqlen_k * p->head_dim;
  j.chunk_rows = CHUNK_ROWS;
  for (;;) {
    j.chunks = rows > j.chunk_rows ? (rows + j.chunk_rows - 1) / j.chunk_rows : 1;
    if (j.chunks == 1 ||
        (double)pairs * (double)j.chunks * (double)kv_el * 2 * sizeof(double) <= (double)PARTIAL_BYTES)
      break;
    j.chunk_rows *= 2; /* too much memory for the partial sums: longer chunks (at last one a pair) */
  }
  j.total = pairs * j.chunks;
  int rc = j.total > INT_MAX ? -1 : 0;
  j.failed = rc == 0 ? calloc((size_t)j.total + 1, 1) : NULL;
  if (j.chunks > 1 && j.failed) j.partial = malloc((size_t)j.total * 2 * (size_t)kv_el * sizeof *j.partial + 1);
  if (!j.failed || (j.chunks > 1 && !j.partial)) {
    free(j.failed);
    free(j.partial);
    free(lut);
    return -1;
  }
  fg_pool_run((int)j.total, threads < 1 ? 1 : threads, work_item, NULL, &j);
  for (int64_t w = 0; w < j.total; w++)
    if (j.failed[w]) rc = -1;
  /* The chunks' sums, added in chunk order (whatever thread computed them). */
  for (int64_t pair = 0; rc == 0 && j.chunks > 1 && pair < pairs; pair++) {
    double *dK = dk + pair * kv_el, *dV = dv + pair * kv_el;
    memset(dK, 0, (size_t)kv_el * sizeof *dK);
    memset(dV, 0, (size_t)kv_el * sizeof *dV);
    for (int64_t c = 0; c < j.chunks; c++) {
      const double *pk = j.partial + (size_t)(pair * j.chunks + c) * 2 * (size_t)kv_el;
      for (int64_t x = 0; x < kv_el; x++) dK[x] += pk[x], dV[x] += pk[kv_el + x];
    }
    finish_kv(&j, dK, dV);
  }
  free(j.partial);
  free(j.failed);
  free(lut);
  return rc;
}

int fg_reference_backward_periodic(const fg_bwd_host_problem *p, int64_t n,
                                   const signed char *signs, int exact, double *dq, double *dk,
                                   double *dv, int threads) {
  const int64_t P = p->seqlen_q, Nk = p->seqlen_k, d = p->head_dim;
  if (p->batch != 1 || p->heads_q != 1 || p->heads_kv != 1 || P <= 0 || n < 0 || Nk < 0 || !signs)
    return -1;
  const int64_t periods = (n + P - 1) / P;
  for (int64_t k = 0; k < periods; k++)
    if (signs[k] != 1 && signs[k] != -1) return -1;
  const size_t nk_el = (size_t)(Nk * d);
  if (p->causal) {
    /* Bottom-right aligned: row i sees keys j <= i + Nk - n, so only the last min(n, Nk) rows see
     * one; they are a problem of their own with the same alignment. */
    const int64_t rows = n < Nk ? n : Nk, first = n - rows;
    uint16_t *q = malloc((size_t)(rows * d) * 2 + 1), *d_o = malloc((size_t)(rows * d) * 2 + 1);
    int rc = q && d_o ? 0 : -1;
    for (int64_t t = 0; rc == 0 && t < rows; t++) {
      memcpy(q + t * d, p->q + ((first + t) % P) * d, (size_t)d * 2);
      memcpy(d_o + t * d, p->d_o + ((first + t) % P) * d, (size_t)d * 2);
      if (signs[(first + t) / P] < 0) /* dO negated (the sign bit of f16 and bf16) */
        for (int64_t x = 0; x < d; x++) d_o[t * d + x] ^= 0x8000;
    }
    fg_bwd_host_problem s = *p;
    s.seqlen_q = rows;
    s.q = q;
    s.d_o = d_o;
    if (rc == 0) rc = fg_reference_backward(&s, exact, dq, dk, dv, NULL, threads);
    free(q);
    free(d_o);
    return rc;
  }
  /* Without a mask: row i's dQ is signs[i / P] times row i % P's (dQ is linear in dO: dP, D and
   * dS change sign with it, P does not), and dK, dV sum the rows' contributions: the whole
   * periods' sums are one period's times the sum of their signs, plus the last partial period's
   * sign times the sum over the first n % P rows. */
  const int64_t count = n / P, rest = n % P;
  int64_t sum = 0;
  for (int64_t k = 0; k < count; k++) sum += signs[k];
  if (fg_reference_backward(p, exact, dq, dk, dv, NULL, threads) != 0) return -1;
  for (size_t x = 0; x < nk_el; x++) dk[x] *= (double)sum, dv[x] *= (double)sum;
  if (rest == 0) return 0;
  fg_bwd_host_problem s = *p;
  s.seqlen_q = rest;
  double *tq = malloc((size_t)(rest * d) * sizeof *tq + 1);
  double *tk = malloc(nk_el * sizeof *tk + 1), *tv = malloc(nk_el * sizeof *tv + 1);
  int rc = tq && tk && tv ? fg_reference_backward(&s, exact, tq, tk, tv, NULL, threads) : -1;
  const double sign = (double)signs[count];
  for (size_t x = 0; rc == 0 && x < nk_el; x++) dk[x] += sign * tk[x], dv[x] += sign * tv[x];
  free(tq);
  free(tk);
  free(tv);
  return rc;
}
