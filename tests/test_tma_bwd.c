/* test_tma_bwd.c: the host side of the backward plans that load through TMA tensor maps (issue
 * 13: params bwd_tma, the tensor do), without a GPU. The plan's vocabulary (text round trip, the
 * tensors each TMA block takes, the block of the other pass refused), the generator reading it
 * from bwd.lua (a copy whose launch(v) says bwd_tma), the cache, `flashgen export` and exported
 * tables carrying it (version 2; refusals), explain --backward's line. Then the backward call on
 * the fake driver (tests/fake_cuda/libcuda.c: its cuTensorMapEncodeTiled records its arguments;
 * its kvtma kernels take fg_bwd_tma_params, refuse maps that are not the launch's q, do, k, v, and
 * read Q, dO, K and V through them): the four maps' encoded arguments (GQA, Nq != Nk, dO's own
 * strides, dimensions of size 1, each batch chunk's own maps), every step getting the block with
 * the workspaces inside, the gradients equal to the same plan reading through pointers, seqlen_k
 * = 0, and the refusals (a dO stride the TMA cannot take, an encode the driver refuses, a driver
 * without cuTensorMapEncodeTiled), none of which launches anything. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_support.h"
#include "cache_support.h"
#include "fg_gen.h"
#include "fg_params.h"
#include "fg_runtime_internal.h"
#include "flashgen_export.h"
#include "support_plan.h"
#include "tma_support.h"

/* The Hopper backward on TMA (d 64, Br 64, Bc 128) and, for comparison, the wgmma one of the same
 * tiles, whose fake kernel reads through the block's pointers. */
#define BWD_TMA "bwd_d64_br64_bc128_bf16_noncausal_kvtma_w8_s2_sm90a"
#define BWD_REF "bwd_d64_br64_bc128_bf16_noncausal_kvwgmma_w8_s2_sm90a"
#define FWD_TMA "fwd_d64_br128_bc64_bf16_noncausal_qtma_w8_s2_sm90a"
/* The kv_wgmma variant the generator's tests render with a bwd_tma plan (its tiles fit). */
#define GEN_REF "bwd_d64_br128_bc128_bf16_noncausal_kvwgmma_w8_s2_sm90a"

/* The plan bwd.lua gives a kv_tma variant: the backward's three steps and workspaces, and for a
 * kvtma name params bwd_tma with maps q and do of Br rows, k and v of Bc (support_plan.h). */
static void bwd_tma_plan(fg_kernel_meta *m, const char *name, int d, int br, int bc) {
  test_backward_plan(m, name, d, bc, 384, 200000);
  cr_assert(m->params == FG_PARAMS_BWD_TMA && m->n_tmaps == 4 && m->tmaps[0].rows == br &&
                m->tmaps[2].rows == bc,
            "%s: not a kvtma plan of Br %d, Bc %d", name, br, bc);
}

static void expect_bwd_tma_plan(const fg_kernel_meta *m, int br, int bc) {
  const fg_tmap_tensor t[4] = {FG_TMAP_Q, FG_TMAP_DO, FG_TMAP_K, FG_TMAP_V};
  const int rows[4] = {br, br, bc, bc};
  fgt_expect_plan_tmaps(m, FG_PARAMS_BWD_TMA, 4, t, rows);
}

/* ---- the plan's vocabulary and text (core/kernel.c) ---------------------------------------- */

Test(plan_text, a_bwd_tma_plan_round_trips) {
  cr_assert_str_eq(fg_param_block_name(FG_PARAMS_BWD_TMA), "bwd_tma");
  cr_assert_eq(fg_param_block_parse("bwd_tma"), FG_PARAMS_BWD_TMA);
  cr_assert_str_eq(fg_tmap_tensor_name(FG_TMAP_DO), "do");
  cr_assert_eq(fg_tmap_tensor_parse("do"), FG_TMAP_DO);
  fg_kernel_meta m, back;
  bwd_tma_plan(&m, BWD_TMA, 64, 64, 128);
  cr_assert_null(fg_kernel_meta_invalid_for(&m, FG_PASS_BWD));
  char text[2048];
  const int n = fg_kernel_plan_format(&m, text, sizeof text);
  cr_assert(n > 0 && n < (int)sizeof text);
  cr_assert(strstr(text, "params bwd_tma\ntmap q 64\ntmap do 64\ntmap k 128\ntmap v 128\n"), "%s",
            text);
  memset(&back, 0, sizeof back);
  cr_assert_null(fg_kernel_plan_parse(text, &back), "%s", text);
  expect_bwd_tma_plan(&back, 64, 128);
  cr_assert(back.n_steps == 3 && back.main_step == 1 && back.n_workspaces == 4);
  cr_assert_str_eq(back.steps[0].entry, "fg_" BWD_TMA "_pre");
  cr_assert_str_eq(back.workspaces[0].param, "workspace");
}

