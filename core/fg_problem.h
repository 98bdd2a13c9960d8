/* fg_problem.h: the problem key: what dispatch, the registry's exported choices, tune, check,
 * export and explain agree a problem is (op, head dim, dtype, masking, length buckets), built
 * from a call's arguments, formatted into the key strings that tuning records and exported
 * tables hold ("fwd_d128_bf16_causal_nk4096"), and parsed back. */
#ifndef FG_PROBLEM_H
#define FG_PROBLEM_H
#include <stddef.h>
#include <stdint.h>

#include "fg_variant.h"
#include "flashgen.h"

/* Length buckets: a length rounded up to a power of two, clamped to [FG_BUCKET_MIN,
 * FG_BUCKET_MAX]. The one place buckets are defined. */
#define FG_BUCKET_MIN 512
#define FG_BUCKET_MAX 16384
int64_t fg_seqlen_bucket(int64_t seqlen);

typedef struct fg_problem {
  fg_pass pass;  /* the op */
  int d;         /* head dimension */
  fg_dtype dtype;
  int causal;    /* the mask: 0 none, 1 bottom-right causal */
  int64_t nq;    /* query-length bucket; 0 = not part of the key (every key so far) */
  int64_t nk;    /* key-length bucket (fg_seqlen_bucket of seqlen_k) */
} fg_problem;

/* The longest key fg_problem_format writes, with its NUL. */
#define FG_PROBLEM_KEY_MAX 64

/* The problem of a call from its op and raw fields: nk = fg_seqlen_bucket(seqlen_k), nq = 0
 * (keys bucket on seqlen_k only). */
fg_problem fg_problem_make(fg_pass pass, int d, fg_dtype dtype, int causal, int64_t seqlen_k);
/* The same from a forward call's or a backward call's arguments. */
fg_problem fg_problem_from_forward(const fg_attention_args *a);
fg_problem fg_problem_from_backward(const fg_attention_backward_args *b);

/* The key string: "<op>_d<d>_<dtype>_<causal|noncausal>[_nq<nq>]_nk<nk>", e.g.
 * "fwd_d128_bf16_causal_nk4096" or "bwd_d64_f16_noncausal_nk512" (the _nq part only when nq is
 * set). Returns the length snprintf reports. */
int fg_problem_format(const fg_problem *p, char *buf, size_t len);
/* The key without its k-length bucket number ("fwd_d128_bf16_causal_nk"): every key sharing it
 * differs only in that bucket. Returns the length. */
int fg_problem_prefix(const fg_problem *p, char *buf, size_t len);
/* The bucket number off a key that starts with prefix; -1 if it does not. */
int64_t fg_problem_key_bucket(const char *key, const char *prefix);
/* Parses a key that fg_problem_format writes back unchanged. Returns 0 and fills *out, or -1
 * with the field that is wrong in err. */
int fg_problem_parse(const char *key, fg_problem *out, char *err, size_t errlen);

/* Whether v computes p's op for p's head dim, dtype and mask (any block sizes, any arch). */
int fg_problem_served_by(const fg_problem *p, const fg_variant *v);
/* The built-in rule's forward variant for a key-length bucket nk (fg_seqlen_bucket; 0: no
 * length, fg_builtin_variant's): fg_builtin_variant, except on sm_90a, where the length picks
 * the loop order and shape (core/problem.c, each rule with its measurements; README lists them):
 * e.g. with a causal mask d = 64 takes K/V blocks of 64 up to 512 keys and the TMA kernel from
 * 1k (persistent up to 4k, two consumer warpgroups at 1k, three from 2k); three consumers where
 * rows end inside a sector; clusters of two blocks (q_tma_c) at long lengths there; K/V blocks
 * of 64 on the persistent grid without a mask at d = 136-256 up to 512 keys; and the persistent
 * grid taking its tiles from a counter (q_tma_d) at the short lengths where the static order
 * left SMs idle, its two consumers in ping-pong (q_tma_dp) at d = 128 causal up to 512 keys. */
fg_variant fg_builtin_variant_for(int d, fg_dtype dtype, int causal, int64_t nk, fg_arch arch);
/* The most variants the built-in rule picks for one (d, dtype, mask) over all lengths. */
#define FG_BUILTIN_MAX 5
/* Those variants, each once, the length-free one (fg_builtin_variant) first, into out; their
 * count. The default set (generator/build.c) holds them all. */
int fg_builtin_variants(int d, fg_dtype dtype, int causal, fg_arch arch,
                        fg_variant out[FG_BUILTIN_MAX]);
/* The built-in rule's variant for p on arch: fg_builtin_variant_for p's key-length bucket for
 * the forward, fg_builtin_backward_variant for the backward. */
fg_variant fg_problem_builtin(const fg_problem *p, fg_arch arch);
#endif
