/* test_reference_bwd.c: the host backward reference, fg_reference_backward (autotune/
 * reference_bwd.c), against an fp64 forward written here: its exact dQ, dK, dV are the gradients
 * of L = sum(dO * O) (central finite differences on the decoded inputs), its LSE is the
 * forward's, rows that see no key get dQ = 0, the naive same-dtype result is close to the exact
 * one but rounded, and the thread count does not change a bit of the result. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fg_autotune.h"

/* One problem: the 16-bit inputs, their decoded values (which the finite differences perturb),
 * and the reference's outputs. Contiguous [B, H, N, d]. */
typedef struct prob {
  fg_bwd_host_problem p;
  uint16_t *q16, *k16, *v16, *do16;
  double *q, *k, *v, *dO;
  double *dq, *dk, *dv, *lse; /* fg_reference_backward, exact */
  size_t nq, nkv, nl;        /* element counts of Q, K, LSE */
} prob;

static uint64_t rng_state;
static double uniform(void) { /* [-1, 1) */
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

static void fill(uint16_t *h, double *x, size_t n, fg_dtype t, double amp) {
  for (size_t i = 0; i < n; i++) {
    h[i] = fg_f32_to_half((float)(amp * uniform()), t);
    x[i] = (double)fg_half_to_f32(h[i], t);
  }
}

static void *xcalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz);
  cr_assert_not_null(p);
  return p;
}

static prob make(fg_dtype t, int causal, int64_t B, int64_t Hq, int64_t Hkv, int64_t Nq,
                 int64_t Nk, int64_t d, uint64_t seed) {
  prob r;
  memset(&r, 0, sizeof r);
  rng_state = seed;
  r.p.dtype = t;
  r.p.causal = causal;
  r.p.batch = B;
  r.p.heads_q = Hq;
  r.p.heads_kv = Hkv;
  r.p.seqlen_q = Nq;
  r.p.seqlen_k = Nk;
  r.p.head_dim = d;
  r.p.scale = 1.0 / sqrt((double)d);
  r.nq = (size_t)(B * Hq * Nq * d);
  r.nkv = (size_t)(B * Hkv * Nk * d);
  r.nl = (size_t)(B * Hq * Nq);
  r.q16 = xcalloc(r.nq, 2);
  r.do16 = xcalloc(r.nq, 2);
  r.k16 = xcalloc(r.nkv, 2);
  r.v16 = xcalloc(r.nkv, 2);
  r.q = xcalloc(r.nq, sizeof(double));
  r.dO = xcalloc(r.nq, sizeof(double));
  r.k = xcalloc(r.nkv, sizeof(double));
  r.v = xcalloc(r.nkv, sizeof(double));
  /* Q and K of magnitude ~2 so the softmax is far from uniform; dO, V of ~1. */
  fill(r.q16, r.q, r.nq, t, 2.0);
  fill(r.k16, r.k, r.nkv, t, 2.0);
  fill(r.v16, r.v, r.nkv, t, 1.0);
  fill(r.do16, r.dO, r.nq, t, 1.0);
  r.p.q = r.q16;
  r.p.k = r.k16;
  r.p.v = r.v16;
  r.p.d_o = r.do16;
  r.dq = xcalloc(r.nq, sizeof(double));
  r.dk = xcalloc(r.nkv, sizeof(double));
  r.dv = xcalloc(r.nkv, sizeof(double));
  r.lse = xcalloc(r.nl, sizeof(double));
  cr_assert_eq(fg_reference_backward(&r.p, 1, r.dq, r.dk, r.dv, r.lse, 1), 0);
  return r;
}

static void release(prob *r) {
  void *ps[] = {r->q16, r->k16, r->v16, r->do16, r->q, r->k, r->v, r->dO,
                r->dq, r->dk, r->dv, r->lse};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
}

/* ---- the fp64 forward of this test ---------------------------------------------------------- */

