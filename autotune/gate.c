/* gate.c: the one correctness gate of flashgen, shared by `flashgen tune` (a candidate is timed
 * only if it passes) and `flashgen check` (every case that runs a kernel), for each op:
 * - forward (fg_gate_forward): every element of O finite, rows that see no key exactly 0 with
 *   LSE = -inf, the LSE within FG_GATE_LSE_TOL (relative + absolute) of the fp64 LSE, and
 *   max|O - ref| <= 2 * max|naive - ref| + eps(dtype) * max|ref|, naive being the same-dtype
 *   reference kernel;
 * - backward (fg_gate_backward): dQ, dK and dV each finite everywhere and within the same
 *   FlashAttention rule of the fp64 reference plus FG_GATE_FLOOR, the tolerance set by the
 *   error of the naive same-dtype computation (fg_reference_backward).
 * And the random inputs every check fills (fg_rng, fg_fill_random: never zero). Host only. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fg_autotune.h"

#if defined(__GNUC__)
static void gate_fail(fg_gate_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
static void gate_fail(fg_gate_result *r, const char *fmt, ...) {
  if (!r->pass && r->reason[0]) return; /* keep the first failure */
  r->pass = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->reason, sizeof r->reason, fmt, ap);
  va_end(ap);
}

/* ---- Random inputs ----------------------------------------------------------------------- */

