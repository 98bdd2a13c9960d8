/* test_export.c: exported tables without a GPU: fg_register_export's checks and messages (the
 * backward's grid kind KV_TILES accepted and checked against the variant, an unknown grid kind
 * refused saying what to do, the plan's later fields read, per_key and the tail, and read as 0
 * from tables written before them), the documented FG_ERROR_KERNEL_MISSING for a table built for
 * another arch (on the fake driver, tests/fake_cuda), and `flashgen export`: identical bytes
 * twice, the tuned choices from the cache, the default set with its backward variants
 * (--dry-run), a backward variant exported as KV_TILES with its three-entry module and run by
 * fg_attention_backward from the table under the exported-only policy, and clear failures for
 * empty or bad variant lists and unknown arches. The install + example + link checks are in
 * tests/export/run_export_tests.sh. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_support.h"
#include "cli_runner.h"
#include "fg_jit.h"
#include "flashgen_export.h"

static char tmp_dir[64];

static void make_tmp(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/fg_export_test_XXXXXX");
  cr_assert_not_null(mkdtemp(tmp_dir));
}

static void remove_tmp(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
}

/* ---- fg_register_export ------------------------------------------------------------------ */
static const unsigned char fake_cubin[16] = {0x7f, 'E', 'L', 'F'};

#define D128 "fwd_d128_br128_bc64_bf16_noncausal_qouter_w8_s2_"

/* The forward kernel's plan: one step (reset by every kernel_sm80() call; tests damage it). */
static fg_export_step fwd_steps[1];

static fg_export_kernel kernel_sm80(void) {
  fg_export_kernel k;
  memset(&k, 0, sizeof k);
  k.variant = D128 "sm80";
  k.arch = "sm_80";
  k.cubin = fake_cubin;
  k.cubin_size = sizeof fake_cubin;
  k.entry = "fg_" D128 "sm80";
  k.threads = 256;
  k.smem_bytes = 104448;
  k.grid = FG_EXPORT_GRID_Q_TILES;
  k.br = 128;
  k.regs = k.spill_load_bytes = k.spill_store_bytes = k.stack_bytes = -1;
  fwd_steps[0] = (fg_export_step){"fg_" D128 "sm80", FG_EXPORT_GRID_Q_TILES, 128, 256, 104448, 0, 0};
  k.steps = fwd_steps;
  k.n_steps = 1;
  k.main_step = 0;
  return k;
}

static fg_export table_of(const fg_export_kernel *k, size_t n, const fg_export_choice *c,
                          size_t nc) {
  fg_export e;
  memset(&e, 0, sizeof e);
  e.abi_version = FG_EXPORT_ABI_VERSION;
  e.size = sizeof e;
  e.kernel_size = sizeof *k;
  e.choice_size = sizeof(fg_export_choice);
  e.description = "test table";
  e.kernels = k;
  e.n_kernels = n;
  e.choices = c;
  e.n_choices = nc;
  e.step_size = sizeof(fg_export_step);
  e.workspace_desc_size = sizeof(fg_export_workspace);
  return e;
}

Test(register_export, accepts_a_table_and_a_second_registration_is_a_noop) {
  static fg_export_kernel k[1];
  k[0] = kernel_sm80();
  static fg_export e;
  e = table_of(k, 1, NULL, 0);
  char err[512] = "x";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_OK, "%s", err);
  cr_assert_str_empty(err);
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_OK, "%s", err);
}

Test(register_export, null_and_unknown_layout) {
  char err[512];
  cr_assert_eq(fg_register_export(NULL, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "NULL"), "%s", err);
  fg_export e = table_of(NULL, 0, NULL, 0);
  e.abi_version = 99;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "layout version 99") && strstr(err, "export again"), "%s", err);
  cr_assert_eq(fg_register_export(&e, NULL, 0), FG_ERROR_INVALID_ARGUMENT, "err may be NULL");
}

Test(register_export, malformed_kernels_are_named) {
  char err[512];
  fg_export_kernel k = kernel_sm80();
  fg_export e = table_of(&k, 1, NULL, 0);

  k.variant = "fwd_d128_nonsense";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "test table") && strstr(err, "kernel 0") && strstr(err, "does not parse"),
            "%s", err);
  k = kernel_sm80();
  k.arch = "sm_75";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "unknown arch 'sm_75'"), "%s", err);
  k = kernel_sm80();
  k.arch = "sm_90a";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "compiled for sm_90a but its name says sm_80"), "%s", err);
  k = kernel_sm80();
  k.cubin = NULL;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "neither cubin nor PTX"), "%s", err);
  k = kernel_sm80();
  fwd_steps[0].entry = "";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "no entry point"), "%s", err);
  k = kernel_sm80();
  k.steps = NULL;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "no plan") && strstr(err, "export it again"), "%s", err);
  k = kernel_sm80();
  k.main_step = 1;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "malformed one"), "%s", err);
  k = kernel_sm80();
  fwd_steps[0].grid = 7;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "kernel 0") && strstr(err, "grid kind 7") &&
                strstr(err, "does not know") && strstr(err, "export it again"),
            "%s", err);
  fwd_steps[0].grid = 0;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "grid kind 0"), "%s", err);
  k = kernel_sm80();
  fwd_steps[0].br = 0;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "malformed launch contract"), "%s", err);
  k = kernel_sm80();
  fwd_steps[0].grid = FG_EXPORT_GRID_KV_TILES; /* a forward kernel on the backward's grid */
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "is a forward variant whose main kernel has grid kind 4") &&
                strstr(err, "export it again"),
            "%s", err);
}

/* A table written before plans (no step size; its kernels carry only the main kernel's contract,
 * the backward's other kernels implicit) is refused, saying to export it again. */