static int64_t visible(const fg_bwd_host_problem *p, int64_t i) {
  if (!p->causal) return p->seqlen_k;
  int64_t n = i + p->seqlen_k - p->seqlen_q + 1;
  return n < 0 ? 0 : n > p->seqlen_k ? p->seqlen_k : n;
}

/* Row i of head (b, h): O_i = softmax(scale * q_i K^T) V over the visible keys; returns
 * dO_i . O_i and writes the row's log-sum-exp (-inf when it sees no key). */
static double row_loss(const prob *r, int64_t b, int64_t h, int64_t i, double *lse) {
  const fg_bwd_host_problem *p = &r->p;
  const int64_t d = p->head_dim, Nq = p->seqlen_q, Nk = p->seqlen_k;
  const int64_t hk = h / (p->heads_q / p->heads_kv), n = visible(p, i);
  const double *q = r->q + ((b * p->heads_q + h) * Nq + i) * d;
  const double *dO = r->dO + ((b * p->heads_q + h) * Nq + i) * d;
  const double *K = r->k + (b * p->heads_kv + hk) * Nk * d;
  const double *V = r->v + (b * p->heads_kv + hk) * Nk * d;
  if (lse) *lse = -INFINITY;
  if (n == 0) return 0;
  double s[64], mx = -INFINITY, sum = 0;
  cr_assert(n <= 64);
  for (int64_t j = 0; j < n; j++) {
    double acc = 0;
    for (int64_t x = 0; x < d; x++) acc += q[x] * K[j * d + x];
    s[j] = acc * p->scale;
    if (s[j] > mx) mx = s[j];
  }
  for (int64_t j = 0; j < n; j++) sum += (s[j] = exp(s[j] - mx));
  if (lse) *lse = mx + log(sum);
  double l = 0;
  for (int64_t x = 0; x < d; x++) {
    double o = 0;
    for (int64_t j = 0; j < n; j++) o += s[j] * V[j * d + x];
    l += dO[x] * (o / sum);
  }
  return l;
}

/* The part of L that depends on K/V head (b, hk): the rows of the query heads it serves. */
static double kv_head_loss(const prob *r, int64_t b, int64_t hk) {
  const int64_t g = r->p.heads_q / r->p.heads_kv;
  double l = 0;
  for (int64_t h = hk * g; h < (hk + 1) * g; h++)
    for (int64_t i = 0; i < r->p.seqlen_q; i++) l += row_loss(r, b, h, i, NULL);
  return l;
}

/* max |a - b| / max |b| over n elements (norm-wise relative error); 0 when both are zero. */
static double rel_err(const double *a, const double *b, size_t n) {
  double e = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    if (fabs(a[i] - b[i]) > e) e = fabs(a[i] - b[i]);
    if (fabs(b[i]) > m) m = fabs(b[i]);
  }
  return m > 0 ? e / m : e;
}

#define FD_H 1e-6

