/* support_cpu_reference.c: the CPU references of cpu_reference.h: double-precision standard
 * attention, the float online-softmax tiling of seed 002 (Algorithm 1), the softmax merge and the
 * fp16/bf16 conversions. Linked into every test executable. */
#include "cpu_reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t fg_ref_q_elems(const fg_ref_problem *p) {
  return (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seqlen_q * (size_t)p->head_dim;
}

size_t fg_ref_kv_elems(const fg_ref_problem *p) {
  return (size_t)p->batch * (size_t)p->heads_kv * (size_t)p->seqlen_k * (size_t)p->head_dim;
}

size_t fg_ref_lse_elems(const fg_ref_problem *p) {
  return (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seqlen_q;
}

int64_t fg_ref_visible_keys(const fg_ref_problem *p, int64_t i) {
  if (!p->causal) return p->seqlen_k;
  int64_t n = i + p->seqlen_k - p->seqlen_q + 1; /* keys j <= i + Nk - Nq */
  if (n < 0) return 0;
  return n < p->seqlen_k ? n : p->seqlen_k;
}

/* Checks p and resolves the scale; 0 when p is valid. */
static int ref_check(const fg_ref_problem *p, double *scale) {
  if (p->batch < 0 || p->heads_q < 0 || p->heads_kv < 0 || p->seqlen_q < 0 || p->seqlen_k < 0 ||
      p->head_dim < 1)
    return -1;
  if (p->heads_q > 0 && (p->heads_kv < 1 || p->heads_q % p->heads_kv != 0)) return -1;
  if (!isfinite(p->scale) || p->scale < 0) return -1;
  *scale = p->scale > 0 ? p->scale : 1.0 / sqrt((double)p->head_dim);
  return 0;
}

/* Offset of row n of head h (of a tensor with `heads` heads and `seqlen` rows) in batch b. */
static size_t ref_row(int64_t b, int64_t h, int64_t n, int64_t heads, int64_t seqlen, int64_t d) {
  return (((size_t)b * (size_t)heads + (size_t)h) * (size_t)seqlen + (size_t)n) * (size_t)d;
}

int fg_ref_attention_f64(const fg_ref_problem *p, const double *q, const double *k, const double *v,
                         double *o, double *lse) {
  double scale;
  if (ref_check(p, &scale) != 0) return -1;
  const int64_t d = p->head_dim, nq = p->seqlen_q, nk = p->seqlen_k;
  double *s = malloc((size_t)(nk > 0 ? nk : 1) * sizeof *s); /* one row of scores */
  if (!s) return -1;
  const int64_t group = p->heads_q > 0 ? p->heads_q / p->heads_kv : 1;
  for (int64_t b = 0; b < p->batch; b++) {
    for (int64_t h = 0; h < p->heads_q; h++) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < nq; i++) {
        const double *qi = q + ref_row(b, h, i, p->heads_q, nq, d);
        double *oi = o + ref_row(b, h, i, p->heads_q, nq, d);
        const size_t row = ((size_t)b * (size_t)p->heads_q + (size_t)h) * (size_t)nq + (size_t)i;
        double *lsei = lse ? lse + row : NULL;
        const int64_t n = fg_ref_visible_keys(p, i);
        for (int64_t c = 0; c < d; c++) oi[c] = 0.0;
        if (n == 0) {
          if (lsei) *lsei = -INFINITY;
          continue;
        }
        double m = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
          const double *kj = k + ref_row(b, hk, j, p->heads_kv, nk, d);
          double dot = 0.0;
          for (int64_t c = 0; c < d; c++) dot += qi[c] * kj[c];
          s[j] = scale * dot;
          if (s[j] > m) m = s[j];
        }
        double l = 0.0;
        for (int64_t j = 0; j < n; j++) {
          const double *vj = v + ref_row(b, hk, j, p->heads_kv, nk, d);
          const double pj = exp(s[j] - m);
          l += pj;
          for (int64_t c = 0; c < d; c++) oi[c] += pj * vj[c];
        }
        for (int64_t c = 0; c < d; c++) oi[c] /= l;
        if (lsei) *lsei = m + log(l);
      }
    }
  }
  free(s);
  return 0;
}

