/* test_generator.c: variant names, the fit rule against real devices' limits, template
 * rendering (sandbox, errors naming template:line, self-contained output) and the seed rule.
 * The plans the manifests return: test_plans.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fg_autotune.h"
#include "fg_gen.h"
#include "tma_support.h"


Test(variant, names_round_trip) {
  static const char *const names[] = {
      "fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm80",
      "fwd_d32_br16_bc16_f16_noncausal_kvouter_w1_s1_sm90a",
      "fwd_d256_br64_bc32_bf16_noncausal_qouter_w4_s3_sm89",
      "fwd_d40_br128_bc128_f16_causal_qouter_w8_s2_sm86",
      "fwd_d96_br64_bc64_bf16_causal_kvouter_w4_s1_sm90",
      "bwd_d128_br64_bc64_bf16_causal_kvouter_w8_s2_sm90a",
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    fg_variant v = fgt_variant(names[i]);
    char back[FG_VARIANT_NAME_MAX];
    cr_assert_gt(fg_variant_name(&v, back, sizeof back), 0);
    cr_assert_str_eq(back, names[i]);
  }
  fg_variant v = fgt_variant("fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm80");
  cr_assert_eq(v.d, 128);
  cr_assert_eq(v.br, 128);
  cr_assert_eq(v.bc, 64);
  cr_assert_eq(v.dtype, FG_DTYPE_BF16);
  cr_assert_eq(v.causal, 1);
  cr_assert_eq(v.loop, FG_LOOP_Q_OUTER);
  cr_assert_eq(v.warps, 4);
  cr_assert_eq(v.stages, 2);
  cr_assert_eq(v.arch, FG_ARCH_SM80);
}

static void expect_bad(const char *name, const char *needle) {
  fg_variant v;
  char err[512] = "";
  cr_assert_neq(fg_variant_parse(name, &v, err, sizeof err), 0, "'%s' was accepted", name);
  cr_assert(strstr(err, needle) != NULL, "message for '%s' should mention '%s': %s", name, needle, err);
}

Test(variant, bad_names_say_which_field) {
  expect_bad("xwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm80", "field 1 'xwd' is not a valid pass");
  expect_bad("fwd_dx_br128_bc64_bf16_causal_qouter_w4_s2_sm80", "field 2 'dx' is not a valid head dim");
  expect_bad("fwd_d128_b128_bc64_bf16_causal_qouter_w4_s2_sm80", "field 3 'b128' is not a valid Br");
  expect_bad("fwd_d128_br128_bc_bf16_causal_qouter_w4_s2_sm80", "field 4 'bc' is not a valid Bc");
  expect_bad("fwd_d128_br128_bc64_fp8_causal_qouter_w4_s2_sm80", "field 5 'fp8' is not a valid dtype");
  expect_bad("fwd_d128_br128_bc64_bf16_masked_qouter_w4_s2_sm80", "field 6 'masked'");
  expect_bad("fwd_d128_br128_bc64_bf16_causal_inner_w4_s2_sm80", "field 7 'inner' is not a valid loop order");
  expect_bad("fwd_d128_br128_bc64_bf16_causal_qouter_4_s2_sm80", "field 8 '4' is not a valid warps");
  expect_bad("fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2x_sm80", "field 9 's2x' is not a valid stages");
  expect_bad("fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm75", "field 10 'sm75' is not a valid arch");
  expect_bad("fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2", "has 9 fields");
  expect_bad("fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm80_x", "expected 10");
  expect_bad("", "has 0 fields");
}

Test(variant, structural_rules) {
  char err[256];
  fg_variant v = fgt_variant("fwd_d100_br64_bc64_bf16_causal_qouter_w4_s2_sm80");
  cr_assert_neq(fg_variant_check(&v, err, sizeof err), 0);
  cr_assert(strstr(err, "d = 100") && strstr(err, "multiple of 8"), "%s", err);
  v = fgt_variant("fwd_d264_br64_bc64_bf16_causal_qouter_w4_s2_sm80");
  cr_assert_neq(fg_variant_check(&v, err, sizeof err), 0);
  v = fgt_variant("fwd_d128_br32_bc64_bf16_causal_qouter_w4_s2_sm80");
  cr_assert_neq(fg_variant_check(&v, err, sizeof err), 0);
  cr_assert(strstr(err, "Br = 32 with 4 warps"), "%s", err);
  v = fgt_variant("fwd_d128_br64_bc24_bf16_causal_qouter_w4_s2_sm80");
  cr_assert_neq(fg_variant_check(&v, err, sizeof err), 0);
  cr_assert(strstr(err, "Bc = 24"), "%s", err);
  for (int d = 32; d <= 256; d += 8) {
    v.d = d;
    v.bc = 64;
    cr_assert_eq(fg_variant_check(&v, err, sizeof err), 0, "d=%d: %s", d, err);
  }
}

/* The fit rule against the A100 (163 KB per block), H100 (227 KB) and RTX 4090 (99 KB). */
Test(fit, devices_accept_and_reject_with_numbers) {
  fg_generator *g = fgt_generator();
  char why[256];
  /* (128 + 2*2*64) rows * 136 elements * 2 B = 104448 B: over the 4090's 101376. */
  fg_variant mid = fgt_variant("fwd_d128_br128_bc64_bf16_causal_qouter_w8_s2_sm80");
  cr_assert_eq(fg_variant_fits(g, &mid, &fg_limits_a100, why, sizeof why), 1, "%s", why);
  cr_assert_eq(fg_variant_fits(g, &mid, &fg_limits_h100, why, sizeof why), 1, "%s", why);
  cr_assert_eq(fg_variant_fits(g, &mid, &fg_limits_rtx4090, why, sizeof why), 0);
  cr_assert_str_eq(why, "needs 104448 B of shared memory, NVIDIA GeForce RTX 4090 allows 101376 B per block");
  /* (128 + 2*3*128) * 136 * 2 = 243712 B: over every device here. */
  fg_variant big = fgt_variant("fwd_d128_br128_bc128_bf16_causal_qouter_w8_s3_sm90a");
  cr_assert_eq(fg_variant_fits(g, &big, &fg_limits_h100, why, sizeof why), 0);
  cr_assert_str_eq(why, "needs 243712 B of shared memory, NVIDIA H100 allows 232448 B per block");
  cr_assert_eq(fg_variant_fits(g, &big, &fg_limits_a100, why, sizeof why), 0);
  cr_assert_str_eq(why, "needs 243712 B of shared memory, NVIDIA A100 allows 166912 B per block");
  /* (64 + 2*2*128) * 264 * 2 = 304128 B at d = 256; (64 + 2*2*32)*264*2 = 101376 fits all three. */
  fg_variant d256 = fgt_variant("fwd_d256_br64_bc32_f16_noncausal_qouter_w4_s2_sm80");
  cr_assert_eq(fg_variant_fits(g, &d256, &fg_limits_rtx4090, why, sizeof why), 1, "%s", why);
  cr_assert_eq(fg_variant_fits(g, &d256, &fg_limits_a100, why, sizeof why), 1, "%s", why);
  /* 8 warps * 64 rows each: too many registers for the accumulators at d = 256. */
  fg_variant regs = fgt_variant("fwd_d256_br256_bc64_f16_noncausal_qouter_w4_s1_sm90a");
  cr_assert_eq(fg_variant_fits(g, &regs, &fg_limits_h100, why, sizeof why), 0);
  cr_assert(strstr(why, "registers"), "%s", why);
  /* kv_outer keeps one K/V block: stages must be 1. */
  fg_variant kv = fgt_variant("fwd_d64_br64_bc64_f16_noncausal_kvouter_w4_s2_sm80");
  cr_assert_eq(fg_variant_fits(g, &kv, &fg_limits_h100, why, sizeof why), 0);
  cr_assert(strstr(why, "stages must be 1"), "%s", why);
  fg_generator_destroy(g);
}