Test(plan_text, each_tma_block_takes_its_own_tensors) {
  static const struct {
    const char *tail, *needle;
  } bad[] = {
      {"params bwd_tma\ntmap o 64\n", "bwd_tma plan views o"},
      {"params fwd_tma\ntmap do 64\n", "fwd_tma plan views do"},
      {"params bwd_tmx\ntmap q 64\n", "parameter block"},
      {"params bwd_tma\ntmap dO 64\n", "other than q, k, v, o or do"},
      {"params bwd_tma\ntmap do 0\n", "tensor map of its plan is malformed"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    fgt_expect_plan_refused("kv_tiles", bad[i].tail, bad[i].needle);
}

Test(plan_text, a_block_of_the_other_pass_is_refused) {
  fg_kernel_meta m;
  bwd_tma_plan(&m, BWD_TMA, 64, 64, 128);
  const char *why = fg_kernel_meta_invalid_for(&m, FG_PASS_FWD);
  cr_assert(why && strstr(why, "backward's tensor-map block (bwd_tma)") &&
                strstr(why, "forward one"),
            "%s", why ? why : "(accepted)");
  fg_kernel_meta_single(&m, "fg_x", FG_GRID_KV_TILES, 128, 256, 0);
  m.params = FG_PARAMS_FWD_TMA;
  m.n_tmaps = 1;
  m.tmaps[0] = (fg_plan_tmap){FG_TMAP_Q, 64};
  cr_assert_null(fg_kernel_meta_invalid(&m), "well formed in itself");
  why = fg_kernel_meta_invalid_for(&m, FG_PASS_BWD);
  cr_assert(why && strstr(why, "forward's tensor-map block (fwd_tma)") &&
                strstr(why, "backward one, whose plan takes bwd_tma"),
            "%s", why ? why : "(accepted)");
  cr_assert_null(fg_kernel_meta_invalid_for(&m, FG_PASS_FWD));
}

/* ---- the generator: bwd.lua's plan (generator/render.c, plan_lua.c) ------------------------ */

/* bwd.lua's launch(v) wrapped (appended before its `return M`) to say `params` and `maps` (Lua
 * text), as the kv_tma plan will; the kernel rendered is kv_wgmma's (bwd_wgmma.cu). */
static const char *const BWD_LUA_END = "\nreturn M\n";
static char wrapper[1024];
static const char *bwd_wrap(const char *params, const char *maps) {
  snprintf(wrapper, sizeof wrapper,
           "\nlocal launch0 = M.launch\n"
           "function M.launch(v)\n"
           "  local t = launch0(v)\n"
           "  t.params = %s\n"
           "  t.tmaps = %s\n"
           "  return t\n"
           "end\n"
           "return M\n",
           params, maps);
  return wrapper;
}
static const char *const QDOKV = "{ { tensor = \"q\", rows = v.br }, { tensor = \"do\", rows = "
                                 "v.br }, { tensor = \"k\", rows = v.bc }, { tensor = \"v\", rows "
                                 "= v.bc } }";

/* A copy of templates/ in dir, with file's text `from` replaced by `to` (NULL: unchanged). */
static void template_dir(char dir[64], const char *file, const char *from, const char *to) {
  fgt_template_dir(dir, "/tmp/fg-tmab-tpl-XXXXXX", file, from, to);
}

Test(generator, reads_a_bwd_tma_plan_from_bwd_lua) {
  char dir[64], err[4096];
  template_dir(dir, "bwd.lua", BWD_LUA_END, bwd_wrap("\"bwd_tma\"", QDOKV));
  fg_kernel_meta m;
  cr_assert_eq(fgt_render_in(dir, GEN_REF, &m, err, sizeof err), 0, "%s", err);
  expect_bwd_tma_plan(&m, 128, 128);
  cr_assert(m.n_steps == 3 && fg_kernel_main(&m)->grid == FG_GRID_KV_TILES);
  fgt_rm_rf(dir);
}

Test(generator, a_tma_block_of_the_other_pass_or_tensor_is_refused) {
  static const struct {
    const char *file, *from, *params, *maps, *variant, *needle;
  } bad[] = {
      /* A backward plan with the forward's block, or a forward one with the backward's. */
      {"bwd.lua", "\nreturn M\n", "\"fwd_tma\"", "{ { tensor = \"q\", rows = v.br } }", GEN_REF,
       "forward's tensor-map block (fwd_tma) but the variant is a backward one"},
      {"fwd.lua", "t.params = \"fwd_tma\"", NULL, NULL, FWD_TMA,
       "backward's tensor-map block (bwd_tma) but the variant is a forward one"},
      /* O is not the backward's to map; dO is not the forward's. */
      {"bwd.lua", "\nreturn M\n", "\"bwd_tma\"", "{ { tensor = \"o\", rows = v.br } }", GEN_REF,
       "bwd_tma plan views o"},
      {"bwd.lua", "\nreturn M\n", "\"bwd_tmz\"", "nil", GEN_REF,
       "params other than \"fwd\", \"fwd_tma\" or \"bwd_tma\""},
      {"bwd.lua", "\nreturn M\n", "nil", QDOKV, GEN_REF,
       "tmaps without params = \"fwd_tma\" or \"bwd_tma\""},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char dir[64], err[4096] = "";
    template_dir(dir, bad[i].file, bad[i].from,
                 bad[i].params ? bwd_wrap(bad[i].params, bad[i].maps) : "t.params = \"bwd_tma\"");
    if (!bad[i].params) /* fwd.lua's q_tma plan needs its (stub) template to render */
      fgt_write_text(dir, "fwd_tma.cu", "extern \"C\" __global__ void {{ entry }}() {}\n");
    fg_kernel_meta m;
    cr_assert_neq(fgt_render_in(dir, bad[i].variant, &m, err, sizeof err), 0, "case %zu accepted",
                  i);
    cr_assert(strstr(err, bad[i].needle) && strstr(err, "launch(v)") &&
                  strstr(err, "templates/README.md"),
              "case %zu: '%s' lacks '%s' (or the manifest's name and what to read)", i, err,
              bad[i].needle);
    fgt_rm_rf(dir);
  }
}

/* ---- the cache ------------------------------------------------------------------------------ */

static char cache_dir[64];
static void cache_setup(void) {
  strcpy(cache_dir, "/tmp/fg-tmab-cache-XXXXXX");
  cr_assert_not_null(mkdtemp(cache_dir));
  chmod(cache_dir, 0700);
}
static void cache_teardown(void) { fgt_rm_rf(cache_dir); }

static const unsigned char fake_cubin[16] = {0x7f, 'E', 'L', 'F'};

Test(cache, a_bwd_tma_plan_round_trips, .init = cache_setup, .fini = cache_teardown) {
  fg_cache *c = fgt_open_ok(cache_dir);
  fg_kernel_meta plan;
  bwd_tma_plan(&plan, BWD_TMA, 64, 64, 128);
  fg_cache_key k = fgt_key_of(BWD_TMA);
  fgt_put_image(c, &k, &plan);
  fg_kernel_image got;
  char warn[1024] = "";
  cr_assert_eq(fgt_get(c, &k, &got, warn, sizeof warn), 1, "%s", warn);
  expect_bwd_tma_plan(&got.meta, 64, 128);
  cr_assert(got.meta.n_steps == 3 && got.meta.n_workspaces == 4);
  fgt_release(&got);
  fg_cache_close(c);
}

/* ---- flashgen export (cli/export_write.c) and exported tables (runtime/export_register.c) -- */

Test(export_cli, a_bwd_tma_kernel_is_written_as_version_2_and_registers, .timeout = 600) {
  char err[1024];
  if (fg_nvrtc_load(err, sizeof err) != 0) cr_skip_test("no NVRTC: %s", err);
  const char *src = getenv("FLASHGEN_TEST_SOURCE_DIR");
  if (!src) cr_skip_test("FLASHGEN_TEST_SOURCE_DIR is not set (run through ctest)");
  char dir[64];
  template_dir(dir, "bwd.lua", BWD_LUA_END, bwd_wrap("\"bwd_tma\"", QDOKV));
  char *text = fgt_export_one(dir, GEN_REF, "tb");
  cr_assert(strstr(text, "_tmaps[4] = {\n"
                         "    {.tensor = FG_EXPORT_TENSOR_Q, .rows = 128},\n"
                         "    {.tensor = FG_EXPORT_TENSOR_DO, .rows = 128},\n"
                         "    {.tensor = FG_EXPORT_TENSOR_K, .rows = 128},\n"
                         "    {.tensor = FG_EXPORT_TENSOR_V, .rows = 128},\n};\n"),
            "the maps are missing");
  cr_assert(strstr(text, "     .params = FG_EXPORT_PARAMS_BWD_TMA,\n"), "no parameter block");
  cr_assert(strstr(text, ".abi_version = FG_EXPORT_ABI_VERSION_TMA,"), "not version 2");
  free(text);
  const fg_export *t = fgt_export_load(dir, "tb");
  cr_assert_eq(t->abi_version, FG_EXPORT_ABI_VERSION_TMA);
  cr_assert(t->n_kernels == 1 && t->kernels[0].params == FG_EXPORT_PARAMS_BWD_TMA &&
            t->kernels[0].n_tmaps == 4 && t->kernels[0].n_steps == 3);
  cr_assert(t->kernels[0].tmaps[1].tensor == FG_EXPORT_TENSOR_DO &&
            t->kernels[0].tmaps[1].rows == 128);
  cr_assert_eq(fg_register_export(t, err, sizeof err), FG_OK, "%s", err);
  fgt_rm_rf(dir);
}

/* The plan of bwd_tma_plan in the layout of flashgen_export.h. */
static fg_export_step ex_steps[3];
static fg_export_workspace ex_ws[4];
static fg_export_tmap ex_maps[4];
static fg_export_kernel bwd_export_kernel(const char *variant) {
  static fg_kernel_meta m;
  bwd_tma_plan(&m, BWD_TMA, 64, 64, 128);
  fg_export_kernel k;
  memset(&k, 0, sizeof k);
  k.variant = variant;
  k.arch = "sm_90a";
  k.cubin = fake_cubin;
  k.cubin_size = sizeof fake_cubin;
  for (int i = 0; i < 3; i++)
    ex_steps[i] = (fg_export_step){m.steps[i].entry,      (int)m.steps[i].grid,
                                   m.steps[i].br,         m.steps[i].threads,
                                   m.steps[i].smem_bytes, m.steps[i].split_rows,
                                   m.steps[i].tail};
  for (int i = 0; i < 4; i++) {
    const fg_plan_workspace *w = &m.workspaces[i];
    ex_ws[i] = (fg_export_workspace){w->name, w->param, w->bytes, w->rows, w->deterministic_only,
                                     w->per_key, w->min_group_rows, w->tail};
    ex_maps[i] = (fg_export_tmap){(int)m.tmaps[i].tensor, m.tmaps[i].rows};
  }
  k.entry = ex_steps[1].entry;
  k.threads = 384;
  k.smem_bytes = 200000;
  k.grid = FG_EXPORT_GRID_KV_TILES;
  k.br = 128;
  k.regs = k.spill_store_bytes = k.spill_load_bytes = k.stack_bytes = -1;
  k.steps = ex_steps;
  k.n_steps = 3;
  k.main_step = 1;
  k.workspaces = ex_ws;
  k.n_workspaces = 4;
  k.params = FG_EXPORT_PARAMS_BWD_TMA;
  k.tmaps = ex_maps;
  k.n_tmaps = 4;
  return k;
}

static fg_export export_of(const fg_export_kernel *k) {
  return fgt_export_table(k, sizeof *k, "test_tma_bwd");
}

Test(export, bwd_tma_tables_are_checked) {
  static fg_export_kernel k[1];
  char err[1024];
  /* A forward variant with the backward's block (its grid made a forward one). */
  k[0] = bwd_export_kernel(FWD_TMA);
  static fg_export_step fsteps[1];
  fsteps[0] = (fg_export_step){"fg_" FWD_TMA, FG_EXPORT_GRID_Q_TILES, 128, 384, 1000, 0, 0};
  k[0].steps = fsteps, k[0].n_steps = 1, k[0].main_step = 0, k[0].n_workspaces = 0;
  k[0].entry = fsteps[0].entry, k[0].grid = FG_EXPORT_GRID_Q_TILES;
  fg_export e = export_of(k);
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "forward variant whose plan takes the backward's tensor-map block") &&
                strstr(err, FWD_TMA) && strstr(err, "export it again"),
            "%s", err);
  /* O mapped by a backward plan. */
  k[0] = bwd_export_kernel(BWD_TMA);
  ex_maps[1].tensor = FG_EXPORT_TENSOR_O;
  e = export_of(k);
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "bwd_tma plan views o") && strstr(err, BWD_TMA), "%s", err);
  /* A version 1 table holding a bwd_tma kernel (runtimes before the maps would misread it). */
  k[0] = bwd_export_kernel(BWD_TMA);
  e = export_of(k);
  e.abi_version = FG_EXPORT_ABI_VERSION;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "takes tensor maps") && strstr(err, "version 1") && strstr(err, BWD_TMA),
            "%s", err);
  /* The well-formed one registers. */
  e = export_of(k);
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_OK, "%s", err);
}