Test(register_export, a_table_from_before_plans_is_refused) {
  char err[512];
  static fg_export_kernel k[1];
  k[0] = kernel_sm80();
  k[0].steps = NULL;
  k[0].n_steps = 0;
  static fg_export e;
  e = table_of(k, 1, NULL, 0);
  e.step_size = e.workspace_desc_size = 0;
  /* As an older producer wrote it: the struct without the plan fields (a smaller stride too). */
  e.size = (uint32_t)offsetof(fg_export, step_size);
  e.kernel_size = (uint32_t)offsetof(fg_export_kernel, steps);
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "test table") && strstr(err, "before kernel plans") &&
                strstr(err, "export it again"),
            "%s", err);
}

/* A backward kernel as `flashgen export` writes it (templates/bwd.lua: br = Bc, d + 1 floats). */
#define BWD128 "bwd_d128_br32_bc64_bf16_causal_kvouter_w8_s2_"

static fg_export_step bwd_steps[3];
static fg_export_workspace bwd_ws[5]; /* the fifth: bwd_kernel_with_tail's */

static fg_export_kernel bwd_kernel_sm90a(void) {
  fg_export_kernel k;
  memset(&k, 0, sizeof k);
  k.variant = BWD128 "sm90a";
  k.arch = "sm_90a";
  k.cubin = fake_cubin;
  k.cubin_size = sizeof fake_cubin;
  k.entry = "fg_" BWD128 "sm90a";
  k.threads = 256;
  k.smem_bytes = 90112;
  k.grid = FG_EXPORT_GRID_KV_TILES;
  k.br = 64;
  k.workspace_floats_per_row = 129;
  k.regs = k.spill_load_bytes = k.spill_store_bytes = k.stack_bytes = -1;
  bwd_steps[0] = (fg_export_step){"fg_" BWD128 "sm90a_pre", FG_EXPORT_GRID_Q_TILES, 64, 128, 0, 0, 0};
  bwd_steps[1] = (fg_export_step){"fg_" BWD128 "sm90a", FG_EXPORT_GRID_KV_TILES, 64, 256, 90112, 0, 0};
  bwd_steps[2] = (fg_export_step){"fg_" BWD128 "sm90a_post", FG_EXPORT_GRID_Q_TILES, 64, 128, 0, 0, 0};
  bwd_ws[0] = (fg_export_workspace){"dq_accum", "workspace", 512, 1, 0, 0, 0, 0};
  bwd_ws[1] = (fg_export_workspace){"dsum", "dsum", 4, 1, 0, 0, 0, 0};
  bwd_ws[2] = (fg_export_workspace){"semaphores", "sem", 4, 16, 1, 0, 0, 0};
  bwd_ws[3] = (fg_export_workspace){"dkv_accum", "dkv", 1024, 1, 0, 1, 65536, 0};
  k.steps = bwd_steps;
  k.n_steps = 3;
  k.main_step = 1;
  k.workspaces = bwd_ws;
  k.n_workspaces = 4;
  return k;
}

Test(register_export, accepts_a_backward_kernel_on_the_kv_tile_grid) {
  static fg_export_kernel k[2];
  k[0] = bwd_kernel_sm90a();
  k[1] = kernel_sm80();
  static fg_export e;
  e = table_of(k, 2, NULL, 0);
  char err[512] = "x";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_OK, "%s", err);
  cr_assert_str_empty(err);
}

Test(register_export, a_backward_kernel_contract_is_checked_against_its_name) {
  char err[512];
  fg_export_kernel k = bwd_kernel_sm90a();
  fg_export e = table_of(&k, 1, NULL, 0);
  k.n_workspaces = 3; /* without the per-key workspace, which needs the K/V-tile grid itself */
  bwd_steps[1].grid = FG_EXPORT_GRID_Q_TILES;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "'" BWD128 "sm90a'") &&
                strstr(err, "backward variant whose main kernel has grid kind 1") &&
                strstr(err, "FG_EXPORT_GRID_KV_TILES"),
            "%s", err);
  k = bwd_kernel_sm90a();
  bwd_steps[1].br = 32; /* the Q block, not the K/V block */
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "br = 32") && strstr(err, "K/V blocks are 64 rows"), "%s", err);
  k = bwd_kernel_sm90a();
  bwd_steps[0].br = 0;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "malformed launch contract"), "%s", err);
  k = bwd_kernel_sm90a();
  bwd_ws[2].rows = 0;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "workspace") && strstr(err, "malformed"), "%s", err);
  k = bwd_kernel_sm90a();
  bwd_ws[3].min_group_rows = -1;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "per_key or min_group_rows") && strstr(err, "export it again"), "%s", err);
  k = bwd_kernel_sm90a();
  bwd_ws[3].per_key = 2;
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "per_key or min_group_rows"), "%s", err);
  k = bwd_kernel_sm90a();
  bwd_steps[2].grid = 7; /* a kind from a newer flashgen */
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "grid kind 7") && strstr(err, "newer flashgen"), "%s", err);
  k = bwd_kernel_sm90a();
  bwd_steps[1].grid = FG_EXPORT_GRID_PERSISTENT; /* a forward grid on the backward's main step */
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "kv_tiles") && strstr(err, "export it again"), "%s", err);
}

/* A workspace per key row needs the K/V-tile main grid (its units are that grid's key blocks): on
 * a forward kernel it is refused, so per_key is read from the table. */
Test(register_export, a_per_key_workspace_needs_the_kv_tile_grid) {
  char err[512];
  static fg_export_workspace ws[1];
  ws[0] = (fg_export_workspace){"dkv_accum", "dkv", 1024, 1, 0, 1, 0, 0};
  static fg_export_kernel k[1];
  k[0] = kernel_sm80();
  k[0].workspaces = ws;
  k[0].n_workspaces = 1;
  static fg_export e;
  e = table_of(k, 1, NULL, 0);
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "per key row") && strstr(err, "kv_tiles") && strstr(err, "export it again"),
            "%s", err);
}