fg_ref_softmax_f64 fg_ref_softmax_block_f64(const double *x, size_t n) {
  fg_ref_softmax_f64 r = {-INFINITY, 0.0};
  for (size_t j = 0; j < n; j++)
    if (x[j] > r.m) r.m = x[j];
  if (r.m == -INFINITY) return r;
  for (size_t j = 0; j < n; j++)
    if (x[j] != -INFINITY) r.l += exp(x[j] - r.m);
  return r;
}

fg_ref_softmax_f32 fg_ref_softmax_block_f32(const float *x, size_t n) {
  fg_ref_softmax_f32 r = {-INFINITY, 0.0f};
  for (size_t j = 0; j < n; j++)
    if (x[j] > r.m) r.m = x[j];
  if (r.m == -INFINITY) return r;
  for (size_t j = 0; j < n; j++)
    if (x[j] != -INFINITY) r.l += expf(x[j] - r.m);
  return r;
}

void fg_ref_softmax_merge_f64(fg_ref_softmax_f64 *acc, fg_ref_softmax_f64 b, double *scale_a,
                              double *scale_b) {
  const double m = acc->m > b.m ? acc->m : b.m;
  const double sa = acc->m == -INFINITY ? 0.0 : exp(acc->m - m);
  const double sb = b.m == -INFINITY ? 0.0 : exp(b.m - m);
  acc->l = sa * acc->l + sb * b.l;
  acc->m = m;
  if (scale_a) *scale_a = sa;
  if (scale_b) *scale_b = sb;
}

void fg_ref_softmax_merge_f32(fg_ref_softmax_f32 *acc, fg_ref_softmax_f32 b, float *scale_a,
                              float *scale_b) {
  const float m = acc->m > b.m ? acc->m : b.m;
  const float sa = acc->m == -INFINITY ? 0.0f : expf(acc->m - m);
  const float sb = b.m == -INFINITY ? 0.0f : expf(b.m - m);
  acc->l = sa * acc->l + sb * b.l;
  acc->m = m;
  if (scale_a) *scale_a = sa;
  if (scale_b) *scale_b = sb;
}

