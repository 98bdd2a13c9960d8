/* test_plans.c: what the manifests' launch(v) returns for a variant, rendered (templates/fwd.lua,
 * bwd.lua): the backward's three kernels in one module and their workspaces, the Hopper
 * backward's tiled dQ accumulator, the persistent TMA forward's grid and Q buffers, every
 * backward template's split of long query ranges, the tail of kv_outer's and kv_tma's main step
 * (and the manifest's tail fields read), and bwd.cu's warp tiles for every block the fit
 * rule accepts. (test_generator.c: names, the fit rule, the
 * renderer and its sandbox; test_tma.c / test_tma_bwd.c: the plans' tensor maps.) */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_support.h" /* fgt_rm_rf */
#include "fg_autotune.h"
#include "fg_gen.h"
#include "tma_support.h"

/* The backward's plan comes from templates/bwd.lua: _pre, the main kernel, _post, in that order,
 * in one module; the five workspaces (kv_outer runs with a tail: dkv_tail third); and the template renders the auxiliary kernels' rows and
 * threads from the same numbers (no second copy in bwd.cu). */
Test(render, backward_plan_comes_from_the_manifest) {
  fg_generator *g = fgt_generator();
  const char *name = "bwd_d128_br64_bc128_bf16_causal_kvouter_w8_s1_sm80";
  fg_variant v = fgt_variant(name);
  char *src = NULL, err[4096];
  fg_kernel_meta meta;
  cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s", err);
  cr_assert_eq(meta.n_steps, 3);
  cr_assert_eq(meta.main_step, 1);
  char e[3][96];
  snprintf(e[0], sizeof e[0], "fg_%s_pre", name);
  snprintf(e[1], sizeof e[1], "fg_%s", name);
  snprintf(e[2], sizeof e[2], "fg_%s_post", name);
  fg_resources r;
  cr_assert_eq(fg_generator_resources(g, &v, &r, err, sizeof err), 0, "%s", err);
  for (int i = 0; i < 3; i++) {
    const fg_plan_step *sp = &meta.steps[i];
    cr_assert_str_eq(sp->entry, e[i], "step %d", i);
    if (i == 1) {
      cr_assert_eq(sp->grid, FG_GRID_KV_TILES);
      cr_assert_eq(sp->br, v.bc, "the main kernel's grid runs over K/V blocks of Bc");
      cr_assert_eq(sp->threads, v.warps * 32);
      cr_assert_eq(sp->smem_bytes, r.smem_bytes);
      cr_assert_eq(sp->split_rows, 65536, "the main kernel splits past 65536 rows per KV head");
      cr_assert_eq(sp->tail, 1, "the main kernel may run with a tail");
    } else {
      cr_assert_eq(sp->grid, FG_GRID_Q_TILES, "step %d", i);
      cr_assert_eq(sp->br, 64, "step %d", i);
      cr_assert_eq(sp->threads, 128, "step %d", i);
      cr_assert_eq(sp->smem_bytes, 0, "step %d", i);
      cr_assert_eq(sp->split_rows, 0, "step %d", i);
      cr_assert_eq(sp->tail, 0, "step %d", i);
    }
    /* Every step is an entry of the one module (bwd_aux.cuh's take the plan's block through
     * BWD_PARAMS: fg_bwd_params p unless the template defines it). */
    char decl[160];
    snprintf(decl, sizeof decl, i == 1 ? " %s(const __grid_constant__ fg_bwd_params p)" : " %s(BWD_PARAMS)",
             e[i]);
    cr_assert_not_null(strstr(src, decl), "no entry %s in the source", e[i]);
  }
  static const struct {
    const char *name, *param;
    int bytes, rows, det, per_key;
    long long min_group_rows;
    int tail;
  } ws[5] = {{"dq_accum", "workspace", 4 * 128, 1, 0, 0, 0, 0},
             {"dkv_accum", "dkv", 4 * (2 * 128 * 128 + 4), 128, 0, 1, 65536, 0},
             {"dkv_tail", "dkv_tail", 4 * (2 * 128 * 128 + 4), 128, 0, 1, 0, 1},
             {"dsum", "dsum", 4, 1, 0, 0, 0, 0},
             {"semaphores", "sem", 4, 16, 1, 0, 0, 0}};
  cr_assert_eq(meta.n_workspaces, 5);
  for (int i = 0; i < 5; i++) {
    const fg_plan_workspace *w = &meta.workspaces[i];
    cr_assert_str_eq(w->name, ws[i].name);
    cr_assert_str_eq(w->param, ws[i].param);
    cr_assert(w->bytes == ws[i].bytes && w->rows == ws[i].rows &&
                  w->deterministic_only == ws[i].det && w->per_key == ws[i].per_key &&
                  w->min_group_rows == ws[i].min_group_rows && w->tail == ws[i].tail,
              "workspace %s: %d B per %d rows, deterministic only %d, per key %d, from %lld, "
              "tail %d",
              w->name, w->bytes, w->rows, w->deterministic_only, w->per_key, w->min_group_rows,
              w->tail);
  }
  /* (d + 1) * 4 B per row, and 4 B per 16 rows when deterministic (no tail: dkv_tail empty). */
  uint64_t b = 0;
  cr_assert_eq(fg_plan_workspace_bytes(&meta, 3, 5, 5, 100, 100, 0, &b, NULL), 0);
  cr_assert_eq(b, 3u * 5 * 100 * 129 * 4);
  cr_assert_eq(fg_plan_workspace_bytes(&meta, 3, 5, 5, 100, 100, 1, &b, NULL), 0);
  cr_assert_eq(b, 3u * 5 * 100 * 129 * 4 + 3u * 5 * 7 * 4);
  /* Past 65536 query rows per K/V head (GQA 4: 16385 * 4), per key block of each (batch, KV
   * head) (seqlen_k 300: 3 blocks of Bc = 128) 2 * 128 * 128 floats and a 16-byte semaphore, right
   * after the dQ accumulator. */
  uint64_t off[FG_PLAN_MAX_WORKSPACES];
  cr_assert_eq(fg_plan_workspace_bytes(&meta, 3, 8, 2, 16385, 300, 0, &b, off), 0);
  cr_assert_eq(b, 3u * 8 * 16385 * 129 * 4 + 3u * 2 * 3 * (2 * 128 * 128 + 4) * 4);
  cr_assert_eq(off[1], 3u * 8 * 16385 * 128 * 4);
  cr_assert_eq(off[2], off[1] + 3u * 2 * 3 * (2 * 128 * 128 + 4) * 4);
  cr_assert_eq(off[3], off[2]);
  cr_assert_eq(fg_plan_workspace_bytes(&meta, 3, 8, 2, 16384, 300, 0, &b, NULL), 0);
  cr_assert_eq(b, 3u * 8 * 16384 * 129 * 4);
  cr_assert_not_null(
      strstr(src, "constexpr int PRE_ROWS = 64, PRE_THREADS = 128, SEM_ROWS = 16;"),
      "bwd.cu renders its auxiliary constants from the manifest");
  cr_assert_not_null(strstr(src, "constexpr int DKV_SEM_FLOATS = 4;"),
                     "bwd.cu renders dkv_accum's layout from the manifest");
  free(src);
  fg_generator_destroy(g);
}