/* A table written before per_key and min_group_rows (its workspace_desc_size the struct without
 * them) reads both as 0, whatever lies in that struct's tail padding: the backward plan with
 * garbage there is accepted (read, per_key = -1 or min_group_rows < 0 would be refused). */
Test(register_export, a_table_from_before_per_key_workspaces_reads_them_as_zero) {
  typedef struct older_workspace {
    const char *name, *param;
    int bytes, rows, deterministic_only;
  } older_workspace;
  static older_workspace ows[3];
  memset(ows, 0xff, sizeof ows);
  static const char *const names[3][2] = {
      {"dq_accum", "workspace"}, {"dsum", "dsum"}, {"semaphores", "sem"}};
  for (int i = 0; i < 3; i++) {
    ows[i].name = names[i][0];
    ows[i].param = names[i][1];
    ows[i].bytes = i == 0 ? 512 : 4;
    ows[i].rows = i == 2 ? 16 : 1;
    ows[i].deterministic_only = i == 2;
  }
  /* The garbage overlaps the new fields: were it read, the table would be refused. */
  cr_assert(sizeof(older_workspace) > offsetof(fg_export_workspace, per_key));
  static fg_export_kernel k[1];
  k[0] = bwd_kernel_sm90a();
  k[0].workspaces = (const fg_export_workspace *)(const void *)ows;
  k[0].n_workspaces = 3;
  static fg_export e;
  e = table_of(k, 1, NULL, 0);
  e.workspace_desc_size = sizeof(older_workspace);
  char err[512] = "x";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_OK, "%s", err);
  /* The same garbage in a table of today's size is read, and refused. */
  static fg_export_workspace nws[3];
  memset(nws, 0xff, sizeof nws);
  for (int i = 0; i < 3; i++) memcpy(&nws[i], &ows[i], offsetof(fg_export_workspace, per_key));
  static fg_export_kernel k2[1];
  k2[0] = k[0];
  k2[0].workspaces = nws;
  static fg_export e2; /* another table, not a second registration of the first */
  e2 = table_of(k2, 1, NULL, 0);
  cr_assert_eq(fg_register_export(&e2, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "per_key or min_group_rows"), "%s", err);
}

/* bwd_kernel_sm90a with the tail bwd.lua declares for kv_outer: the main step may run with one,
 * and the workspace dkv_tail (one key block of Bc = 64 rows per tail key block). */
static fg_export_kernel bwd_kernel_with_tail(void) {
  fg_export_kernel k = bwd_kernel_sm90a();
  bwd_steps[1].tail = 1;
  bwd_ws[4] = (fg_export_workspace){"dkv_tail", "dkv_tail", 4 * (2 * 64 * 128 + 4), 64, 0, 1, 0, 1};
  k.n_workspaces = 5;
  return k;
}

/* The tail's fields are read from the table (fg_export_step.tail, fg_export_workspace.tail) and
 * checked as the plan's text is: a plan with a tail registers; a tail step without a tail
 * workspace, a tail workspace without a tail step or one that is not per key block of the main
 * step are refused, saying to export again. */
Test(register_export, a_tail_is_read_from_the_table) {
  char err[512] = "x";
  static fg_export_kernel k[1];
  k[0] = bwd_kernel_with_tail();
  static fg_export e;
  e = table_of(k, 1, NULL, 0);
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_OK, "%s", err);
  static const struct {
    int step_tail, ws_tail, ws_rows, n_ws;
    const char *why;
  } bad[] = {{1, 1, 64, 4, "no tail workspace"},
             {0, 1, 64, 5, "runs without a tail"},
             {1, 1, 32, 5, "not per key block"},
             {2, 1, 64, 5, "malformed (tail)"},
             {1, 3, 64, 5, "malformed (tail)"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    static fg_export_kernel kb[1];
    kb[0] = bwd_kernel_with_tail();
    bwd_steps[1].tail = bad[i].step_tail;
    bwd_ws[4].tail = bad[i].ws_tail;
    bwd_ws[4].rows = bad[i].ws_rows;
    kb[0].n_workspaces = bad[i].n_ws;
    fg_export eb = table_of(kb, 1, NULL, 0);
    cr_assert_eq(fg_register_export(&eb, err, sizeof err), FG_ERROR_INVALID_ARGUMENT, "case %zu",
                 i);
    cr_assert(strstr(err, bad[i].why) && strstr(err, "export it again"), "case %zu: %s", i, err);
  }
}

/* A table written before the tail reads it as 0. fg_export_step.tail lies in what was the
 * struct's padding (LP64), so a table of steps from before it may have the same step_size and
 * garbage there: the tail is read only from a table whose workspace_desc_size covers
 * fg_export_workspace.tail, which came with it. The same garbage in a table that knows the tail
 * is read, and refused. */
