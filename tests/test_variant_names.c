/* test_variant_names.c: one variant, one name (issue 11, item 9): fg_variant_parse accepts a
 * name only in the spelling fg_variant_name writes, every name of the candidate space and of
 * the default sets still parses back to itself, and the CLI refuses the other spellings. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cli_runner.h"
#include "fg_gen.h"

#define GOOD "fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80"

Test(variant_names, non_canonical_spellings_are_refused) {
  static const char *const bad[] = {
      "_" GOOD,                                               /* leading '_' */
      GOOD "_",                                               /* trailing '_' */
      GOOD "__",
      "fwd__d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80",   /* doubled '_' */
      "fwd_d64_br64_bc64_f16_noncausal__qouter_w4_s2_sm80",
      "__fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80__",
      "fwd_d064_br64_bc64_f16_noncausal_qouter_w4_s2_sm80",   /* leading zeros */
      "fwd_d64_br064_bc64_f16_noncausal_qouter_w4_s2_sm80",
      "fwd_d64_br64_bc0064_f16_noncausal_qouter_w4_s2_sm80",
      "fwd_d64_br64_bc64_f16_noncausal_qouter_w04_s2_sm80",
      "fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s02_sm80",
      "fwd_d64_br64_bc64_fp16_noncausal_qouter_w4_s2_sm80",   /* dtype aliases */
      "fwd_d64_br64_bc64_half_noncausal_qouter_w4_s2_sm80",
      "fwd_d64_br64_bc64_bfloat16_noncausal_qouter_w4_s2_sm80",
      "fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm_80",   /* the arch's other spelling */
      "fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm90a_",
      "fwd_d+64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80",
      "fwd_d-64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80",
      "fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80 ",
      " " GOOD,
      "FWD_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80",
      "fwd_d64_br64_bc64_F16_noncausal_qouter_w4_s2_sm80",
      "fwd_d999999_br64_bc64_f16_noncausal_qouter_w4_s2_sm80",
      "_",
      "",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fg_variant v;
    char err[512] = "";
    cr_expect_neq(fg_variant_parse(bad[i], &v, err, sizeof err), 0, "'%s' was accepted", bad[i]);
    cr_expect(err[0] != '\0', "no message for '%s'", bad[i]);
  }
  /* The message gives the name to write instead. */
  fg_variant v;
  char err[512] = "";
  cr_assert_neq(fg_variant_parse("fwd_d064_br64_bc64_fp16_noncausal_qouter_w4_s2_sm80_", &v, err,
                                 sizeof err), 0);
  cr_assert(strstr(err, "write it '" GOOD "'"), "%s", err);
}

static void expect_round_trip(const fg_variant *v, int *count) {
  char name[FG_VARIANT_NAME_MAX], back[FG_VARIANT_NAME_MAX], err[512];
  cr_assert_gt(fg_variant_name(v, name, sizeof name), 0);
  fg_variant p;
  cr_assert_eq(fg_variant_parse(name, &p, err, sizeof err), 0, "'%s' is refused: %s", name, err);
  cr_assert_gt(fg_variant_name(&p, back, sizeof back), 0);
  cr_assert_str_eq(back, name);
  cr_assert_eq(memcmp(&p, v, sizeof p), 0, "'%s' parses to another variant", name);
  (*count)++;
}

/* Every variant `flashgen list` can name (all it enumerates, fitting or not, stages up to 4),
 * on every arch: so cache entries and exported tables of existing names keep parsing. */
Test(variant_names, every_canonical_name_parses_back_to_itself) {
  static const int brs[] = {16, 32, 64, 128, 256}, bcs[] = {16, 32, 64, 128, 256};
  static const int warps[] = {1, 2, 4, 8};
  int count = 0;
  for (int arch = 0; arch < FG_ARCH_COUNT; arch++)
    for (int d = 32; d <= 256; d += 8)
      for (int dt = FG_DTYPE_F16; dt <= FG_DTYPE_BF16; dt++)
        for (int causal = 0; causal <= 1; causal++)
          for (int loop = 0; loop < FG_LOOP_COUNT; loop++)
            for (int bi = 0; bi < 5; bi++)
              for (int ci = 0; ci < 5; ci++)
                for (int wi = 0; wi < 4; wi++)
                  for (int st = 1; st <= 4; st++) {
                    fg_variant v;
                    memset(&v, 0, sizeof v);
                    v.pass = FG_PASS_FWD;
                    v.d = d;
                    v.br = brs[bi];
                    v.bc = bcs[ci];
                    v.dtype = (fg_dtype)dt;
                    v.causal = causal;
                    v.loop = (fg_loop_order)loop;
                    v.warps = warps[wi];
                    v.stages = st;
                    v.arch = (fg_arch)arch;
                    expect_round_trip(&v, &count);
                  }
  cr_assert_eq(count, FG_ARCH_COUNT * 29 * 2 * 2 * FG_LOOP_COUNT * 5 * 5 * 4 * 4);
}

Test(variant_names, the_default_sets_and_built_in_choices_parse) {
  int count = 0;
  for (int arch = 0; arch < FG_ARCH_COUNT; arch++) {
    fg_variant v[FG_DEFAULT_VARIANTS_MAX];
    for (int kv = 0; kv <= 1; kv++) {
      int n = fg_default_variants((fg_arch)arch, kv, v, FG_DEFAULT_VARIANTS_MAX);
      cr_assert_gt(n, 0);
      for (int i = 0; i < n; i++) expect_round_trip(&v[i], &count);
    }
    for (int d = 32; d <= 256; d += 8)
      for (int causal = 0; causal <= 1; causal++) {
        fg_variant b = fg_builtin_variant(d, FG_DTYPE_BF16, causal, (fg_arch)arch);
        expect_round_trip(&b, &count);
      }
    /* The backward's default set: the built-in backward variant of every (d, dtype, causal), once. */
    fg_variant w[128];
    const int nb = fg_default_backward_variants((fg_arch)arch, w, 128);
    cr_assert_eq(nb, 29 * 2 * 2, "%s: %d backward defaults", fg_arch_name((fg_arch)arch), nb);
    for (int i = 0; i < nb; i++) {
      const fg_variant b = fg_builtin_backward_variant(w[i].d, w[i].dtype, w[i].causal, (fg_arch)arch);
      cr_assert(w[i].pass == FG_PASS_BWD && memcmp(&w[i], &b, sizeof b) == 0, "entry %d", i);
      for (int j = 0; j < i; j++)
        cr_assert(w[j].d != w[i].d || w[j].dtype != w[i].dtype || w[j].causal != w[i].causal,
                  "entries %d and %d are one problem", j, i);
      expect_round_trip(&w[i], &count);
    }
    cr_assert_eq(fg_default_backward_variants((fg_arch)arch, w, 3), 3, "cap is respected");
  }
}

Test(variant_names, the_command_refuses_a_non_canonical_name) {
  int rc = fg_test_run_cli(NULL, NULL, "render fwd__d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80");
  cr_assert_eq(rc, 2, "exit %d; stderr: %s", rc, fg_test_err);
  cr_assert(strstr(fg_test_err, "write it '" GOOD "'"), "%s", fg_test_err);
  cr_assert_eq(fg_test_out[0], '\0', "printed a kernel: %.200s", fg_test_out);
}