/* The Hopper backward loop (kv_wgmma, templates/bwd.lua): its shapes fit, and each rule refuses
 * with its reason; the forward does not take it. */
Test(fit, backward_wgmma_rules) {
  fg_generator *g = fgt_generator();
  char why[256];
  static const char *const ok[] = {"bwd_d128_br64_bc128_bf16_causal_kvwgmma_w8_s2_sm90a",
                                   "bwd_d64_br128_bc128_f16_noncausal_kvwgmma_w8_s2_sm90a",
                                   "bwd_d64_br64_bc64_bf16_noncausal_kvwgmma_w4_s2_sm90a"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    fg_variant v = fgt_variant(ok[i]);
    cr_assert_eq(fg_variant_fits(g, &v, &fg_limits_h100, why, sizeof why), 1, "%s: %s", ok[i], why);
  }
  static const struct {
    const char *name, *reason;
  } bad[] = {
      {"bwd_d128_br64_bc128_bf16_causal_kvwgmma_w8_s2_sm80", "needs sm_90a"},
      {"bwd_d128_br64_bc128_bf16_causal_kvwgmma_w8_s2_sm90", "needs sm_90a"},
      {"bwd_d96_br64_bc128_bf16_causal_kvwgmma_w8_s2_sm90a", "d = 64 or 128"},
      {"bwd_d128_br64_bc128_bf16_causal_kvwgmma_w4_s2_sm90a", "warps Bc / 16"},
      {"bwd_d128_br64_bc128_bf16_causal_kvwgmma_w8_s1_sm90a", "2 stages"},
      {"bwd_d64_br64_bc128_bf16_causal_kvwgmma_w8_s2_sm90a", "64-row block per warpgroup"},
      {"bwd_d128_br128_bc128_bf16_causal_kvwgmma_w8_s2_sm90a", "registers"},
      {"fwd_d128_br64_bc64_bf16_causal_kvwgmma_w4_s2_sm90a", "loop order of the backward"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fg_variant v = fgt_variant(bad[i].name);
    cr_assert_eq(fg_variant_fits(g, &v, &fg_limits_h100, why, sizeof why), 0, "%s fits", bad[i].name);
    cr_assert(strstr(why, bad[i].reason), "%s: '%s' lacks '%s'", bad[i].name, why, bad[i].reason);
  }
  fg_generator_destroy(g);
}

/* The warp-specialised Hopper backward (kv_tma, templates/bwd.lua): the built-in shapes and the
 * third stage fit an H100 (the block's 64K registers over 384 threads count, not the consumers'
 * 232), with the dQ tile double-buffered where two fit in the 227 KB (the built-in shapes: to the
 * byte at d = 64) and single-buffered at d = 128 with three stages; head dims off 64-column
 * blocks take the tiles, shape and shared memory of d rounded up to 64 (d = 96 and 72 those of
 * d = 128, d = 40 those of d = 64); each rule refuses with its reason, and three stages at d = 64
 * with Br 128 exceed the shared memory. */
Test(fit, backward_tma_rules) {
  fg_generator *g = fgt_generator();
  char why[256];
  static const struct {
    const char *name;
    int smem;
  } ok[] = {
      /* 1 KB of alignment, K V, Q dO per stage, 2 dS^T, dq_bufs x the fp32 dQ tile, LSE D */
      {"bwd_d128_br64_bc128_bf16_causal_kvtma_w8_s2_sm90a", 1024 + 163840 + 2 * 32768 + 1024},
      {"bwd_d64_br128_bc128_f16_noncausal_kvtma_w8_s2_sm90a", 1024 + 163840 + 2 * 32768 + 2048},
      {"bwd_d64_br64_bc128_bf16_noncausal_kvtma_w8_s3_sm90a", 1024 + 114688 + 2 * 16384 + 1536},
      {"bwd_d128_br64_bc128_bf16_noncausal_kvtma_w8_s3_sm90a", 1024 + 196608 + 32768 + 1536},
      /* head dims off 64-column blocks: the tiles of d rounded up to 64 (d = 128's, d = 64's) */
      {"bwd_d96_br64_bc128_bf16_causal_kvtma_w8_s2_sm90a", 1024 + 163840 + 2 * 32768 + 1024},
      {"bwd_d72_br64_bc128_f16_noncausal_kvtma_w8_s2_sm90a", 1024 + 163840 + 2 * 32768 + 1024},
      {"bwd_d40_br128_bc128_f16_noncausal_kvtma_w8_s2_sm90a", 1024 + 163840 + 2 * 32768 + 2048},
      /* above d = 128 (bwd_tmat.cu): K, V, two Q/dO stages, two P^T/dS^T buffers, LSE/D */
      {"bwd_d256_br64_bc64_bf16_noncausal_kvtma_w8_s2_sm90a", 1024 + 65536 + 131072 + 32768 + 1024},
      {"bwd_d136_br64_bc64_f16_causal_kvtma_w8_s2_sm90a", 1024 + 49152 + 98304 + 32768 + 1024},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    fg_variant v = fgt_variant(ok[i].name);
    cr_assert_eq(fg_variant_fits(g, &v, &fg_limits_h100, why, sizeof why), 1, "%s: %s", ok[i].name, why);
    fg_resources r;
    cr_assert_eq(fg_generator_resources(g, &v, &r, why, sizeof why), 0, "%s", why);
    cr_assert_eq(r.threads, 32 * v.warps + 128, "%s: the producer warpgroup", ok[i].name);
    cr_assert_eq(r.regs_estimate, 168, "%s: 65536 / 384 in multiples of 8", ok[i].name);
    cr_assert_eq(r.smem_bytes, ok[i].smem, "%s: %d bytes of shared memory", ok[i].name, r.smem_bytes);
  }
  static const struct {
    const char *name, *reason;
  } bad[] = {
      {"bwd_d128_br64_bc128_bf16_causal_kvtma_w8_s2_sm80", "needs sm_90a"},
      {"bwd_d136_br64_bc128_bf16_causal_kvtma_w8_s2_sm90a", "Br = 64, Bc = 64 and 8 consumer warps"},
      {"bwd_d256_br64_bc64_bf16_causal_kvtma_w8_s1_sm90a", "2 stages of Q and dO"},
      {"bwd_d96_br128_bc128_bf16_causal_kvtma_w8_s2_sm90a", "64-column halves"},
      {"bwd_d128_br64_bc64_bf16_causal_kvtma_w4_s2_sm90a", "Bc = 128, warps = 8"},
      {"bwd_d128_br64_bc128_bf16_causal_kvtma_w8_s1_sm90a", "2 or 3 stages"},
      {"bwd_d128_br128_bc128_bf16_causal_kvtma_w8_s2_sm90a", "64-column halves"},
      {"bwd_d64_br128_bc128_bf16_causal_kvtma_w8_s3_sm90a", "shared memory"},
      {"fwd_d128_br64_bc64_bf16_causal_kvtma_w4_s2_sm90a", "loop order of the backward"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fg_variant v = fgt_variant(bad[i].name);
    cr_assert_eq(fg_variant_fits(g, &v, &fg_limits_h100, why, sizeof why), 0, "%s fits", bad[i].name);
    cr_assert(strstr(why, bad[i].reason), "%s: '%s' lacks '%s'", bad[i].name, why, bad[i].reason);
  }
  fg_generator_destroy(g);
}

Test(fit, builtin_variants_fit_the_smallest_device) {
  fg_generator *g = fgt_generator();
  char why[256];
  for (int d = 32; d <= 256; d += 8)
    for (int c = 0; c <= 1; c++) {
      fg_variant v = fg_builtin_variant(d, FG_DTYPE_BF16, c, FG_ARCH_SM89);
      cr_assert_eq(fg_variant_fits(g, &v, &fg_limits_rtx4090, why, sizeof why), 1, "d=%d: %s", d, why);
    }
  fg_generator_destroy(g);
}

Test(seed_rule, follows_the_paper_within_the_limits) {
  fg_generator *g = fgt_generator();
  char why[256];
  /* H100: M = 232448 / 2 = 116224 elements; ceil(M / 4d) at d = 64 is 454: Bc capped at 256, Br =
   * min(454, 64) = 64. The result must fit. */
  const fg_problem p64 = {FG_PASS_FWD, 64, FG_DTYPE_BF16, 0, 0, 0};
  fg_variant v = fg_seed_rule_variant(g, &p64, FG_ARCH_SM90A, &fg_limits_h100);
  cr_assert_eq(v.br, 64);
  cr_assert_eq(fg_variant_fits(g, &v, &fg_limits_h100, why, sizeof why), 1, "%s", why);
  v = fg_seed_rule_variant(g, &(fg_problem){FG_PASS_FWD, 128, FG_DTYPE_BF16, 0, 0, 0}, FG_ARCH_SM80,
                           &fg_limits_a100);
  cr_assert_eq(fg_variant_fits(g, &v, &fg_limits_a100, why, sizeof why), 1, "%s", why);
  fg_variant cands[128];
  fg_prune_counts pc;
  const fg_problem p = {FG_PASS_FWD, 128, FG_DTYPE_BF16, 1, 0, 0};
  int n = fg_candidates(g, &p, FG_ARCH_SM90A, &fg_limits_h100, cands, 128, &pc);
  cr_assert_gt(n, 10);
  cr_assert_eq(memcmp(&cands[0], &(fg_variant){0}, sizeof cands[0]) != 0, 1);
  cr_assert_gt(pc.smem, 0, "the H100 must prune some d=128 candidates by shared memory");
  for (int i = 0; i < n; i++)
    cr_assert_eq(fg_variant_fits(g, &cands[i], &fg_limits_h100, why, sizeof why), 1);
  fg_generator_destroy(g);
}

Test(render, source_is_self_contained_and_names_itself) {
  fg_generator *g = fgt_generator();
  static const char *const names[] = {"fwd_d128_br128_bc64_bf16_causal_qouter_w8_s2_sm80",
                                      "fwd_d40_br64_bc32_f16_noncausal_kvouter_w4_s1_sm90a"};
  for (int i = 0; i < 2; i++) {
    fg_variant v = fgt_variant(names[i]);
    char *src = NULL, err[4096];
    fg_kernel_meta meta;
    cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s", err);
    char first[256];
    snprintf(first, sizeof first, "// Generated by flashgen from template %s: variant %s.",
             i == 0 ? "fwd_q_outer.cu" : "fwd_kv_outer.cu", names[i]);
    cr_assert_eq(strncmp(src, first, strlen(first)), 0, "first line: %.120s", src);
    cr_assert_null(strstr(src, "#include"), "generated source must include no header");
    cr_assert_null(strstr(src, "{{"), "unrendered substitution");
    cr_assert(strstr(src, "constexpr int D = ") != NULL);
    cr_assert_eq(meta.n_steps, 1, "a forward plan is one kernel");
    cr_assert_eq(meta.main_step, 0);
    const fg_plan_step *sp = fg_kernel_main(&meta);
    cr_assert_str_eq(sp->entry + 3, names[i]);
    cr_assert_eq(sp->threads, v.warps * 32);
    cr_assert_eq(sp->grid, i == 0 ? FG_GRID_Q_TILES : FG_GRID_HEADS);
    cr_assert_eq(sp->br, v.br);
    /* kv_outer keeps O, m and l in fp32 between K/V blocks: d + 2 floats per query row. */
    cr_assert_eq(meta.n_workspaces, i == 0 ? 0 : 1);
    if (i == 1) {
      cr_assert_str_eq(meta.workspaces[0].param, "workspace");
      cr_assert_eq(meta.workspaces[0].bytes, 4 * (v.d + 2));
      cr_assert_eq(meta.workspaces[0].rows, 1);
      cr_assert_eq(meta.workspaces[0].deterministic_only, 0);
    }
    fg_resources r;
    cr_assert_eq(fg_generator_resources(g, &v, &r, err, sizeof err), 0);
    cr_assert_eq(sp->smem_bytes, r.smem_bytes);
    free(src);
  }
  fg_generator_destroy(g);
}

/* Copies every regular file of the source tree's templates/ (listed at test time, so a new
 * template is covered without editing this test) into a new directory, replacing line `line` of
 * `file` with text (which may hold several lines); file NULL copies unchanged. */
static void make_template_dir(char *dir, const char *file, int line, const char *text) {
  strcpy(dir, "/tmp/fg-tpl-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  const char *src = getenv("FLASHGEN_TEST_SOURCE_DIR");
  cr_assert_not_null(src, "FLASHGEN_TEST_SOURCE_DIR must point at the source tree");
  char tdir[1024];
  snprintf(tdir, sizeof tdir, "%s/templates", src);
  DIR *d = opendir(tdir);
  cr_assert_not_null(d, "cannot list %s", tdir);
  int copied = 0;
  for (struct dirent *e; (e = readdir(d));) {
    char in[2048], out[2048], buf[4096];
    snprintf(in, sizeof in, "%s/%s", tdir, e->d_name);
    struct stat st;
    if (stat(in, &st) || !S_ISREG(st.st_mode)) continue;
    snprintf(out, sizeof out, "%s/%s", dir, e->d_name);
    FILE *fi = fopen(in, "r"), *fo = fopen(out, "w");
    cr_assert(fi && fo);
    int n = 0;
    while (fgets(buf, sizeof buf, fi)) {
      n++;
      if (file && strcmp(e->d_name, file) == 0 && n == line) fprintf(fo, "%s\n", text);
      else fputs(buf, fo);
    }
    fclose(fi);
    fclose(fo);
    copied++;
  }
  closedir(d);
  cr_assert_gt(copied, 5, "templates/ under %s looks empty", src);
}

static void write_file(const char *dir, const char *name, const char *mode, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, mode);
  cr_assert_not_null(f, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

/* The template hash of a generator made from dir (NULL: the embedded templates). */
static uint64_t hash_of(const char *dir) {
  if (dir) setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);
  else unsetenv("FLASHGEN_TEMPLATE_DIR");
  fg_generator *g = fgt_generator();
  uint64_t h = fg_generator_template_hash(g);
  fg_generator_destroy(g);
  unsetenv("FLASHGEN_TEMPLATE_DIR");
  return h;
}

static void expect_render_error(const char *file, int line, const char *text, const char *needle) {
  char dir[64];
  make_template_dir(dir, file, line, text);
  setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);
  fg_generator *g = fgt_generator();
  fg_variant v = fgt_variant("fwd_d64_br64_bc64_f16_causal_qouter_w4_s2_sm80");
  char *src = NULL, err[4096];
  fg_kernel_meta meta;
  cr_assert_neq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "render should fail");
  cr_assert(strstr(err, needle) != NULL, "expected '%s' in: %s", needle, err);
  fg_generator_destroy(g);
  unsetenv("FLASHGEN_TEMPLATE_DIR");
  remove_dir(dir);
}

Test(render, errors_name_template_and_line) {
  expect_render_error("fwd_q_outer.cu", 12, "constexpr int X = {{ no_such_param }};",
                      "fwd_q_outer.cu:12: undefined template name 'no_such_param'");
  expect_render_error("fwd_q_outer.cu", 7, "{% if then %}", "fwd_q_outer.cu:7:");
  expect_render_error("common.cuh", 9, "{% error('broken helper') %}", "common.cuh:9: broken helper");
  expect_render_error("fwd_q_outer.cu", 20, "{% local f = io.open('/etc/passwd') %}",
                      "fwd_q_outer.cu:20: undefined template name 'io'");
  expect_render_error("fwd_q_outer.cu", 21, "{{ os.getenv('HOME') }}",
                      "fwd_q_outer.cu:21: undefined template name 'os'");
  expect_render_error("fwd_q_outer.cu", 22, "{% require('x') %}",
                      "fwd_q_outer.cu:22: undefined template name 'require'");
  expect_render_error("fwd_q_outer.cu", 23, "{% dofile('/etc/passwd') %}",
                      "fwd_q_outer.cu:23: undefined template name 'dofile'");
}

Test(render, template_dir_override_changes_hash) {
  fg_generator *g = fgt_generator();
  uint64_t h0 = fg_generator_template_hash(g);
  cr_assert_str_eq(fg_generator_template_source(g), "embedded");
  fg_generator_destroy(g);
  char dir[64];
  make_template_dir(dir, "fwd_q_outer.cu", 2, "// a comment that changes nothing but the text");
  setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);
  g = fgt_generator();
  cr_assert_str_eq(fg_generator_template_source(g), dir);
  cr_assert_neq(fg_generator_template_hash(g), h0, "any template change must change the hash");
  fg_generator_destroy(g);
  unsetenv("FLASHGEN_TEMPLATE_DIR");
  remove_dir(dir);
}