/* ---- the backward call on the fake driver --------------------------------------------------- */

/* The fake driver and its records (fake_support.h), and the context on it. */
static fgt_fake fake;
static fg_context *ctx;

/* Kernels as if exported: the kv_tma variant (bwd_tma_plan), the kv_wgmma one of the same tiles
 * (the plain block), a forward variant with a bwd_tma plan and a backward one with fwd_tma (both
 * refused when loaded); an exported choice of the kv_tma variant for bf16 d = 64. */
#define FWD_WRONG "fwd_d64_br64_bc64_bf16_noncausal_qtma_w4_s2_sm90a"
#define BWD_WRONG "bwd_d64_br64_bc64_bf16_noncausal_kvtma_w8_s2_sm90a"
static fg_kernel_image images[4];
static const fg_exported_choice choices[1] = {{"bwd_d64_bf16_noncausal_nk512", BWD_TMA}};
static fg_exported_table table;

static void register_kernels(void) {
  const char *names[4] = {BWD_TMA, BWD_REF, FWD_WRONG, BWD_WRONG};
  for (int i = 0; i < 4; i++) {
    fg_kernel_image *k = &images[i];
    memset(k, 0, sizeof *k);
    snprintf(k->variant, sizeof k->variant, "%s", names[i]);
    k->arch = FG_ARCH_SM90A;
    k->cubin = (unsigned char *)fake_cubin;
    k->cubin_size = sizeof fake_cubin;
  }
  bwd_tma_plan(&images[0].meta, BWD_TMA, 64, 64, 128);
  test_backward_plan(&images[1].meta, BWD_REF, 64, 128, 256, 150000);
  /* fg_register_exported takes plans as given: the loader is what refuses these two. */
  fg_kernel_meta_single(&images[2].meta, "fg_" FWD_WRONG, FG_GRID_Q_TILES, 64, 256, 1000);
  images[2].meta.params = FG_PARAMS_BWD_TMA;
  images[2].meta.n_tmaps = 1;
  images[2].meta.tmaps[0] = (fg_plan_tmap){FG_TMAP_Q, 64};
  test_backward_plan(&images[3].meta, BWD_WRONG, 64, 64, 256, 1000);
  images[3].meta.params = FG_PARAMS_FWD_TMA;
  images[3].meta.n_tmaps = 1;
  images[3].meta.tmaps[0] = (fg_plan_tmap){FG_TMAP_Q, 64};
  for (int i = 0; i < 4; i++)
    images[i].meta.regs = images[i].meta.spill_load_bytes = images[i].meta.spill_store_bytes =
        images[i].meta.stack_bytes = -1;
  table.description = "test_tma_bwd";
  table.kernels = images;
  table.n_kernels = 4;
  table.choices = choices;
  table.n_choices = 1;
  char e[512];
  cr_assert_eq(fg_register_exported(&table, e, sizeof e), FG_OK, "%s", e);
}

static void fake_setup_with(const char *defines) {
  ctx = fgt_fake_open(&fake, "/tmp/fg-tmab-fake-XXXXXX", defines, register_kernels);
}
static void fake_setup(void) { fake_setup_with(""); }
static void fake_setup_no_tmap(void) { fake_setup_with("-DFAKE_CUDA_NO_TENSOR_MAP"); }

static void fake_teardown(void) {
  fgt_fake_close(&fake, ctx);
  ctx = NULL;
}

/* A backward problem in host memory (the fake's device memory): q, k, v, o, do, dq, dk, dv in
 * bf16 and lse in fp32; strides per tensor in the order of fg_attention_backward_args (q, k, v,
 * o, do; all zero: contiguous), the gradients contiguous. */
enum { T_Q, T_K, T_V, T_O, T_DO, T_DQ, T_DK, T_DV, T_LSE, T_N };
typedef struct problem {
  fg_attention_backward_args a;
  void *mem[T_N];
  size_t bytes[T_N];
} problem;

static problem make_problem(int64_t B, int64_t Hq, int64_t Hkv, int64_t Nq, int64_t Nk, int64_t d,
                            const int64_t *strides /* 5 x 3 or NULL */) {
  problem pr;
  memset(&pr, 0, sizeof pr);
  fg_attention_backward_args *a = &pr.a;
  a->size = sizeof *a;
  a->dtype = FG_DTYPE_BF16;
  a->batch = B, a->heads_q = Hq, a->heads_kv = Hkv, a->seqlen_q = Nq, a->seqlen_k = Nk;
  a->head_dim = d;
  int64_t *st[T_N] = {a->q_stride, a->k_stride, a->v_stride, a->o_stride, a->do_stride,
                      a->dq_stride, a->dk_stride, a->dv_stride, NULL};
  if (strides)
    for (int i = 0; i < 5; i++) memcpy(st[i], strides + 3 * i, 3 * sizeof(int64_t));
  const int64_t zero[3] = {0, 0, 0};
  const int64_t n1[T_N] = {Hq, Hkv, Hkv, Hq, Hq, Hq, Hkv, Hkv, Hq};
  const int64_t n2[T_N] = {Nq, Nk, Nk, Nq, Nq, Nq, Nk, Nk, Nq};
  unsigned seed = 4242;
  for (int i = 0; i < T_N; i++) {
    pr.bytes[i] = i == T_LSE ? (size_t)(4 * B * Hq * Nq)
                             : 2 * fgt_span(B, n1[i], n2[i], d, st[i] ? st[i] : zero);
    pr.mem[i] = fgt_fake_alloc(pr.bytes[i]);
    if (i <= T_DO) fgt_fill_random(pr.mem[i], pr.bytes[i] / 2, FG_DTYPE_BF16, &seed);
  }
  a->q = pr.mem[T_Q], a->k = pr.mem[T_K], a->v = pr.mem[T_V], a->o = pr.mem[T_O];
  a->d_o = pr.mem[T_DO], a->lse = pr.mem[T_LSE];
  a->dq = pr.mem[T_DQ], a->dk = pr.mem[T_DK], a->dv = pr.mem[T_DV];
  return pr;
}

static void free_problem(problem *pr) {
  for (int i = 0; i < T_N; i++) free(pr->mem[i]);
}

/* Runs BWD_TMA on pr, then BWD_REF (through pointers) on the same inputs: dQ, dK and dV must be
 * equal bit for bit (and not mostly zero). The fake's record is cleared in between, and holds
 * the TMA run's afterwards. */
static void expect_same_gradients_as_pointers(problem *pr) {
  unsigned char *tma[3];
  for (int g = 0; g < 3; g++) memset(pr->mem[T_DQ + g], 0, pr->bytes[T_DQ + g]);
  fg_variant r = fgt_variant(BWD_REF);
  fg_status st = fg_attention_backward_variant(ctx, &pr->a, NULL, &r);
  cr_assert_eq(st, FG_OK, "%s: %s", fg_status_string(st), fg_context_last_error(ctx));
  for (int g = 0; g < 3; g++) {
    tma[g] = malloc(pr->bytes[T_DQ + g] + 1);
    memcpy(tma[g], pr->mem[T_DQ + g], pr->bytes[T_DQ + g]);
    memset(pr->mem[T_DQ + g], 0, pr->bytes[T_DQ + g]);
  }
  fake.reset();
  fg_variant v = fgt_variant(BWD_TMA);
  st = fg_attention_backward_variant(ctx, &pr->a, NULL, &v);
  cr_assert_eq(st, FG_OK, "%s: %s", fg_status_string(st), fg_context_last_error(ctx));
  static const char *const what[3] = {"dQ", "dK", "dV"};
  for (int g = 0; g < 3; g++) {
    size_t nonzero = 0;
    for (size_t i = 0; i < pr->bytes[T_DQ + g]; i++) nonzero += tma[g][i] != 0;
    cr_assert_gt(nonzero, pr->bytes[T_DQ + g] / 4, "the reference's %s is mostly zero", what[g]);
    cr_assert_eq(memcmp(tma[g], pr->mem[T_DQ + g], pr->bytes[T_DQ + g]), 0,
                 "%s read through the tensor maps differs from %s read through the pointers",
                 what[g], what[g]);
    free(tma[g]);
  }
}

/* Asserts encode i as fgt_expect_map does, for a bf16 map (CUDA data type 9). */
static void expect_map(int i, const void *base, const unsigned long long dims[4],
                       const unsigned long long strides[3], unsigned rows) {
  fgt_expect_map(&fake, i, 9, base, dims, strides, rows);
}

/* Launch i of the fake's kvtma record: the plan's step (entry), its maps the encodes first ..
 * first + 3 (in the plan's order q, do, k, v), and its inner block the same as the plain record's
 * of the same launch, with the workspaces of the plan in it. */
static const fake_bwd_tma_launch *expect_tma_launch(int i, const char *step, int first) {
  const fake_bwd_tma_launch *l = fake.bwd_tma_launch_get(i);
  cr_assert_not_null(l, "kvtma launch %d not recorded (%d)", i, fake.bwd_tma_launch_count());
  char entry[128];
  snprintf(entry, sizeof entry, "fg_%s%s", BWD_TMA, step);
  cr_assert_str_eq(l->entry, entry, "launch %d", i);
  for (int m = 0; m < 4; m++) {
    const fake_tmap *enc = fake.tmap_encoded(&l->params.tmap[m]);
    cr_assert_not_null(enc, "launch %d (%s): tmap[%d] holds no map", i, entry, m);
    cr_assert_eq(memcmp(enc, fake.tmap_get(first + m), sizeof *enc), 0,
                 "launch %d (%s): tmap[%d] is not encode %d", i, entry, m, first + m);
  }
  const fake_launch *plain = fake.launch_get(i);
  cr_assert_not_null(plain);
  cr_assert_eq(memcmp(&plain->params, &l->params.p, sizeof plain->params), 0);
  cr_assert(l->params.p.workspace != 0 && l->params.p.dsum != 0,
            "launch %d (%s): the dQ accumulator and D are in the inner block", i, entry);
  cr_assert(l->params.p.sem == 0 && l->params.p.dkv == 0, "unused workspaces are 0");
  return l;
}

#define ULL(...) ((const unsigned long long[]){__VA_ARGS__})

Test(launch, gqa_nq_ne_nk_and_dos_own_strides, .init = fake_setup, .fini = fake_teardown) {
  /* q, k, v, o (B, H, N, d); dO (B, N, H, d), its own layout. */
  const int64_t B = 2, Hq = 4, Hkv = 2, Nq = 100, Nk = 130, d = 64;
  const int64_t s[15] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, Nq * Hq * d, d, Hq * d};
  problem pr = make_problem(B, Hq, Hkv, Nq, Nk, d, s);
  expect_same_gradients_as_pointers(&pr);
  cr_assert_eq(fake.tmap_count(), 4, "four maps for one launch of each step, got %d",
               fake.tmap_count());
  expect_map(0, pr.mem[T_Q], ULL(64, 100, 4, 2), ULL(128, 100 * 128, 4 * 100 * 128), 64);
  expect_map(1, pr.mem[T_DO], ULL(64, 100, 4, 2), ULL(4 * 128, 128, 100 * 4 * 128), 64);
  expect_map(2, pr.mem[T_K], ULL(64, 130, 2, 2), ULL(128, 130 * 128, 2 * 130 * 128), 128);
  expect_map(3, pr.mem[T_V], ULL(64, 130, 2, 2), ULL(128, 130 * 128, 2 * 130 * 128), 128);
  /* Every step of the plan got the block: the maps, then the backward's with its workspaces. */
  cr_assert_eq(fake.bwd_tma_launch_count(), 3);
  cr_assert_eq(fake.launch_count(), 3);
  const fake_bwd_tma_launch *pre = expect_tma_launch(0, "_pre", 0);
  const fake_bwd_tma_launch *mid = expect_tma_launch(1, "", 0);
  const fake_bwd_tma_launch *post = expect_tma_launch(2, "_post", 0);
  cr_assert(pre->grid[0] == 2 && pre->grid[1] == 8 && pre->block[0] == 128, "_pre grid");
  cr_assert(mid->grid[0] == 2 && mid->grid[1] == 4 && mid->block[0] == 384 && mid->smem == 200000,
            "main grid %u x %u", mid->grid[0], mid->grid[1]);
  cr_assert(post->grid[0] == 2 && post->grid[1] == 8);
  cr_assert(pre->params.p.workspace == mid->params.p.workspace &&
                mid->params.p.dsum == post->params.p.dsum,
            "the steps share the workspaces");
  cr_assert(mid->params.p.d_o == (uintptr_t)pr.mem[T_DO] && mid->params.p.do_sn == Hq * d &&
            mid->params.p.batch == 2 && mid->params.p.hq_per_hkv == 2);
  free_problem(&pr);
}

Test(launch, dimensions_of_size_one_take_the_contiguous_stride, .init = fake_setup,
     .fini = fake_teardown) {
  /* MQA (heads_kv = 1) and one query row, in (B, N, H, d): the strides of those dimensions (here
   * nonsense: 8 elements) are never stepped over and are replaced by the contiguous ones. */
  const int64_t B = 2, Hq = 4, Hkv = 1, Nq = 1, Nk = 50, d = 64;
  const int64_t s[15] = {Nq * Hq * d, d, 8,        /* q: row stride of a single row */
                         Nk * Hkv * d, 8, Hkv * d, /* k: head stride of a single head */
                         Nk * Hkv * d, 8, Hkv * d, /* v */
                         Nq * Hq * d, d, Hq * d,   /* o */
                         Nq * Hq * d, d, 8};       /* do: row stride of a single row */
  problem pr = make_problem(B, Hq, Hkv, Nq, Nk, d, s);
  expect_same_gradients_as_pointers(&pr);
  expect_map(0, pr.mem[T_Q], ULL(64, 1, 4, 2), ULL(128, 128, 4 * 128), 64);
  expect_map(1, pr.mem[T_DO], ULL(64, 1, 4, 2), ULL(128, 128, 4 * 128), 64);
  expect_map(2, pr.mem[T_K], ULL(64, 50, 1, 2), ULL(128, 50 * 128, 50 * 128), 128);
  expect_map(3, pr.mem[T_V], ULL(64, 50, 1, 2), ULL(128, 50 * 128, 50 * 128), 128);
  free_problem(&pr);
}

Test(launch, each_batch_chunk_gets_its_own_maps, .init = fake_setup, .fini = fake_teardown) {
  /* batch * heads_q past the grid's y limit (65535): chunks of 2 batches, then 1. Two rows (with
   * one key, dS and so dQ and dK would be zero). */
  const int64_t B = 3, H = 30000, N = 2, d = 64;
  problem pr = make_problem(B, H, H, N, N, d, NULL);
  expect_same_gradients_as_pointers(&pr);
  cr_assert_eq(fake.bwd_tma_launch_count(), 6, "three steps for each of two chunks");
  const unsigned long long sb = (unsigned long long)(H * N * d * 2);
  /* The last chunk's maps are encoded first (a refusal there launches nothing), then each
   * launch's. */
  cr_assert_eq(fake.tmap_count(), 12);
  const int t[4] = {T_Q, T_DO, T_K, T_V};
  for (int i = 0; i < 4; i++) {
    const char *base = pr.mem[t[i]];
    const unsigned rows = i < 2 ? 64 : 128;
    const unsigned long long h = (unsigned long long)H;
    expect_map(i, base + 2 * sb, ULL(64, 2, h, 1), ULL(128, 256, sb), rows);
    expect_map(4 + i, base, ULL(64, 2, h, 2), ULL(128, 256, sb), rows);
    expect_map(8 + i, base + 2 * sb, ULL(64, 2, h, 1), ULL(128, 256, sb), rows);
  }
  for (int i = 0; i < 6; i++) {
    const char *step = i % 3 == 0 ? "_pre" : i % 3 == 1 ? "" : "_post";
    const fake_bwd_tma_launch *l = expect_tma_launch(i, step, i < 3 ? 4 : 8);
    cr_assert_eq(l->params.p.batch, i < 3 ? 2 : 1);
  }
  /* The second chunk's workspaces start at its first batch's part: dq_accum (4 d B per row)
   * and D (4 B per row) each hold every batch, one after the other. */
  const fake_bwd_tma_launch *l0 = fake.bwd_tma_launch_get(1), *l1 = fake.bwd_tma_launch_get(4);
  cr_assert_eq(l1->params.p.workspace - l0->params.p.workspace, 2ull * H * N * 4 * d);
  cr_assert_eq(l1->params.p.dsum - l0->params.p.dsum, 2ull * H * N * 4);
  cr_assert_eq(l1->params.p.q, (uintptr_t)pr.mem[T_Q] + 2 * sb);
  free_problem(&pr);
}

/* seqlen_k = 0 (no key for any query): K and V have no rows, which a tensor map cannot describe;
 * their maps stay zero (no step reads a K/V block), Q's and dO's are encoded, and the steps that
 * run (_pre, _post: the main kernel has no key block) get them. */
Test(launch, no_keys_leaves_the_kv_maps_zero, .init = fake_setup, .fini = fake_teardown) {
  problem pr = make_problem(1, 2, 2, 70, 0, 64, NULL);
  fg_variant v = fgt_variant(BWD_TMA);
  fg_status st = fg_attention_backward_variant(ctx, &pr.a, NULL, &v);
  cr_assert_eq(st, FG_OK, "%s: %s", fg_status_string(st), fg_context_last_error(ctx));
  cr_assert_eq(fake.tmap_count(), 2, "only Q's and dO's maps are encoded, got %d",
               fake.tmap_count());
  expect_map(0, pr.mem[T_Q], ULL(64, 70, 2, 1), ULL(128, 70 * 128, 2 * 70 * 128), 64);
  expect_map(1, pr.mem[T_DO], ULL(64, 70, 2, 1), ULL(128, 70 * 128, 2 * 70 * 128), 64);
  cr_assert_eq(fake.bwd_tma_launch_count(), 2);
  static const fg_tmap zero;
  for (int i = 0; i < 2; i++) {
    const fake_bwd_tma_launch *l = fake.bwd_tma_launch_get(i);
    cr_assert_not_null(fake.tmap_encoded(&l->params.tmap[0]));
    cr_assert_not_null(fake.tmap_encoded(&l->params.tmap[1]));
    for (int m = 2; m < 4; m++)
      cr_assert_eq(memcmp(&l->params.tmap[m], &zero, sizeof zero), 0, "%s: tmap[%d] not zero",
                   l->entry, m);
  }
  free_problem(&pr);
}

/* ---- refusals: nothing is launched, the workspace is given back ---- */

#define FAKE_ADDR(i) ((void *)((uintptr_t)(i) << 44)) /* 2^44 B apart: room for a 2^40 stride */

static fg_attention_backward_args fake_args(void) {
  fg_attention_backward_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = FG_DTYPE_BF16;
  a.batch = 2, a.heads_q = 4, a.heads_kv = 2, a.seqlen_q = 100, a.seqlen_k = 130;
  a.head_dim = 64;
  a.q = FAKE_ADDR(1), a.k = FAKE_ADDR(2), a.v = FAKE_ADDR(3), a.o = FAKE_ADDR(4);
  a.lse = FAKE_ADDR(5), a.d_o = FAKE_ADDR(6), a.dq = FAKE_ADDR(7), a.dk = FAKE_ADDR(8);
  a.dv = FAKE_ADDR(9);
  return a;
}

static void expect_refused(fg_status st, const char *const *needles, size_t n) {
  fgt_expect_unsupported(ctx, st, needles, n);
  cr_assert_eq(fake.launch_count(), 0, "a refused call launches nothing");
  int allocs, frees;
  size_t last;
  fake.mem_counts(&allocs, &frees, &last);
  cr_assert_eq(allocs, frees, "the workspace is freed (%d allocations, %d frees)", allocs, frees);
}
#define EXPECT_REFUSED(st, ...) FGT_WITH_NEEDLES(expect_refused, st, __VA_ARGS__)

Test(refuse, a_do_stride_of_2_to_the_40_bytes, .init = fake_setup, .fini = fake_teardown) {
  fg_attention_backward_args a = fake_args();
  const int64_t ds[3] = {(int64_t)1 << 39, 100 * 64, 64}; /* 2^40 B between dO's batches */
  memcpy(a.do_stride, ds, sizeof ds);
  fg_variant v = fgt_variant(BWD_TMA);
  EXPECT_REFUSED(fg_attention_backward_variant(ctx, &a, NULL, &v), BWD_TMA, "cannot read do",
                 "batch stride", "2^40", "make do contiguous", "a loop order other than kvtma");
}

Test(refuse, a_do_row_stride_not_a_multiple_of_16_bytes, .init = fake_setup,
     .fini = fake_teardown) {
  /* The public call refuses such strides before (multiples of 8 elements); the block's fill,
   * which every backward launch goes through, refuses them too, naming dO. */
  fg_attention_backward_args a = fake_args(), n;
  char err[512];
  cr_assert_eq(fg_validate_backward_args(&a, FG_VALIDATE_CALL, &n, err, sizeof err), FG_OK, "%s",
               err);
  fg_bwd_params p;
  fg_bwd_params_from_args(&n, &p);
  p.do_sn = 68; /* 136 B */
  const fg_loaded_kernel *k = NULL;
  fg_variant v = fgt_variant(BWD_TMA);
  cr_assert_eq(fg_registry_get(ctx, &v, &k), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(k->dtype, FG_DTYPE_BF16, "the maps' element type comes from the variant");
  static fg_bwd_tma_params tp;
  cr_assert_eq(fg_ctx_push(ctx), FG_OK);
  const fg_status st = fg_bwd_tma_params_fill(ctx, k, &p, &tp);
  fg_ctx_pop(ctx);
  EXPECT_REFUSED(st, "cannot read do", "row stride is 68 elements (136 bytes)",
                 "not a multiple of 16 bytes", "make do contiguous",
                 "a loop order other than kvtma");
  cr_assert_eq(fake.tmap_count(), 1, "q's map was encoded, dO's refused before the driver");
}

Test(refuse, an_encode_the_driver_refuses, .init = fake_setup, .fini = fake_teardown) {
  setenv("FAKE_CUDA_TMAP_FAIL", "1", 1);
  fg_attention_backward_args a = fake_args();
  fg_variant v = fgt_variant(BWD_TMA);
  EXPECT_REFUSED(fg_attention_backward_variant(ctx, &a, NULL, &v), "cuTensorMapEncodeTiled",
                 "tensor map of q", "dims {64, 100, 4, 2}", "box {64, 64, 1, 1}",
                 "make q contiguous", "a loop order other than kvtma");
  unsetenv("FAKE_CUDA_TMAP_FAIL");
}

Test(refuse, a_driver_without_cuTensorMapEncodeTiled, .init = fake_setup_no_tmap,
     .fini = fake_teardown) {
  fg_attention_backward_args a = fake_args();
  fg_variant v = fgt_variant(BWD_TMA);
  EXPECT_REFUSED(fg_attention_backward_variant(ctx, &a, NULL, &v), BWD_TMA,
                 "no cuTensorMapEncodeTiled", "update the NVIDIA driver",
                 "a loop order other than kvtma");
}

Test(refuse, a_tma_block_of_the_other_pass_does_not_load, .init = fake_setup,
     .fini = fake_teardown) {
  const fg_loaded_kernel *k = NULL;
  fg_variant v = fgt_variant(FWD_WRONG);
  cr_assert_eq(fg_registry_get(ctx, &v, &k), FG_ERROR_INTERNAL);
  const char *e = fg_context_last_error(ctx);
  cr_assert(strstr(e, FWD_WRONG) && strstr(e, "parameter block bwd_tma") &&
                strstr(e, "only backward variants do") && strstr(e, "rebuild or re-export"),
            "%s", e);
  v = fgt_variant(BWD_WRONG);
  cr_assert_eq(fg_registry_get(ctx, &v, &k), FG_ERROR_INTERNAL);
  e = fg_context_last_error(ctx);
  cr_assert(strstr(e, BWD_WRONG) && strstr(e, "parameter block fwd_tma") &&
                strstr(e, "only forward variants do"),
            "%s", e);
}

/* ---- explain --backward ---- */

Test(explain, names_the_backwards_tensor_maps, .init = fake_setup, .fini = fake_teardown) {
  fg_attention_backward_args a = fake_args();
  char buf[8192];
  cr_assert_eq(fg_explain_backward(ctx, &a, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, "variant: " BWD_TMA "\n"), "the exported choice: %s", buf);
  cr_assert(strstr(buf, "plan: 3 kernels in order on the stream"), "%s", buf);
  cr_assert(strstr(buf, "\nTMA: q 64 rows, do 64, k 128, v 128\n"), "%s", buf);
}
