/* test_problem.c: the problem key (core/fg_problem.h): the strings tuning records and exported
 * tables hold stay byte-identical, keys from a forward and a backward call, parsing back; the
 * built-in rule by key length. */
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

/* fg_builtin_variant_for with q_tma_d (and q_tma_dp, its consumers in ping-pong) read as the
 * q_tma_p it takes its tiles from a counter in (which lengths take them: builtin_rule_dynamic
 * below). */
static fg_variant rule_static(int d, fg_dtype dtype, int causal, int64_t nk, fg_arch arch) {
  fg_variant v = fg_builtin_variant_for(d, dtype, causal, nk, arch);
  if (v.loop == FG_LOOP_Q_TMA_D || v.loop == FG_LOOP_Q_TMA_DP) v.loop = FG_LOOP_Q_TMA_P;
  return v;
}

/* The built-in rule by key length (fg_builtin_variant_for): on sm_90a with a causal mask, d = 64
 * runs the wgmma kernel with K/V blocks of 64 at 512, the persistent TMA kernel at 1k (two
 * consumer warpgroups, 4 stages) and 2k-4k (three) and the plain one from 8k; below 64 the
 * persistent one (causal: two consumers up to 1k, three from 2k; 4 stages up to 1k with a mask
 * or without); a head dim padded up to 128 (d = 72-120) the
 * persistent one with three consumers from 2k keys, with or without a mask (causal d = 88, 104
 * from 1k, Bc 96 there); d = 136, 152, 168
 * (rows ending inside a sector) three consumers at every length without a mask and from 1k
 * (168: 2k) with one; the other d = 136-184 causal the plain grid from 4k; without a mask the
 * other d = 136-256 take K/V blocks of 64 on the persistent grid at 512 (d = 256 up to 4k), and
 * with one d = 240 and 256 the persistent grid from 1k to 8k; clusters of two blocks
 * (q_tma_c) where rows end inside a sector without a mask: d = 200-232 at every length, 248 from
 * 1k, 184 from 2k, and from 4k on top of three consumers at d = 72-104 and 136-152, on two
 * (Bc 96) at d = 168; with one d = 200-232 from 1k, 184, 248 and 168 (on two) from 4k, and on
 * three consumers at d = 72-104 and 136-152 from 8k; every other problem (d = 128 at every length), and every other arch, the length-free
 * rule. fg_problem_builtin follows the call's bucket, and
 * fg_builtin_variants lists each variant once, the length-free one first. */