/* Central differences of L for every element of Q, K and V, compared with the exact gradients. */
static void check_gradients(prob *r, const char *what) {
  const fg_bwd_host_problem *p = &r->p;
  const int64_t d = p->head_dim, Nq = p->seqlen_q, Nk = p->seqlen_k;
  double *fq = xcalloc(r->nq, sizeof(double)), *fk = xcalloc(r->nkv, sizeof(double));
  double *fv = xcalloc(r->nkv, sizeof(double));
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t h = 0; h < p->heads_q; h++)
      for (int64_t i = 0; i < Nq; i++)
        for (int64_t x = 0; x < d; x++) {
          const size_t at = (size_t)(((b * p->heads_q + h) * Nq + i) * d + x);
          const double q0 = r->q[at];
          r->q[at] = q0 + FD_H;
          const double lp = row_loss(r, b, h, i, NULL);
          r->q[at] = q0 - FD_H;
          const double lm = row_loss(r, b, h, i, NULL);
          r->q[at] = q0;
          fq[at] = (lp - lm) / (2 * FD_H);
        }
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t hk = 0; hk < p->heads_kv; hk++)
      for (int64_t j = 0; j < Nk; j++)
        for (int64_t x = 0; x < d; x++) {
          const size_t at = (size_t)(((b * p->heads_kv + hk) * Nk + j) * d + x);
          double *t[2] = {r->k, r->v}, *f[2] = {fk, fv};
          for (int w = 0; w < 2; w++) {
            const double x0 = t[w][at];
            t[w][at] = x0 + FD_H;
            const double lp = kv_head_loss(r, b, hk);
            t[w][at] = x0 - FD_H;
            const double lm = kv_head_loss(r, b, hk);
            t[w][at] = x0;
            f[w][at] = (lp - lm) / (2 * FD_H);
          }
        }
  const double eq = rel_err(r->dq, fq, r->nq), ek = rel_err(r->dk, fk, r->nkv);
  const double ev = rel_err(r->dv, fv, r->nkv);
  cr_assert_lt(eq, 1e-6, "%s: dQ differs from the finite differences by %g (relative)", what, eq);
  cr_assert_lt(ek, 1e-6, "%s: dK differs from the finite differences by %g (relative)", what, ek);
  cr_assert_lt(ev, 1e-6, "%s: dV differs from the finite differences by %g (relative)", what, ev);
  /* A gradient that is all zeros would pass against zeros: make sure there is something to
   * compare (with one visible key the softmax is constant, so dQ = dK = 0 there). */
  double mq = 0, mv = 0;
  for (size_t i = 0; i < r->nq; i++) mq = fmax(mq, fabs(fq[i]));
  for (size_t i = 0; i < r->nkv; i++) mv = fmax(mv, fabs(fv[i]));
  if (Nk > 0) cr_assert_gt(mv, 1e-3, "%s: the finite differences of V are all ~0", what);
  if (Nk > 1) cr_assert_gt(mq, 1e-3, "%s: the finite differences of Q are all ~0", what);
  free(fq);
  free(fk);
  free(fv);
}

static void check_lse(const prob *r, const char *what) {
  const fg_bwd_host_problem *p = &r->p;
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t h = 0; h < p->heads_q; h++)
      for (int64_t i = 0; i < p->seqlen_q; i++) {
        double want;
        row_loss(r, b, h, i, &want);
        const double got = r->lse[(b * p->heads_q + h) * p->seqlen_q + i];
        if (isinf(want)) {
          cr_assert(isinf(got) && got < 0, "%s: row %lld sees no key: lse %g, want -inf", what,
                    (long long)i, got);
        } else {
          cr_assert_lt(fabs(got - want), 1e-12 * (1 + fabs(want)),
                       "%s: lse of (%lld, %lld, %lld) is %.17g, the forward gives %.17g", what,
                       (long long)b, (long long)h, (long long)i, got, want);
        }
      }
}

/* ---- tests ---------------------------------------------------------------------------------- */

Test(reference_bwd, exact_gradients_match_finite_differences) {
  static const int64_t ns[3] = {1, 5, 17};
  int checked = 0;
  for (int causal = 0; causal < 2; causal++)
    for (int a = 0; a < 3; a++)
      for (int c = 0; c < 3; c++) {
        char what[96];
        snprintf(what, sizeof what, "f16 %s Nq %lld Nk %lld GQA 4/2",
                 causal ? "causal" : "noncausal", (long long)ns[a], (long long)ns[c]);
        prob r = make(FG_DTYPE_F16, causal, 1, 4, 2, ns[a], ns[c], 32,
                      0x1234u + 97u * (uint64_t)(a * 3 + c) + 1000u * (uint64_t)causal);
        check_gradients(&r, what);
        check_lse(&r, what);
        release(&r);
        checked++;
      }
  cr_assert_eq(checked, 18);
}