Test(register_export, a_table_from_before_the_tail_reads_it_as_zero) {
  typedef struct older_step {
    const char *entry;
    int grid, br, threads, smem_bytes, split_rows;
  } older_step;
  typedef struct older_workspace {
    const char *name, *param;
    int bytes, rows, deterministic_only, per_key;
    long long min_group_rows;
  } older_workspace;
  cr_assert(sizeof(older_step) >= offsetof(fg_export_step, tail) + sizeof(int),
            "the garbage overlaps the step's tail (as on LP64)");
  cr_assert_eq(sizeof(older_workspace), offsetof(fg_export_workspace, tail));
  static fg_export_kernel k[1];
  k[0] = bwd_kernel_sm90a();
  static older_step osteps[3];
  static older_workspace ows[4];
  memset(osteps, 0xff, sizeof osteps);
  memset(ows, 0xff, sizeof ows);
  for (int i = 0; i < 3; i++) {
    osteps[i].entry = bwd_steps[i].entry;
    osteps[i].grid = bwd_steps[i].grid;
    osteps[i].br = bwd_steps[i].br;
    osteps[i].threads = bwd_steps[i].threads;
    osteps[i].smem_bytes = bwd_steps[i].smem_bytes;
    osteps[i].split_rows = bwd_steps[i].split_rows;
  }
  for (int i = 0; i < 4; i++) memcpy(&ows[i], &bwd_ws[i], sizeof ows[i]);
  k[0].steps = (const fg_export_step *)(const void *)osteps;
  k[0].workspaces = (const fg_export_workspace *)(const void *)ows;
  static fg_export e;
  e = table_of(k, 1, NULL, 0);
  e.step_size = sizeof(older_step);
  e.workspace_desc_size = sizeof(older_workspace);
  char err[512] = "x";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_OK, "%s", err);
  /* Today's workspaces with the old steps' garbage: the step's tail is read (-1), and refused. */
  static fg_export_kernel k2[1];
  k2[0] = k[0];
  k2[0].workspaces = bwd_ws;
  static fg_export e2; /* another table, not a second registration of the first */
  e2 = table_of(k2, 1, NULL, 0);
  e2.step_size = sizeof(older_step);
  cr_assert_eq(fg_register_export(&e2, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "step of its plan is malformed (tail)"), "%s", err);
}

Test(register_export, choices_must_name_a_kernel_of_the_table) {
  char err[512];
  fg_export_kernel k = kernel_sm80();
  fg_export_choice c = {"fwd_d128_bf16_noncausal_nk4096", D128 "sm90a", "a GPU"};
  fg_export e = table_of(&k, 1, &c, 1);
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "not one of the table's kernels") && strstr(err, D128 "sm90a"), "%s", err);
  c.variant = "garbage";
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "does not parse"), "%s", err);
}

Test(register_export, a_newer_table_with_appended_fields_reads) {
  /* A producer whose kernel struct has grown by one field: the runtime strides by the recorded
   * size and ignores what it does not know. */
  typedef struct newer_kernel {
    fg_export_kernel k;
    long long appended;
  } newer_kernel;
  static newer_kernel nk[2];
  nk[0].k = kernel_sm80();
  nk[1].k = kernel_sm80();
  nk[1].k.variant = D128 "sm90a";
  nk[1].k.arch = "sm_90a";
  nk[1].k.entry = "fg_" D128 "sm90a";
  static fg_export_step st90[1] = {{"fg_" D128 "sm90a", FG_EXPORT_GRID_Q_TILES, 128, 256, 104448, 0, 0}};
  nk[1].k.steps = st90;
  nk[0].appended = nk[1].appended = -1;
  static fg_export e;
  e = table_of(&nk[0].k, 2, NULL, 0);
  e.kernel_size = sizeof(newer_kernel);
  char err[512];
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_OK, "%s", err);
}

/* ---- the documented error, on the fake driver ----------------------------------------------- */
static char fake_lib[160];

static void use_fake_driver(void) {
  fgt_fake_driver_build(tmp_dir, "", fake_lib, sizeof fake_lib);
}

Test(exported_only, a_table_for_another_arch_gives_the_documented_error, .init = make_tmp,
     .fini = remove_tmp) {
  use_fake_driver();
  /* An sm_80 cubin without PTX cannot run on the fake H100 (compute capability 9.0). */
  static fg_export_kernel k[1];
  k[0] = kernel_sm80();
  static fg_export e;
  e = table_of(k, 1, NULL, 0);
  e.description = "app: sm_80 only";
  char err[512];
  cr_assert_eq(fg_register_export(&e, err, sizeof err), FG_OK, "%s", err);

  fg_context_options o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.policy = FG_POLICY_EXPORTED_ONLY;
  o.quiet = 1;
  fg_context *ctx;
  cr_assert_eq(fg_context_create(&ctx, &o), FG_OK, "%s", fg_last_create_error());
  void *buf = NULL, *obuf = NULL;
  cr_assert_eq(fg_dev_alloc(ctx, (CUdeviceptr *)&buf, 64 * 128 * 2), FG_OK);
  cr_assert_eq(fg_dev_alloc(ctx, (CUdeviceptr *)&obuf, 64 * 128 * 2), FG_OK);
  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.dtype = FG_DTYPE_BF16;
  a.batch = a.heads_q = a.heads_kv = 1;
  a.seqlen_q = a.seqlen_k = 64;
  a.head_dim = 128;
  a.q = a.k = a.v = buf;
  a.o = obuf;
  fg_status s = fg_attention_forward(ctx, &a, NULL);
  const char *msg = fg_context_last_error(ctx);
  cr_assert_eq(s, FG_ERROR_KERNEL_MISSING, "%s: %s", fg_status_string(s), msg);
  /* The problem, the GPU and its arch, the policy, and what the export contains. */
  cr_assert(strstr(msg, "fwd_d128_bf16_noncausal_nk512"), "%s", msg);
  cr_assert(strstr(msg, "head_dim 128"), "%s", msg);
  cr_assert(strstr(msg, "Fake H100") && strstr(msg, "sm_90a"), "%s", msg);
  cr_assert(strstr(msg, "exported-only"), "%s", msg);
  cr_assert(strstr(msg, "holds 1 kernel, none of which runs on"), "%s", msg);
  cr_assert(strstr(msg, "export for sm_90a"), "%s", msg);

  fg_dev_free(ctx, (CUdeviceptr)buf);
  fg_dev_free(ctx, (CUdeviceptr)obuf);
  fg_context_destroy(ctx);
}

Test(exported_only, fg_arch_compat_is_what_the_message_relies_on) {
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM80, 9, 0), 1, "sm_80 on an H100: PTX only");
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM90A, 8, 0), 0, "sm_90a on an A100: nothing");
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM90A, 9, 0), 3);
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM80, 8, 6), 2, "sm_80 cubins run on 8.6");
}

