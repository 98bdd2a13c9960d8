/* test_reference.c: tests of the CPU references (cpu_reference.h): seed 002's online-softmax worked
 * example, the double-precision attention against closed forms, the float online tiling against
 * the double reference, and the fp16/bf16 conversions. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_reference.h"
#include "fg_autotune.h"

/* |a - b| <= tol * |b| (or <= tol when b is 0). */
static int close_rel(double a, double b, double tol) {
  const double scale = fabs(b) > 0 ? fabs(b) : 1.0;
  return fabs(a - b) <= tol * scale;
}

/* ---- Seed 002's worked example: x = [1,3,2,4,3,2] in blocks [1,3], [2,4], [3,2]. ---- */

Test(softmax_merge, worked_example_of_seed_002_f64) {
  const double x[6] = {1, 3, 2, 4, 3, 2};
  /* Hand values of (m, l) after each merge. */
  const double hand_m[3] = {3, 4, 4};
  const double hand_l[3] = {exp(-2.0) + 1.0, exp(-1.0) * (exp(-2.0) + 1.0) + (exp(-2.0) + 1.0),
                            exp(-3.0) + exp(-1.0) + exp(-2.0) + 1.0 + exp(-1.0) + exp(-2.0)};
  double f[6]; /* f(x) of the merged prefix, relative to the running maximum */
  fg_ref_softmax_f64 acc = {-INFINITY, 0.0};
  for (int blk = 0; blk < 3; blk++) {
    const double *xb = x + 2 * blk;
    const fg_ref_softmax_f64 st = fg_ref_softmax_block_f64(xb, 2);
    cr_assert_eq(st.m, fmax(xb[0], xb[1]));
    cr_assert(close_rel(st.l, exp(xb[0] - st.m) + exp(xb[1] - st.m), 1e-15));
    double sa, sb;
    fg_ref_softmax_merge_f64(&acc, st, &sa, &sb);
    for (int j = 0; j < 2 * blk; j++) f[j] *= sa;
    for (int j = 0; j < 2; j++) f[2 * blk + j] = sb * exp(xb[j] - st.m);
    cr_assert_eq(acc.m, hand_m[blk], "block %d: m = %g, expected %g", blk, acc.m, hand_m[blk]);
    cr_assert(close_rel(acc.l, hand_l[blk], 1e-15), "block %d: l = %.17g, expected %.17g", blk,
              acc.l, hand_l[blk]);
  }
  /* m = 4 and l = sum exp(x - 4) over the whole row. */
  double l_whole = 0.0;
  for (int j = 0; j < 6; j++) l_whole += exp(x[j] - 4.0);
  cr_assert_eq(acc.m, 4.0);
  cr_assert(close_rel(acc.l, l_whole, 1e-15), "l = %.17g, whole row %.17g", acc.l, l_whole);
  /* The merged softmax equals the two-pass softmax of the whole row. */
  for (int j = 0; j < 6; j++) {
    const double whole = exp(x[j] - 4.0) / l_whole;
    cr_assert(close_rel(f[j] / acc.l, whole, 1e-15), "softmax[%d] = %.17g, whole row %.17g", j,
              f[j] / acc.l, whole);
  }
  const double expected0 = exp(-3.0) / l_whole; /* softmax(x)_1 by hand */
  cr_assert(close_rel(f[0] / acc.l, expected0, 1e-15));
}

Test(softmax_merge, worked_example_of_seed_002_f32) {
  const float x[6] = {1, 3, 2, 4, 3, 2};
  float f[6];
  fg_ref_softmax_f32 acc = {-INFINITY, 0.0f};
  for (int blk = 0; blk < 3; blk++) {
    const fg_ref_softmax_f32 st = fg_ref_softmax_block_f32(x + 2 * blk, 2);
    float sa, sb;
    fg_ref_softmax_merge_f32(&acc, st, &sa, &sb);
    for (int j = 0; j < 2 * blk; j++) f[j] *= sa;
    for (int j = 0; j < 2; j++) f[2 * blk + j] = sb * expf(x[2 * blk + j] - st.m);
  }
  double l_whole = 0.0;
  for (int j = 0; j < 6; j++) l_whole += exp((double)x[j] - 4.0);
  cr_assert_eq(acc.m, 4.0f);
  cr_assert(close_rel(acc.l, l_whole, 1e-6));
  for (int j = 0; j < 6; j++)
    cr_assert(close_rel((double)f[j] / acc.l, exp(x[j] - 4.0) / l_whole, 1e-6));
}

