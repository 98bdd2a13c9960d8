/* test_problem.c: the problem key (core/fg_problem.h): the strings tuning records and exported
 * tables hold stay byte-identical, keys from a forward and a backward call, parsing back. */
#include <criterion/criterion.h>
#include <string.h>

#include "fg_problem.h"

static const char *fmt(fg_problem p) {
  static char buf[FG_PROBLEM_KEY_MAX];
  cr_assert_lt(fg_problem_format(&p, buf, sizeof buf), (int)sizeof buf);
  return buf;
}

Test(problem, key_strings_are_pinned) {
  /* These exact strings are in users' caches and exported tables: never change them. */
  cr_assert_str_eq(fmt(fg_problem_make(FG_PASS_FWD, 128, FG_DTYPE_BF16, 1, 4096)),
                   "fwd_d128_bf16_causal_nk4096");
  cr_assert_str_eq(fmt(fg_problem_make(FG_PASS_FWD, 64, FG_DTYPE_F16, 0, 1)),
                   "fwd_d64_f16_noncausal_nk512");
  cr_assert_str_eq(fmt(fg_problem_make(FG_PASS_FWD, 256, FG_DTYPE_F16, 1, 100000)),
                   "fwd_d256_f16_causal_nk16384");
  cr_assert_str_eq(fmt(fg_problem_make(FG_PASS_BWD, 128, FG_DTYPE_BF16, 1, 3000)),
                   "bwd_d128_bf16_causal_nk4096");
  cr_assert_str_eq(fmt(fg_problem_make(FG_PASS_BWD, 32, FG_DTYPE_F16, 0, 513)),
                   "bwd_d32_f16_noncausal_nk1024");
  fg_problem p = fg_problem_make(FG_PASS_FWD, 96, FG_DTYPE_BF16, 0, 2048);
  char pre[FG_PROBLEM_KEY_MAX];
  fg_problem_prefix(&p, pre, sizeof pre);
  cr_assert_str_eq(pre, "fwd_d96_bf16_noncausal_nk");
  cr_assert_eq(fg_problem_key_bucket(fmt(p), pre), 2048);
  /* A query-length bucket, when a key uses one, sits before the key-length bucket. */
  p.nq = 1024;
  cr_assert_str_eq(fmt(p), "fwd_d96_bf16_noncausal_nq1024_nk2048");
  fg_problem_prefix(&p, pre, sizeof pre);
  cr_assert_str_eq(pre, "fwd_d96_bf16_noncausal_nq1024_nk");
}

Test(problem, from_call_arguments) {
  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.dtype = FG_DTYPE_F16;
  a.causal = 1;
  a.head_dim = 64;
  a.seqlen_q = 7;
  a.seqlen_k = 9000;
  cr_assert_str_eq(fmt(fg_problem_from_forward(&a)), "fwd_d64_f16_causal_nk16384");
  fg_attention_backward_args b;
  memset(&b, 0, sizeof b);
  b.dtype = FG_DTYPE_BF16;
  b.causal = 0;
  b.head_dim = 128;
  b.seqlen_q = 4096;
  b.seqlen_k = 600;
  fg_problem p = fg_problem_from_backward(&b);
  cr_assert_str_eq(fmt(p), "bwd_d128_bf16_noncausal_nk1024");
  fg_variant v = fg_problem_builtin(&p, FG_ARCH_SM80);
  cr_assert_eq(v.pass, FG_PASS_BWD);
  cr_assert(fg_problem_served_by(&p, &v));
  v.causal = 1;
  cr_assert_not(fg_problem_served_by(&p, &v), "a causal kernel serves no non-causal key");
  p.pass = FG_PASS_FWD;
  v = fg_problem_builtin(&p, FG_ARCH_SM90A);
  cr_assert_eq(v.pass, FG_PASS_FWD);
  cr_assert(fg_problem_served_by(&p, &v));
}

Test(problem, parse_round_trips_and_refuses) {
  const char *ok[] = {"fwd_d128_bf16_causal_nk4096", "bwd_d64_f16_noncausal_nk512",
                      "fwd_d96_bf16_noncausal_nq1024_nk2048"};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    fg_problem p;
    char err[256] = "";
    cr_assert_eq(fg_problem_parse(ok[i], &p, err, sizeof err), 0, "%s: %s", ok[i], err);
    cr_assert_str_eq(fmt(p), ok[i]);
  }
  fg_problem p;
  cr_assert_eq(fg_problem_parse("fwd_d128_bf16_causal_nk4096", &p, NULL, 0), 0);
  cr_assert_eq(p.pass, FG_PASS_FWD);
  cr_assert_eq(p.d, 128);
  cr_assert_eq(p.dtype, FG_DTYPE_BF16);
  cr_assert_eq(p.causal, 1);
  cr_assert_eq(p.nq, 0);
  cr_assert_eq(p.nk, 4096);
  const struct {
    const char *key, *says;
  } bad[] = {
      {"dec_d128_bf16_causal_nk4096", "unknown op"},
      {"fwd_x128_bf16_causal_nk4096", "head dim"},
      {"fwd_d128_fp16_causal_nk4096", "dtype"},
      {"fwd_d128_bf16_masked_nk4096", "causal or noncausal"},
      {"fwd_d128_bf16_causal_nk", "key-length bucket"},
      {"fwd_d128_bf16_causal_nk04096", "key-length bucket"},
      {"fwd_d128_bf16_causal_nq0_nk4096", "query-length bucket"},
      {"fwd_d128_bf16_causal_nk4096_x", "bucket"},
      {"fwd_d128_bf16_causal_nq512_nk4096_x", "canonical"},
      {"fwd_d128_bf16", "form"},
      {"", "form"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char err[256] = "";
    cr_assert_eq(fg_problem_parse(bad[i].key, &p, err, sizeof err), -1, "%s", bad[i].key);
    cr_assert(strstr(err, bad[i].says), "%s: %s", bad[i].key, err);
  }
}
