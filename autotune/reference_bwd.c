/* reference_bwd.c: the backward pass on the host, in fp64 (the yardstick) and as the naive
 * same-dtype computation (every matrix product and elementwise result rounded to f16/bf16, as
 * an eager framework computes it), whose error sets the tolerance of `flashgen check`. Work is
 * split over threads by (batch, KV head): dK and dV of a KV head sum over its query heads. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fg_autotune.h"

typedef struct job {
  const fg_bwd_host_problem *p;
  int exact;
  double *dq, *dk, *dv, *lse;
  int64_t next, total; /* (batch, KV head) pairs */
  pthread_mutex_t mu;
} job;

static double rnd(double x, fg_dtype t, int exact) {
  return exact ? x : (double)fg_half_to_f32(fg_f32_to_half((float)x, t), t);
}

/* One (batch, query head): rows i of Q, dO against all keys of KV head hk. */
static void one_head(const job *j, int64_t b, int64_t h, int64_t hk, double *s, double *pr,
                     double *dp) {
  const fg_bwd_host_problem *p = j->p;
  const int64_t Nq = p->seqlen_q, Nk = p->seqlen_k, d = p->head_dim;
  const int ex = j->exact;
  const fg_dtype t = p->dtype;
  const uint16_t *Q = p->q + ((b * p->heads_q + h) * Nq) * d;
  const uint16_t *dO = p->d_o + ((b * p->heads_q + h) * Nq) * d;
  const uint16_t *K = p->k + ((b * p->heads_kv + hk) * Nk) * d;
  const uint16_t *V = p->v + ((b * p->heads_kv + hk) * Nk) * d;
  double *dQ = j->dq + ((b * p->heads_q + h) * Nq) * d;
  double *dK = j->dk + ((b * p->heads_kv + hk) * Nk) * d;
  double *dV = j->dv + ((b * p->heads_kv + hk) * Nk) * d;
  for (int64_t i = 0; i < Nq; i++) {
    int64_t n = Nk;
    if (p->causal) n = i + Nk - Nq + 1 < Nk ? i + Nk - Nq + 1 : Nk;
    if (n < 0) n = 0;
    double *dqi = dQ + i * d;
    memset(dqi, 0, (size_t)d * sizeof *dqi);
    if (j->lse) j->lse[(b * p->heads_q + h) * Nq + i] = -INFINITY;
    if (n == 0) continue;
    const uint16_t *qi = Q + i * d, *doi = dO + i * d;
    double mx = -INFINITY;
    for (int64_t c = 0; c < n; c++) {
      double acc = 0;
      const uint16_t *kc = K + c * d;
      for (int64_t x = 0; x < d; x++)
        acc += (double)fg_half_to_f32(qi[x], t) * (double)fg_half_to_f32(kc[x], t);
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
      for (int64_t x = 0; x < d; x++)
        acc += (double)fg_half_to_f32(doi[x], t) * (double)fg_half_to_f32(vc[x], t);
      dp[c] = rnd(acc, t, ex);
      D += pr[c] * dp[c];
    }
    D = rnd(D, t, ex);
    for (int64_t c = 0; c < n; c++) {
      const double ds = rnd(pr[c] * (dp[c] - D), t, ex);
      const uint16_t *kc = K + c * d;
      double *dkc = dK + c * d, *dvc = dV + c * d;
      for (int64_t x = 0; x < d; x++) {
        dqi[x] += ds * (double)fg_half_to_f32(kc[x], t);
        dkc[x] += ds * (double)fg_half_to_f32(qi[x], t);
        dvc[x] += pr[c] * (double)fg_half_to_f32(doi[x], t);
      }
    }
    for (int64_t x = 0; x < d; x++) dqi[x] = rnd(dqi[x] * p->scale, t, ex);
  }
}

static void *worker(void *arg) {
  job *j = arg;
  const fg_bwd_host_problem *p = j->p;
  const int64_t Nk = p->seqlen_k, d = p->head_dim;
  double *s = malloc((size_t)(Nk > 0 ? Nk : 1) * 3 * sizeof *s);
  if (!s) return (void *)1;
  for (;;) {
    pthread_mutex_lock(&j->mu);
    const int64_t w = j->next++;
    pthread_mutex_unlock(&j->mu);
    if (w >= j->total) break;
    const int64_t b = w / p->heads_kv, hk = w % p->heads_kv, g = p->heads_q / p->heads_kv;
    double *dK = j->dk + ((b * p->heads_kv + hk) * Nk) * d;
    double *dV = j->dv + ((b * p->heads_kv + hk) * Nk) * d;
    memset(dK, 0, (size_t)(Nk * d) * sizeof *dK);
    memset(dV, 0, (size_t)(Nk * d) * sizeof *dV);
    for (int64_t h = hk * g; h < (hk + 1) * g; h++) one_head(j, b, h, hk, s, s + Nk, s + 2 * Nk);
    for (int64_t x = 0; x < Nk * d; x++) {
      dK[x] = rnd(dK[x] * p->scale, p->dtype, j->exact);
      dV[x] = rnd(dV[x], p->dtype, j->exact);
    }
  }
  free(s);
  return NULL;
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
  j.total = p->batch * p->heads_kv;
  if (p->heads_kv <= 0 || p->heads_q % p->heads_kv) return -1;
  pthread_mutex_init(&j.mu, NULL);
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  if (threads > j.total) threads = (int)(j.total > 0 ? j.total : 1);
  pthread_t tid[64];
  int started = 0, rc = 0;
  for (int i = 1; i < threads; i++)
    if (pthread_create(&tid[started], NULL, worker, &j) == 0) started++;
  if (worker(&j)) rc = -1;
  for (int i = 0; i < started; i++) {
    void *r;
    pthread_join(tid[i], &r);
    if (r) rc = -1;
  }
  pthread_mutex_destroy(&j.mu);
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