uint64_t fg_rng_next(fg_rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double fg_rng_uniform(fg_rng *r) { return (double)(fg_rng_next(r) >> 11) * 0x1.0p-53; }

double fg_rng_normal(fg_rng *r) { /* Box-Muller, one value per two draws */
  double u1 = fg_rng_uniform(r), u2 = fg_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void fg_fill_random(uint16_t *h, int64_t n, fg_rng *r, fg_dtype dt, int normal) {
  for (int64_t i = 0; i < n; i++) {
    uint16_t x = fg_f32_to_half((float)(normal ? fg_rng_normal(r) : 2.0 * fg_rng_uniform(r) - 1.0),
                                dt);
    if ((x & 0x7fffu) == 0) x = dt == FG_DTYPE_BF16 ? 0x3b80 /* 2^-8 */ : 0x1c00; /* never zero */
    h[i] = x;
  }
}

uint64_t fg_seed_of_name(const char *s) { /* FNV-1a */
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* ---- The forward ------------------------------------------------------------------------- */

int fg_gate_forward(const fg_gate_fwd *f, fg_gate_result *r) {
  memset(r, 0, sizeof *r);
  r->pass = 1;
  const int64_t B = f->batch, H = f->heads, N = f->seqlen_q, Nk = f->seqlen_k, d = f->head_dim;
  int64_t os[3] = {f->o_stride[0], f->o_stride[1], f->o_stride[2]};
  if (!os[0] && !os[1] && !os[2]) os[0] = H * N * d, os[1] = N * d, os[2] = d;
  double max_err = 0, max_low = 0, max_ref = 0, lse_err = 0;
  int64_t ref_bad = 0, worst = 0;
  char first_ref[160] = "", first_nan[160] = "", first_nokey[200] = "", first_lse[200] = "";
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < N; i++) {
        const int64_t row = (b * H + h) * N + i;
        const int nokey = Nk == 0 || (f->causal && i + Nk - N < 0);
        for (int64_t c = 0; c < d; c++) {
          const uint16_t bits = f->o[b * os[0] + h * os[1] + i * os[2] + c];
          const double x = fg_half_to_f32(bits, f->dtype);
          const double ref = f->ref_o[row * d + c], low = f->naive_o[row * d + c];
          if (!isfinite(ref) || !isfinite(low)) {
            if (!ref_bad++)
              snprintf(first_ref, sizeof first_ref,
                       "%s O[b=%" PRId64 ", h=%" PRId64 ", i=%" PRId64 ", c=%" PRId64 "] = %g",
                       isfinite(ref) ? "naive" : "fp64", b, h, i, c, isfinite(ref) ? low : ref);
            continue;
          }
          if (!isfinite(x)) {
            if (!r->nonfinite++)
              snprintf(first_nan, sizeof first_nan,
                       "O[b=%" PRId64 ", h=%" PRId64 ", i=%" PRId64 ", c=%" PRId64 "] = 0x%04x", b,
                       h, i, c, bits);
            continue;
          }
          if (nokey && x != 0.0) {
            if (!r->nokey_bad++)
              snprintf(first_nokey, sizeof first_nokey,
                       "O[b=%" PRId64 ", h=%" PRId64 ", i=%" PRId64 ", c=%" PRId64
                       "] = %g in a row that sees no key (expected 0)",
                       b, h, i, c, x);
          }
          const double e = fabs(x - ref);
          if (e > max_err) max_err = e, worst = row * d + c;
          max_low = fmax(max_low, fabs(low - ref));
          max_ref = fmax(max_ref, fabs(ref));
        }
        if (f->lse) {
          const double l = f->lse[row], rl = f->ref_lse[row];
          int bad = 0;
          if (nokey) {
            bad = !(isinf(l) && l < 0);
          } else if (!isfinite(l) || !isfinite(rl)) {
            bad = !(l == rl);
          } else {
            const double e = fabs(l - rl);
            if (e > lse_err) lse_err = e, r->worst[1] = row;
            bad = e > FG_GATE_LSE_TOL * (1.0 + fabs(rl));
          }
          if (bad && !r->lse_bad++)
            snprintf(first_lse, sizeof first_lse,
                     "LSE[b=%" PRId64 ", h=%" PRId64 ", i=%" PRId64 "] = %.9g, reference %.9g%s", b,
                     h, i, l, rl, nokey ? " (row sees no key: expected -inf)" : "");
        }
      }
  const double eps = f->dtype == FG_DTYPE_BF16 ? 0x1.0p-8 : 0x1.0p-11;
  r->err[0] = max_err;
  r->naive_err[0] = max_low;
  r->ref_max[0] = max_ref;
  r->worst[0] = worst;
  r->tol[0] = 2.0 * max_low + eps * max_ref;
  r->err[1] = lse_err;
  r->tol[1] = FG_GATE_LSE_TOL;
  if (ref_bad)
    gate_fail(r, "%" PRId64 " values of the reference O are not finite, first %s; the reference "
              "kernel is broken (check the templates)", ref_bad, first_ref);
  if (r->nonfinite)
    gate_fail(r, "%" PRId64 " elements of O are not finite (unwritten or NaN), first %s",
              r->nonfinite, first_nan);
  if (r->nokey_bad)
    gate_fail(r, "%" PRId64 " elements of rows with no key are not 0, first %s", r->nokey_bad,
              first_nokey);
  if (r->lse_bad) gate_fail(r, "%" PRId64 " LSE values are wrong, first %s", r->lse_bad, first_lse);
  if (max_err > r->tol[0])
    gate_fail(r, "max|O - ref| = %.3e exceeds 2 * max|lowp - ref| + eps * max|ref| = 2 * %.3e + "
              "%.3e", max_err, max_low, eps * max_ref);
  return r->pass;
}

/* ---- The backward ------------------------------------------------------------------------ */

int fg_gate_tensor(const char *what, const uint16_t *x, const double *ref, const double *naive,
                   int64_t n, fg_dtype dtype, int slot, fg_gate_result *r) {
  double err = 0, nerr = 0, mag = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < n; i++) {
    const double v = fg_half_to_f32(x[i], dtype);
    if (!isfinite(v)) {
      r->worst[slot] = i;
      r->err[slot] = INFINITY;
      gate_fail(r, "%s[%" PRId64 "] = %g is not finite (poison left, or NaN)", what, i, v);
      return 0;
    }
    const double e = fabs(v - ref[i]);
    if (e > err) err = e, worst = i;
    nerr = fmax(nerr, fabs(naive[i] - ref[i]));
    mag = fmax(mag, fabs(ref[i]));
  }
  const double eps = dtype == FG_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
  r->err[slot] = err;
  r->naive_err[slot] = nerr;
  r->ref_max[slot] = mag;
  r->worst[slot] = worst;
  r->tol[slot] = 2 * nerr + eps * mag + FG_GATE_FLOOR;
  if (!(err <= r->tol[slot])) {
    gate_fail(r, "%s: max error %.3e over the tolerance %.3e (naive same-dtype error %.3e, "
              "max|ref| %.3e) at index %" PRId64, what, err, r->tol[slot], nerr, mag, worst);
    return 0;
  }
  return 1;
}

int fg_gate_backward(fg_dtype dtype, const uint16_t *dq, const uint16_t *dk, const uint16_t *dv,
                     const double *ref, const double *naive, int64_t nq, int64_t nk,
                     fg_gate_result *r) {
  memset(r, 0, sizeof *r);
  r->pass = 1;
  fg_gate_tensor("dQ", dq, ref, naive, nq, dtype, 0, r);
  fg_gate_tensor("dK", dk, ref + nq, naive + nq, nk, dtype, 1, r);
  fg_gate_tensor("dV", dv, ref + nq + nk, naive + nq + nk, nk, dtype, 2, r);
  return r->pass;
}