/* ---- flashgen export -------------------------------------------------------------------- */



static void write_text(const char *name, const char *text) {
  char p[128];
  snprintf(p, sizeof p, "%s/%s", tmp_dir, name);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
}

static void need_nvrtc(void) {
  char err[1024];
  if (fg_nvrtc_load(err, sizeof err) != 0) cr_skip_test("no NVRTC: %s", err);
}

Test(export_cli, empty_list_fails_clearly, .init = make_tmp, .fini = remove_tmp) {
  write_text("empty.txt", "# nothing here\n\n   # still nothing\n");
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export --arch sm_80 --variants empty.txt -o out"), 2, "%s", fg_test_err);
  cr_assert(strstr(fg_test_err, "empty.txt names no variant (3 lines"), "%s", fg_test_err);
  char p[128];
  snprintf(p, sizeof p, "%s/out", tmp_dir);
  cr_assert_neq(access(p, F_OK), 0, "nothing is written");
}

Test(export_cli, unknown_variant_names_its_line, .init = make_tmp, .fini = remove_tmp) {
  write_text("bad.txt", "# ok\nfwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80\n"
                        "fwd_d64_br64_bc64_f33_noncausal_qouter_w4_s2_sm80  # typo\n");
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export --arch sm_80 --variants bad.txt -o out"), 2, "%s", fg_test_err);
  cr_assert(strstr(fg_test_err, "bad.txt:3: 'fwd_d64_br64_bc64_f33_noncausal_qouter_w4_s2_sm80' is "
                             "not a variant"),
            "%s", fg_test_err);
  char p[128];
  snprintf(p, sizeof p, "%s/out/exported_kernels.c", tmp_dir);
  cr_assert_neq(access(p, F_OK), 0, "nothing is written");
}

Test(export_cli, a_variant_that_does_not_fit_names_its_line, .init = make_tmp, .fini = remove_tmp) {
  write_text("big.txt", "fwd_d256_br256_bc256_bf16_noncausal_qouter_w8_s3_sm80\n");
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export --arch sm_80 --variants big.txt -o out"), 2, "%s", fg_test_err);
  cr_assert(strstr(fg_test_err, "big.txt:1:") && strstr(fg_test_err, "does not fit"), "%s", fg_test_err);
}

Test(export_cli, missing_list_and_bad_usage, .init = make_tmp, .fini = remove_tmp) {
  FG_EXPECT_CLI_ERR(tmp_dir, NULL, "export --arch sm_80 --variants nope.txt -o out", 2,
                    "cannot read the variant list nope.txt");
  FG_EXPECT_CLI_ERR(tmp_dir, NULL, "export --arch sm_80,sm_75 --default -o out", 2,
                    "unknown arch 'sm_75'");
  FG_EXPECT_CLI_ERR(tmp_dir, NULL, "export --default -o out", 2, "--arch is required");
  FG_EXPECT_CLI_ERR(tmp_dir, NULL, "export --arch sm_80", 2, "-o DIR is required");
  FG_EXPECT_CLI_ERR(tmp_dir, NULL, "export --arch sm_80 --prefix 9lives -o out", 2,
                    "not a C identifier");
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export --arch sm_80 --default --variants x -o out"), 2);
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export --help"), 0);
  cr_assert(strstr(fg_test_out, "usage: flashgen export"), "%s", fg_test_out);
}

Test(export_cli, twice_gives_identical_bytes, .init = make_tmp, .fini = remove_tmp,
     .timeout = 300) {
  need_nvrtc();
  write_text("v.txt", "fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80\n");
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export -q --arch sm_90a,sm_80 --variants v.txt --prefix t -o a"), 0,
               "%s", fg_test_err);
  cr_assert(strstr(fg_test_out, "2 kernels for sm_80,sm_90a"), "%s", fg_test_out);
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export -q -j1 --arch sm_80,sm_90a --variants v.txt --prefix t -o b"),
               0, "%s", fg_test_err);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "cd '%s' && cmp a/t_kernels.c b/t_kernels.c && cmp a/t_kernels.h b/t_kernels.h",
           tmp_dir);
  cr_assert_eq(system(cmd), 0, "two exports differ");
  char p[128];
  static char head[1 << 16];
  snprintf(p, sizeof p, "%s/a/t_kernels.c", tmp_dir);
  fg_test_slurp(p, head, sizeof head);
  cr_assert(strstr(head, "Do not edit"), "banner");
  cr_assert(strstr(head, "Produced by flashgen " FG_VERSION_STRING), "%.600s", head);
  cr_assert(strstr(head, "Template hash: "), "%.600s", head);
  cr_assert(strstr(head, "NVRTC: "), "%.600s", head);
  cr_assert(strstr(head, "Tuning from: none: built-in rule"), "%.600s", head);
  cr_assert(strstr(head, "static const unsigned char t_fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80_cubin["),
            "%.900s", head);
  /* It compiles cleanly as C11. */
  const char *src = getenv("FLASHGEN_TEST_SOURCE_DIR");
  if (src) {
    const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
    snprintf(cmd, sizeof cmd,
             "cd '%s' && %s -std=c11 -Wall -Wextra -Werror -pedantic -Wmissing-prototypes "
             "-Wstrict-prototypes -Wshadow -I'%s/include' -c a/t_kernels.c -o t.o",
             tmp_dir, cc, src);
    cr_assert_eq(system(cmd), 0, "the exported C does not compile: %s", cmd);
  }
}