/* Issue 11, item 1: the hash covers every file the renderer can read, so an edit to any of them
 * (fwd_wgmma.cu was once left out) or a new file a template could include changes every cache
 * key. The templates are listed at test time: a new template is covered without editing this. */
Test(template_hash, an_edit_to_any_template_file_changes_it) {
  char base[64];
  make_template_dir(base, NULL, 0, NULL);
  uint64_t h0 = hash_of(base);
  cr_assert_eq(hash_of(base), h0, "the hash must be deterministic");
  char names[128][256];
  int n = 0;
  DIR *d = opendir(base);
  cr_assert_not_null(d);
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.' && n < 128) snprintf(names[n++], sizeof names[0], "%s", e->d_name);
  closedir(d);
  cr_assert_gt(n, 8);
  int wgmma = 0;
  for (int i = 0; i < n; i++) {
    char dir[64];
    make_template_dir(dir, NULL, 0, NULL);
    cr_assert_eq(hash_of(dir), h0, "an unedited copy (%s) must hash like the first", dir);
    write_file(dir, names[i], "a", " \n"); /* a whitespace edit at the end */
    cr_expect_neq(hash_of(dir), h0, "an edit to %s must change the template hash", names[i]);
    wgmma += strcmp(names[i], "fwd_wgmma.cu") == 0;
    remove_dir(dir);
  }
  cr_assert_eq(wgmma, 1, "fwd_wgmma.cu must be among the files tried");
  /* A file a template could include, added to the directory. */
  write_file(base, "extra_helpers.cuh", "w", "// a helper a template may include\n");
  cr_assert_neq(hash_of(base), h0, "a file added to the template directory must change the hash");
  remove_dir(base);
}