Test(softmax_merge, order_and_empty_blocks) {
  const double x1[2] = {1, 3}, x2[2] = {2, 4}, x3[2] = {3, 2};
  const fg_ref_softmax_f64 b1 = fg_ref_softmax_block_f64(x1, 2);
  const fg_ref_softmax_f64 b2 = fg_ref_softmax_block_f64(x2, 2);
  const fg_ref_softmax_f64 b3 = fg_ref_softmax_block_f64(x3, 2);
  /* Reverse order: the maximum now comes before the other blocks, which get scale_b < 1. */
  fg_ref_softmax_f64 fwd = {-INFINITY, 0}, rev = {-INFINITY, 0};
  fg_ref_softmax_merge_f64(&fwd, b1, NULL, NULL);
  fg_ref_softmax_merge_f64(&fwd, b2, NULL, NULL);
  fg_ref_softmax_merge_f64(&fwd, b3, NULL, NULL);
  fg_ref_softmax_merge_f64(&rev, b3, NULL, NULL);
  fg_ref_softmax_merge_f64(&rev, b2, NULL, NULL);
  double sa, sb;
  fg_ref_softmax_merge_f64(&rev, b1, &sa, &sb);
  cr_assert_eq(sa, 1.0);
  cr_assert(close_rel(sb, exp(-1.0), 1e-15));
  cr_assert_eq(fwd.m, rev.m);
  cr_assert(close_rel(fwd.l, rev.l, 1e-15));

  /* The empty block {-inf, 0} is the identity, on either side. */
  const fg_ref_softmax_f64 empty = fg_ref_softmax_block_f64(NULL, 0);
  cr_assert_eq(empty.m, -INFINITY);
  cr_assert_eq(empty.l, 0.0);
  fg_ref_softmax_f64 a = b2;
  fg_ref_softmax_merge_f64(&a, empty, &sa, &sb);
  cr_assert_eq(a.m, b2.m);
  cr_assert_eq(a.l, b2.l);
  cr_assert_eq(sa, 1.0);
  cr_assert_eq(sb, 0.0);
  fg_ref_softmax_f64 e = empty;
  fg_ref_softmax_merge_f64(&e, empty, &sa, &sb);
  cr_assert_eq(e.m, -INFINITY);
  cr_assert_eq(e.l, 0.0);
  cr_assert_eq(sa, 0.0);
  cr_assert_eq(sb, 0.0);
  /* A fully masked block (all -inf) is empty too. */
  const double masked[3] = {-INFINITY, -INFINITY, -INFINITY};
  const fg_ref_softmax_f64 mb = fg_ref_softmax_block_f64(masked, 3);
  cr_assert_eq(mb.m, -INFINITY);
  cr_assert_eq(mb.l, 0.0);
}

/* ---- The double reference against closed forms. ---- */

Test(reference_f64, one_query_two_keys_d1) {
  const fg_ref_problem p = {1, 1, 1, 1, 2, 1, 0, 1.0};
  const double q[1] = {1}, k[2] = {0, 1}, v[2] = {2, 4};
  double o[1], lse[1];
  cr_assert_eq(fg_ref_attention_f64(&p, q, k, v, o, lse), 0);
  const double e = exp(1.0);
  cr_assert(close_rel(o[0], (2.0 + 4.0 * e) / (1.0 + e), 1e-15), "o = %.17g", o[0]);
  cr_assert(close_rel(lse[0], log(1.0 + e), 1e-15), "lse = %.17g", lse[0]);
}