Test(export_cli, tuned_choices_come_from_the_cache, .init = make_tmp, .fini = remove_tmp,
     .timeout = 300) {
  need_nvrtc();
  /* Two GPUs' records in a cache: an H100 (sm_90a winners) and an A100 (sm_80 winners). */
  char dir[128], warn[512] = "";
  snprintf(dir, sizeof dir, "%s/cache", tmp_dir);
  fg_cache *c = fg_cache_open(dir, warn, sizeof warn);
  cr_assert_not_null(c, "%s", warn);
  fg_device_id h100 = {"NVIDIA H100 80GB HBM3", 9, 0, 132, 12080};
  fg_device_id a100 = {"NVIDIA A100-SXM4-80GB", 8, 0, 108, 12080};
  fg_tune_candidate cand;
  memset(&cand, 0, sizeof cand);
  cand.ok = 1;
  cand.ms = 1;
  cand.tflops = 100;
  snprintf(cand.variant, sizeof cand.variant, "fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm90a");
  cr_assert_eq(fg_cache_put_tuning(c, &h100, "fwd_d64_f16_noncausal_nk4096", &cand, 1, cand.variant,
                                   warn, sizeof warn), 0, "%s", warn);
  snprintf(cand.variant, sizeof cand.variant, "fwd_d64_br64_bc32_f16_noncausal_qouter_w4_s2_sm80");
  cr_assert_eq(fg_cache_put_tuning(c, &a100, "fwd_d64_f16_noncausal_nk1024", &cand, 1, cand.variant,
                                   warn, sizeof warn), 0, "%s", warn);
  fg_cache_close(c);
  write_text("v.txt", "fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80\n");
  char args[512];
  snprintf(args, sizeof args,
           "export -q --tuned --all-devices --cache-dir '%s' --arch sm_80,sm_90a --variants v.txt "
           "--prefix tt -o out", dir);
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, args), 0, "%s", fg_test_err);
  cr_assert(strstr(fg_test_out, "3 kernels") && strstr(fg_test_out, "2 tuned choices"), "%s", fg_test_out);
  static char text[1 << 16];
  char p[160];
  snprintf(p, sizeof p, "%s/out/tt_kernels.h", tmp_dir);
  fg_test_slurp(p, text, sizeof text);
  cr_assert(strstr(text, "Tuning from: NVIDIA A100-SXM4-80GB (cc 8.0, 108 SMs); NVIDIA H100 80GB "
                         "HBM3 (cc 9.0, 132 SMs)"), "%s", text);
  snprintf(p, sizeof p, "%s/out/tt_kernels.c", tmp_dir);
  FILE *f = fopen(p, "rb");
  cr_assert_not_null(f);
  fseek(f, -4096, SEEK_END);
  size_t n = fread(text, 1, 4095, f);
  text[n] = 0;
  fclose(f);
  cr_assert(strstr(text, "{.bucket = \"fwd_d64_f16_noncausal_nk1024\", .variant = "
                         "\"fwd_d64_br64_bc32_f16_noncausal_qouter_w4_s2_sm80\""), "%s", text);
  cr_assert(strstr(text, "{.bucket = \"fwd_d64_f16_noncausal_nk4096\", .variant = "
                         "\"fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm90a\""), "%s", text);
  cr_assert(strstr(text, ".device = \"NVIDIA H100 80GB HBM3 (cc 9.0, 132 SMs)\""), "%s", text);

  /* An empty cache: a clear failure. */
  snprintf(args, sizeof args, "export -q --tuned --all-devices --cache-dir '%s/empty' --arch sm_80 "
           "--variants v.txt -o out2", tmp_dir);
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, args), 1, "%s", fg_test_err);
  cr_assert(strstr(fg_test_err, "has no tuning record") && strstr(fg_test_err, "flashgen tune"), "%s",
            fg_test_err);
}

/* ---- the backward in flashgen export ------------------------------------------------------ */
Test(export_cli, the_default_set_holds_the_backward_of_every_problem, .init = make_tmp,
     .fini = remove_tmp) {
  /* --dry-run compiles nothing: no NVRTC needed. */
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export --default --arch sm_80,sm_86 --dry-run"), 0,
               "%s", fg_test_err);
  cr_assert(strstr(fg_test_out, "464 kernels (232 forward, 232 backward)"), "%.400s", fg_test_out);
  const fg_arch archs[2] = {FG_ARCH_SM80, FG_ARCH_SM86};
  for (int a = 0; a < 2; a++)
    for (int d = 32; d <= 256; d += 8)
      for (int dt = FG_DTYPE_F16; dt <= FG_DTYPE_BF16; dt++)
        for (int causal = 0; causal <= 1; causal++) {
          fg_variant f = fg_builtin_variant(d, (fg_dtype)dt, causal, archs[a]);
          fg_variant b = fg_builtin_backward_variant(d, (fg_dtype)dt, causal, archs[a]);
          char fn[FG_VARIANT_NAME_MAX + 2] = "\n", bn[FG_VARIANT_NAME_MAX + 2] = "\n";
          fg_variant_name(&f, fn + 1, sizeof fn - 1);
          fg_variant_name(&b, bn + 1, sizeof bn - 1);
          strcat(fn, "\n"), strcat(bn, "\n");
          cr_assert(strstr(fg_test_out, fn), "the forward %s is missing", fn + 1);
          cr_assert(strstr(fg_test_out, bn), "the backward %s is missing", bn + 1);
        }
  /* --no-backward: the forward kernels only; it names the default set's option, not a list's. */
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export --default --no-backward --arch sm_80 --dry-run"),
               0, "%s", fg_test_err);
  cr_assert(strstr(fg_test_out, "116 kernels (116 forward, 0 backward)"), "%.400s", fg_test_out);
  cr_assert_null(strstr(fg_test_out, "\nbwd_"), "%.400s", fg_test_out);
  write_text("v.txt", "fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80\n");
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export --variants v.txt --no-backward --arch sm_80 "
                                              "--dry-run"), 2);
  cr_assert(strstr(fg_test_err, "--no-backward applies to the default set"), "%s", fg_test_err);
  /* A list may name backward variants; a bad one names its line. */
  write_text("b.txt", "bwd_d64_br64_bc64_f16_noncausal_kvouter_w8_s2_sm80\n"
                      "bwd_d64_br64_bc64_f16_noncausal_qouter_w8_s2_sm80\n");
  FG_EXPECT_CLI_ERR(tmp_dir, NULL, "export --variants b.txt --arch sm_80 --dry-run", 2, "b.txt:2:");
}

typedef const fg_export *(*export_fn)(void);

Test(export_cli, a_backward_variant_is_exported_with_its_plan_and_runs_from_the_table,
     .init = make_tmp, .fini = remove_tmp, .timeout = 300) {
  need_nvrtc();
  const char *src = getenv("FLASHGEN_TEST_SOURCE_DIR");
  if (!src) cr_skip_test("FLASHGEN_TEST_SOURCE_DIR is not set (run through ctest)");
  write_text("v.txt", "# the built-in rule's backward of d = 64, f16, non-causal\n"
                      "bwd_d64_br64_bc64_f16_noncausal_kvouter_w8_s2_sm80\n");
  cr_assert_eq(fg_test_run_cli(tmp_dir, NULL, "export -q --arch sm_90a --variants v.txt --prefix tb -o out"),
               0, "%s", fg_test_err);
  cr_assert(strstr(fg_test_out, "1 kernels for sm_90a (0 forward, 1 backward"), "%s", fg_test_out);

  /* The generated C: the launch contract with grid kind KV_TILES, br = Bc, d + 1 floats of
   * workspace, and the module's three entries named. */
  const size_t cap = 16u << 20;
  char *text = malloc(cap), p[160];
  cr_assert_not_null(text);
  snprintf(p, sizeof p, "%s/out/tb_kernels.c", tmp_dir);
  fg_test_slurp(p, text, cap);
#define E "fg_bwd_d64_br64_bc64_f16_noncausal_kvouter_w8_s2_sm90a"
  /* Its plan: the three entries of the module in launch order (the main one may run with a
   * tail), and the five workspaces. */
  cr_assert(strstr(text, "_steps[3] = {\n"
                         "    {.entry = \"" E "_pre\", .grid = FG_EXPORT_GRID_Q_TILES, .br = 64, "
                         ".threads = 128, .smem_bytes = 0, .split_rows = 0, .tail = 0},\n"
                         "    {.entry = \"" E "\", .grid = FG_EXPORT_GRID_KV_TILES, .br = 64, "),
            "the plan's steps are missing");
  cr_assert(strstr(text, ", .split_rows = 65536, .tail = 1},\n"),
            "the main step's split and tail are missing");
  cr_assert(strstr(text, "    {.entry = \"" E "_post\", .grid = FG_EXPORT_GRID_Q_TILES, .br = 64, "
                         ".threads = 128, .smem_bytes = 0, .split_rows = 0, .tail = 0},\n};\n"),
            "the plan's last step is missing");
  /* d = 64, Bc = 64: (2 * 64 * 64 + 4) * 4 = 32784 bytes per key block. */
  cr_assert(strstr(text, "_workspaces[5] = {\n"
                         "    {.name = \"dq_accum\", .param = \"workspace\", .bytes = 256, .rows = 1, "
                         ".deterministic_only = 0, .per_key = 0, .min_group_rows = 0, .tail = 0},\n"
                         "    {.name = \"dkv_accum\", .param = \"dkv\", .bytes = 32784, .rows = 64, "
                         ".deterministic_only = 0, .per_key = 1, .min_group_rows = 65536, .tail = 0},\n"
                         "    {.name = \"dkv_tail\", .param = \"dkv_tail\", .bytes = 32784, .rows = 64, "
                         ".deterministic_only = 0, .per_key = 1, .min_group_rows = 0, .tail = 1},\n"
                         "    {.name = \"dsum\", .param = \"dsum\", .bytes = 4, .rows = 1, "
                         ".deterministic_only = 0, .per_key = 0, .min_group_rows = 0, .tail = 0},\n"
                         "    {.name = \"semaphores\", .param = \"sem\", .bytes = 4, .rows = 16, "
                         ".deterministic_only = 1, .per_key = 0, .min_group_rows = 0, .tail = 0},\n};\n"),
            "the plan's workspaces are missing");
  const char *k = strstr(text, "{.variant = \"bwd_d64_br64_bc64_f16_noncausal_kvouter_w8_s2_sm90a\"");
  cr_assert_not_null(k, "the kernel entry is missing");
  cr_assert(strstr(k, ".entry = \"" E "\",\n"), "%.800s", k);
  cr_assert(strstr(k, ".grid = FG_EXPORT_GRID_KV_TILES,\n     .br = 64,\n"
                      "     .workspace_floats_per_row = 65,"), "%.800s", k);

  /* It compiles, and its PTX declares the three entries of the plan. */
  char cmd[1024], so[160];
  snprintf(so, sizeof so, "%s/tb.so", tmp_dir);
  const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
  snprintf(cmd, sizeof cmd,
           "%s -std=c11 -Wall -Wextra -Werror -pedantic -shared -fPIC -I'%s/include' -I'%s/out' "
           "-o '%s' '%s'", cc, src, tmp_dir, so, p);
  cr_assert_eq(system(cmd), 0, "the exported C does not compile: %s", cmd);
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h, "%s", dlerror());
  export_fn fn;
  *(void **)&fn = dlsym(h, "tb_flashgen_export");
  cr_assert_not_null(fn, "%s", dlerror());
  const fg_export *t = fn();
  cr_assert_eq(t->n_kernels, 1);
  cr_assert_eq(t->kernels[0].grid, FG_EXPORT_GRID_KV_TILES);
  cr_assert_eq(t->step_size, sizeof(fg_export_step));
  cr_assert_eq(t->kernels[0].n_steps, 3);
  cr_assert_eq(t->kernels[0].main_step, 1);
  cr_assert_str_eq(t->kernels[0].steps[2].entry, E "_post");
  cr_assert_eq(t->kernels[0].n_workspaces, 5);
  cr_assert_eq(t->kernels[0].workspaces[4].deterministic_only, 1);
  cr_assert_eq(t->kernels[0].steps[1].split_rows, 65536);
  cr_assert(t->kernels[0].steps[1].tail == 1 && t->kernels[0].steps[0].tail == 0);
  cr_assert(t->kernels[0].workspaces[2].tail == 1 && t->kernels[0].workspaces[1].tail == 0);
  cr_assert_eq(t->workspace_desc_size, sizeof(fg_export_workspace));
  const fg_export_workspace *dkv = &t->kernels[0].workspaces[1];
  cr_assert(strcmp(dkv->param, "dkv") == 0 && dkv->per_key == 1 && dkv->min_group_rows == 65536 &&
                dkv->rows == 64 && dkv->bytes == 4 * (2 * 64 * 64 + 4),
            "%s: %d B, per key %d, from %lld", dkv->param, dkv->bytes, dkv->per_key,
            dkv->min_group_rows);
  const uint64_t dkv_bytes = (uint64_t)dkv->bytes;
  cr_assert_not_null(t->kernels[0].ptx);
  cr_assert(strstr(t->kernels[0].ptx, ".entry " E "_pre("), "no _pre entry in the PTX");
  cr_assert(strstr(t->kernels[0].ptx, ".entry " E "("), "no main entry in the PTX");
  cr_assert(strstr(t->kernels[0].ptx, ".entry " E "_post("), "no _post entry in the PTX");