Test(reference_bwd, bf16_two_batches_match_finite_differences) {
  prob r = make(FG_DTYPE_BF16, 1, 2, 4, 2, 17, 5, 32, 77);
  check_gradients(&r, "bf16 causal B 2 Nq 17 Nk 5 GQA 4/2");
  check_lse(&r, "bf16 causal B 2 Nq 17 Nk 5");
  release(&r);
  prob m = make(FG_DTYPE_BF16, 0, 2, 2, 1, 5, 17, 32, 78);
  check_gradients(&m, "bf16 noncausal B 2 Nq 5 Nk 17 MQA 2/1");
  check_lse(&m, "bf16 noncausal B 2 Nq 5 Nk 17 MQA");
  release(&m);
}

Test(reference_bwd, rows_that_see_no_key_get_zero_dq) {
  /* Causal with Nq = 17 > Nk = 5: rows 0..11 see no key (bottom-right alignment). */
  prob r = make(FG_DTYPE_F16, 1, 1, 4, 2, 17, 5, 32, 5);
  const int64_t d = 32;
  for (int64_t h = 0; h < 4; h++)
    for (int64_t i = 0; i < 17; i++) {
      const double *row = r.dq + (h * 17 + i) * d;
      double mx = 0;
      for (int64_t x = 0; x < d; x++) mx = fmax(mx, fabs(row[x]));
      const double lse = r.lse[h * 17 + i];
      if (i <= 11) {
        cr_assert_eq(mx, 0.0, "head %lld row %lld sees no key but dQ is %g", (long long)h,
                     (long long)i, mx);
        cr_assert(isinf(lse) && lse < 0, "row %lld: lse %g, want -inf", (long long)i, lse);
      } else if (i == 12) { /* one key: P = 1, so dS = P (dP - D) = 0 exactly */
        cr_assert_eq(mx, 0.0, "head %lld row 12 sees one key but dQ is %g", (long long)h, mx);
        cr_assert(isfinite(lse));
      } else {
        cr_assert_gt(mx, 0.0, "head %lld row %lld sees %lld keys but dQ is 0", (long long)h,
                     (long long)i, (long long)(i - 11));
        cr_assert(isfinite(lse));
      }
    }
  release(&r);
  /* seqlen_k = 0: every row sees nothing. */
  prob e = make(FG_DTYPE_BF16, 0, 1, 2, 2, 5, 0, 32, 6);
  for (size_t i = 0; i < e.nq; i++) cr_assert_eq(e.dq[i], 0.0);
  for (size_t i = 0; i < e.nl; i++) cr_assert(isinf(e.lse[i]) && e.lse[i] < 0);
  release(&e);
}

/* Does every element round-trip through the dtype (is it a dtype value)? */
static int all_representable(const double *x, size_t n, fg_dtype t) {
  for (size_t i = 0; i < n; i++)
    if ((double)fg_half_to_f32(fg_f32_to_half((float)x[i], t), t) != x[i]) return 0;
  return 1;
}