/* kv_tma's dQ accumulator is tiled (templates/bwd.lua, bwd_tma.cu), and so is kv_outer's on
 * sm_90 / sm_90a where Br = 128 and the staging fits (dq_bulk: bwd.cu adds dQ with bulk
 * reductions): a unit of Br query rows of Br * d floats (kv_tma off 64-column blocks: d rounded
 * up to 64, its tiles' width), so each head's rows are rounded up
 * to Br (the last tile's parts are added whole), laid out in fragment order (DQ_TILED: _pre and
 * _post follow); kv_tma's dQ tile is double-buffered where two fit (the constant the template
 * renders) and single-buffered at d = 128 with three stages; _post's step declares the shared
 * memory it reorders a chunk in. kv_outer keeps the row-ordered accumulator on sm_80 (the first
 * test) and with Br = 64 or 32. */
Test(render, bulk_dq_backward_tiles_the_dq_accumulator) {
  fg_generator *g = fgt_generator();
  static const struct {
    const char *name;
    int br, d, bufs;
  } c[] = {{"bwd_d64_br128_bc128_bf16_noncausal_kvtma_w8_s2_sm90a", 128, 64, 2},
           {"bwd_d128_br64_bc128_f16_causal_kvtma_w8_s2_sm90a", 64, 128, 2},
           {"bwd_d128_br64_bc128_bf16_noncausal_kvtma_w8_s3_sm90a", 64, 128, 1},
           /* d = 96 and 40 on tiles 128 and 64 wide (bwd_tma.cu DQ_W): the accumulator too */
           {"bwd_d96_br64_bc128_bf16_noncausal_kvtma_w8_s2_sm90a", 64, 128, 2},
           {"bwd_d40_br128_bc128_f16_causal_kvtma_w8_s2_sm90a", 128, 64, 2},
           {"bwd_d64_br128_bc128_bf16_noncausal_kvouter_w8_s2_sm90a", 128, 64, 0},
           {"bwd_d32_br128_bc128_f16_causal_kvouter_w8_s2_sm90", 128, 32, 0},
           {"bwd_d128_br64_bc128_f16_causal_kvouter_w8_s2_sm90a", 1, 128, -1},
           {"bwd_d96_br32_bc64_bf16_causal_kvouter_w4_s2_sm90a", 1, 96, -1}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    fg_variant v = fgt_variant(c[i].name);
    char *src = NULL, err[4096];
    fg_kernel_meta meta;
    cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s", err);
    const fg_plan_workspace *w = &meta.workspaces[0];
    cr_assert_str_eq(w->name, "dq_accum");
    cr_assert(w->rows == c[i].br && w->bytes == 4 * c[i].d * c[i].br, "%s: %d B per %d rows",
              c[i].name, w->bytes, w->rows);
    if (c[i].bufs < 0) { /* row order: d floats a row, no DQ_TILED, _post without shared memory */
      cr_assert_null(strstr(src, "#define DQ_TILED 1"), "%s", c[i].name);
      cr_assert_eq(meta.steps[2].smem_bytes, 0, "%s", c[i].name);
      free(src);
      continue;
    }
    /* 100 query rows: 128 per head (two tiles of 64 or one of 128), then D (4 B a row; after
     * dkv_accum and dkv_tail, both empty here); bwd_tma.cu (the rows with NBUF) at Br 64 claims
     * each dQ part through a semaphore (4 B per 16 rows) also without deterministic mode
     * (bwd_aux.cuh: dq_claim), the others have them only in it. */
    uint64_t b = 0, off[FG_PLAN_MAX_WORKSPACES];
    cr_assert_eq(fg_plan_workspace_bytes(&meta, 3, 5, 5, 100, 100, 0, &b, off), 0);
    int dsum = 0;
    while (dsum < meta.n_workspaces && strcmp(meta.workspaces[dsum].name, "dsum")) dsum++;
    cr_assert_eq(dsum, 3, "%s: dq_accum, dkv_accum, dkv_tail, then dsum", c[i].name);
    cr_assert_eq(off[dsum], 3u * 5 * 128 * c[i].d * 4, "%s", c[i].name);
    cr_assert_eq(b, off[dsum] + 3u * 5 * 100 * 4 + (c[i].bufs > 0 && c[i].br == 64 ? 3u * 5 * 7 * 4 : 0), "%s", c[i].name);
    char want[64];
    snprintf(want, sizeof want, "NBUF = %d;", c[i].bufs);
    cr_assert(c[i].bufs == 0 || strstr(src, want), "%s: %s", c[i].name, want);
    cr_assert_not_null(strstr(src, "#define DQ_TILED 1"), "%s", c[i].name);
    /* _post reorders a 64-row chunk in dynamic shared memory, which its step declares. */
    cr_assert_eq(meta.steps[2].smem_bytes, 64 * (c[i].d + 8) * 2, "%s", c[i].name);
    free(src);
  }
  fg_generator_destroy(g);
}

/* Past d = 128 with a causal mask the backward runs deterministic mode's order also without it
 * up to 1024 keys (bwd_aux.cuh det_order, bwd.lua det_order_max_keys), so its plan has the
 * semaphores in either mode; without a mask, and at d <= 128, only in deterministic mode or where
 * bwd_tma.cu claims dQ parts (Br 64). */
Test(render, causal_past_d128_takes_the_deterministic_order_up_to_1024_keys) {
  fg_generator *g = fgt_generator();
  static const struct {
    const char *name;
    int max_keys, sems_always;
  } c[] = {{"bwd_d256_br64_bc64_bf16_causal_kvtma_w8_s2_sm90a", 1024, 1},
           {"bwd_d160_br64_bc64_f16_causal_kvtma_w8_s2_sm90a", 1024, 1},
           {"bwd_d256_br64_bc64_bf16_noncausal_kvtma_w8_s2_sm90a", 0, 0},
           {"bwd_d128_br64_bc128_bf16_causal_kvtma_w8_s2_sm90a", 0, 1},
           {"bwd_d64_br128_bc128_bf16_causal_kvtma_w8_s2_sm90a", 0, 0}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    fg_variant v = fgt_variant(c[i].name);
    char *src = NULL, err[4096], want[64];
    fg_kernel_meta meta;
    cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s", err);
    snprintf(want, sizeof want, "#define DET_ORDER_MAX_KEYS %d", c[i].max_keys);
    cr_assert(c[i].max_keys == 0 ? strstr(src, "#define DET_ORDER_MAX_KEYS 1024") == NULL : strstr(src, want) != NULL,
              "%s: %s", c[i].name, want);
    int found = 0;
    for (int j = 0; j < meta.n_workspaces; j++)
      if (strcmp(meta.workspaces[j].name, "semaphores") == 0) {
        found = 1;
        cr_assert_eq(meta.workspaces[j].deterministic_only, !c[i].sems_always, "%s", c[i].name);
      }
    cr_assert(found, "%s: no semaphores", c[i].name);
    free(src);
  }
  fg_generator_destroy(g);
}

/* The plan of variant `name`, written as text, holds `words` (its main step's grid kind and rows)
 * and reads back with its main step's grid kind `grid`. */
static void expect_plan_grid(fg_generator *g, const char *name, const char *words, fg_grid_kind grid) {
  fg_variant v = fgt_variant(name);
  char *src = NULL, err[4096];
  fg_kernel_meta meta;
  cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s", err);
  free(src);
  char text[512];
  fg_kernel_plan_format(&meta, text, sizeof text);
  cr_assert_not_null(strstr(text, words), "%s", text);
  fg_kernel_meta back;
  memset(&back, 0, sizeof back);
  cr_assert_null(fg_kernel_plan_parse(text, &back), "%s", text);
  cr_assert_eq(fg_kernel_main(&back)->grid, grid);
}