/* The embedded table (every file cmake/embed_templates.cmake globs) hashes like a directory
 * holding exactly those files: so the embedded hash covers each of them too. */
Test(template_hash, embedded_hash_covers_every_embedded_file) {
  char dir[64];
  make_template_dir(dir, NULL, 0, NULL);
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  for (struct dirent *e; (e = readdir(d));) {
    const char *x = strrchr(e->d_name, '.');
    int embedded = x && (strcmp(x, ".cu") == 0 || strcmp(x, ".cuh") == 0 || strcmp(x, ".lua") == 0);
    embedded |= strcmp(e->d_name, "fg_params.h") == 0;
    if (!embedded && e->d_name[0] != '.') {
      char path[1024];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      unlink(path);
    }
  }
  closedir(d);
  cr_assert_eq(hash_of(dir), hash_of(NULL),
               "a directory holding the embedded files must hash like the embedded table");
  remove_dir(dir);
}

/* ---- The sandbox's limits (issue 11, item 6) ---- */
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The line of templates/file that contains needle (1-based). */
static int line_of(const char *file, const char *needle) {
  char path[1024], buf[4096];
  snprintf(path, sizeof path, "%s/templates/%s", getenv("FLASHGEN_TEST_SOURCE_DIR"), file);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  int n = 0, found = 0;
  while (!found && fgets(buf, sizeof buf, f)) n++, found = strstr(buf, needle) != NULL;
  fclose(f);
  cr_assert(found, "no '%s' in %s", needle, path);
  return n;
}