Test(reference_bwd, naive_is_close_to_exact_but_rounded) {
  static const fg_dtype types[2] = {FG_DTYPE_F16, FG_DTYPE_BF16};
  for (int ti = 0; ti < 2; ti++)
    for (int causal = 0; causal < 2; causal++) {
      const fg_dtype t = types[ti];
      const double eps = t == FG_DTYPE_F16 ? ldexp(1, -10) : ldexp(1, -7); /* one ulp at 1 */
      prob r = make(t, causal, 2, 4, 2, 17, 17, 32, 900u + (uint64_t)(ti * 2 + causal));
      double *dq = xcalloc(r.nq, sizeof(double)), *dk = xcalloc(r.nkv, sizeof(double));
      double *dv = xcalloc(r.nkv, sizeof(double)), *lse = xcalloc(r.nl, sizeof(double));
      cr_assert_eq(fg_reference_backward(&r.p, 0, dq, dk, dv, lse, 2), 0);
      const char *name = t == FG_DTYPE_F16 ? "f16" : "bf16";
      const double *got[3] = {dq, dk, dv}, *want[3] = {r.dq, r.dk, r.dv};
      const size_t n[3] = {r.nq, r.nkv, r.nkv};
      static const char *const tn[3] = {"dQ", "dK", "dV"};
      for (int w = 0; w < 3; w++) {
        const double e = rel_err(got[w], want[w], n[w]);
        /* Within a few ulps of the dtype, relative to the tensor's largest element ... */
        cr_assert_lt(e, 4 * eps, "%s %s: naive %s is %g (%.1f ulps) from exact", name,
                     causal ? "causal" : "noncausal", tn[w], e, e / eps);
        /* ... but rounded: not the exact values, and every element a value of the dtype. */
        cr_assert_gt(e, 0.0, "%s: naive %s is identical to exact", name, tn[w]);
        cr_assert(all_representable(got[w], n[w], t), "%s: naive %s has values that are not %s",
                  name, tn[w], name);
        cr_assert(!all_representable(want[w], n[w], t), "%s: exact %s looks rounded to %s",
                  name, tn[w], name);
      }
      free(dq);
      free(dk);
      free(dv);
      free(lse);
      release(&r);
    }
}

Test(reference_bwd, thread_count_does_not_change_the_result) {
  for (int exact = 0; exact < 2; exact++) {
    prob r = make(FG_DTYPE_BF16, 1, 3, 4, 2, 17, 23, 40, 4242u + (uint64_t)exact);
    double *o1[4], *o4[4];
    const size_t n[4] = {r.nq, r.nkv, r.nkv, r.nl};
    for (int i = 0; i < 4; i++) {
      o1[i] = xcalloc(n[i], sizeof(double));
      o4[i] = xcalloc(n[i], sizeof(double));
      for (size_t j = 0; j < n[i]; j++) o4[i][j] = NAN; /* every element must be written */
    }
    cr_assert_eq(fg_reference_backward(&r.p, exact, o1[0], o1[1], o1[2], o1[3], 1), 0);
    cr_assert_eq(fg_reference_backward(&r.p, exact, o4[0], o4[1], o4[2], o4[3], 4), 0);
    static const char *const tn[4] = {"dQ", "dK", "dV", "LSE"};
    for (int i = 0; i < 4; i++)
      cr_assert_eq(memcmp(o1[i], o4[i], n[i] * sizeof(double)), 0,
                   "%s (exact %d) differs between 1 and 4 threads", tn[i], exact);
    for (int i = 0; i < 4; i++) {
      free(o1[i]);
      free(o4[i]);
    }
    release(&r);
  }
}

Test(reference_bwd, heads_kv_must_divide_heads_q) {
  uint16_t x[32 * 3] = {0};
  double out[32 * 3];
  fg_bwd_host_problem p;
  memset(&p, 0, sizeof p);
  p.dtype = FG_DTYPE_F16;
  p.batch = 1;
  p.heads_q = 3;
  p.heads_kv = 2;
  p.seqlen_q = p.seqlen_k = 1;
  p.head_dim = 32;
  p.scale = 1;
  p.q = p.k = p.v = p.d_o = x;
  cr_assert_eq(fg_reference_backward(&p, 1, out, out, out, NULL, 1), -1);
  p.heads_kv = 0;
  cr_assert_eq(fg_reference_backward(&p, 1, out, out, out, NULL, 1), -1);
}

/* fg_reference_backward_periodic (the reference of `flashgen check`'s case past 2^31 elements)
 * against fg_reference_backward of the same problem written out row by row: Q and dO repeat a
 * pattern of P rows over n rows (a partial period at the end or not), dO signed per period by a
 * sign sequence that does not alternate (-, -, +, -, +, +, ...: the sum of the whole periods'
 * signs is not 0 or 1), without a mask (every row's dQ is its pattern row's, signed; dK, dV the
 * full sums) and causal (only the last Nk rows see a key), and a problem shorter than a period. */