/* q_tma_p is fwd_tma.cu on the persistent grid: the same template with PERSIST on, two Q buffers
 * where they fit (the next tile's Q loads while this one is computed), one where not (d = 256,
 * Bc 80: 225 KB with one), and with two, causal, 128 columns and two consumers, an O buffer where
 * it fits (o_buf: d = 128 Bc 128 takes 225 KB with it; not without a mask, at d = 64, nor on three
 * consumers); q_tma renders PERSIST off with one Q buffer. q_tma_d is q_tma_p with DYN on (its
 * tiles from a counter) and a workspace of one word per (batch, head) for the counter; q_tma_dp is
 * q_tma_d with PP on (its two consumers in ping-pong: the softmax with turns), two consumers only.
 * With one Q buffer on the persistent grid, where each consumer's O area fits beside it (64 rows
 * of half the tile's 64-column blocks, one block where their number is odd), QEARLY is on and the
 * areas are in the block's shared memory (d = 256 Bc 64: 32 KB more; d = 192 Bc 96: 16 KB; d =
 * 256 Bc 80 has no room: off). */
Test(render, tma_persistent_is_the_tma_template_on_a_persistent_grid) {
  fg_generator *g = fgt_generator();
  static const struct {
    const char *name;
    int persist, qbufs, obuf, d, br, bc, dyn, pp, opart; /* opart: QEARLY's O part, 0 = off */
  } c[] = {{"fwd_d128_br128_bc128_bf16_noncausal_qtmap_w8_s2_sm90a", 1, 2, 0, 128, 128, 128, 0, 0, 0},
           {"fwd_d64_br192_bc64_f16_causal_qtmap_w12_s2_sm90a", 1, 2, 0, 64, 192, 64, 0, 0, 0},
           {"fwd_d256_br128_bc80_bf16_noncausal_qtmap_w8_s2_sm90a", 1, 1, 0, 256, 128, 80, 0, 0, 0},
           {"fwd_d256_br128_bc64_bf16_noncausal_qtmap_w8_s2_sm90a", 1, 1, 0, 256, 128, 64, 0, 0, 2},
           {"fwd_d192_br128_bc96_f16_noncausal_qtmap_w8_s2_sm90a", 1, 1, 0, 192, 128, 96, 0, 0, 1},
           {"fwd_d256_br128_bc64_bf16_causal_qtmadp_w8_s2_sm90a", 1, 1, 0, 256, 128, 64, 1, 1, 2},
           {"fwd_d128_br128_bc128_bf16_causal_qtmap_w8_s2_sm90a", 1, 2, 1, 128, 128, 128, 0, 0, 0},
           {"fwd_d128_br128_bc112_f16_causal_qtmap_w8_s2_sm90a", 1, 2, 1, 128, 128, 112, 0, 0, 0},
           {"fwd_d64_br128_bc128_bf16_causal_qtmap_w8_s2_sm90a", 1, 2, 0, 64, 128, 128, 0, 0, 0},
           {"fwd_d128_br128_bc128_bf16_noncausal_qtma_w8_s2_sm90a", 0, 1, 0, 128, 128, 128, 0, 0, 0},
           {"fwd_d256_br128_bc64_bf16_causal_qtma_w8_s2_sm90a", 0, 1, 0, 256, 128, 64, 0, 0, 0},
           {"fwd_d128_br128_bc128_bf16_causal_qtmad_w8_s2_sm90a", 1, 2, 1, 128, 128, 128, 1, 0, 0},
           {"fwd_d64_br192_bc128_f16_noncausal_qtmad_w12_s2_sm90a", 1, 2, 0, 64, 192, 128, 1, 0, 0},
           {"fwd_d128_br128_bc128_bf16_causal_qtmadp_w8_s2_sm90a", 1, 2, 1, 128, 128, 128, 1, 1, 0},
           {"fwd_d128_br128_bc128_f16_noncausal_qtmadp_w8_s2_sm90a", 1, 2, 0, 128, 128, 128, 1, 1, 0}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    fg_variant v = fgt_variant(c[i].name);
    char *src = NULL, err[4096];
    fg_kernel_meta meta;
    cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s", err);
    cr_assert_eq(fg_kernel_main(&meta)->grid,
                 c[i].persist ? FG_GRID_PERSISTENT : FG_GRID_Q_TILES, "%s", c[i].name);
    cr_assert_eq(fg_kernel_main(&meta)->br, c[i].br, "%s", c[i].name);
    cr_assert_eq(meta.params, FG_PARAMS_FWD_TMA, "%s", c[i].name);
    cr_assert_eq(fg_kernel_main(&meta)->smem_bytes,
                 ((c[i].qbufs + c[i].obuf) * c[i].br + 4 * c[i].bc) * c[i].d * 2 + 1024 + 256 +
                     (c[i].br / 64) * 64 * c[i].opart * 128,
                 "%s", c[i].name);
    char want[64];
    snprintf(want, sizeof want, "PERSIST = %s;", c[i].persist ? "true" : "false");
    cr_assert_not_null(strstr(src, want), "%s: %s", c[i].name, want);
    snprintf(want, sizeof want, "QBUFS = %d;", c[i].qbufs);
    cr_assert_not_null(strstr(src, want), "%s: %s", c[i].name, want);
    snprintf(want, sizeof want, "OBUF = %s;", c[i].obuf ? "true" : "false");
    cr_assert_not_null(strstr(src, want), "%s: %s", c[i].name, want);
    snprintf(want, sizeof want, "DYN = %s;", c[i].dyn ? "true" : "false");
    cr_assert_not_null(strstr(src, want), "%s: %s", c[i].name, want);
    snprintf(want, sizeof want, "PP = %s;", c[i].pp ? "true" : "false");
    cr_assert_not_null(strstr(src, want), "%s: %s", c[i].name, want);
    snprintf(want, sizeof want, "QEARLY = %s;", c[i].opart ? "true" : "false");
    cr_assert_not_null(strstr(src, want), "%s: %s", c[i].name, want);
    if (c[i].opart) {
      snprintf(want, sizeof want, "OPART = %d;", c[i].opart);
      cr_assert_not_null(strstr(src, want), "%s: %s", c[i].name, want);
    }
    /* the turns are rendered into the softmax only where PP is on */
    cr_assert_eq(strstr(src, "pingpong_wait(wg);") != NULL, c[i].pp, "%s", c[i].name);
    cr_assert_eq(meta.n_workspaces, c[i].dyn, "%s", c[i].name);
    if (c[i].dyn)
      cr_assert(strcmp(meta.workspaces[0].name, "tile_counter") == 0 &&
                    strcmp(meta.workspaces[0].param, "workspace") == 0 &&
                    meta.workspaces[0].bytes == 8 && meta.workspaces[0].rows == 2147483647 &&
                    !meta.workspaces[0].per_key,
                "%s", c[i].name);
    free(src);
  }
  /* q_tma_dp takes two consumer warpgroups only, and says so. */
  fg_variant w12 = fgt_variant("fwd_d128_br128_bc128_bf16_causal_qtmadp_w8_s2_sm90a");
  w12.warps = 4, w12.br = 64;
  char *src = NULL, err[4096] = "";
  fg_kernel_meta meta;
  cr_assert_neq(fg_generator_render(g, &w12, &src, &meta, err, sizeof err), 0);
  cr_assert(strstr(err, "two consumer warpgroups take turns"), "%s", err);
  free(src);
  /* The plan names the grid kind and reads back (tests/test_tma.c launches it on the fake). */
  expect_plan_grid(g, c[0].name, " persistent 128 ", FG_GRID_PERSISTENT);
  fg_generator_destroy(g);
}