Test(reference_f64, causal_square_d2) {
  const fg_ref_problem p = {1, 1, 1, 2, 2, 2, 1, 0.5};
  const double q[4] = {1, 0, 0, 2}, k[4] = {2, 0, 1, 1}, v[4] = {1, -1, 3, 5};
  double o[4], lse[2];
  cr_assert_eq(fg_ref_attention_f64(&p, q, k, v, o, lse), 0);
  /* Row 0 sees key 0 only: O = v0, lse = 0.5 * (q0 . k0) = 1. */
  cr_assert_eq(o[0], 1.0);
  cr_assert_eq(o[1], -1.0);
  cr_assert(close_rel(lse[0], 1.0, 1e-15));
  /* Row 1: scores 0.5 * [0, 2] = [0, 1]. */
  const double e = exp(1.0);
  cr_assert(close_rel(o[2], (1.0 + 3.0 * e) / (1.0 + e), 1e-15));
  cr_assert(close_rel(o[3], (-1.0 + 5.0 * e) / (1.0 + e), 1e-15));
  cr_assert(close_rel(lse[1], log(1.0 + e), 1e-15));
}

Test(reference_f64, causal_bottom_right_more_queries_than_keys) {
  /* Nq = 3, Nk = 2: query i sees keys j <= i - 1. */
  const fg_ref_problem p = {1, 1, 1, 3, 2, 1, 1, 1.0};
  const double q[3] = {5, 1, 2}, k[2] = {1, -1}, v[2] = {10, 20};
  double o[3], lse[3];
  cr_assert_eq(fg_ref_visible_keys(&p, 0), 0);
  cr_assert_eq(fg_ref_visible_keys(&p, 1), 1);
  cr_assert_eq(fg_ref_visible_keys(&p, 2), 2);
  cr_assert_eq(fg_ref_attention_f64(&p, q, k, v, o, lse), 0);
  cr_assert_eq(o[0], 0.0);
  cr_assert(isinf(lse[0]) && lse[0] < 0);
  cr_assert_eq(o[1], 10.0);
  cr_assert(close_rel(lse[1], 1.0, 1e-15));
  /* Row 2: scores [2, -2]. */
  const double a = exp(2.0), b = exp(-2.0);
  cr_assert(close_rel(o[2], (10.0 * a + 20.0 * b) / (a + b), 1e-15));
  cr_assert(close_rel(lse[2], log(a + b), 1e-15));
}

Test(reference_f64, gqa_default_scale_d2) {
  /* Two query heads share one K/V head; scale 0 means 1/sqrt(2). */
  const fg_ref_problem p = {1, 2, 1, 1, 2, 2, 0, 0.0};
  const double q[4] = {1, 1, -1, 1}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 7};
  double o[4], lse[2];
  cr_assert_eq(fg_ref_attention_f64(&p, q, k, v, o, lse), 0);
  const double a = 1.0 / sqrt(2.0);
  /* Head 0: equal scores a, a. */
  cr_assert(close_rel(o[0], 2.0, 1e-15));
  cr_assert(close_rel(o[1], 4.5, 1e-15));
  cr_assert(close_rel(lse[0], a + log(2.0), 1e-15));
  /* Head 1: scores -a, a. */
  const double w0 = exp(-a), w1 = exp(a);
  cr_assert(close_rel(o[2], (1.0 * w0 + 3.0 * w1) / (w0 + w1), 1e-15));
  cr_assert(close_rel(o[3], (2.0 * w0 + 7.0 * w1) / (w0 + w1), 1e-15));
  cr_assert(close_rel(lse[1], log(w0 + w1), 1e-15));
}