static const signed char test_signs[] = {-1, -1, 1, -1, 1, 1, 1, -1, -1, -1, 1, 1};

static void periodic_vs_direct(int causal, int64_t P, int64_t n, int64_t Nk) {
  const int64_t d = 16;
  const signed char *sg = test_signs;
  cr_assert_leq((n + P - 1) / P, (int64_t)sizeof test_signs, "more periods than test signs");
  prob pat = make(FG_DTYPE_BF16, causal, 1, 1, 1, P, Nk, d, 77 + (uint64_t)n);
  uint16_t *q = xcalloc((size_t)(n * d), 2), *d_o = xcalloc((size_t)(n * d), 2);
  for (int64_t i = 0; i < n; i++) {
    memcpy(q + i * d, pat.q16 + (i % P) * d, (size_t)d * 2);
    memcpy(d_o + i * d, pat.do16 + (i % P) * d, (size_t)d * 2);
    if (sg[i / P] < 0)
      for (int64_t x = 0; x < d; x++) d_o[i * d + x] ^= 0x8000; /* dO negated */
  }
  fg_bwd_host_problem full = pat.p;
  full.seqlen_q = n;
  full.q = q;
  full.d_o = d_o;
  double *fq = xcalloc((size_t)(n * d), 8), *fk = xcalloc((size_t)(Nk * d), 8),
         *fv = xcalloc((size_t)(Nk * d), 8);
  cr_assert_eq(fg_reference_backward(&full, 1, fq, fk, fv, NULL, 1), 0);
  const int64_t rows = causal ? (n < Nk ? n : Nk) : P;
  double *pq = xcalloc((size_t)(rows * d), 8), *pk = xcalloc((size_t)(Nk * d), 8),
         *pv = xcalloc((size_t)(Nk * d), 8);
  cr_assert_eq(fg_reference_backward_periodic(&pat.p, n, sg, 1, pq, pk, pv, 2), 0);
  double mag = 0;
  for (int64_t x = 0; x < Nk * d; x++) mag = fmax(mag, fmax(fabs(fk[x]), fabs(fv[x])));
  cr_assert_gt(mag, 0.1, "the sums are not trivially small");
  for (int64_t x = 0; x < Nk * d; x++) {
    cr_assert_float_eq(pk[x], fk[x], 1e-12 * mag, "dK[%lld]: %g, written out %g", (long long)x,
                       pk[x], fk[x]);
    cr_assert_float_eq(pv[x], fv[x], 1e-12 * mag, "dV[%lld]", (long long)x);
  }
  for (int64_t i = 0; i < n; i++)
    for (int64_t x = 0; x < d; x++) {
      double want = fq[i * d + x], got;
      if (causal) got = i >= n - rows ? pq[(i - (n - rows)) * d + x] : 0.0;
      else got = sg[i / P] * pq[(i % P) * d + x];
      cr_assert_float_eq(got, want, 1e-12, "dQ row %lld col %lld (causal %d)", (long long)i,
                         (long long)x, causal);
    }
  free(q), free(d_o), free(fq), free(fk), free(fv), free(pq), free(pk), free(pv);
  release(&pat);
}

Test(reference_bwd, periodic_equals_written_out) {
  for (int causal = 0; causal <= 1; causal++) {
    periodic_vs_direct(causal, 7, 3 * 7 + 5, 5);
    periodic_vs_direct(causal, 7, 9 * 7 + 3, 5); /* whole periods' signs sum to -1 */
    periodic_vs_direct(causal, 7, 5 * 7, 9); /* whole periods, more keys than a period's rows */
    periodic_vs_direct(causal, 7, 4, 5);     /* shorter than a period; causal: fewer rows than
                                                keys */
  }
  prob pat = make(FG_DTYPE_BF16, 0, 1, 2, 1, 7, 5, 16, 1);
  double x[512];
  cr_assert_eq(fg_reference_backward_periodic(&pat.p, 20, test_signs, 1, x, x, x, 1), -1,
               "more than one head is refused");
  release(&pat);
  pat = make(FG_DTYPE_BF16, 0, 1, 1, 1, 7, 5, 16, 1);
  static const signed char zero[3] = {1, 0, 1};
  cr_assert_eq(fg_reference_backward_periodic(&pat.p, 20, zero, 1, x, x, x, 1), -1,
               "a sign of 0 is refused");
  cr_assert_eq(fg_reference_backward_periodic(&pat.p, 20, NULL, 1, x, x, x, 1), -1,
               "no signs is refused");
  release(&pat);
}