Test(problem, builtin_rule_by_length) {
  const int64_t buckets[] = {512, 1024, 2048, 4096, 8192, 16384};
  for (int dt = FG_DTYPE_F16; dt <= FG_DTYPE_BF16; dt++) {
    const fg_variant base64 = fg_builtin_variant(64, (fg_dtype)dt, 1, FG_ARCH_SM90A);
    cr_assert_eq(base64.loop, FG_LOOP_Q_WGMMA);
    for (size_t i = 0; i < 6; i++) {
      const fg_variant v = rule_static(64, (fg_dtype)dt, 1, buckets[i], FG_ARCH_SM90A);
      const fg_loop_order want = buckets[i] <= 512    ? FG_LOOP_Q_WGMMA
                                 : buckets[i] <= 4096 ? FG_LOOP_Q_TMA_P
                                                      : FG_LOOP_Q_TMA;
      cr_assert_eq(v.loop, want, "d = 64 causal, nk %lld", (long long)buckets[i]);
      const int warps = buckets[i] <= 1024 ? 8 : 12;
      if (want != FG_LOOP_Q_WGMMA)
        cr_assert(v.warps == warps && v.br == 16 * warps && v.bc == 128 &&
                  v.stages == (buckets[i] <= 1024 ? 4 : 2) &&
                  v.causal == 1 && v.d == 64 && v.dtype == (fg_dtype)dt &&
                  v.arch == FG_ARCH_SM90A);
      else {
        fg_variant w = v;
        cr_assert_eq(w.bc, 64);
        w.bc = base64.bc;
        cr_assert(memcmp(&w, &base64, sizeof w) == 0);
      }
      /* Padded up to 128 (d = 72-120): the persistent grid, three consumers (Br 192, the key
       * block fg_builtin_w12_bc gives) from 2k keys with or without a mask, and at every length
       * without one at d = 72, 88, 104 (with one d = 88 and 104 at 1k too, Bc 96; without one
       * from 4k on clusters); two (Br 128, Bc 128) else. */
      const int padded[] = {72, 88, 96, 104, 112, 120};
      const int w12_bc[] = {112, 112, 96, 96, 96, 80};
      for (size_t k = 0; k < 6; k++)
        for (int c = 0; c <= 1; c++) {
          const fg_variant w =
              rule_static(padded[k], (fg_dtype)dt, c, buckets[i], FG_ARCH_SM90A);
          const fg_variant wb = fg_builtin_variant(padded[k], (fg_dtype)dt, c, FG_ARCH_SM90A);
          const int always = !c && padded[k] % 16 == 8 && padded[k] <= 104;
          cr_assert(wb.loop == FG_LOOP_Q_TMA_P && wb.stages == 2 &&
                        wb.warps == (always ? 12 : 8) && wb.bc == (always ? w12_bc[k] : 128),
                    "d = %d causal %d", padded[k], c);
          const int at1k = c && (padded[k] == 88 || padded[k] == 104) && buckets[i] == 1024;
          const int three = always || at1k || buckets[i] >= 2048;
          const int mid = padded[k] % 16 == 8 && padded[k] <= 104;
          const fg_loop_order loop = mid && buckets[i] >= (c ? 8192 : 4096) ? FG_LOOP_Q_TMA_C
                                                                            : FG_LOOP_Q_TMA_P;
          cr_assert(w.loop == loop && w.stages == 2 && w.warps == (three ? 12 : 8) &&
                        w.br == 16 * w.warps && w.bc == (at1k ? 96 : three ? w12_bc[k] : 128),
                    "d = %d causal %d nk %lld", padded[k], c, (long long)buckets[i]);
        }
      /* Below 64: the persistent grid; causal two consumers (4 stages) up to 1k keys, three from 2k;
       * without a mask three (4 stages up to 1k). */
      for (int d = 32; d < 64; d += 8) {
        const fg_variant c = rule_static(d, (fg_dtype)dt, 1, buckets[i], FG_ARCH_SM90A);
        const int w = buckets[i] >= 2048 ? 12 : 8;
        cr_assert(c.loop == FG_LOOP_Q_TMA_P && c.warps == w && c.br == 16 * w && c.bc == 128 &&
                      c.stages == (buckets[i] <= 1024 ? 4 : 2),
                  "d = %d causal nk %lld", d, (long long)buckets[i]);
        const fg_variant n = rule_static(d, (fg_dtype)dt, 0, buckets[i], FG_ARCH_SM90A);
        cr_assert(n.loop == FG_LOOP_Q_TMA_P && n.warps == 12 && n.br == 192 && n.bc == 128 &&
                      n.stages == (buckets[i] <= 1024 ? 4 : 2),
                  "d = %d nk %lld", d, (long long)buckets[i]);
        const fg_variant b = fg_builtin_variant(d, (fg_dtype)dt, 1, FG_ARCH_SM90A);
        cr_assert(b.loop == FG_LOOP_Q_TMA_P && b.warps == 8 && b.bc == 128, "d = %d causal", d);
      }
      /* Padded up to 192, rows ending inside a sector: three consumers at every length without
       * a mask, with one from 1k (d = 168: 2k), on the plain grid with Bc 80 / 64 and on the
       * persistent one with Bc 48 (d = 168; causal below 4k only); without a mask from 4k on
       * clusters (d = 168 there on two consumers, Bc 96). */
      const int sector[] = {136, 152, 168};
      const int sector_bc[] = {80, 64, 48};
      for (size_t k = 0; k < 3; k++)
        for (int c = 0; c <= 1; c++) {
          const int d = sector[k];
          const fg_variant w = rule_static(d, (fg_dtype)dt, c, buckets[i], FG_ARCH_SM90A);
          if ((!c || d == 168) && buckets[i] >= 4096) {
            cr_assert(w.loop == FG_LOOP_Q_TMA_C && w.stages == 2 &&
                          w.warps == (d == 168 ? 8 : 12) && w.br == 16 * w.warps &&
                          w.bc == (d == 168 ? 96 : sector_bc[k]),
                      "d = %d nk %lld", d, (long long)buckets[i]);
            continue;
          }
          const int three = !c || buckets[i] >= (d < 168 ? 1024 : 2048);
          const int persistent = three ? d == 168 && (!c || buckets[i] < 4096) : buckets[i] < 4096;
          const int cluster = c && buckets[i] >= 8192;
          cr_assert(w.warps == (three ? 12 : 8) && w.br == 16 * w.warps &&
                        w.bc == (three ? sector_bc[k] : c ? 64 : 96) && w.stages == 2 &&
                        w.loop == (cluster      ? FG_LOOP_Q_TMA_C
                                   : persistent ? FG_LOOP_Q_TMA_P
                                                : FG_LOOP_Q_TMA),
                    "d = %d causal %d nk %lld", d, c, (long long)buckets[i]);
        }
      /* Clusters past d = 176 where rows end inside a sector (no mask): d = 216 as 200, d = 232
       * with Bc 64 at every length, d = 248 with Bc 64 from 1k (the persistent grid's Bc 64 at
       * 512), d = 184 with Bc 64 from 2k (the length-free rule below); causal below. */
      const int past[] = {184, 216, 232, 248};
      for (size_t k = 0; k < 4; k++) {
        const int d = past[k];
        const fg_variant a = rule_static(d, (fg_dtype)dt, 0, buckets[i], FG_ARCH_SM90A);
        const fg_variant b = fg_builtin_variant(d, (fg_dtype)dt, 0, FG_ARCH_SM90A);
        const int from = d == 184 ? 2048 : d == 248 ? 1024 : 512;
        const int bc = d == 216 && buckets[i] > 512 ? 80 : 64;
        if (buckets[i] >= from)
          cr_assert(a.loop == FG_LOOP_Q_TMA_C && a.bc == bc && a.warps == 8 && a.br == 128 &&
                        a.stages == 2,
                    "d = %d nk %lld", d, (long long)buckets[i]);
        else if (buckets[i] == 512)
          cr_assert(a.loop == FG_LOOP_Q_TMA_P && a.bc == 64 && a.warps == 8, "d = %d 512", d);
        else
          cr_assert(memcmp(&a, &b, sizeof a) == 0, "d = %d nk %lld", d, (long long)buckets[i]);
        /* With a causal mask: d = 216, 232 from 1k, 248 and 184 (Bc 80) from 4k. */
        const fg_variant ac = rule_static(d, (fg_dtype)dt, 1, buckets[i], FG_ARCH_SM90A);
        const int cfrom = d == 184 || d == 248 ? 4096 : 1024;
        cr_assert_eq(ac.loop == FG_LOOP_Q_TMA_C, buckets[i] >= cfrom, "d = %d causal nk %lld", d,
                     (long long)buckets[i]);
        if (buckets[i] >= cfrom)
          cr_assert(ac.bc == (d == 184 ? 80 : 64) && ac.warps == 8 && ac.br == 128, "d = %d causal", d);
      }
      /* No mask: K/V blocks of 64 on the persistent grid at 512 from d = 144 (d = 192 up to 1k,
       * d = 256 up to 4k), else the length-free rule; other archs, and with a mask d = 128 and 192:
       * the length-free rule; d = 256 with a mask the persistent grid from 1k to 8k. */
      const int ds[] = {64, 96, 128, 144, 192, 200, 256};
      for (size_t k = 0; k < 7; k++) {
        fg_variant a = rule_static(ds[k], (fg_dtype)dt, 0, buckets[i], FG_ARCH_SM90A);
        fg_variant b = fg_builtin_variant(ds[k], (fg_dtype)dt, 0, FG_ARCH_SM90A);
        if (ds[k] == 200) { /* clusters at every length: Bc 64 at 512, the length-free 80 from 1k */
          cr_assert(a.loop == FG_LOOP_Q_TMA_C && b.loop == FG_LOOP_Q_TMA && b.bc == 80 &&
                        a.bc == (buckets[i] == 512 ? 64 : 80),
                    "d = 200 non-causal");
          a.loop = b.loop;
          a.bc = b.bc;
          cr_assert(memcmp(&a, &b, sizeof a) == 0, "d = 200 non-causal");
        } else if (ds[k] > 128 && (buckets[i] == 512 || (ds[k] == 192 && buckets[i] == 1024) ||
                                   (ds[k] == 256 && buckets[i] <= 4096))) {
          cr_assert(a.loop == FG_LOOP_Q_TMA_P && a.bc == 64 && a.br == b.br &&
                        a.warps == b.warps && a.stages == b.stages,
                    "d = %d non-causal 512", ds[k]);
          cr_assert(b.bc != 64);
        } else if (ds[k] == 64 && buckets[i] <= 1024) { /* d <= 64 up to 1k: 4 stages */
          cr_assert(a.stages == 4 && b.stages == 2, "d = 64 non-causal");
          a.stages = b.stages;
          cr_assert(memcmp(&a, &b, sizeof a) == 0, "d = 64 non-causal");
        } else if (ds[k] == 96 && buckets[i] >= 2048) {
          cr_assert(a.warps == 12 && b.warps == 8, "d = 96 non-causal");
        } else {
          cr_assert(memcmp(&a, &b, sizeof a) == 0, "d = %d non-causal", ds[k]);
        }
        a = rule_static(ds[k], (fg_dtype)dt, 1, buckets[i], FG_ARCH_SM80);
        b = fg_builtin_variant(ds[k], (fg_dtype)dt, 1, FG_ARCH_SM80);
        cr_assert(memcmp(&a, &b, sizeof a) == 0, "d = %d sm_80", ds[k]);
        a = rule_static(ds[k], (fg_dtype)dt, 0, buckets[i], FG_ARCH_SM80);
        b = fg_builtin_variant(ds[k], (fg_dtype)dt, 0, FG_ARCH_SM80);
        cr_assert(memcmp(&a, &b, sizeof a) == 0, "d = %d sm_80 non-causal", ds[k]);
        if (ds[k] != 64 && ds[k] != 96) {
          a = rule_static(ds[k], (fg_dtype)dt, 1, buckets[i], FG_ARCH_SM90A);
          b = fg_builtin_variant(ds[k], (fg_dtype)dt, 1, FG_ARCH_SM90A);
          if (ds[k] == 144 && buckets[i] >= 4096) { /* d = 136-184 causal: the plain grid from 4k */
            cr_assert(b.loop == FG_LOOP_Q_TMA_P && a.loop == FG_LOOP_Q_TMA);
            a.loop = b.loop;
          }
          if (ds[k] == 256 && buckets[i] >= 1024 && buckets[i] <= 8192) {
            /* d = 240, 256 causal: the persistent grid from 1k to 8k */
            cr_assert(b.loop == FG_LOOP_Q_TMA && a.loop == FG_LOOP_Q_TMA_P && a.bc == 64 && b.bc == 64);
            a.loop = b.loop;
          }
          if (ds[k] == 200 && buckets[i] >= 1024) { /* d = 200-232 causal: clusters from 1k */
            cr_assert(b.loop == FG_LOOP_Q_TMA && a.loop == FG_LOOP_Q_TMA_C && a.bc == 64 && b.bc == 64);
            a.loop = b.loop;
          }
          cr_assert(memcmp(&a, &b, sizeof a) == 0, "d = %d causal", ds[k]);
        }
      }
    }
    /* No length: the length-free rule. */
    const fg_variant z = rule_static(64, (fg_dtype)dt, 1, 0, FG_ARCH_SM90A);
    cr_assert(memcmp(&z, &base64, sizeof z) == 0);
    /* A call's problem: seqlen_k 5000 is bucket 8192, so the plain TMA kernel. */
    const fg_problem p = fg_problem_make(FG_PASS_FWD, 64, (fg_dtype)dt, 1, 5000);
    cr_assert_eq(fg_problem_builtin(&p, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA);
    /* Each variant once, the length-free one first. */
    fg_variant out[FG_BUILTIN_MAX];
    cr_assert_eq(fg_builtin_variants(64, (fg_dtype)dt, 1, FG_ARCH_SM90A, out), FG_BUILTIN_MAX);
    cr_assert(memcmp(&out[0], &base64, sizeof base64) == 0);
    cr_assert(out[1].loop == FG_LOOP_Q_WGMMA && out[1].bc == 64);
    cr_assert(out[2].loop == FG_LOOP_Q_TMA_D && out[2].warps == 8);
    cr_assert(out[3].loop == FG_LOOP_Q_TMA_D && out[3].warps == 12);
    cr_assert(out[4].loop == FG_LOOP_Q_TMA && out[4].warps == 12);
    cr_assert_eq(fg_builtin_variants(128, (fg_dtype)dt, 1, FG_ARCH_SM90A, out), 3);
    cr_assert(out[0].loop == FG_LOOP_Q_TMA_P && out[1].loop == FG_LOOP_Q_TMA_DP &&
              out[2].loop == FG_LOOP_Q_TMA_D);
    cr_assert_eq(fg_builtin_variants(96, (fg_dtype)dt, 1, FG_ARCH_SM90A, out), 3);
    cr_assert(out[0].loop == FG_LOOP_Q_TMA_P && out[0].warps == 8 && out[1].loop == FG_LOOP_Q_TMA_D &&
              out[1].warps == 8 && out[2].loop == FG_LOOP_Q_TMA_P && out[2].warps == 12 &&
              out[2].bc == 96);
    cr_assert_eq(fg_builtin_variants(72, (fg_dtype)dt, 0, FG_ARCH_SM90A, out), 3); /* always 3 */
    cr_assert(out[1].loop == FG_LOOP_Q_TMA_D && out[2].loop == FG_LOOP_Q_TMA_C &&
              out[2].warps == 12 && out[2].bc == out[0].bc);
    cr_assert_eq(fg_builtin_variants(128, (fg_dtype)dt, 0, FG_ARCH_SM90A, out), 2);
    cr_assert(out[0].loop == FG_LOOP_Q_TMA_P && out[1].loop == FG_LOOP_Q_TMA_D && out[1].bc == out[0].bc);
    cr_assert_eq(fg_builtin_variants(256, (fg_dtype)dt, 1, FG_ARCH_SM90A, out), 2);
    cr_assert(out[0].loop == FG_LOOP_Q_TMA && out[1].loop == FG_LOOP_Q_TMA_D && out[1].bc == 64);
    cr_assert_eq(fg_builtin_variants(192, (fg_dtype)dt, 0, FG_ARCH_SM90A, out), 2);
    cr_assert(out[1].loop == FG_LOOP_Q_TMA_D && out[1].bc == 64);
    cr_assert_eq(fg_builtin_variants(64, (fg_dtype)dt, 1, FG_ARCH_SM80, out), 1);
  }
}

/* fg_builtin_variants stops at FG_BUILTIN_MAX without a word: every (d, dtype, mask, arch) must
 * list every variant its lengths pick (d = 64 and 88 causal take all 5 on sm_90a), so that the
 * default set and the tuner hold each of them. */
Test(problem, builtin_variants_list_every_length) {
  const int64_t buckets[] = {512, 1024, 2048, 4096, 8192, 16384};
  for (int arch = 0; arch < FG_ARCH_COUNT; arch++)
    for (int dt = FG_DTYPE_F16; dt <= FG_DTYPE_BF16; dt++)
      for (int d = 32; d <= 256; d += 8)
        for (int c = 0; c <= 1; c++) {
          fg_variant out[FG_BUILTIN_MAX];
          const int n = fg_builtin_variants(d, (fg_dtype)dt, c, (fg_arch)arch, out);
          for (size_t i = 0; i < 6; i++) {
            const fg_variant v = fg_builtin_variant_for(d, (fg_dtype)dt, c, buckets[i], (fg_arch)arch);
            int listed = 0;
            for (int k = 0; k < n && !listed; k++) listed = memcmp(&v, &out[k], sizeof v) == 0;
            cr_assert(listed, "arch %d d = %d causal %d nk %lld: the rule's variant is past the "
                      "list's %d (raise FG_BUILTIN_MAX)", arch, d, c, (long long)buckets[i], n);
          }
        }
}

/* The persistent grid taking its tiles from a counter (q_tma_d) where the static order left SMs
 * idle (core/problem.c, fg_builtin_dynamic): with a mask up to 1k keys on two consumers at
 * d <= 160 but 72, 176 and 192, and d = 64 up to 4k; without one at 512 keys at d <= 72, and d =
 * 128 and 192 up to 1k (d = 192 with the 512 keys' K/V blocks of 64 at 1k too); with a mask
 * d = 240 and 256 wherever the persistent grid is theirs (1k-8k); with a mask at
 * 512 keys at d = 128 its consumers in ping-pong (q_tma_dp). Everything else about the
 * variant is the rule's q_tma_p; no other loop order changes. */
Test(problem, builtin_rule_dynamic) {
  const int64_t buckets[] = {512, 1024, 2048, 4096, 8192, 16384};
  /* The rows that take it, by mask and head dim: from / to key-length buckets (d = 88, 104, 136
   * and 152 with a mask run three consumers from 1k, so q_tma_d at 512 only). */
  static const struct {
    int causal, d;
    int64_t from, to;
  } rows[] = {{1, 32, 512, 1024},  {1, 40, 512, 1024},  {1, 48, 512, 1024},  {1, 56, 512, 1024},
              {1, 64, 1024, 4096}, {1, 80, 512, 1024},  {1, 88, 512, 512},   {1, 96, 512, 1024},
              {1, 104, 512, 512},  {1, 112, 512, 1024}, {1, 120, 512, 1024}, {1, 128, 512, 1024},
              {1, 136, 512, 512},  {1, 144, 512, 1024}, {1, 152, 512, 512},  {1, 160, 512, 1024},
              {1, 176, 512, 1024}, {1, 192, 512, 1024}, {1, 240, 1024, 8192}, {1, 256, 1024, 8192},
              {0, 32, 512, 512},   {0, 40, 512, 512},
              {0, 48, 512, 512},   {0, 56, 512, 512},   {0, 64, 512, 512},   {0, 72, 512, 512},
              {0, 128, 512, 1024}, {0, 192, 512, 1024}};
  int seen = 0, pingpong = 0;
  for (int d = 32; d <= 256; d += 8)
    for (int c = 0; c <= 1; c++)
      for (size_t i = 0; i < 6; i++) {
        const int64_t nk = buckets[i];
        const fg_variant v = fg_builtin_variant_for(d, FG_DTYPE_BF16, c, nk, FG_ARCH_SM90A);
        const fg_variant s = rule_static(d, FG_DTYPE_BF16, c, nk, FG_ARCH_SM90A);
        int dyn = 0;
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
          dyn |= rows[r].causal == c && rows[r].d == d && nk >= rows[r].from && nk <= rows[r].to;
        if (dyn) cr_assert_eq(s.loop, FG_LOOP_Q_TMA_P, "d = %d causal %d nk %lld", d, c, (long long)nk);
        const int pp = dyn && c && nk <= 512 && d == 128;
        cr_assert_eq(v.loop, pp ? FG_LOOP_Q_TMA_DP : dyn ? FG_LOOP_Q_TMA_D : s.loop,
                     "d = %d causal %d nk %lld", d, c, (long long)nk);
        pingpong += pp;
        fg_variant w = v;
        w.loop = s.loop;
        cr_assert(memcmp(&w, &s, sizeof w) == 0, "d = %d causal %d nk %lld", d, c, (long long)nk);
        seen += dyn;
        /* Never on another arch. */
        const fg_loop_order l80 = fg_builtin_variant_for(d, FG_DTYPE_BF16, c, nk, FG_ARCH_SM80).loop;
        cr_assert(l80 != FG_LOOP_Q_TMA_D && l80 != FG_LOOP_Q_TMA_DP);
      }
  cr_assert_eq(seen, 51, "q_tma_d chosen %d times", seen); /* (d, mask, length) triples */
  cr_assert_eq(pingpong, 1, "q_tma_dp chosen %d times", pingpong);
  /* The grid's short rows: d = 96, 128 and 192 causal at 512 / 1k, d = 64 causal 1k-4k, d = 64
   * and 192 at 512 without a mask. */
  cr_assert_eq(fg_builtin_variant_for(96, FG_DTYPE_F16, 1, 512, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA_D);
  cr_assert_eq(fg_builtin_variant_for(128, FG_DTYPE_F16, 1, 512, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA_DP);
  cr_assert_eq(fg_builtin_variant_for(128, FG_DTYPE_F16, 1, 1024, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA_D);
  cr_assert_eq(fg_builtin_variant_for(128, FG_DTYPE_F16, 1, 2048, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA_P);
  cr_assert_eq(fg_builtin_variant_for(64, FG_DTYPE_F16, 1, 4096, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA_D);
  cr_assert_eq(fg_builtin_variant_for(64, FG_DTYPE_F16, 0, 512, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA_D);
  cr_assert_eq(fg_builtin_variant_for(192, FG_DTYPE_F16, 1, 1024, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA_D);
  cr_assert_eq(fg_builtin_variant_for(64, FG_DTYPE_F16, 0, 1024, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA_P);
  cr_assert_eq(fg_builtin_variant_for(192, FG_DTYPE_BF16, 0, 512, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA_D);
  cr_assert_eq(fg_builtin_variant_for(120, FG_DTYPE_BF16, 0, 512, FG_ARCH_SM90A).loop, FG_LOOP_Q_TMA_P);
}
