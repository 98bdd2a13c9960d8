/* gate.c: the backward pass's correctness gate, one function for `flashgen tune` (a candidate is
 * timed only if it passes) and `flashgen check` (the bwd/ cases): dQ, dK and dV each finite
 * everywhere and within the FlashAttention rule of the fp64 reference, the tolerance set by the
 * error of the naive same-dtype computation (fg_reference_backward). Host only. */
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