int fg_ref_attention_f32_online(const fg_ref_problem *p, int64_t block_q, int64_t block_k,
                                const float *q, const float *k, const float *v, float *o,
                                float *lse) {
  double scale_d;
  if (ref_check(p, &scale_d) != 0 || block_q < 1 || block_k < 1) return -1;
  const float scale = (float)scale_d;
  const int64_t d = p->head_dim, nq = p->seqlen_q, nk = p->seqlen_k;
  /* "HBM" state of Algorithm 1 for one head: m and l per query row; O lives in o itself. */
  float *m = malloc((size_t)(nq > 0 ? nq : 1) * sizeof *m);
  float *l = malloc((size_t)(nq > 0 ? nq : 1) * sizeof *l);
  float *s = malloc((size_t)block_k * sizeof *s);  /* one row of S_ij */
  float *pv = malloc((size_t)d * sizeof *pv);      /* one row of P~_ij V_j */
  if (!m || !l || !s || !pv) {
    free(m), free(l), free(s), free(pv);
    return -1;
  }
  const int64_t group = p->heads_q > 0 ? p->heads_q / p->heads_kv : 1;
  for (int64_t b = 0; b < p->batch; b++) {
    for (int64_t h = 0; h < p->heads_q; h++) {
      const int64_t hk = h / group;
      float *oh = o + ref_row(b, h, 0, p->heads_q, nq, d);
      /* Line 2: O = 0, l = 0, m = -inf. */
      for (size_t e = 0; e < (size_t)nq * (size_t)d; e++) oh[e] = 0.0f;
      for (int64_t i = 0; i < nq; i++) m[i] = -INFINITY, l[i] = 0.0f;
      /* Line 5: outer loop over K/V blocks. */
      for (int64_t j0 = 0; j0 < nk; j0 += block_k) {
        const int64_t bc = nk - j0 < block_k ? nk - j0 : block_k;
        /* Line 7: inner loop over Q blocks. */
        for (int64_t i0 = 0; i0 < nq; i0 += block_q) {
          const int64_t i1 = nq - i0 < block_q ? nq : i0 + block_q;
          for (int64_t i = i0; i < i1; i++) {
            const float *qi = q + ref_row(b, h, i, p->heads_q, nq, d);
            float *oi = oh + (size_t)i * (size_t)d;
            const int64_t n = fg_ref_visible_keys(p, i);
            /* Line 9: S_ij = scale Q_i K_j^T, masked keys at -inf. */
            for (int64_t jj = 0; jj < bc; jj++) {
              const int64_t j = j0 + jj;
              if (j >= n) {
                s[jj] = -INFINITY;
                continue;
              }
              const float *kj = k + ref_row(b, hk, j, p->heads_kv, nk, d);
              float dot = 0.0f;
              for (int64_t c = 0; c < d; c++) dot += qi[c] * kj[c];
              s[jj] = scale * dot;
            }
            /* Line 10: m~, P~ = exp(S - m~), l~. */
            const fg_ref_softmax_f32 blk = fg_ref_softmax_block_f32(s, (size_t)bc);
            if (blk.m == -INFINITY) continue; /* the whole block is masked for this row */
            for (int64_t c = 0; c < d; c++) pv[c] = 0.0f;
            for (int64_t jj = 0; jj < bc; jj++) {
              if (s[jj] == -INFINITY) continue;
              const float pj = expf(s[jj] - blk.m);
              const float *vj = v + ref_row(b, hk, j0 + jj, p->heads_kv, nk, d);
              for (int64_t c = 0; c < d; c++) pv[c] += pj * vj[c];
            }
            /* Lines 11-13: m_new, l_new; O_i rescaled and renormalised; m, l written back. */
            const fg_ref_softmax_f32 old = {m[i], l[i]};
            fg_ref_softmax_f32 acc = old;
            float sa, sb;
            fg_ref_softmax_merge_f32(&acc, blk, &sa, &sb);
            for (int64_t c = 0; c < d; c++) oi[c] = (old.l * sa * oi[c] + sb * pv[c]) / acc.l;
            m[i] = acc.m;
            l[i] = acc.l;
          }
        }
      }
      if (lse) {
        float *lh = lse + ((size_t)b * (size_t)p->heads_q + (size_t)h) * (size_t)nq;
        for (int64_t i = 0; i < nq; i++) lh[i] = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
      }
    }
  }
  free(m), free(l), free(s), free(pv);
  return 0;
}

/* ---- fp16 / bf16 ---- */

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* q + 1 when the discarded bits `rem` (out of 2^shift) round q up, to nearest, ties to even. */
static uint32_t round_rne(uint32_t q, uint32_t rem, unsigned shift) {
  const uint32_t half = 1u << (shift - 1);
  return q + (rem > half || (rem == half && (q & 1u)));
}

uint16_t fg_ref_f32_to_f16(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t exp = (u >> 23) & 0xffu;
  const uint32_t man = u & 0x7fffffu;
  if (exp == 0xffu) /* inf, or NaN kept quiet with its top payload bits */
    return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
  const int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    /* Subnormal half: count units of 2^-24. The float is (man | 2^23) * 2^(exp - 150), so the
     * count is that mantissa shifted right by 126 - exp. Float subnormals (exp 0) are far below. */
    if (exp == 0) return (uint16_t)sign;
    const unsigned shift = (unsigned)(126 - (int)exp);
    if (shift > 25) return (uint16_t)sign; /* below 2^-25: rounds to zero */
    const uint32_t full = man | 0x800000u;
    return (uint16_t)(sign | round_rne(full >> shift, full & ((1u << shift) - 1u), shift));
  }
  /* A carry out of the mantissa moves into the exponent, up to infinity, as it should. */
  const uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13);
  return (uint16_t)round_rne(h, man & 0x1fffu, 13);
}

float fg_ref_f16_to_f32(uint16_t h) {
  const uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  const uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
  const uint32_t man = (uint32_t)h & 0x3ffu;
  if (exp == 0) {
    const float mag = ldexpf((float)man, -24); /* exact: at most 10 significant bits */
    return sign ? -mag : mag;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
  return f32_from_bits(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

uint16_t fg_ref_f32_to_bf16(float x) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)(round_rne(u >> 16, u & 0xffffu, 16));
}

float fg_ref_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }
