/* cpu_reference.h: the CPU references that kernels are checked against: double-precision standard
 * attention, a float implementation of seed 002's online-softmax tiling, the online-softmax merge
 * both rest on, and fp16/bf16 conversions. Implemented in support_cpu_reference.c; plain C and
 * libm, no flashgen dependency, so the GPU check program can link it too.
 *
 * Layouts are contiguous: Q and O [batch, heads_q, seqlen_q, head_dim], K and V
 * [batch, heads_kv, seqlen_k, head_dim], LSE [batch, heads_q, seqlen_q]. Head h of Q reads K/V
 * head h / (heads_q / heads_kv) (GQA). Causal masking is aligned to the bottom-right corner:
 * query i sees keys j <= i + seqlen_k - seqlen_q. A row that sees no key gets O = 0 and
 * LSE = -inf, as fg_attention_forward documents. */
#ifndef FG_CPU_REFERENCE_H
#define FG_CPU_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

/* One attention problem. scale 0 means 1/sqrt(head_dim), as in fg_attention_args. */
typedef struct fg_ref_problem {
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  int causal;
  double scale;
} fg_ref_problem;

/* Element counts of Q (and O), of K (and V) and of LSE for p. */
size_t fg_ref_q_elems(const fg_ref_problem *p);
size_t fg_ref_kv_elems(const fg_ref_problem *p);
size_t fg_ref_lse_elems(const fg_ref_problem *p);

/* The number of keys query row i sees (0 .. seqlen_k). */
int64_t fg_ref_visible_keys(const fg_ref_problem *p, int64_t i);

/* Standard attention in double precision: for each row, the scores scale*q.k_j are materialised,
 * then a two-pass softmax (max, then sum of exp) weights the rows of V. lse may be NULL.
 * Returns 0, or -1 when p is invalid (negative sizes, heads_kv not dividing heads_q, a
 * non-finite or negative scale) or memory runs out; o and lse are then untouched. */
int fg_ref_attention_f64(const fg_ref_problem *p, const double *q, const double *k, const double *v,
                         double *o, double *lse);

/* Statistics of a partial softmax over some of a row's scores x: m = max x, l = sum exp(x - m).
 * The empty block is {-inf, 0}. */
typedef struct fg_ref_softmax_f64 {
  double m, l;
} fg_ref_softmax_f64;
typedef struct fg_ref_softmax_f32 {
  float m, l;
} fg_ref_softmax_f32;

/* The statistics of the block x[0..n) (n = 0 gives the empty block; -inf scores are masked). */
fg_ref_softmax_f64 fg_ref_softmax_block_f64(const double *x, size_t n);
fg_ref_softmax_f32 fg_ref_softmax_block_f32(const float *x, size_t n);

/* Merges block b into the running statistics *acc (seed 002):
 *   m = max(m_a, m_b),  l = exp(m_a - m) l_a + exp(m_b - m) l_b.
 * *scale_a = exp(m_a - m) and *scale_b = exp(m_b - m) are the factors that bring anything
 * accumulated against m_a or m_b (f(x), or P V) to the new maximum; a side that is empty gets 0.
 * Merging two empty blocks leaves {-inf, 0}. scale_a and scale_b may be NULL. */
void fg_ref_softmax_merge_f64(fg_ref_softmax_f64 *acc, fg_ref_softmax_f64 b, double *scale_a,
                              double *scale_b);
void fg_ref_softmax_merge_f32(fg_ref_softmax_f32 *acc, fg_ref_softmax_f32 b, float *scale_a,
                              float *scale_b);

/* Algorithm 1 of seed 002 (FlashAttention-1) in plain C floats: K/V in blocks of block_k keys
 * (outer loop), Q in blocks of block_q rows (inner loop), with O, l and m kept in memory between
 * iterations; each step merges the block's statistics with fg_ref_softmax_merge_f32 and updates
 * O_i = diag(l_new)^-1 (diag(l) exp(m - m_new) O_i + exp(m~ - m_new) P~ V_j). Same contract as
 * fg_ref_attention_f64 (lse may be NULL); block_q and block_k must be >= 1. */
int fg_ref_attention_f32_online(const fg_ref_problem *p, int64_t block_q, int64_t block_k,
                                const float *q, const float *k, const float *v, float *o,
                                float *lse);

/* IEEE binary16 and bfloat16 bit patterns. Float to half/bf16 rounds to nearest, ties to even;
 * overflow gives infinity, NaN stays NaN (quiet), fp16 subnormals are exact. The conversions back
 * are exact. */
uint16_t fg_ref_f32_to_f16(float x);
float fg_ref_f16_to_f32(uint16_t h);
uint16_t fg_ref_f32_to_bf16(float x);
float fg_ref_bf16_to_f32(uint16_t h);

#endif /* FG_CPU_REFERENCE_H */