/* The key block the built-in rule gives three consumer warpgroups (fg_builtin_w12_bc, C) is the
 * largest multiple of 16 that fwd.lua's register fit lets them hold: it fits, 16 more does not,
 * at every head dim it is used for (d = 72..184), on the plain grid and with a mask or not. */
Test(render, builtin_three_consumer_key_block_is_the_fit_rules_largest) {
  fg_generator *g = fgt_generator();
  const fg_device_limits *lim = fg_limits_for_arch(FG_ARCH_SM90A);
  for (int d = 72; d <= 184; d += 8) {
    if (d == 128) continue; /* the three consumers' rule is for head dims off the 64-column blocks */
    for (int causal = 0; causal <= 1; causal++) {
      const int bc = fg_builtin_w12_bc(d);
      fg_variant v = {FG_PASS_FWD, d, 192, bc, FG_DTYPE_BF16, causal, FG_LOOP_Q_TMA, 12, 2,
                      FG_ARCH_SM90A};
      char why[512] = "";
      cr_assert_eq(fg_variant_fits(g, &v, lim, why, sizeof why), 1, "d = %d Bc %d: %s", d, bc, why);
      v.bc = bc + 16;
      cr_assert_eq(fg_variant_fits(g, &v, lim, why, sizeof why), 0, "d = %d Bc %d fits", d, v.bc);
      cr_assert(strstr(why, "registers"), "d = %d Bc %d: %s", d, v.bc, why);
    }
  }
  fg_generator_destroy(g);
}

/* q_tma_c is fwd_tma.cu on clusters of two blocks: the kernel compiled with its cluster shape,
 * the grid "q_tile_pairs", K/V boxes of half a block (each block loads half, multicast to both);
 * q_tma has no cluster; with a causal mask the same (the pair loads the later tile's blocks). */