Test(reference_f64, rejects_invalid_problems) {
  const double x[8] = {0};
  double o[8] = {42}, lse[2] = {42};
  const fg_ref_problem bad[] = {
      {1, 3, 2, 1, 1, 1, 0, 1.0},        /* heads_q not a multiple of heads_kv */
      {-1, 1, 1, 1, 1, 1, 0, 1.0},       /* negative batch */
      {1, 1, 0, 1, 1, 1, 0, 1.0},        /* no K/V heads */
      {1, 1, 1, 1, 1, 0, 0, 1.0},        /* head_dim 0 */
      {1, 1, 1, 1, 1, 1, 0, NAN},        /* scale not finite */
      {1, 1, 1, 1, 1, 1, 0, -1.0},       /* negative scale */
  };
  for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
    cr_assert_eq(fg_ref_attention_f64(&bad[c], x, x, x, o, lse), -1, "case %zu", c);
    cr_assert_eq(o[0], 42.0, "case %zu wrote its output", c);
  }
  float xf[8] = {0}, of[8] = {0};
  const fg_ref_problem ok = {1, 1, 1, 1, 1, 1, 0, 1.0};
  cr_assert_eq(fg_ref_attention_f32_online(&bad[0], 1, 1, xf, xf, xf, of, NULL), -1);
  cr_assert_eq(fg_ref_attention_f32_online(&ok, 0, 1, xf, xf, xf, of, NULL), -1);
  cr_assert_eq(fg_ref_attention_f32_online(&ok, 1, 0, xf, xf, xf, of, NULL), -1);
}

/* ---- The float online tiling against the double reference. ---- */

static uint64_t rng_state;

static double rng_uniform(double lo, double hi) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return lo + (hi - lo) * (double)(z >> 11) * 0x1.0p-53;
}

typedef struct online_case {
  fg_ref_problem p;
  int64_t block_q, block_k;
  int64_t empty_rows; /* query rows per head that see no key */
} online_case;

static const online_case online_cases[] = {
    {{2, 4, 4, 33, 47, 64, 0, 0.0}, 16, 16, 0},
    {{1, 2, 2, 64, 64, 32, 1, 0.0}, 16, 16, 0},    /* causal, square */
    {{2, 4, 2, 17, 129, 40, 1, 0.0}, 8, 32, 0},    /* causal Nq < Nk, GQA 2:1, d = 40 */
    {{1, 8, 1, 20, 7, 64, 1, 0.0}, 4, 4, 13},      /* causal Nq > Nk: 13 rows see nothing; MQA */
    {{3, 2, 1, 5, 1, 128, 0, 0.0}, 4, 16, 0},      /* Nk = 1 */
    {{1, 2, 2, 9, 1, 48, 1, 0.0}, 4, 4, 8},        /* Nk = 1, causal: only the last row sees it */
    {{1, 2, 1, 4, 0, 32, 0, 0.0}, 4, 4, 4},        /* Nk = 0: every row is empty */
    {{1, 4, 2, 128, 256, 128, 0, 0.0}, 64, 32, 0}, /* d = 128 */
    {{1, 2, 2, 70, 70, 64, 1, 1.0}, 16, 16, 0},    /* scale 1: wide score range, heavy rescaling */
    {{1, 1, 1, 31, 93, 256, 1, 0.0}, 16, 64, 0},   /* d = 256, blocks not dividing N */
};