#undef E
  free(text);

  /* Registered, it serves fg_attention_backward under the exported-only policy (on the fake
   * driver, which emulates the plan): nothing compiled, the binary from the table. */
  char err[512];
  cr_assert_eq(fg_register_export(t, err, sizeof err), FG_OK, "%s", err);
  use_fake_driver();
  setenv("FLASHGEN_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so", 1);
  fg_context_options o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.policy = FG_POLICY_EXPORTED_ONLY;
  o.quiet = 1;
  fg_context *ctx;
  cr_assert_eq(fg_context_create(&ctx, &o), FG_OK, "%s", fg_last_create_error());
  enum { N = 32, D = 64, EL = N * D };
  CUdeviceptr m[8];
  for (int i = 0; i < 8; i++) cr_assert_eq(fg_dev_alloc(ctx, &m[i], EL * 2), FG_OK);
  uint16_t host[EL];
  for (int i = 0; i < EL; i++) host[i] = (uint16_t)(0x3000 + (i * 7919) % 0x800); /* f16 (0.125, 0.25) */
  for (int i = 0; i < 5; i++) cr_assert_eq(fg_dev_upload(ctx, m[i], host, EL * 2), FG_OK);
  CUdeviceptr lse;
  cr_assert_eq(fg_dev_alloc(ctx, &lse, N * 4), FG_OK);
  fg_attention_backward_args a;
  memset(&a, 0, sizeof a);
  a.dtype = FG_DTYPE_F16;
  a.batch = a.heads_q = a.heads_kv = 1;
  a.seqlen_q = a.seqlen_k = N;
  a.head_dim = D;
  a.q = (const void *)(uintptr_t)m[0], a.k = (const void *)(uintptr_t)m[1];
  a.v = (const void *)(uintptr_t)m[2], a.o = (const void *)(uintptr_t)m[3];
  a.d_o = (const void *)(uintptr_t)m[4], a.lse = (const float *)(uintptr_t)lse;
  a.dq = (void *)(uintptr_t)m[5], a.dk = (void *)(uintptr_t)m[6], a.dv = (void *)(uintptr_t)m[7];
  /* The table's plan sizes the workspace: past 65536 query rows, the dK/dV partial sums of
   * seqlen_k = 32 rows: one key block of Bc = 64. */
  {
    fg_attention_backward_args big = a; /* shapes only: no tensors of 65537 rows */
    big.q = big.k = big.v = big.o = big.d_o = NULL;
    big.dq = big.dk = big.dv = NULL;
    big.lse = NULL;
    size_t at = 0, past = 0;
    big.seqlen_q = 65536;
    cr_assert_eq(fg_attention_backward_workspace_size(ctx, &big, &at), FG_OK, "%s",
                 fg_context_last_error(ctx));
    big.seqlen_q = 65537;
    cr_assert_eq(fg_attention_backward_workspace_size(ctx, &big, &past), FG_OK, "%s",
                 fg_context_last_error(ctx));
    cr_assert_eq(past - at, (size_t)(4 * (D + 1)) + dkv_bytes, "%zu then %zu", at, past);
  }
  fg_status st = fg_attention_backward(ctx, &a, NULL);
  cr_assert_eq(st, FG_OK, "%s: %s", fg_status_string(st), fg_context_last_error(ctx));
  /* dV = P^T dO with P and dO positive: every element finite, nonzero, so written by the plan. */
  uint16_t dv[EL];
  cr_assert_eq(fg_dev_download(ctx, dv, m[7], EL * 2), FG_OK);
  int nonzero = 0;
  for (int i = 0; i < EL; i++) nonzero += (dv[i] & 0x7fff) != 0 && (dv[i] & 0x7c00) != 0x7c00;
  cr_assert_eq(nonzero, EL, "dV was not written by the plan");
  /* A backward head_dim the table lacks: the documented error, not a compile. */
  a.head_dim = 32;
  st = fg_attention_backward(ctx, &a, NULL);
  cr_assert_eq(st, FG_ERROR_KERNEL_MISSING, "%s: %s", fg_status_string(st),
               fg_context_last_error(ctx));
  for (int i = 0; i < 8; i++) fg_dev_free(ctx, m[i]);
  fg_dev_free(ctx, lse);
  fg_context_destroy(ctx);
}