Test(render, tma_cluster_is_the_tma_template_on_pairs_of_tiles) {
  fg_generator *g = fgt_generator();
  static const struct {
    const char *name;
    int cluster, br, bc;
  } c[] = {{"fwd_d216_br128_bc80_bf16_noncausal_qtmac_w8_s2_sm90a", 2, 128, 80},
           {"fwd_d72_br192_bc112_f16_noncausal_qtmac_w12_s2_sm90a", 2, 192, 112},
           {"fwd_d216_br128_bc80_bf16_noncausal_qtma_w8_s2_sm90a", 1, 128, 80},
           {"fwd_d200_br128_bc64_f16_causal_qtmac_w8_s2_sm90a", 2, 128, 64}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    fg_variant v = fgt_variant(c[i].name);
    char *src = NULL, err[4096];
    fg_kernel_meta meta;
    cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s", err);
    const fg_plan_step *s = fg_kernel_main(&meta);
    cr_assert_eq(s->grid, c[i].cluster > 1 ? FG_GRID_Q_TILE_PAIRS : FG_GRID_Q_TILES, "%s", c[i].name);
    cr_assert_eq(s->br, c[i].br, "%s", c[i].name);
    cr_assert_eq(meta.n_tmaps, 4);
    cr_assert(meta.tmaps[0].rows == c[i].br && meta.tmaps[1].rows == c[i].bc / c[i].cluster &&
                  meta.tmaps[2].rows == c[i].bc / c[i].cluster && meta.tmaps[3].rows == 64,
              "%s", c[i].name);
    char want[64];
    snprintf(want, sizeof want, "CLUSTER = %d;", c[i].cluster);
    cr_assert_not_null(strstr(src, want), "%s: %s", c[i].name, want);
    cr_assert_eq(strstr(src, "__cluster_dims__(2, 1, 1) fg_") != NULL, c[i].cluster > 1, "%s", c[i].name);
    free(src);
  }
  /* The plan names the grid kind and reads back. */
  expect_plan_grid(g, c[0].name, " q_tile_pairs 128 ", FG_GRID_Q_TILE_PAIRS);
  fg_generator_destroy(g);
}

/* Every backward template splits long query ranges (kv_outer at every d, kv_wgmma): the main
 * step's split_rows and a per-key dkv_accum of the same threshold, (2 Bc d + 4) * 4 bytes per key
 * block (the unpadded head dimension: the epilogue adds only the columns below d), and the
 * kernels read the split from the grid's z and p.dkv. */
Test(render, every_backward_template_splits_long_query_ranges) {
  fg_generator *g = fgt_generator();
  static const char *const names[] = {"bwd_d96_br64_bc128_bf16_causal_kvouter_w8_s2_sm90a",
                                      "bwd_d64_br128_bc128_bf16_causal_kvwgmma_w8_s2_sm90a",
                                      "bwd_d128_br64_bc128_f16_noncausal_kvwgmma_w8_s2_sm90a",
                                      "bwd_d192_br64_bc64_bf16_noncausal_kvouter_w8_s1_sm90a",
                                      "bwd_d256_br32_bc64_f16_causal_kvouter_w8_s1_sm80"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    fg_variant v = fgt_variant(names[i]);
    char *src = NULL, err[4096];
    fg_kernel_meta meta;
    cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s: %s", names[i],
                 err);
    cr_assert_eq(fg_kernel_main(&meta)->split_rows, 65536, "%s", names[i]);
    const fg_plan_workspace *w = &meta.workspaces[1];
    cr_assert_str_eq(w->param, "dkv", "%s", names[i]);
    cr_assert(w->per_key == 1 && w->rows == v.bc && w->min_group_rows == 65536 &&
                  w->bytes == 4 * (2 * v.bc * v.d + 4),
              "%s: %d B per %d key rows from %lld (expected %d)", names[i], w->bytes, w->rows,
              w->min_group_rows, 4 * (2 * v.bc * v.d + 4));
    cr_assert(strstr(src, "if (p.dkv) {"), "%s adds its split's sums to dkv_accum", names[i]);
    cr_assert(strstr(src, "blockIdx.z"), "%s reads its split from the grid's z", names[i]);
    free(src);
  }
  fg_generator_destroy(g);
}

/* The tail (templates/bwd.lua: bwd.cu and bwd_tma.cu; core/fg_tail.h): kv_outer's and kv_tma's
 * main step may run with one and the plan has dkv_tail third, (2 Bc d + 4) * 4 bytes per key block
 * of the launch's tail in total (not per head: 0 units; fg_plan_workspace_bytes_tail sizes it,
 * and the workspaces after it start that much later); kv_wgmma's runs without, with the four
 * workspaces. */