static void check_online_case(const online_case *c, int64_t block_q, int64_t block_k) {
  const fg_ref_problem *p = &c->p;
  const size_t nqe = fg_ref_q_elems(p), nke = fg_ref_kv_elems(p), nle = fg_ref_lse_elems(p);
  float *qf = malloc((nqe + 1) * sizeof *qf), *kf = malloc((nke + 1) * sizeof *kf),
        *vf = malloc((nke + 1) * sizeof *vf), *of = malloc((nqe + 1) * sizeof *of),
        *lf = malloc((nle + 1) * sizeof *lf);
  double *qd = malloc((nqe + 1) * sizeof *qd), *kd = malloc((nke + 1) * sizeof *kd),
         *vd = malloc((nke + 1) * sizeof *vd), *od = malloc((nqe + 1) * sizeof *od),
         *ld = malloc((nle + 1) * sizeof *ld);
  cr_assert(qf && kf && vf && of && lf && qd && kd && vd && od && ld);
  rng_state = 0x5eed0000u + (uint64_t)(c - online_cases);
  /* Inputs are floats; the double reference sees exactly the same values. */
  for (size_t e = 0; e < nqe; e++) qd[e] = qf[e] = (float)rng_uniform(-1.5, 1.5);
  for (size_t e = 0; e < nke; e++) kd[e] = kf[e] = (float)rng_uniform(-1.5, 1.5);
  for (size_t e = 0; e < nke; e++) vd[e] = vf[e] = (float)rng_uniform(-1.0, 1.0);
  for (size_t e = 0; e < nqe; e++) of[e] = NAN, od[e] = NAN; /* every element must be written */
  for (size_t e = 0; e < nle; e++) lf[e] = NAN, ld[e] = NAN;

  cr_assert_eq(fg_ref_attention_f64(p, qd, kd, vd, od, ld), 0);
  cr_assert_eq(fg_ref_attention_f32_online(p, block_q, block_k, qf, kf, vf, of, lf), 0);

  const int64_t d = p->head_dim;
  double max_ref = 0.0, max_err = 0.0;
  for (size_t e = 0; e < nqe; e++) {
    cr_assert(!isnan(of[e]) && !isnan(od[e]), "element %zu not written", e);
    max_ref = fmax(max_ref, fabs(od[e]));
    max_err = fmax(max_err, fabs((double)of[e] - od[e]));
  }
  int64_t empty = 0;
  for (size_t r = 0; r < nle; r++) {
    const int64_t i = (int64_t)(r % (size_t)p->seqlen_q);
    const float *orow = of + r * (size_t)d;
    const double *drow = od + r * (size_t)d;
    if (fg_ref_visible_keys(p, i) == 0) {
      if (r < (size_t)p->seqlen_q) empty++;
      for (int64_t c2 = 0; c2 < d; c2++) {
        cr_assert(orow[c2] == 0.0f && drow[c2] == 0.0, "row %zu sees no key: O must be 0", r);
      }
      cr_assert(isinf(lf[r]) && lf[r] < 0, "row %zu: lse %g, expected -inf", r, (double)lf[r]);
      cr_assert(isinf(ld[r]) && ld[r] < 0);
    } else {
      cr_assert(close_rel(lf[r], ld[r], 1e-5) || fabs(lf[r] - ld[r]) <= 1e-5,
                "row %zu: lse %.9g, reference %.17g", r, (double)lf[r], ld[r]);
    }
  }
  cr_assert_eq(empty, c->empty_rows, "empty rows per head: %lld, expected %lld", (long long)empty,
               (long long)c->empty_rows);
  if (max_ref > 0) {
    cr_assert(max_err / max_ref < 1e-5,
              "case %d (bq %lld, bk %lld): relative error %.3g", (int)(c - online_cases),
              (long long)block_q, (long long)block_k, max_err / max_ref);
  }
  free(qf), free(kf), free(vf), free(of), free(lf);
  free(qd), free(kd), free(vd), free(od), free(ld);
}

Test(online_f32, matches_f64_reference) {
  for (size_t c = 0; c < sizeof online_cases / sizeof online_cases[0]; c++) {
    const online_case *oc = &online_cases[c];
    check_online_case(oc, oc->block_q, oc->block_k);
    check_online_case(oc, 1, 1); /* one key per block: the most merges */
    check_online_case(oc, oc->p.seqlen_q + 1, oc->p.seqlen_k + 1); /* one block: plain softmax */
  }
}

Test(online_f32, lse_may_be_null) {
  const fg_ref_problem p = {1, 1, 1, 3, 5, 32, 1, 0.0};
  float q[96], k[160], v[160], o[96], o2[96], lse[3];
  rng_state = 7;
  for (int e = 0; e < 96; e++) q[e] = (float)rng_uniform(-1, 1);
  for (int e = 0; e < 160; e++) k[e] = (float)rng_uniform(-1, 1), v[e] = (float)rng_uniform(-1, 1);
  cr_assert_eq(fg_ref_attention_f32_online(&p, 2, 2, q, k, v, o, NULL), 0);
  cr_assert_eq(fg_ref_attention_f32_online(&p, 2, 2, q, k, v, o2, lse), 0);
  cr_assert(memcmp(o, o2, sizeof o) == 0);
}

/* ---- fp16 / bf16 conversions. ---- */