/* Renders variant from a copy whose file:line is replaced by text; expects a failure (of the
 * render, or of creating the generator when at_create) within max_s, with each needle (up to
 * 3, NULL-ended) in the message. */
static void expect_limit(const char *file, int line, const char *text, const char *variant,
                         int at_create, double max_s, const char *n1, const char *n2,
                         const char *n3) {
  char dir[64];
  make_template_dir(dir, file, line, text);
  setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);
  char err[4096] = "";
  double t0 = now_s();
  fg_generator *g = NULL;
  int rc = fg_generator_create(&g, err, sizeof err);
  if (!at_create) {
    cr_assert_eq(rc, 0, "generator: %s", err);
    fg_variant v = fgt_variant(variant);
    char *src = NULL;
    fg_kernel_meta meta;
    rc = fg_generator_render(g, &v, &src, &meta, err, sizeof err);
    free(src);
  }
  double dt = now_s() - t0;
  cr_assert_neq(rc, 0, "%s:%d '%s' should have failed", file, line, text);
  const char *needles[] = {n1, n2, n3};
  for (int i = 0; i < 3; i++)
    if (needles[i]) cr_assert(strstr(err, needles[i]) != NULL, "expected '%s' in: %s", needles[i], err);
  cr_assert_lt(dt, max_s, "stopping took %.1f s (limit %.0f s): %s", dt, max_s, err);
  printf("%s:%d stopped in %.2f s: %s\n", file, line, dt, err);
  fg_generator_destroy(g);
  unsetenv("FLASHGEN_TEMPLATE_DIR");
  remove_dir(dir);
}