Test(render, kv_outer_and_kv_tma_run_with_a_tail_kv_wgmma_without) {
  fg_generator *g = fgt_generator();
  static const struct {
    const char *name;
    int tail;
  } c[] = {{"bwd_d64_br128_bc128_bf16_noncausal_kvouter_w8_s2_sm90a", 1},
           {"bwd_d128_br64_bc128_bf16_noncausal_kvtma_w8_s2_sm90a", 1},
           {"bwd_d64_br64_bc64_bf16_noncausal_kvwgmma_w4_s2_sm90a", 0}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    fg_variant v = fgt_variant(c[i].name);
    char *src = NULL, err[4096];
    fg_kernel_meta meta;
    cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s: %s",
                 c[i].name, err);
    free(src);
    for (int j = 0; j < meta.n_steps; j++)
      cr_assert_eq(meta.steps[j].tail, j == meta.main_step && c[i].tail, "%s: step %d",
                   c[i].name, j);
    cr_assert_eq(meta.n_workspaces, 4 + c[i].tail, "%s", c[i].name);
    static const char *const names[2][5] = {
        {"dq_accum", "dkv_accum", "dsum", "semaphores", NULL},
        {"dq_accum", "dkv_accum", "dkv_tail", "dsum", "semaphores"}};
    for (int j = 0; j < meta.n_workspaces; j++) {
      const fg_plan_workspace *w = &meta.workspaces[j];
      cr_assert_str_eq(w->name, names[c[i].tail][j], "%s", c[i].name);
      cr_assert_eq(w->tail, c[i].tail && j == 2, "%s: %s", c[i].name, w->name);
    }
    uint64_t b0 = 0, bt = 0, off0[FG_PLAN_MAX_WORKSPACES], offt[FG_PLAN_MAX_WORKSPACES];
    /* GQA 4, seqlen_k 1000: dkv_accum empty (16384 * 4 rows per KV head: not past 65536). */
    cr_assert_eq(fg_plan_workspace_bytes(&meta, 3, 8, 2, 16384, 1000, 1, &b0, off0), 0);
    cr_assert_eq(fg_plan_workspace_bytes_tail(&meta, 3, 8, 2, 16384, 1000, 1, 0, &bt, offt), 0);
    cr_assert_eq(bt, b0, "%s: tail_blocks 0 is fg_plan_workspace_bytes", c[i].name);
    cr_assert_eq(memcmp(offt, off0, (size_t)meta.n_workspaces * sizeof off0[0]), 0, "%s",
                 c[i].name);
    cr_assert_eq(fg_plan_workspace_bytes_tail(&meta, 3, 8, 2, 16384, 1000, 1, 7, &bt, offt), 0);
    if (!c[i].tail) { /* no tail workspace: tail_blocks changes nothing */
      cr_assert_eq(bt, b0, "%s", c[i].name);
      continue;
    }
    const fg_plan_workspace *tw = &meta.workspaces[2];
    cr_assert(tw->per_key == 1 && tw->rows == v.bc && tw->min_group_rows == 0 &&
                  tw->deterministic_only == 0 && tw->bytes == 4 * (2 * v.bc * v.d + 4) &&
                  strcmp(tw->param, "dkv_tail") == 0,
              "%s: %s %d B per %d key rows, per key %d, from %lld, deterministic only %d",
              c[i].name, tw->param, tw->bytes, tw->rows, tw->per_key, tw->min_group_rows,
              tw->deterministic_only);
    cr_assert_eq(fg_plan_workspace_units(tw, v.bc, 8, 2, 16384, 1000, 1), 0,
                 "%s: the tail's workspace is not sized per head", c[i].name);
    const uint64_t tail = 7u * (uint64_t)tw->bytes;
    cr_assert_eq(bt, b0 + tail, "%s", c[i].name);
    for (int j = 0; j < meta.n_workspaces; j++)
      cr_assert_eq(offt[j], off0[j] + (j > 2 ? tail : 0), "%s: workspace %d", c[i].name, j);
    /* The tail's bytes are overflow-checked like the rest. */
    cr_assert_eq(fg_plan_workspace_bytes_tail(&meta, 3, 8, 2, 16384, 1000, 1, UINT64_MAX / 2,
                                              &bt, NULL),
                 -1, "%s", c[i].name);
  }
  fg_generator_destroy(g);
}

/* The manifest's tail fields (generator/plan_lua.c): a boolean or the integer 0 or 1 on a step
 * and on a workspace (absent: 0); anything else is refused naming the field, and so is a plan
 * whose tail fields disagree (fg_kernel_meta_invalid). STEP and WS: the texts of bwd.lua
 * replaced, the main step's tail and the tail workspace's. */