Test(convert, bf16_rounds_to_nearest_even) {
  cr_assert_eq(fg_ref_f32_to_bf16(1.0f), 0x3f80);
  cr_assert_eq(fg_ref_f32_to_bf16(1.0f + 0x1p-7f), 0x3f81);          /* exact */
  cr_assert_eq(fg_ref_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);          /* tie, to even (down) */
  cr_assert_eq(fg_ref_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);      /* tie, to even (up) */
  cr_assert_eq(fg_ref_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-16f), 0x3f81); /* above the tie */
  cr_assert_eq(fg_ref_f32_to_bf16(-(1.0f + 0x1p-8f)), 0xbf80);
  cr_assert_eq(fg_ref_f32_to_bf16(-0.0f), 0x8000);
  cr_assert_eq(fg_ref_f32_to_bf16(INFINITY), 0x7f80);
  cr_assert_eq(fg_ref_f32_to_bf16(-INFINITY), 0xff80);
  cr_assert_eq(fg_ref_f32_to_bf16(0x1.fffffep127f), 0x7f80); /* FLT_MAX rounds to infinity */
  cr_assert_eq(fg_ref_f32_to_bf16(0x1.fep127f), 0x7f7f);     /* the largest bf16 */
  const uint16_t nan = fg_ref_f32_to_bf16(NAN);
  cr_assert((nan & 0x7f80) == 0x7f80 && (nan & 0x7f), "NaN became 0x%04x", nan);
  cr_assert(isnan(fg_ref_bf16_to_f32(nan)));
  cr_assert_eq(fg_ref_bf16_to_f32(0x3f81), 1.0f + 0x1p-7f);
  cr_assert_eq(fg_ref_bf16_to_f32(0xc040), -3.0f);
}