#define V64 "fwd_d64_br64_bc64_f16_causal_qouter_w4_s2_sm80"

Test(sandbox, endless_template_loop_stops_with_template_line, .timeout = 120) {
  expect_limit("fwd_q_outer.cu", 20, "{% while true do end %}", V64, 0, 5.0, "fwd_q_outer.cu:20:",
               "instructions", NULL);
  /* in an included file, and in a loop a pcall would catch */
  expect_limit("common.cuh", 9, "{% local x = 0 while true do x = x + 1 end %}", V64, 0, 5.0,
               "common.cuh:9:", "instructions", NULL);
}

Test(sandbox, endless_loop_in_the_manifest_stops, .timeout = 120) {
  /* at load time (top level of fwd.lua) */
  expect_limit("fwd.lua", 5, "while true do end", V64, 1, 5.0, "fwd.lua:5:", "instructions", NULL);
  /* in a function the renderer calls, caught and retried by pcall: still stops */
  int l = line_of("fwd.lua", "function M.entry");
  char at[32];
  snprintf(at, sizeof at, "fwd.lua:%d:", l);
  expect_limit("fwd.lua", l,
               "function M.entry(v) while true do pcall(function() while true do end end) end end",
               V64, 0, 5.0, at, "instructions", NULL);
}

/* The budget is per call: a generator that hit it renders the next variant. */
Test(sandbox, the_budget_is_per_call, .timeout = 120) {
  char dir[64];
  make_template_dir(dir, "fwd_q_outer.cu", 20, "{% if d == 64 then while true do end end %}");
  setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);
  fg_generator *g = fgt_generator();
  char *src = NULL, err[4096];
  fg_kernel_meta meta;
  fg_variant v = fgt_variant(V64);
  cr_assert_neq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0);
  cr_assert(strstr(err, "fwd_q_outer.cu:20:"), "%s", err);
  v = fgt_variant("fwd_d128_br128_bc64_bf16_causal_qouter_w8_s2_sm80");
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s", err);
    free(src);
  }
  fg_generator_destroy(g);
  unsetenv("FLASHGEN_TEMPLATE_DIR");
  remove_dir(dir);
}