#define STEP "split_rows = SPLIT_ROWS, tail = tail }"
#define WS "per = \"key\", tail = true }"
Test(render, the_manifests_tail_is_a_boolean_or_0_or_1) {
  static const struct {
    const char *from, *to, *needle; /* needle NULL: accepted, with tail 1 on both */
  } c[] = {
      {STEP, "split_rows = SPLIT_ROWS, tail = tail and 1 }", NULL},
      {WS, "per = \"key\", tail = 1 }", NULL},
      {STEP, "split_rows = SPLIT_ROWS, tail = 2 }", "a step whose tail is neither"},
      {STEP, "split_rows = SPLIT_ROWS, tail = \"yes\" }", "a step whose tail is neither"},
      {STEP, "split_rows = SPLIT_ROWS, tail = 1.0 }", "a step whose tail is neither"},
      {WS, "per = \"key\", tail = -1 }", "a workspace whose tail is neither"},
      {WS, "per = \"key\", tail = {} }", "a workspace whose tail is neither"},
      {STEP, "split_rows = SPLIT_ROWS, tail = 0 }", "its main step runs without a tail"},
      {WS, "per = \"key\", tail = false }", "no tail workspace"},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    char dir[64], err[4096] = "";
    fgt_template_dir(dir, "/tmp/fg-plans-tpl-XXXXXX", "bwd.lua", c[i].from, c[i].to);
    fg_kernel_meta m;
    const int rc = fgt_render_in(dir, "bwd_d64_br128_bc128_bf16_noncausal_kvouter_w8_s2_sm90a", &m,
                                 err, sizeof err);
    if (!c[i].needle) {
      cr_assert_eq(rc, 0, "%s: %s", c[i].to, err);
      cr_assert(fg_kernel_main(&m)->tail == 1 && m.workspaces[2].tail == 1, "%s", c[i].to);
    } else {
      cr_assert_neq(rc, 0, "accepted: %s", c[i].to);
      cr_assert(strstr(err, c[i].needle) && strstr(err, "templates/README.md"),
                "for %s: '%s' lacks '%s'", c[i].to, err, c[i].needle);
    }
    fgt_rm_rf(dir);
  }
}
#undef STEP
#undef WS

/* bwd.cu's warp tiles (bwd.lua: layout) cover its blocks for every mma.sync backward variant the
 * fit rule accepts on sm_80 and sm_90a (Br, Bc 16..128, 4 / 8 / 16 warps, head dims 32..256): S and
 * dP (Br x Bc) in WS x WK warps of m16 x n16 tiles, dK and dV (Bc x d_pad) in WM x WN, dQ (Br x
 * d_pad) in WQ x WD. bwd.cu's static_asserts say the same, but only NVRTC sees them, and the
 * tuner compiles shapes CI does not. */
static int rendered_int(const char *src, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "constexpr int %s = ", name);
  const char *at = strstr(src, key);
  if (!at) {
    snprintf(key, sizeof key, ", %s = ", name);
    at = strstr(src, key);
  }
  cr_assert_not_null(at, "no %s in the rendered source", name);
  return atoi(at + strlen(key));
}

Test(render, portable_backward_warp_tiles_cover_every_accepted_block) {
  fg_generator *g = fgt_generator();
  static const int blocks[] = {16, 32, 64, 128}, warps[] = {4, 8, 16}, dims[] = {32, 64, 96, 128, 200, 256};
  static const fg_arch arches[] = {FG_ARCH_SM80, FG_ARCH_SM90A};
  int accepted = 0;
  char why[256];
  for (size_t a = 0; a < 2; a++)
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
      for (size_t bi = 0; bi < 4; bi++)
        for (size_t ci = 0; ci < 4; ci++)
          for (size_t wi = 0; wi < 3; wi++) {
            fg_variant v = {FG_PASS_BWD, dims[di], blocks[bi], blocks[ci], FG_DTYPE_BF16, 1,
                            FG_LOOP_KV_OUTER, warps[wi], 1, arches[a]};
            if (fg_variant_fits(g, &v, fg_limits_for_arch(arches[a]), why, sizeof why) != 1) continue;
            char *src = NULL, err[4096];
            fg_kernel_meta meta;
            cr_assert_eq(fg_generator_render(g, &v, &src, &meta, err, sizeof err), 0, "%s", err);
            const int W = warps[wi], br = v.br, bc = v.bc, dp = rendered_int(src, "DP");
            const int ws = rendered_int(src, "WS"), wm = rendered_int(src, "WM"), wq = rendered_int(src, "WQ");
            cr_assert(ws >= 1 && W % ws == 0 && wm >= 1 && W % wm == 0 && wq >= 1 && W % wq == 0,
                      "d %d Br %d Bc %d warps %d: WS %d WM %d WQ %d", v.d, br, bc, W, ws, wm, wq);
            /* S, dP: MS m16 tiles of queries, NS n8 tiles of keys (pairs, for ldmatrix x4) */
            cr_assert(br % (16 * ws) == 0 && bc % (16 * (W / ws)) == 0,
                      "d %d Br %d Bc %d warps %d: S in %d x %d warps", v.d, br, bc, W, ws, W / ws);
            cr_assert(bc % (16 * wm) == 0 && dp % (16 * (W / wm)) == 0,
                      "d %d Br %d Bc %d warps %d: dK, dV in %d x %d warps", v.d, br, bc, W, wm, W / wm);
            cr_assert(br % (16 * wq) == 0 && dp % (16 * (W / wq)) == 0,
                      "d %d Br %d Bc %d warps %d: dQ in %d x %d warps", v.d, br, bc, W, wq, W / wq);
            free(src);
            accepted++;
          }
  cr_assert_gt(accepted, 50, "only %d variants accepted: the grid above no longer reaches the rule", accepted);
  fg_generator_destroy(g);
}