Test(convert, f16_rounds_to_nearest_even) {
  cr_assert_eq(fg_ref_f32_to_f16(1.0f), 0x3c00);
  cr_assert_eq(fg_ref_f32_to_f16(1.0f + 0x1p-10f), 0x3c01);
  cr_assert_eq(fg_ref_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie, to even (down) */
  cr_assert_eq(fg_ref_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie, to even (up) */
  cr_assert_eq(fg_ref_f32_to_f16(-2.0f), 0xc000);
  cr_assert_eq(fg_ref_f32_to_f16(65504.0f), 0x7bff);
  cr_assert_eq(fg_ref_f32_to_f16(65519.0f), 0x7bff);
  cr_assert_eq(fg_ref_f32_to_f16(65520.0f), 0x7c00); /* tie between 65504 and 2^16: to infinity */
  cr_assert_eq(fg_ref_f32_to_f16(1e10f), 0x7c00);
  cr_assert_eq(fg_ref_f32_to_f16(-INFINITY), 0xfc00);
  cr_assert_eq(fg_ref_f32_to_f16(0x1p-14f), 0x0400);               /* smallest normal */
  cr_assert_eq(fg_ref_f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);    /* tie: up, to the normal */
  cr_assert_eq(fg_ref_f32_to_f16(0x1p-24f), 0x0001);               /* smallest subnormal */
  cr_assert_eq(fg_ref_f32_to_f16(0x1p-25f), 0x0000);               /* tie, to even (zero) */
  cr_assert_eq(fg_ref_f32_to_f16(0x1.8p-25f), 0x0001);
  cr_assert_eq(fg_ref_f32_to_f16(3 * 0x1p-25f), 0x0002);           /* 1.5 units: tie, to even */
  cr_assert_eq(fg_ref_f32_to_f16(5 * 0x1p-25f), 0x0002);           /* 2.5 units: tie, to even */
  cr_assert_eq(fg_ref_f32_to_f16(-0x1p-26f), 0x8000);
  cr_assert_eq(fg_ref_f32_to_f16(0x1p-140f), 0x0000);              /* float subnormal */
  const uint16_t nan = fg_ref_f32_to_f16(NAN);
  cr_assert((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff), "NaN became 0x%04x", nan);
  cr_assert(isnan(fg_ref_f16_to_f32(nan)));
  cr_assert_eq(fg_ref_f16_to_f32(0x0001), 0x1p-24f);
  cr_assert_eq(fg_ref_f16_to_f32(0x8001), -0x1p-24f);
  cr_assert_eq(fg_ref_f16_to_f32(0x03ff), 1023 * 0x1p-24f);
  cr_assert_eq(fg_ref_f16_to_f32(0x7bff), 65504.0f);
  cr_assert_eq(fg_ref_f16_to_f32(0x7c00), INFINITY);
}

Test(convert, every_pattern_round_trips) {
  for (uint32_t h = 0; h <= 0xffff; h++) {
    const float b = fg_ref_bf16_to_f32((uint16_t)h), f = fg_ref_f16_to_f32((uint16_t)h);
    if (isnan(b)) {
      cr_assert(isnan(fg_ref_bf16_to_f32(fg_ref_f32_to_bf16(b))));
    } else {
      cr_assert_eq(fg_ref_f32_to_bf16(b), h, "bf16 0x%04x -> %a -> 0x%04x", h, (double)b,
                   fg_ref_f32_to_bf16(b));
    }
    if (isnan(f)) {
      cr_assert(isnan(fg_ref_f16_to_f32(fg_ref_f32_to_f16(f))));
    } else {
      cr_assert_eq(fg_ref_f32_to_f16(f), h, "f16 0x%04x -> %a -> 0x%04x", h, (double)f,
                   fg_ref_f32_to_f16(f));
    }
  }
}

/* The result is a nearest representable value, and on a tie the even one. */
static void check_nearest(float x, uint16_t h, float (*back)(uint16_t)) {
  const double xd = x, err = fabs((double)back(h) - xd);
  const uint16_t nb[2] = {(uint16_t)(h - 1), (uint16_t)(h + 1)};
  for (int s = 0; s < 2; s++) {
    if ((nb[s] ^ h) & 0x8000) continue; /* crossed the sign */
    const float y = back(nb[s]);
    if (isnan(y) || isinf(y)) continue;
    const double other = fabs((double)y - xd);
    cr_assert(err < other || (err == other && (h & 1) == 0), "%a -> 0x%04x (%a); 0x%04x is nearer",
              xd, h, (double)back(h), nb[s]);
  }
}

Test(convert, random_floats_round_to_nearest) {
  rng_state = 99;
  for (int t = 0; t < 200000; t++) {
    /* Random bits; exponents cover the fp16 normal and subnormal range. */
    const float mag = (float)ldexp(rng_uniform(1.0, 2.0), (int)rng_uniform(-27, 16));
    const float x = (t & 1) ? -mag : mag;
    check_nearest(x, fg_ref_f32_to_bf16(x), fg_ref_bf16_to_f32);
    if (fabsf(x) < 65504.0f) check_nearest(x, fg_ref_f32_to_f16(x), fg_ref_f16_to_f32);
  }
}

/* The correctness gate's conversions (autotune/half.c) against this file's independent ones, on
 * every 16-bit pattern and on floats around every rounding boundary. */
Test(conversions, gate_matches_reference_implementation) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float b = fg_half_to_f32((uint16_t)h, FG_DTYPE_BF16), f = fg_half_to_f32((uint16_t)h, FG_DTYPE_F16);
    const float rb = fg_ref_bf16_to_f32((uint16_t)h), rf = fg_ref_f16_to_f32((uint16_t)h);
    cr_assert(memcmp(&b, &rb, 4) == 0 || (isnan(b) && isnan(rb)), "bf16 %04x", h);
    cr_assert(memcmp(&f, &rf, 4) == 0 || (isnan(f) && isnan(rf)), "f16 %04x", h);
  }
  uint64_t s = 12345;
  for (int i = 0; i < 200000; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t bits = (uint32_t)(s >> 32);
    float x;
    memcpy(&x, &bits, 4);
    if (isnan(x)) continue;
    cr_assert_eq(fg_f32_to_half(x, FG_DTYPE_BF16), fg_ref_f32_to_bf16(x), "bf16 of %a", (double)x);
    cr_assert_eq(fg_f32_to_half(x, FG_DTYPE_F16), fg_ref_f32_to_f16(x), "f16 of %a", (double)x);
  }
}