Test(sandbox, huge_output_and_memory_are_capped, .timeout = 120) {
  /* 100 M lines of 100 kB: the output cap */
  expect_limit("fwd_q_outer.cu", 20,
               "{% for i = 1, 100000000 do %}\n{{ string.rep('x', 100000) }}\n{% end %}", V64, 0,
               10.0, "fwd_q_outer.cu:21:", "output", NULL);
  /* 100 M short lines (the 2 GB): whichever limit comes first (instructions) */
  expect_limit("fwd_q_outer.cu", 20, "{% for i = 1, 100000000 do %}\n;\n{% end %}", V64, 0, 10.0,
               "fwd_q_outer.cu:", "the sandbox's limit", NULL);
  /* a table of 10 kB strings that grows without bound: the memory cap */
  expect_limit("fwd_q_outer.cu", 20,
               "{% local t = {} for i = 1, 1e9 do t[#t + 1] = string.rep('x', 10000) .. i end %}",
               V64, 0, 10.0, "fwd_q_outer.cu:20:", "Lua memory reached", NULL);
  /* one allocation over the cap, and a string that doubles */
  expect_limit("fwd_q_outer.cu", 20, "{{ #string.rep('x', 1 << 30) }}", V64, 0, 10.0,
               "fwd_q_outer.cu:20:", "Lua memory reached", NULL);
  expect_limit("fwd_q_outer.cu", 20, "{% local s = 'x' while true do s = s .. s end %}", V64, 0,
               10.0, "fwd_q_outer.cu:20:", "Lua memory reached", NULL);
}

Test(sandbox, binary_chunks_are_refused) {
  expect_limit("fwd.lua", 5,
               "local f, e = load(string.dump(function() return 1 end), 'x', 'b') "
               "if f then error('a binary chunk was loaded') end error('refused: ' .. e)",
               V64, 1, 5.0, "refused: ", "binary", NULL);
  /* mode "bt" or none asks for binary too */
  expect_limit("fwd.lua", 5,
               "local f, e = load(string.dump(function() return 1 end)) "
               "if f then error('a binary chunk was loaded') end error('refused: ' .. e)",
               V64, 1, 5.0, "refused: ", "binary", NULL);
  /* text still loads */
  expect_limit("fwd.lua", 5, "error('text: ' .. load('return 41 + 1', 'x', 'bt')())", V64, 1, 5.0,
               "text: 42", NULL, NULL);
  /* templates have no load at all */
  expect_render_error("fwd_q_outer.cu", 20, "{{ load('return 1')() }}",
                      "fwd_q_outer.cu:20: undefined template name 'load'");
}

Test(nvrtc, missing_library_is_reported) {
  setenv("FLASHGEN_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so.99", 1);
  char err[2048];
  cr_assert_neq(fg_nvrtc_load(err, sizeof err), 0);
  cr_assert(strstr(err, "/nonexistent/libnvrtc.so.99") != NULL, "%s", err);
  cr_assert(strstr(err, "FLASHGEN_NVRTC_LIBRARY") != NULL, "%s", err);
  cr_assert_eq(fg_nvrtc_version(), 0);
}

