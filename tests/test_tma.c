/* test_tma.c: the host side of kernels that load through TMA tensor maps (issue 13), without a
 * GPU. A plan's parameter block and tensor maps: fwd.lua's q_tma plan as the generator reads it
 * (and its refusals of malformed ones), the plan's text (round trip, older text unchanged,
 * malformed lines refused), the cache and exported tables carrying them (older tables as "no
 * maps"), explain's line. Then the launch on the fake driver (tests/fake_cuda/libcuda.c, whose
 * cuTensorMapEncodeTiled records its arguments and whose qtma kernels read Q, K and V through
 * the maps): the encoded dims, strides, box, swizzle and data type for GQA, Nq != Nk, (B, N, H, d)
 * strides, dimensions of size 1 and batch chunks, the output equal to the same kernel reading
 * through pointers, and the refusals (a stride the TMA cannot take, an encode the driver refuses,
 * a driver without cuTensorMapEncodeTiled), none of which launches anything. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "fake_support.h"
#include "cache_support.h"
#include "fg_gen.h"
#include "fg_params.h"
#include "fg_runtime_internal.h"
#include "flashgen_export.h"
#include "tma_support.h"

/* ---- the plan's text (core/kernel.c) ------------------------------------------------------ */

static const char *const TMA_NAME = "fwd_d64_br128_bc64_bf16_noncausal_qtma_w8_s2_sm90a";

/* The q_tma plan of fwd.lua for a variant of Br = br, Bc = bc (entry fg_<name>). */
static void tma_plan(fg_kernel_meta *m, const char *name, int br, int bc) {
  char e[64];
  snprintf(e, sizeof e, "fg_%.60s", name);
  fg_kernel_meta_single(m, e, FG_GRID_Q_TILES, br, 384, 99584);
  m->params = FG_PARAMS_FWD_TMA;
  m->n_tmaps = 4;
  m->tmaps[0] = (fg_plan_tmap){FG_TMAP_Q, br};
  m->tmaps[1] = (fg_plan_tmap){FG_TMAP_K, bc};
  m->tmaps[2] = (fg_plan_tmap){FG_TMAP_V, bc};
  m->tmaps[3] = (fg_plan_tmap){FG_TMAP_O, 64};
}

/* A q_tma plan: Q, K, V loaded, and (fwd.lua's, n_maps 4) O stored by each consumer warpgroup,
 * 64 rows; the runtime tests' hand-made tables hold the first three. */
static void expect_tma_plan_n(const fg_kernel_meta *m, int br, int bc, int n_maps) {
  const fg_tmap_tensor t[4] = {FG_TMAP_Q, FG_TMAP_K, FG_TMAP_V, FG_TMAP_O};
  const int rows[4] = {br, bc, bc, 64};
  fgt_expect_plan_tmaps(m, FG_PARAMS_FWD_TMA, n_maps, t, rows);
}
static void expect_tma_plan(const fg_kernel_meta *m, int br, int bc) {
  expect_tma_plan_n(m, br, bc, 4);
}

Test(plan_text, tensor_maps_round_trip) {
  fg_kernel_meta m, back;
  tma_plan(&m, TMA_NAME, 128, 64);
  char text[1024];
  const int n = fg_kernel_plan_format(&m, text, sizeof text);
  cr_assert(n > 0 && (size_t)n < sizeof text);
  cr_assert(strstr(text, "params fwd_tma\ntmap q 128\ntmap k 64\ntmap v 64\ntmap o 64\n"), "%s", text);
  memset(&back, 0x5a, sizeof back);
  const char *why = fg_kernel_plan_parse(text, &back);
  cr_assert_null(why, "%s", why);
  expect_tma_plan(&back, 128, 64);
  cr_assert_eq(back.steps[0].br, 128);
}

Test(plan_text, a_plan_without_maps_reads_and_writes_as_before) {
  fg_kernel_meta m;
  fg_kernel_meta_single(&m, "fg_x", FG_GRID_Q_TILES, 64, 128, 1024);
  char text[1024];
  fg_kernel_plan_format(&m, text, sizeof text);
  cr_assert_str_eq(text, "main 0\nstep fg_x q_tiles 64 128 1024\n",
                   "the text (and so the checksum) of a plan without maps must not change");
  /* Text written before parameter blocks: the pass's own block, no maps (whatever m held). */
  fg_kernel_meta back;
  tma_plan(&back, TMA_NAME, 128, 64);
  cr_assert_null(fg_kernel_plan_parse(text, &back));
  cr_assert_eq(back.params, FG_PARAMS_DEFAULT);
  cr_assert_eq(back.n_tmaps, 0);
}

Test(plan_text, malformed_lines_are_refused) {
  static const struct {
    const char *tail, *needle;
  } bad[] = {
      {"params fwd_tmx\n", "parameter block"},
      {"params fwd_tma\ntmap x 64\n", "other than q, k, v, o or do"},
      {"params fwd_tma\ntmap q 0\n", "tensor map of its plan is malformed"},
      {"params fwd_tma\ntmap q 257\n", "tensor map of its plan is malformed"},
      {"params fwd_tma\ntmap q 64 1\n", "not main, step, workspace, params or tmap"},
      {"tmap q 64\n", "not a parameter block that carries them"},
      {"params fwd_tma\ntmap q 1\ntmap k 1\ntmap v 1\ntmap o 1\ntmap q 1\n", "too many tensor maps"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    fgt_expect_plan_refused("q_tiles", bad[i].tail, bad[i].needle);
  /* Four maps, one of each tensor, are fine. */
  fg_kernel_meta m;
  cr_assert_null(fg_kernel_plan_parse("main 0\nstep fg_x q_tiles 64 128 0\nparams fwd_tma\n"
                                      "tmap q 1\ntmap k 2\ntmap v 3\ntmap o 256\n",
                                      &m));
  cr_assert(m.n_tmaps == 4 && m.tmaps[3].tensor == FG_TMAP_O && m.tmaps[3].rows == 256);
}

/* ---- the generator: fwd.lua's plan (generator/render.c) ----------------------------------- */

/* A copy of templates/ in dir, with fwd_tma.cu a stub (the kernel is the lead's; the plan is
 * what is read here) and fwd.lua's text `from` replaced by `to` (NULL: unchanged). */
static void template_dir(char dir[64], const char *from, const char *to) {
  fgt_template_dir(dir, "/tmp/fg-tma-tpl-XXXXXX", "fwd.lua", from, to);
  fgt_write_text(dir, "fwd_tma.cu",
                 "// a stub of the q_tma kernel for test_tma.c\n"
                 "extern \"C\" __global__ void {{ entry }}() {}\n");
}

Test(generator, reads_the_q_tma_plan_of_fwd_lua) {
  char dir[64], err[4096];
  template_dir(dir, NULL, NULL);
  fg_kernel_meta m;
  cr_assert_eq(fgt_render_in(dir, TMA_NAME, &m, err, sizeof err), 0, "%s", err);
  expect_tma_plan(&m, 128, 64);
  cr_assert_eq(m.steps[0].threads, 8 * 32 + 128, "consumers and the producer warpgroup");
  cr_assert_eq(fg_kernel_main(&m)->grid, FG_GRID_Q_TILES);
  cr_assert_eq(fgt_render_in(dir, "fwd_d128_br64_bc128_f16_noncausal_qtma_w4_s2_sm90a", &m, err,
                             sizeof err),
               0, "%s", err);
  expect_tma_plan(&m, 64, 128);
  /* The other loop orders keep the pass's own block, without maps. */
  cr_assert_eq(fgt_render_in(dir, "fwd_d64_br128_bc64_bf16_noncausal_qwgmma_w8_s2_sm90a", &m,
                             err, sizeof err),
               0, "%s", err);
  cr_assert(m.params == FG_PARAMS_DEFAULT && m.n_tmaps == 0);
  fgt_rm_rf(dir);
}

Test(generator, malformed_tensor_maps_are_refused) {
  static const char *const tmaps =
      "t.tmaps = { { tensor = \"q\", rows = v.br }, { tensor = \"k\", rows = v.bc // cluster },\n"
      "                { tensor = \"v\", rows = v.bc // cluster }, { tensor = \"o\", rows = 64 } }";
  static const struct {
    const char *from, *to, *needle;
  } bad[] = {
      {"t.params = \"fwd_tma\"", "t.params = \"fwd_tmz\"",
       "params other than \"fwd\", \"fwd_tma\" or \"bwd_tma\""},
      {"t.params = \"fwd_tma\"", "t.params = 3", "params other than"},
      {"t.params = \"fwd_tma\"", "t.params = nil",
       "tmaps without params = \"fwd_tma\" or \"bwd_tma\""},
      {tmaps, "t.tmaps = { { tensor = \"x\", rows = v.br } }", "whose tensor is not"},
      {tmaps, "t.tmaps = { { tensor = \"q\", rows = 257 } }", "rows is not an integer from 1 to 256"},
      {tmaps, "t.tmaps = { { tensor = \"q\", rows = 0 } }", "rows is not an integer from 1 to 256"},
      {tmaps, "t.tmaps = { { tensor = \"q\", rows = 1.5 } }", "rows is not an integer"},
      {tmaps, "t.tmaps = { { tensor = \"q\" } }", "rows is not an integer"},
      {tmaps, "t.tmaps = 7", "tmaps that is not a list"},
      {tmaps,
       "t.tmaps = { { tensor = \"q\", rows = 1 }, { tensor = \"k\", rows = 1 }, { tensor = \"v\", "
       "rows = 1 }, { tensor = \"o\", rows = 1 }, { tensor = \"q\", rows = 1 } }",
       "more than 4 tensor maps"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char dir[64], err[4096] = "";
    template_dir(dir, bad[i].from, bad[i].to);
    fg_kernel_meta m;
    cr_assert_neq(fgt_render_in(dir, TMA_NAME, &m, err, sizeof err), 0, "accepted: %s",
                  bad[i].to);
    cr_assert(strstr(err, bad[i].needle) && strstr(err, "launch(v)") &&
                  strstr(err, "templates/README.md"),
              "for %s: '%s' lacks '%s' (or the manifest's name and what to read)", bad[i].to, err,
              bad[i].needle);
    fgt_rm_rf(dir);
  }
}

Test(export_cli, flashgen_export_writes_the_maps_and_the_table_registers_them, .timeout = 300) {
  char err[1024];
  if (fg_nvrtc_load(err, sizeof err) != 0) cr_skip_test("no NVRTC: %s", err);
  const char *src = getenv("FLASHGEN_TEST_SOURCE_DIR");
  if (!src) cr_skip_test("FLASHGEN_TEST_SOURCE_DIR is not set (run through ctest)");
  char dir[64];
  template_dir(dir, NULL, NULL); /* also the working directory of the command */
  char *text = fgt_export_one(dir, TMA_NAME, "tt");
  cr_assert(strstr(text, "_tmaps[4] = {\n"
                         "    {.tensor = FG_EXPORT_TENSOR_Q, .rows = 128},\n"
                         "    {.tensor = FG_EXPORT_TENSOR_K, .rows = 64},\n"
                         "    {.tensor = FG_EXPORT_TENSOR_V, .rows = 64},\n"
                         "    {.tensor = FG_EXPORT_TENSOR_O, .rows = 64},\n};\n"),
            "the maps are missing: %.2000s", text);
  cr_assert(strstr(text, "     .params = FG_EXPORT_PARAMS_FWD_TMA,\n"), "no parameter block");
  cr_assert(strstr(text, "    .tmap_size = sizeof(fg_export_tmap)};\n"), "no tmap_size");
  free(text);
  /* It compiles warning-free, and registers with its maps. */
  const fg_export *t = fgt_export_load(dir, "tt");
  cr_assert(t->n_kernels == 1 && t->tmap_size == sizeof(fg_export_tmap));
  cr_assert_eq(t->abi_version, FG_EXPORT_ABI_VERSION_TMA,
               "a table holding a TMA kernel is version 2 (runtimes before the maps refuse it)");
  cr_assert(t->kernels[0].params == FG_EXPORT_PARAMS_FWD_TMA && t->kernels[0].n_tmaps == 4);
  cr_assert(t->kernels[0].tmaps[1].tensor == FG_EXPORT_TENSOR_K && t->kernels[0].tmaps[1].rows == 64);
  cr_assert_eq(fg_register_export(t, err, sizeof err), FG_OK, "%s", err);
  fgt_rm_rf(dir);
}

/* Exports variant alone (table `prefix`), finds `grid_macro` in the written table and reads the
 * table back: one kernel, whose grid kind is grid, K/V boxes of kv_rows rows, registered. */
static void expect_export_grid(const char *variant, const char *prefix, const char *grid_macro,
                               int grid, int kv_rows) {
  char err[1024];
  if (fg_nvrtc_load(err, sizeof err) != 0) cr_skip_test("no NVRTC: %s", err);
  if (!getenv("FLASHGEN_TEST_SOURCE_DIR"))
    cr_skip_test("FLASHGEN_TEST_SOURCE_DIR is not set (run through ctest)");
  char dir[64];
  template_dir(dir, NULL, NULL);
  char *text = fgt_export_one(dir, variant, prefix);
  cr_assert(strstr(text, grid_macro), "no %s: %.2000s", grid_macro, text);
  free(text);
  const fg_export *t = fgt_export_load(dir, prefix);
  cr_assert_eq(t->n_kernels, 1);
  cr_assert_eq(t->kernels[0].grid, grid);
  cr_assert_eq(t->kernels[0].steps[0].grid, grid);
  cr_assert_eq(t->kernels[0].params, FG_EXPORT_PARAMS_FWD_TMA);
  cr_assert(t->kernels[0].tmaps[1].tensor == FG_EXPORT_TENSOR_K && t->kernels[0].tmaps[1].rows == kv_rows);
  cr_assert_eq(fg_register_export(t, err, sizeof err), FG_OK, "%s", err);
  fgt_rm_rf(dir);
}

/* The persistent kernel (q_tma_p) exports with its grid kind, which the runtime reads back. */
Test(export_cli, a_persistent_kernel_exports_its_grid_kind, .timeout = 300) {
  expect_export_grid("fwd_d64_br128_bc64_bf16_noncausal_qtmap_w8_s2_sm90a", "tp",
                     "FG_EXPORT_GRID_PERSISTENT", FG_EXPORT_GRID_PERSISTENT, 64);
}

/* q_tma_c exports with its grid kind (pairs of query tiles) and K/V boxes of half a block, which
 * the runtime reads back; the grid rounds the query tiles up to even (a cluster of two along x),
 * batch * heads along y. */
Test(export_cli, a_cluster_kernel_exports_its_grid_kind, .timeout = 300) {
  fg_plan_step s;
  memset(&s, 0, sizeof s);
  s.grid = FG_GRID_Q_TILE_PAIRS;
  s.br = 128;
  uint64_t g[3];
  fg_plan_grid(&s, 132, 3, 5, 1, 300, 1000, g); /* 3 tiles: 4 */
  cr_assert(g[0] == 4 && g[1] == 15 && g[2] == 1, "grid %llu %llu %llu", (unsigned long long)g[0],
            (unsigned long long)g[1], (unsigned long long)g[2]);
  fg_plan_grid(&s, 132, 1, 1, 1, 256, 1000, g); /* 2 tiles */
  cr_assert(g[0] == 2 && g[1] == 1);
  fg_plan_grid(&s, 132, 1, 1, 1, 1, 1000, g); /* 1 tile: its partner past the rows */
  cr_assert(g[0] == 2 && g[1] == 1);
  expect_export_grid("fwd_d216_br128_bc80_bf16_noncausal_qtmac_w8_s2_sm90a", "tc",
                     "FG_EXPORT_GRID_Q_TILE_PAIRS", FG_EXPORT_GRID_Q_TILE_PAIRS, 40);
}

/* ---- the cache ------------------------------------------------------------------------------ */

static char cache_dir[64];
static void cache_setup(void) {
  strcpy(cache_dir, "/tmp/fg-tma-cache-XXXXXX");
  cr_assert_not_null(mkdtemp(cache_dir));
  chmod(cache_dir, 0700);
}
static void cache_teardown(void) { fgt_rm_rf(cache_dir); }

static const unsigned char fake_cubin[16] = {0x7f, 'E', 'L', 'F'};

Test(cache, a_plan_with_tensor_maps_round_trips_and_a_damaged_map_is_a_miss,
     .init = cache_setup, .fini = cache_teardown) {
  fg_cache *c = fgt_open_ok(cache_dir);
  fg_kernel_meta plan;
  tma_plan(&plan, TMA_NAME, 128, 64);
  fg_cache_key k = fgt_key_of(TMA_NAME);
  fgt_put_image(c, &k, &plan);
  fg_kernel_image got;
  char warn[1024] = "";
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 1, "%s", warn);
  expect_tma_plan(&got.meta, 128, 64);
  fgt_release(&got);
  /* A map's line damaged in the row: a miss (the entry is deleted), never a wrong map. */
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open(fg_cache_path(c), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  cr_assert_eq(sqlite3_exec(db, "UPDATE kernels SET plan = replace(plan, 'tmap k 64', 'tmap x 64')",
                            NULL, NULL, NULL),
               SQLITE_OK);
  cr_assert_eq(sqlite3_changes(db), 1);
  sqlite3_close(db);
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 0, "a damaged plan must be a miss");
  cr_assert_null(got.cubin);
  cr_assert(strstr(warn, TMA_NAME), "the warning names the entry: %s", warn);
  cr_assert_eq(fgt_kernel_count(c), 0, "and it is deleted");
  fg_cache_close(c);
}

/* ---- exported tables (runtime/export_register.c) ------------------------------------------- */

static fg_export_step tma_steps[1];
static const fg_export_tmap tma_maps[3] = {
    {FG_EXPORT_TENSOR_Q, 128}, {FG_EXPORT_TENSOR_K, 64}, {FG_EXPORT_TENSOR_V, 64}};

static fg_export_kernel tma_export_kernel(void) {
  fg_export_kernel k;
  memset(&k, 0, sizeof k);
  k.variant = TMA_NAME;
  k.arch = "sm_90a";
  k.cubin = fake_cubin;
  k.cubin_size = sizeof fake_cubin;
  tma_steps[0] = (fg_export_step){"fg_fwd_d64_br128_bc64_bf16_noncausal_qtma_w8_s2_sm90a",
                                  FG_EXPORT_GRID_Q_TILES, 128, 384, 99584, 0, 0};
  k.entry = tma_steps[0].entry;
  k.threads = 384;
  k.smem_bytes = 99584;
  k.grid = FG_EXPORT_GRID_Q_TILES;
  k.br = 128;
  k.regs = k.spill_store_bytes = k.spill_load_bytes = k.stack_bytes = -1;
  k.steps = tma_steps;
  k.n_steps = 1;
  k.params = FG_EXPORT_PARAMS_FWD_TMA;
  k.tmaps = tma_maps;
  k.n_tmaps = 3;
  return k;
}

static fg_export export_of(const fg_export_kernel *k, size_t kernel_size) {
  return fgt_export_table(k, kernel_size, "test_tma");
}

/* A table whose kernel takes tensor maps must say version 2 (which runtimes from before the maps
 * refuse); the same table as version 1 is refused, naming the kernel; flashgen export's output
 * is checked to be version 2 in export_cli above. */
Test(export, a_tma_kernel_in_a_version_1_table_is_refused) {
  fg_export_kernel k = tma_export_kernel();
  fg_export e = export_of(&k, sizeof k);
  cr_assert_eq(e.abi_version, FG_EXPORT_ABI_VERSION_TMA);
  e.abi_version = FG_EXPORT_ABI_VERSION;
  char err[1024] = "";
  cr_assert_neq(fg_register_export(&e, err, sizeof err), FG_OK);
  cr_assert(strstr(err, "takes tensor maps") && strstr(err, "version 1") && strstr(err, "qtma"),
            "%s", err);
}

Test(export, malformed_tensor_maps_are_refused_naming_the_kernel) {
  static const struct {
    int params, tensor, rows, tmap_size;
    const char *needle;
  } bad[] = {
#define TMA FG_EXPORT_PARAMS_FWD_TMA
#define Q FG_EXPORT_TENSOR_Q
#define SZ sizeof(fg_export_tmap)
#define MALFORMED "tensor map of its plan is malformed"
      {3, Q, 128, SZ, "parameter block 3"},
      {TMA, 9, 128, SZ, MALFORMED},
      {TMA, Q, 0, SZ, MALFORMED},
      {TMA, Q, 300, SZ, MALFORMED},
      {TMA, Q, 128, 0, "malformed list of tensor maps"},
      {FG_EXPORT_PARAMS_DEFAULT, Q, 128, SZ, "not a parameter block that carries them"},
#undef TMA
#undef Q
#undef SZ
#undef MALFORMED
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    static fg_export_kernel k[1];
    static fg_export_tmap maps[3];
    k[0] = tma_export_kernel();
    memcpy(maps, tma_maps, sizeof maps);
    maps[0] = (fg_export_tmap){bad[i].tensor, bad[i].rows};
    k[0].tmaps = maps;
    k[0].params = bad[i].params;
    fg_export e = export_of(k, sizeof k[0]);
    e.tmap_size = (uint32_t)bad[i].tmap_size;
    char err[1024] = "";
    cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT, "case %zu", i);
    cr_assert(strstr(err, bad[i].needle) && strstr(err, TMA_NAME) && strstr(err, "export it again"),
              "case %zu: '%s' lacks '%s' (or the kernel, or what to do)", i, err, bad[i].needle);
  }
  /* A backward kernel with the forward's tensor-map block. */
  static fg_export_kernel kb[1];
  static fg_export_step bsteps[1];
  kb[0] = tma_export_kernel();
  kb[0].variant = "bwd_d64_br64_bc128_bf16_noncausal_kvwgmma_w8_s2_sm90a";
  bsteps[0] = (fg_export_step){"fg_bwd_d64_br64_bc128_bf16_noncausal_kvwgmma_w8_s2_sm90a",
                               FG_EXPORT_GRID_KV_TILES, 128, 256, 1000, 0, 0};
  kb[0].steps = bsteps;
  kb[0].entry = bsteps[0].entry;
  kb[0].grid = FG_EXPORT_GRID_KV_TILES;
  fg_export e = export_of(kb, sizeof kb[0]);
  char err[1024] = "";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "backward variant whose plan takes the forward's tensor-map block"), "%s",
            err);
}

/* ---- the launch on the fake driver ---------------------------------------------------------- */

/* The fake driver and its records (fake_support.h), and the context on it. */
static fgt_fake fake;
static fg_context *ctx;

/* Kernels as `flashgen export` would write them: two q_tma variants and, for comparison, the
 * q_wgmma variant of TMA_NAME's problem (the fake computes it through the pointers), with an
 * exported choice of TMA_NAME for short bf16 problems at d = 64. */
static const char *const REF_NAME = "fwd_d64_br128_bc64_bf16_noncausal_qwgmma_w8_s2_sm90a";
static const char *const F16_NAME = "fwd_d128_br64_bc128_f16_causal_qtma_w4_s2_sm90a";
/* TMA_NAME on the persistent grid (q_tma_p: one block per SM, each looping over tiles). */
static const char *const PERSIST_NAME = "fwd_d64_br128_bc64_bf16_noncausal_qtmap_w8_s2_sm90a";
/* TMA_NAME on clusters of two blocks (q_tma_c: K/V boxes of half a block), chosen at 2k keys. */
static const char *const CLUSTER_NAME = "fwd_d64_br128_bc64_bf16_noncausal_qtmac_w8_s2_sm90a";
/* And with a causal mask (the pair loading its later tile's K/V blocks), chosen at 2k keys. */
static const char *const CLUSTER_CAUSAL_NAME = "fwd_d64_br128_bc64_bf16_causal_qtmac_w8_s2_sm90a";
/* PERSIST_NAME taking its tiles from a counter (q_tma_d: the first word of its workspace of 8
 * bytes per (batch, head), fwd.lua), chosen at 1k keys. */
static const char *const DYN_NAME = "fwd_d64_br128_bc64_bf16_noncausal_qtmad_w8_s2_sm90a";
static const fg_export_workspace dyn_ws[1] = {{"tile_counter", "workspace", 8, 2147483647, 0, 0, 0, 0}};
static fg_export_step steps3[7][1];
static char entries[7][64];
static const fg_export_tmap f16_maps[3] = {
    {FG_EXPORT_TENSOR_Q, 64}, {FG_EXPORT_TENSOR_K, 128}, {FG_EXPORT_TENSOR_V, 128}};
static const fg_export_tmap cluster_maps[3] = {
    {FG_EXPORT_TENSOR_Q, 128}, {FG_EXPORT_TENSOR_K, 32}, {FG_EXPORT_TENSOR_V, 32}};
static fg_export_kernel kernels[7];
static const fg_export_choice choices[4] = {
    {"fwd_d64_bf16_noncausal_nk512", "fwd_d64_br128_bc64_bf16_noncausal_qtma_w8_s2_sm90a", "test"},
    {"fwd_d64_bf16_noncausal_nk1024", "fwd_d64_br128_bc64_bf16_noncausal_qtmad_w8_s2_sm90a", "test"},
    {"fwd_d64_bf16_noncausal_nk2048", "fwd_d64_br128_bc64_bf16_noncausal_qtmac_w8_s2_sm90a", "test"},
    {"fwd_d64_bf16_causal_nk2048", "fwd_d64_br128_bc64_bf16_causal_qtmac_w8_s2_sm90a", "test"}};
static fg_export table;

static void register_kernels(void) {
  const char *names[7] = {TMA_NAME, REF_NAME, F16_NAME, PERSIST_NAME, CLUSTER_NAME,
                          CLUSTER_CAUSAL_NAME, DYN_NAME};
  const int br[7] = {128, 128, 64, 128, 128, 128, 128},
            threads[7] = {384, 256, 256, 384, 384, 384, 384};
  for (int i = 0; i < 7; i++) {
    kernels[i] = tma_export_kernel();
    kernels[i].variant = names[i];
    snprintf(entries[i], sizeof entries[i], "fg_%s", names[i]);
    const int grid = i == 3 || i == 6 ? FG_EXPORT_GRID_PERSISTENT
                     : i >= 4         ? FG_EXPORT_GRID_Q_TILE_PAIRS
                                      : FG_EXPORT_GRID_Q_TILES;
    kernels[i].grid = grid;
    steps3[i][0] = (fg_export_step){entries[i], grid, br[i], threads[i], 99000 + i, 0, 0};
    kernels[i].steps = steps3[i];
    kernels[i].entry = entries[i];
    kernels[i].br = br[i];
    kernels[i].threads = threads[i];
  }
  kernels[1].params = FG_EXPORT_PARAMS_DEFAULT;
  kernels[1].tmaps = NULL;
  kernels[1].n_tmaps = 0;
  kernels[2].tmaps = f16_maps;
  kernels[4].tmaps = cluster_maps;
  kernels[5].tmaps = cluster_maps;
  kernels[6].workspaces = dyn_ws;
  kernels[6].n_workspaces = 1;
  table = export_of(kernels, sizeof kernels[0]);
  table.n_kernels = 7;
  table.choices = choices;
  table.n_choices = 4;
  char err[1024] = "";
  cr_assert_eq(fg_register_export(&table, err, sizeof err), FG_OK, "%s", err);
}

static void fake_setup_with(const char *defines) {
  ctx = fgt_fake_open(&fake, "/tmp/fg-tma-fake-XXXXXX", defines, register_kernels);
}
static void fake_setup(void) { fake_setup_with(""); }
static void fake_setup_no_tmap(void) { fake_setup_with("-DFAKE_CUDA_NO_TENSOR_MAP"); }

static void fake_teardown(void) {
  fgt_fake_close(&fake, ctx);
  ctx = NULL;
}

/* A problem whose tensors are host memory (the fake's device memory): sizes, and per tensor
 * its strides (all zero: contiguous). */
typedef struct problem {
  fg_attention_args a;
  void *mem[4]; /* q, k, v, o */
  size_t bytes[4];
} problem;

static problem make_problem(fg_dtype t, int64_t B, int64_t Hq, int64_t Hkv, int64_t Nq,
                            int64_t Nk, int64_t d, const int64_t *strides /* 4 x 3 or NULL */) {
  problem pr;
  memset(&pr, 0, sizeof pr);
  fg_attention_args *a = &pr.a;
  a->size = sizeof *a;
  a->dtype = t;
  a->batch = B, a->heads_q = Hq, a->heads_kv = Hkv, a->seqlen_q = Nq, a->seqlen_k = Nk;
  a->head_dim = d;
  if (strides) {
    memcpy(a->q_stride, strides, sizeof a->q_stride);
    memcpy(a->k_stride, strides + 3, sizeof a->k_stride);
    memcpy(a->v_stride, strides + 6, sizeof a->v_stride);
    memcpy(a->o_stride, strides + 9, sizeof a->o_stride);
  }
  const int64_t n1[4] = {Hq, Hkv, Hkv, Hq}, n2[4] = {Nq, Nk, Nk, Nq};
  int64_t *st[4] = {a->q_stride, a->k_stride, a->v_stride, a->o_stride};
  unsigned seed = 12345;
  for (int i = 0; i < 4; i++) {
    pr.bytes[i] = 2 * fgt_span(B, n1[i], n2[i], d, st[i]);
    pr.mem[i] = fgt_fake_alloc(pr.bytes[i]);
    fgt_fill_random(pr.mem[i], pr.bytes[i] / 2, t, &seed);
  }
  a->q = pr.mem[0], a->k = pr.mem[1], a->v = pr.mem[2], a->o = pr.mem[3];
  return pr;
}

static void free_problem(problem *pr) {
  for (int i = 0; i < 4; i++) free(pr->mem[i]);
}

/* Runs the TMA variant name on pr, then REF_NAME (through pointers) on the same inputs into a
 * second O: the two outputs must be equal bit for bit (and not all zero). */
static void expect_same_output_as_pointers(problem *pr, const char *name) {
  memset(pr->mem[3], 0, pr->bytes[3]);
  fg_variant v = fgt_variant(name);
  fg_status st = fg_attention_forward_variant(ctx, &pr->a, NULL, &v);
  cr_assert_eq(st, FG_OK, "%s: %s", fg_status_string(st), fg_context_last_error(ctx));
  unsigned char *tma_out = malloc(pr->bytes[3]);
  memcpy(tma_out, pr->mem[3], pr->bytes[3]);
  memset(pr->mem[3], 0, pr->bytes[3]);
  fg_variant r = fgt_variant(REF_NAME);
  st = fg_attention_forward_variant(ctx, &pr->a, NULL, &r);
  cr_assert_eq(st, FG_OK, "%s: %s", fg_status_string(st), fg_context_last_error(ctx));
  size_t nonzero = 0;
  for (size_t i = 0; i < pr->bytes[3]; i++) nonzero += tma_out[i] != 0;
  cr_assert_gt(nonzero, pr->bytes[3] / 4, "the TMA kernel's O is mostly zero");
  cr_assert_eq(memcmp(tma_out, pr->mem[3], pr->bytes[3]), 0,
               "O read through the tensor maps differs from O read through the pointers");
  free(tma_out);
}

/* Runs name on pr as expect_same_output_as_pointers does and returns its one TMA launch, whose
 * entry is fg_<name>. */
static const fake_tma_launch *one_launch_as_pointers(problem *pr, const char *name) {
  const int before = fake.tma_launch_count();
  expect_same_output_as_pointers(pr, name);
  cr_assert_eq(fake.tma_launch_count(), before + 1);
  const fake_tma_launch *l = fake.tma_launch_get(before);
  char entry[FG_VARIANT_NAME_MAX + 3];
  snprintf(entry, sizeof entry, "fg_%s", name);
  cr_assert_str_eq(l->entry, entry);
  return l;
}

/* Asserts encode i as fgt_expect_map does, and an element stride of 1 in every dimension. */
static void expect_map(int i, int type, const void *base, const unsigned long long dims[4],
                       const unsigned long long strides[3], unsigned rows) {
  fgt_expect_map(&fake, i, type, base, dims, strides, rows);
  const fake_tmap *t = fake.tmap_get(i);
  for (int j = 0; j < 4; j++) cr_assert_eq(t->element_strides[j], 1, "map %d", i);
}

#define ULL(...) ((const unsigned long long[]){__VA_ARGS__})

Test(launch, gqa_and_nq_ne_nk_maps_and_output, .init = fake_setup, .fini = fake_teardown) {
  const int64_t B = 2, Hq = 4, Hkv = 2, Nq = 100, Nk = 130, d = 64;
  problem pr = make_problem(FG_DTYPE_BF16, B, Hq, Hkv, Nq, Nk, d, NULL);
  expect_same_output_as_pointers(&pr, TMA_NAME);
  cr_assert_eq(fake.tmap_count(), 3, "three maps for one launch, got %d", fake.tmap_count());
  expect_map(0, 9, pr.mem[0], ULL(64, 100, 4, 2), ULL(128, 100 * 128, 4 * 100 * 128), 128);
  expect_map(1, 9, pr.mem[1], ULL(64, 130, 2, 2), ULL(128, 130 * 128, 2 * 130 * 128), 64);
  expect_map(2, 9, pr.mem[2], ULL(64, 130, 2, 2), ULL(128, 130 * 128, 2 * 130 * 128), 64);
  /* The launch: the plan's grid and block, the maps as encoded in tmap[0..2], tmap[3] zero, the
   * forward's block after them. */
  cr_assert_eq(fake.tma_launch_count(), 1);
  const fake_tma_launch *l = fake.tma_launch_get(0);
  cr_assert_str_eq(l->entry, "fg_fwd_d64_br128_bc64_bf16_noncausal_qtma_w8_s2_sm90a");
  cr_assert(l->grid[0] == 1 && l->grid[1] == 8 && l->grid[2] == 1, "grid %u x %u x %u",
            l->grid[0], l->grid[1], l->grid[2]);
  cr_assert(l->block[0] == 384 && l->smem == 99000);
  for (int i = 0; i < 3; i++) {
    const fake_tmap *enc = fake.tmap_encoded(&l->params.tmap[i]);
    cr_assert_not_null(enc, "tmap[%d] holds no map", i);
    cr_assert_eq(memcmp(enc, fake.tmap_get(i), sizeof *enc), 0, "tmap[%d] is not encode %d", i, i);
  }
  static const fg_tmap zero;
  cr_assert_eq(memcmp(&l->params.tmap[3], &zero, sizeof zero), 0, "the unused map is zero");
  cr_assert(l->params.p.q == (uintptr_t)pr.mem[0] && l->params.p.batch == 2 &&
            l->params.p.seqlen_k == 130 && l->params.p.hq_per_hkv == 2);
  free_problem(&pr);
}

/* seqlen_k = 0 (no key for any query): K and V have no rows, which a tensor map cannot describe;
 * their maps stay zero (the kernel reads no K/V block) and the call succeeds. */
Test(launch, no_keys_leaves_the_kv_maps_zero, .init = fake_setup, .fini = fake_teardown) {
  problem pr = make_problem(FG_DTYPE_BF16, 1, 2, 2, 70, 0, 64, NULL);
  fg_variant v = fgt_variant(TMA_NAME);
  fg_status st = fg_attention_forward_variant(ctx, &pr.a, NULL, &v);
  cr_assert_eq(st, FG_OK, "%s: %s", fg_status_string(st), fg_context_last_error(ctx));
  cr_assert_eq(fake.tmap_count(), 1, "only Q's map is encoded, got %d", fake.tmap_count());
  expect_map(0, 9, pr.mem[0], ULL(64, 70, 2, 1), ULL(128, 70 * 128, 2 * 70 * 128), 128);
  cr_assert_eq(fake.tma_launch_count(), 1);
  const fake_tma_launch *l = fake.tma_launch_get(0);
  static const fg_tmap zero;
  for (int i = 1; i < 4; i++)
    cr_assert_eq(memcmp(&l->params.tmap[i], &zero, sizeof zero), 0, "tmap[%d] is not zero", i);
  free_problem(&pr);
}

Test(launch, f16_causal_maps_take_float16_and_the_plans_rows, .init = fake_setup,
     .fini = fake_teardown) {
  problem pr = make_problem(FG_DTYPE_F16, 1, 2, 2, 70, 70, 128, NULL);
  pr.a.causal = 1;
  fg_variant v = fgt_variant(F16_NAME);
  fg_status st = fg_attention_forward_variant(ctx, &pr.a, NULL, &v);
  cr_assert_eq(st, FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake.tmap_count(), 3);
  expect_map(0, 6, pr.mem[0], ULL(128, 70, 2, 1), ULL(256, 70 * 256, 2 * 70 * 256), 64);
  expect_map(1, 6, pr.mem[1], ULL(128, 70, 2, 1), ULL(256, 70 * 256, 2 * 70 * 256), 128);
  expect_map(2, 6, pr.mem[2], ULL(128, 70, 2, 1), ULL(256, 70 * 256, 2 * 70 * 256), 128);
  free_problem(&pr);
}

/* The persistent grid: one block per SM (the fake has 132) when there are more tiles, one per
 * tile when fewer; the output as through the pointers either way (the fake computes the whole
 * problem at a launch: the tiles' order is the kernel's, checked on the GPU by flashgen check's
 * tma_persistent cases). */
Test(launch, persistent_grid_is_one_block_per_sm_at_most, .init = fake_setup,
     .fini = fake_teardown) {
  static const struct {
    int64_t B, Hq, Hkv, Nq;
    unsigned grid;
  } runs[] = {{2, 40, 8, 300, 132} /* 3 x 80 = 240 tiles */, {1, 4, 2, 200, 8} /* 2 x 4 */};
  for (int i = 0; i < 2; i++) {
    problem pr = make_problem(FG_DTYPE_BF16, runs[i].B, runs[i].Hq, runs[i].Hkv, runs[i].Nq, 50,
                              64, NULL);
    const fake_tma_launch *l = one_launch_as_pointers(&pr, PERSIST_NAME);
    cr_assert(l->grid[0] == runs[i].grid && l->grid[1] == 1 && l->grid[2] == 1,
              "grid %u x %u x %u, expected %u x 1 x 1", l->grid[0], l->grid[1], l->grid[2],
              runs[i].grid);
    cr_assert(l->params.p.batch == runs[i].B && l->params.p.heads_q == runs[i].Hq);
    free_problem(&pr);
  }
}

/* The persistent grid taking its tiles from a counter (q_tma_d): its workspace (8 bytes per
 * (batch, head)) in p.workspace, and each launch its own number in p.tile_epoch, the counter's
 * epoch: in the signalling-NaN range of a float's bits (0x7F800001 ..), never the same twice in
 * a row; the grid and the output as q_tma_p's. */
Test(launch, dynamic_tiles_get_a_counter_and_a_launch_number, .init = fake_setup,
     .fini = fake_teardown) {
  problem pr = make_problem(FG_DTYPE_BF16, 2, 40, 8, 300, 50, 64, NULL); /* 240 tiles */
  unsigned long long epoch[2];
  for (int i = 0; i < 2; i++) {
    const fake_tma_launch *l = one_launch_as_pointers(&pr, DYN_NAME);
    cr_assert(l->grid[0] == 132 && l->grid[1] == 1 && l->grid[2] == 1, "grid %u", l->grid[0]);
    cr_assert_neq(l->params.p.workspace, 0ull, "the tile counter's workspace");
    epoch[i] = l->params.p.tile_epoch;
    cr_assert(epoch[i] >= 0x7F800001ull && epoch[i] <= 0x7FBFFFFEull, "epoch %llx", epoch[i]);
  }
  cr_assert_neq(epoch[0], epoch[1]);
  fg_attention_args a = pr.a;
  a.seqlen_k = 1000; /* bucket 1024: the table's choice */
  char buf[8192];
  cr_assert_eq(fg_explain(ctx, &a, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, DYN_NAME) && strstr(buf, "640 B workspace (tile_counter)") &&
                strstr(buf, "taking its next tile from the counter"),
            "%s", buf);
  free_problem(&pr);
}

/* Clusters of two blocks: the query tiles rounded up to even along x (3 -> 4 at 300 rows, 1 -> 2),
 * batch * heads along y, K/V maps of half a block's rows; the output as through the pointers. */
Test(launch, cluster_grid_pairs_the_query_tiles, .init = fake_setup, .fini = fake_teardown) {
  static const struct {
    int64_t Nq;
    unsigned grid_x;
  } runs[] = {{300, 4}, {256, 2}, {40, 2}};
  for (int i = 0; i < 3; i++) {
    problem pr = make_problem(FG_DTYPE_BF16, 2, 4, 2, runs[i].Nq, 90, 64, NULL);
    const fake_tma_launch *l = one_launch_as_pointers(&pr, CLUSTER_NAME);
    cr_assert(l->grid[0] == runs[i].grid_x && l->grid[1] == 8 && l->grid[2] == 1,
              "grid %u x %u x %u, expected %u x 8 x 1", l->grid[0], l->grid[1], l->grid[2],
              runs[i].grid_x);
    const fake_tmap *k = fake.tmap_encoded(&l->params.tmap[1]);
    cr_assert(k && k->box[1] == 32, "K's box: half a K/V block");
    free_problem(&pr);
  }
}

Test(launch, bnhd_strides_and_dims_of_size_one, .init = fake_setup, .fini = fake_teardown) {
  /* (B, N, H, d) tensors; MQA (heads_kv = 1) and one query row: the strides of those dimensions
   * of size 1 (here nonsense: 8 elements) are never stepped over and are replaced by the
   * contiguous ones, as the Python binding does. */
  const int64_t B = 2, Hq = 4, Hkv = 1, Nq = 1, Nk = 50, d = 64;
  const int64_t s[12] = {Nq * Hq * d, d, 8,        /* q: row stride of a single row */
                         Nk * Hkv * d, 8, Hkv * d, /* k: head stride of a single head */
                         Nk * Hkv * d, 8, Hkv * d, /* v */
                         Nq * Hq * d, d, Hq * d};
  problem pr = make_problem(FG_DTYPE_BF16, B, Hq, Hkv, Nq, Nk, d, s);
  expect_same_output_as_pointers(&pr, TMA_NAME);
  /* q: rows 1 -> row stride d * 2 B; heads and batch as given (B, N, H, d). */
  expect_map(0, 9, pr.mem[0], ULL(64, 1, 4, 2), ULL(128, 128, 4 * 128), 128);
  /* k, v: heads 1 -> head stride Nk * d * 2 B; rows H_kv * d * 2 B; batch as given. */
  expect_map(1, 9, pr.mem[1], ULL(64, 50, 1, 2), ULL(128, 50 * 128, 50 * 128), 64);
  expect_map(2, 9, pr.mem[2], ULL(64, 50, 1, 2), ULL(128, 50 * 128, 50 * 128), 64);
  free_problem(&pr);
}

Test(launch, each_batch_chunk_gets_its_own_maps, .init = fake_setup, .fini = fake_teardown) {
  /* batch * heads_q past the grid's y limit (65535): chunks of 2 batches, then 1. */
  const int64_t B = 3, H = 30000, N = 1, d = 64;
  problem pr = make_problem(FG_DTYPE_BF16, B, H, H, N, N, d, NULL);
  expect_same_output_as_pointers(&pr, TMA_NAME);
  cr_assert_eq(fake.tma_launch_count(), 2);
  const unsigned long long sb = (unsigned long long)(H * N * d * 2);
  /* The last chunk's maps are encoded first (a refusal there would launch nothing), then each
   * launch's. */
  cr_assert_eq(fake.tmap_count(), 9);
  for (int i = 0; i < 3; i++) {
    const char *base = pr.mem[i];
    const unsigned rows = i == 0 ? 128 : 64;
    expect_map(i, 9, base + 2 * sb, ULL(64, 1, (unsigned long long)H, 1), ULL(128, 128, sb), rows);
    expect_map(3 + i, 9, base, ULL(64, 1, (unsigned long long)H, 2), ULL(128, 128, sb), rows);
    expect_map(6 + i, 9, base + 2 * sb, ULL(64, 1, (unsigned long long)H, 1), ULL(128, 128, sb),
               rows);
  }
  const fake_tma_launch *l0 = fake.tma_launch_get(0), *l1 = fake.tma_launch_get(1);
  cr_assert(l0->params.p.batch == 2 && l1->params.p.batch == 1);
  cr_assert(l0->grid[1] == 2 * H && l1->grid[1] == H);
  cr_assert_eq(fake.tmap_encoded(&l1->params.tmap[1])->address,
               (unsigned long long)(uintptr_t)pr.mem[1] + 2 * sb);
  free_problem(&pr);
}

/* ---- refusals: nothing is launched ---- */

#define FAKE_ADDR(i) ((void *)((uintptr_t)(i) << 44)) /* 2^44 B apart: room for a 2^40 stride */

static fg_attention_args fake_args(void) {
  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = FG_DTYPE_BF16;
  a.batch = 2, a.heads_q = 4, a.heads_kv = 2, a.seqlen_q = 100, a.seqlen_k = 130;
  a.head_dim = 64;
  a.q = FAKE_ADDR(1), a.k = FAKE_ADDR(2), a.v = FAKE_ADDR(3), a.o = FAKE_ADDR(4);
  return a;
}

static void expect_refused(fg_status st, const char *const *needles, size_t n) {
  fgt_expect_unsupported(ctx, st, needles, n);
  cr_assert_eq(fake.tma_launch_count(), 0, "a refused call launches nothing");
}
#define EXPECT_REFUSED(st, ...) FGT_WITH_NEEDLES(expect_refused, st, __VA_ARGS__)

Test(refuse, a_stride_of_2_to_the_40_bytes, .init = fake_setup, .fini = fake_teardown) {
  fg_attention_args a = fake_args();
  const int64_t ks[3] = {(int64_t)1 << 39, 130 * 64, 64}; /* 2^40 B between K's batches */
  memcpy(a.k_stride, ks, sizeof ks);
  fg_variant v = fgt_variant(TMA_NAME);
  EXPECT_REFUSED(fg_attention_forward_variant(ctx, &a, NULL, &v), TMA_NAME, "cannot read k",
                 "batch stride", "2^40", "make k contiguous", "without TMA");
}

Test(refuse, a_row_stride_not_a_multiple_of_16_bytes, .init = fake_setup, .fini = fake_teardown) {
  /* The public call refuses such strides before (multiples of 8 elements); the launch itself,
   * which check and tune reach directly, refuses them too. */
  fg_attention_args a = fake_args(), n;
  char err[512];
  cr_assert_eq(fg_validate_args(&a, FG_VALIDATE_CALL, &n, err, sizeof err), FG_OK, "%s", err);
  fg_fwd_params p;
  fg_params_from_args(&n, &p);
  p.q_sn = 68; /* 136 B */
  const fg_loaded_kernel *k = NULL;
  fg_variant v = fgt_variant(TMA_NAME);
  cr_assert_eq(fg_registry_get(ctx, &v, &k), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(k->dtype, FG_DTYPE_BF16);
  EXPECT_REFUSED(fg_kernel_launch(ctx, k, &p, FG_ELEMS_FORWARD, NULL), "cannot read q",
                 "row stride is 68 elements (136 bytes)", "not a multiple of 16 bytes",
                 "make q contiguous");
}

Test(refuse, an_encode_the_driver_refuses, .init = fake_setup, .fini = fake_teardown) {
  setenv("FAKE_CUDA_TMAP_FAIL", "1", 1);
  fg_attention_args a = fake_args();
  fg_variant v = fgt_variant(TMA_NAME);
  EXPECT_REFUSED(fg_attention_forward_variant(ctx, &a, NULL, &v), "cuTensorMapEncodeTiled",
                 "tensor map of q", "dims {64, 100, 4, 2}", "strides {128, 12800, 51200} B",
                 "box {64, 128, 1, 1}", "make q contiguous");
  unsetenv("FAKE_CUDA_TMAP_FAIL");
}

Test(refuse, a_driver_without_cuTensorMapEncodeTiled, .init = fake_setup_no_tmap,
     .fini = fake_teardown) {
  fg_attention_args a = fake_args();
  fg_variant v = fgt_variant(TMA_NAME);
  EXPECT_REFUSED(fg_attention_forward_variant(ctx, &a, NULL, &v), TMA_NAME,
                 "no cuTensorMapEncodeTiled", "update the NVIDIA driver", "without TMA");
  /* Kernels without maps still run there. */
  problem pr = make_problem(FG_DTYPE_BF16, 1, 2, 2, 16, 16, 64, NULL);
  fg_variant r = fgt_variant(REF_NAME);
  cr_assert_eq(fg_attention_forward_variant(ctx, &pr.a, NULL, &r), FG_OK, "%s",
               fg_context_last_error(ctx));
  free_problem(&pr);
}

/* ---- exported tables from before tensor maps; explain ---- */

Test(export, a_table_from_before_tensor_maps_reads_as_no_maps, .init = fake_setup,
     .fini = fake_teardown) {
  /* Its kernel struct ends before params: whatever follows in memory is not read. */
  static fg_export_kernel k[2];
  static fg_export_step st[1];
  static const char *const name = "fwd_d64_br64_bc64_bf16_noncausal_qwgmma_w4_s2_sm90a";
  k[0] = tma_export_kernel();
  k[0].variant = name;
  st[0] = (fg_export_step){"fg_fwd_d64_br64_bc64_bf16_noncausal_qwgmma_w4_s2_sm90a",
                           FG_EXPORT_GRID_Q_TILES, 64, 128, 1000, 0, 0};
  k[0].steps = st;
  k[0].entry = st[0].entry;
  k[0].params = 1, k[0].n_tmaps = 3; /* past kernel_size */
  static fg_export e;
  e = export_of(k, offsetof(fg_export_kernel, params));
  e.size = (uint32_t)offsetof(fg_export, tmap_size);
  e.tmap_size = 77; /* past size: not read either */
  char err[1024] = "";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_OK, "%s", err);
  const fg_loaded_kernel *lk = NULL;
  fg_variant v = fgt_variant(name);
  cr_assert_eq(fg_registry_get(ctx, &v, &lk), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(lk->meta.params, FG_PARAMS_DEFAULT);
  cr_assert_eq(lk->meta.n_tmaps, 0);
  /* And the maps of the table registered at setup arrived. */
  fg_variant t = fgt_variant(TMA_NAME);
  cr_assert_eq(fg_registry_get(ctx, &t, &lk), FG_OK, "%s", fg_context_last_error(ctx));
  expect_tma_plan_n(&lk->meta, 128, 64, 3);
}

Test(explain, names_the_tensor_maps, .init = fake_setup, .fini = fake_teardown) {
  fg_attention_args a = fake_args();
  char buf[8192];
  cr_assert_eq(fg_explain(ctx, &a, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, TMA_NAME), "the exported choice: %s", buf);
  cr_assert(strstr(buf, "\nTMA: q 128 rows, k 64, v 64\n"), "%s", buf);
  a.seqlen_k = 2000; /* bucket 2048: the table's choice is the cluster kernel */
  cr_assert_eq(fg_explain(ctx, &a, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, CLUSTER_NAME), "the exported choice: %s", buf);
  cr_assert(strstr(buf, "grid (2, 8, 1) x 384 threads") && strstr(buf, "clusters of two blocks"),
            "%s", buf);
  cr_assert(strstr(buf, "\nTMA: q 128 rows, k 32, v 32\n"), "%s", buf);
  a.causal = 1; /* the causal pair: the later tile's blocks, the earlier tile skipping the rest */
  cr_assert_eq(fg_explain(ctx, &a, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, CLUSTER_CAUSAL_NAME), "the exported choice: %s", buf);
  cr_assert(strstr(buf, "clusters of two blocks") && strstr(buf, "the later tile's"), "%s", buf);
}