/* A KV head whose query rows (4 heads x 700 = 2800) span many of the reference's chunks (256
 * rows) is split over work items whose dK/dV sums are added afterwards: the result must be the
 * sum over its query heads of the same problem without GQA (K and V repeated per head, 700 rows
 * each, chunked otherwise) up to fp64 rounding, dQ and LSE bit for bit, and the same with 1 or 8
 * threads. */
Test(reference_bwd, a_long_group_split_in_chunks_sums_like_its_heads) {
  for (int causal = 0; causal <= 1; causal++) {
    const int64_t Hq = 4, Nq = 700, Nk = 9, d = 32;
    prob g = make(FG_DTYPE_F16, causal, 1, Hq, 1, Nq, Nk, d, 99u + (uint64_t)causal);
    prob m = make(FG_DTYPE_F16, causal, 1, Hq, Hq, Nq, Nk, d, 1u);
    /* m: g's Q and dO, its one K/V head repeated for every query head */
    memcpy(m.q16, g.q16, g.nq * 2);
    memcpy(m.do16, g.do16, g.nq * 2);
    for (int64_t h = 0; h < Hq; h++) {
      memcpy(m.k16 + h * Nk * d, g.k16, (size_t)(Nk * d) * 2);
      memcpy(m.v16 + h * Nk * d, g.v16, (size_t)(Nk * d) * 2);
    }
    cr_assert_eq(fg_reference_backward(&g.p, 1, g.dq, g.dk, g.dv, g.lse, 8), 0);
    cr_assert_eq(fg_reference_backward(&m.p, 1, m.dq, m.dk, m.dv, m.lse, 8), 0);
    cr_assert_eq(memcmp(g.dq, m.dq, g.nq * sizeof(double)), 0, "dQ (causal %d)", causal);
    cr_assert_eq(memcmp(g.lse, m.lse, g.nl * sizeof(double)), 0, "LSE (causal %d)", causal);
    double worst = 0, big = 0;
    for (int64_t x = 0; x < Nk * d; x++) {
      double sk = 0, sv = 0;
      for (int64_t h = 0; h < Hq; h++) sk += m.dk[h * Nk * d + x], sv += m.dv[h * Nk * d + x];
      worst = fmax(worst, fmax(fabs(sk - g.dk[x]), fabs(sv - g.dv[x])));
      big = fmax(big, fmax(fabs(sk), fabs(sv)));
    }
    cr_assert_gt(big, 1e-3, "the sums are not all zero");
    cr_assert_leq(worst, 1e-12 * big, "dK/dV of the split group differ by %g (of %g)", worst, big);
    double *dq1 = xcalloc(g.nq, sizeof(double)), *dk1 = xcalloc(g.nkv, sizeof(double));
    double *dv1 = xcalloc(g.nkv, sizeof(double)), *l1 = xcalloc(g.nl, sizeof(double));
    cr_assert_eq(fg_reference_backward(&g.p, 1, dq1, dk1, dv1, l1, 1), 0);
    cr_assert_eq(memcmp(dk1, g.dk, g.nkv * sizeof(double)), 0, "dK: 1 thread against 8");
    cr_assert_eq(memcmp(dv1, g.dv, g.nkv * sizeof(double)), 0, "dV: 1 thread against 8");
    free(dq1), free(dk1), free(dv1), free(l1);
    release(&g);
    release(&m);
  }
}