Test(nvrtc, compile_error_carries_log_and_variant) {
  char err[256];
  if (fg_nvrtc_load(err, sizeof err)) cr_skip_test("NVRTC not installed: %s", err);
  fg_kernel_image img;
  fg_kernel_meta meta = {0};
  char *log = NULL;
  cr_assert_neq(fg_nvrtc_compile("extern \"C\" __global__ void k() { undefined_thing(); }",
                                 "fwd_broken_example", FG_ARCH_SM80, &meta, &img, &log), 0);
  cr_assert_not_null(log);
  cr_assert(strstr(log, "fwd_broken_example") != NULL, "%s", log);
  cr_assert(strstr(log, "undefined_thing") != NULL, "the NVRTC log must be included: %s", log);
  cr_assert(strstr(log, "--gpu-architecture=sm_80") != NULL, "the options must be included: %s", log);
  free(log);
}

/* NVRTC's diagnostics point at the template file and line, and at the generated line. */
static void expect_nvrtc_error_at(const char *file, const char *needle, const char *variant) {
  int l = line_of(file, needle);
  char dir[64], at[64];
  make_template_dir(dir, file, l, "  undefined_thing_here();");
  snprintf(at, sizeof at, "%s:%d", file, l);
  setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);
  fg_generator *g = fgt_generator();
  fg_variant v = fgt_variant(variant);
  fg_kernel_image img;
  char *log = NULL;
  cr_assert_neq(fg_generator_build(g, &v, &img, &log), 0, "the broken template compiled");
  cr_assert_not_null(log);
  cr_assert(strstr(log, at) != NULL, "expected '%s' in:\n%s", at, log);
  cr_assert(strstr(log, "undefined_thing_here") != NULL, "%s", log);
  cr_assert(strstr(log, "generated line ") != NULL, "the generated line must be named too:\n%s", log);
  /* ... and the generated line is the right one */
  char *src = NULL, err[4096];
  fg_kernel_meta meta;
  cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s", err);
  int gl = atoi(strstr(log, "generated line ") + strlen("generated line "));
  const char *p = src;
  for (int i = 1; i < gl && p; i++) p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
  cr_assert(p && strncmp(p, "  undefined_thing_here();", 25) == 0, "generated line %d is: %.80s", gl,
            p ? p : "(past the end)");
  free(src);
  free(log);
  fg_generator_destroy(g);
  unsetenv("FLASHGEN_TEMPLATE_DIR");
  remove_dir(dir);
}

Test(nvrtc, compile_error_names_the_template_line) {
  char err[256];
  if (fg_nvrtc_load(err, sizeof err)) cr_skip_test("NVRTC not installed: %s", err);
  /* in the kernel body, after a {% %} block (fwd_q_outer.cu) */
  expect_nvrtc_error_at("fwd_q_outer.cu", "// Mask keys past the end and, when causal", V64);
  /* in an included file */
  expect_nvrtc_error_at("common.cuh", "// 32-bit division: bh (blockIdx.y, or a persistent", V64);
}

Test(variant, arch_for_compute_capability) {
  cr_assert_eq(fg_arch_for_cc(8, 0), FG_ARCH_SM80);
  cr_assert_eq(fg_arch_for_cc(8, 6), FG_ARCH_SM86);
  cr_assert_eq(fg_arch_for_cc(8, 7), FG_ARCH_SM86);
  cr_assert_eq(fg_arch_for_cc(8, 9), FG_ARCH_SM89);
  cr_assert_eq(fg_arch_for_cc(9, 0), FG_ARCH_SM90A);
  /* sm_90a code does not run past 9.0: newer GPUs get plain sm_90, whose PTX they can JIT. */
  cr_assert_eq(fg_arch_for_cc(10, 0), FG_ARCH_SM90);
  cr_assert_eq(fg_arch_for_cc(12, 0), FG_ARCH_SM90);
}

/* A manifest whose plan is malformed is refused with a message that names the manifest. */
Test(render, malformed_plan_is_refused) {
  char dir[64];
  int l = line_of("bwd.lua", "template = template, main = 2,");
  make_template_dir(dir, "bwd.lua", l, "    template = template, main = 5,");
  fg_generator *g = NULL;
  char err[4096];
  setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "%s", err);
  unsetenv("FLASHGEN_TEMPLATE_DIR");
  fg_variant v = fgt_variant("bwd_d128_br64_bc128_bf16_causal_kvouter_w8_s2_sm90a");
  char *src = NULL;
  fg_kernel_meta meta;
  cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), -1);
  cr_assert(strstr(err, "launch(v)") && strstr(err, "main step"), "%s", err);
  cr_assert_null(src);
  fg_generator_destroy(g);
  remove_dir(dir);
}
