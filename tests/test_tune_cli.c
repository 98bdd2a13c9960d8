/* test_tune_cli.c: the commands around tuning, with no GPU: fg_explain_backward on the fake
 * driver under FG_POLICY_EXPORTED_ONLY (built-in rule, exported choice, nearest bucket, the plan's
 * launches); the `flashgen tune`, `flashgen explain --backward` and `flashgen cache` commands (run
 * from $FLASHGEN_CLI): usage errors, no GPU, each cache action; and whole runs of `flashgen tune`
 * and `flashgen check` on the fake driver (tests/fake_cuda/libcuda.c, built by the test): the hang
 * watchdog, the diagnosis of non-finite backward gradients, tuning that records and skips. */
#include <criterion/criterion.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_support.h"
#include "cli_runner.h"
#include "fg_autotune.h"
#include "fg_cache.h"
#include "fg_gen.h"
#include "fg_jit.h"
#include "support_plan.h"

/* ---- fg_explain_backward on the fake driver, no GPU -------------------------------------- */

static char fake_dir[64], fake_path[128];

static void fake_driver(void) {
  strcpy(fake_dir, "/tmp/fg_test_explain_XXXXXX");
  cr_assert(mkdtemp(fake_dir));
  fgt_fake_driver_build(fake_dir, "", fake_path, sizeof fake_path);
}

static void fake_driver_done(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fake_dir);
  if (fake_dir[0] && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", fake_dir);
}

static fg_attention_backward_args bwd_shape(int64_t n, int causal) {
  fg_attention_backward_args b;
  memset(&b, 0, sizeof b);
  b.size = sizeof b;
  b.dtype = FG_DTYPE_BF16;
  b.causal = causal;
  b.batch = 2;
  b.heads_q = 16;
  b.heads_kv = 4;
  b.seqlen_q = b.seqlen_k = n;
  b.head_dim = 128;
  return b;
}

Test(explain_backward, builtin_rule_and_missing_binary, .init = fake_driver,
     .fini = fake_driver_done) {
  fg_context *ctx = fgt_exported_only_context();
  fg_attention_backward_args b = bwd_shape(4000, 1);
  char buf[8192];
  fg_status st = fg_explain_backward(ctx, &b, buf, sizeof buf);
  cr_assert_eq(st, FG_ERROR_KERNEL_MISSING, "%s: %s", fg_status_string(st), buf);
  cr_assert(strstr(buf, "problem: backward"), "%s", buf);
  cr_assert(strstr(buf, "key: bwd_d128_bf16_causal_nk4096 (seqlen_k 4000 -> bucket 4096)"), "%s",
            buf);
  const fg_variant bi = fg_builtin_backward_variant(128, FG_DTYPE_BF16, 1, FG_ARCH_SM90A);
  char name[FG_VARIANT_NAME_MAX];
  fg_variant_name(&bi, name, sizeof name);
  cr_assert(strstr(buf, "no backward kernel for problem bwd_d128_bf16_causal_nk4096") &&
                strstr(buf, name) && strstr(buf, "exported-only"),
            "the built-in rule's variant was tried: %s", buf);
  cr_assert(strstr(fg_context_last_error(ctx), "bwd_d128_bf16_causal_nk4096"), "%s",
            fg_context_last_error(ctx));
  /* Bad input is refused before anything is decided. */
  b.heads_kv = 3;
  cr_assert_eq(fg_explain_backward(ctx, &b, buf, sizeof buf), FG_ERROR_INVALID_ARGUMENT, "%s", buf);
  cr_assert_eq(fg_explain_backward(NULL, &b, buf, sizeof buf), FG_ERROR_INVALID_ARGUMENT);
  /* Nothing to launch. */
  b = bwd_shape(0, 0);
  cr_assert_eq(fg_explain_backward(ctx, &b, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, "nothing to launch"), "%s", buf);
  fg_context_destroy(ctx);
}

#define BWD_CHOICE "bwd_d128_br64_bc64_bf16_causal_kvouter_w8_s1_sm90a"
#define FWD_OTHER "fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm90a"

Test(explain_backward, exported_choice_nearest_bucket_and_plan, .init = fake_driver,
     .fini = fake_driver_done) {
  static unsigned char cubin[64] = {0x7f, 'E', 'L', 'F'};
  static fg_kernel_image k[2];
  memset(k, 0, sizeof k);
  snprintf(k[0].variant, sizeof k[0].variant, BWD_CHOICE);
  k[0].arch = FG_ARCH_SM90A;
  k[0].cubin = cubin;
  k[0].cubin_size = sizeof cubin;
  test_backward_plan(&k[0].meta, BWD_CHOICE, 128, 64, 256, 99840); /* Bc 64 */
  k[0].meta.regs = 168;
  k[0].meta.spill_load_bytes = k[0].meta.spill_store_bytes = k[0].meta.stack_bytes = 0;
  /* A forward kernel of the same (d, dtype, causal): it never serves the backward. */
  k[1] = k[0];
  snprintf(k[1].variant, sizeof k[1].variant, FWD_OTHER);
  fg_kernel_meta_single(&k[1].meta, "fg_" FWD_OTHER, FG_GRID_Q_TILES, 128, 256, 99840);
  static const fg_exported_choice choices[] = {{"bwd_d128_bf16_causal_nk4096", BWD_CHOICE},
                                               {"fwd_d128_bf16_causal_nk4096", FWD_OTHER}};
  static fg_exported_table tab;
  tab.description = "test: one backward choice";
  tab.kernels = k;
  tab.n_kernels = 2;
  tab.choices = choices;
  tab.n_choices = 2;
  char err[512];
  cr_assert_eq(fg_register_exported(&tab, err, sizeof err), FG_OK, "%s", err);

  fg_context *ctx = fgt_exported_only_context();
  fg_attention_backward_args b = bwd_shape(4096, 1);
  char buf[8192];
  fg_status st = fg_explain_backward(ctx, &b, buf, sizeof buf);
  cr_assert_eq(st, FG_OK, "%s: %s", fg_status_string(st), buf);
  cr_assert(strstr(buf, "key: bwd_d128_bf16_causal_nk4096"), "%s", buf);
  cr_assert(strstr(buf, "choice: the tuned choice for bwd_d128_bf16_causal_nk4096 in the exported "
                        "table 'test: one backward choice'"),
            "%s", buf);
  cr_assert(strstr(buf, "variant: " BWD_CHOICE "\n"), "%s", buf);
  cr_assert(strstr(buf, "binary: the exported table 'test: one backward choice' (" BWD_CHOICE
                        " cubin)"),
            "%s", buf);
  /* The plan: 4096 rows / 64 = 64 row blocks; B * Hq = 32; 4096 / Bc 64 = 64 K/V blocks on
   * B * Hkv = 8; workspace 2 * 16 * 4096 * 129 * 4 B = 64.5 MiB. */
  cr_assert(strstr(buf, "plan: 3 kernels in order on the stream"), "%s", buf);
  cr_assert(strstr(buf, "1. fg_" BWD_CHOICE "_pre: grid q_tiles (64, 32) x 128 threads\n"), "%s",
            buf);
  cr_assert(strstr(buf, "2. fg_" BWD_CHOICE ": grid kv_tiles (64, 8) x 256 threads, 99840 B "
                        "dynamic shared memory, 168 registers per thread\n"),
            "%s", buf);
  cr_assert(strstr(buf, "3. fg_" BWD_CHOICE "_post: grid q_tiles (64, 32) x 128 threads\n"), "%s",
            buf);
  cr_assert(strstr(buf, "workspace: 64.5 MiB (dq_accum, dsum)") &&
                strstr(buf, "allocated on the stream"),
            "%s", buf);
  /* The caller's workspace is named as such. */
  static _Alignas(16) unsigned char ws[16];
  b.workspace = ws;
  b.workspace_size = sizeof ws;
  cr_assert_eq(fg_explain_backward(ctx, &b, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, "the caller's buffer of 16 bytes"), "%s", buf);
  /* Below the threshold the main kernel is not split, and explain says why. */
  cr_assert(strstr(buf, "query rows per KV head (seqlen_q * heads_q / heads_kv = 16384) within "
                        "65536: one block per key block sums them all\n"),
            "%s", buf);
  /* Past 65536 query rows per K/V head (16385 * 16 / 4 = 65540), the main kernel's grid splits
   * them in 2 (its z), and the dK/dV partial sums join: 2 * 4 K/V heads x 64 key blocks x
   * (2 * 64 * 128 + 4) floats, about 32 MiB more. */
  b = bwd_shape(4096, 1);
  b.seqlen_q = 16385;
  cr_assert_eq(fg_explain_backward(ctx, &b, buf, sizeof buf), FG_OK, "%s", buf);
  char want[200];
  snprintf(want, sizeof want,
           "workspace: %.1f MiB (dq_accum, dkv_accum per key block, only when Nq*Hq/Hkv > 65536, "
           "dsum)",
           (2.0 * 16 * 16385 * 129 * 4 + 8.0 * 64 * (2 * 64 * 128 + 4) * 4) / (1024.0 * 1024.0));
  cr_assert(strstr(buf, want), "no '%s' in:\n%s", want, buf);
  cr_assert(strstr(buf, "2. fg_" BWD_CHOICE ": grid kv_tiles (64, 8, 2) x 256 threads"), "%s", buf);
  cr_assert(strstr(buf, "query rows per KV head (seqlen_q * heads_q / heads_kv = 65540) past 65536: "
                        "each key block's query blocks split over the grid's z, the splits' "
                        "partial dK/dV summed in fp32 (dkv_accum)\n"),
            "%s", buf);
  b.seqlen_q = 16384;
  cr_assert_eq(fg_explain_backward(ctx, &b, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, "(dq_accum, dsum)") && !strstr(buf, "dkv_accum"), "%s", buf);

  /* Another bucket of the same prefix takes the nearest choice. */
  b = bwd_shape(1000, 1);
  cr_assert_eq(fg_explain_backward(ctx, &b, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, "key: bwd_d128_bf16_causal_nk1024") &&
                strstr(buf, "nearest bucket bwd_d128_bf16_causal_nk4096") &&
                strstr(buf, "variant: " BWD_CHOICE),
            "%s", buf);

  /* Non-causal has no choice and no kernel: missing, and the forward kernel is not offered. */
  b = bwd_shape(4096, 0);
  cr_assert_eq(fg_explain_backward(ctx, &b, buf, sizeof buf), FG_ERROR_KERNEL_MISSING, "%s", buf);
  cr_assert_null(strstr(buf, "variant: fwd_"), "%s", buf);

  /* The forward of the same problem decides on its own key and kernel. */
  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = FG_DTYPE_BF16;
  a.causal = 1;
  a.batch = 2;
  a.heads_q = 16;
  a.heads_kv = 4;
  a.seqlen_q = a.seqlen_k = 4096;
  a.head_dim = 128;
  cr_assert_eq(fg_explain(ctx, &a, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, "key: fwd_d128_bf16_causal_nk4096") && strstr(buf, "variant: " FWD_OTHER),
            "%s", buf);
  /* And the backward's decision was memoised apart from it: asked again, the same. */
  b = bwd_shape(4096, 1);
  cr_assert_eq(fg_explain_backward(ctx, &b, buf, sizeof buf), FG_OK, "%s", buf);
  cr_assert(strstr(buf, "variant: " BWD_CHOICE), "%s", buf);
  fg_context_destroy(ctx);
}

/* ---- the commands ------------------------------------------------------------------------ */




#define NO_GPU "FLASHGEN_CUDA_LIBRARY=/nonexistent/libcuda.so.1"

Test(cli, tune_help_and_usage_errors) {
  cr_assert_eq(fg_test_run_cli(NULL, NULL, "tune --help"), 0);
  cr_assert(strstr(fg_test_out, "usage: flashgen tune") && strstr(fg_test_out, "PROBLEM"), "%s", fg_test_out);
  FG_EXPECT_CLI_ERR(NULL, NO_GPU, "tune d=12,n=4k", 2,
                    "d=12: head dimension must be a multiple of 8");
  FG_EXPECT_CLI_ERR(NULL, NO_GPU, "tune --frobnicate", 2, "unknown option '--frobnicate'");
  FG_EXPECT_CLI_ERR(NULL, NO_GPU, "tune -j 0", 2, "-j needs an integer from 1");
  FG_EXPECT_CLI_ERR(NULL, NO_GPU, "tune --quick d=64,n=1k", 2, "--quick");
  FG_EXPECT_CLI_ERR(NULL, NO_GPU, "tune --problems /nonexistent/p.txt", 2,
                    "/nonexistent/p.txt: cannot open");
}

Test(cli, tune_and_explain_take_the_backward) {
  cr_assert_eq(fg_test_run_cli(NULL, NULL, "tune --help"), 0);
  cr_assert(strstr(fg_test_out, "pass=bwd") && strstr(fg_test_out, "backward at N in {1k, 4k}"),
            "%s", fg_test_out);
  FG_EXPECT_CLI_ERR(NULL, NO_GPU, "tune d=128,n=4k,pass=sideways", 2,
                    "pass=sideways: expected fwd or bwd");
  cr_assert_eq(fg_test_run_cli(NULL, NO_GPU, "tune d=128,n=4k,pass=bwd"), 1, "%s", fg_test_err);
  cr_assert(strstr(fg_test_err, "tuning needs a CUDA GPU"), "a backward problem parses: %s",
            fg_test_err);
  cr_assert_eq(fg_test_run_cli(NULL, NULL, "explain --help"), 0);
  cr_assert(strstr(fg_test_out, "--backward"), "%s", fg_test_out);
  cr_assert_eq(fg_test_run_cli(NULL, NO_GPU, "explain --backward --d 64"), 1);
}

Test(cli, explain_backward_on_the_fake_driver, .init = fake_driver, .fini = fake_driver_done) {
  char env[256];
  snprintf(env, sizeof env, "FLASHGEN_CUDA_LIBRARY='%s'", fake_path);
  cr_assert_eq(fg_test_run_cli(NULL, env,
                               "explain --backward --d 64 --dtype f16 --causal --nq 2000 "
                               "--policy exported-only"),
               1, "%s%s", fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_out, "problem: backward") &&
                strstr(fg_test_out, "key: bwd_d64_f16_causal_nk2048") &&
                strstr(fg_test_out, "no backward kernel"),
            "%s", fg_test_out);
  cr_assert(strstr(fg_test_err, "flashgen explain:") && strstr(fg_test_err, "bwd_d64_f16"), "%s",
            fg_test_err);
}

/* build-default --cache stores the kernels under the runtime's key: explain, on the fake H100,
 * then finds its binary in the cache instead of compiling it (no GPU, no tuning). */
Test(cli, build_default_fills_the_kernel_cache, .init = fake_driver, .fini = fake_driver_done,
     .timeout = 300) {
  char err[1024];
  if (fg_nvrtc_load(err, sizeof err) != 0) cr_skip_test("no NVRTC: %s", err);
  char env[512];
  snprintf(env, sizeof env, "FLASHGEN_CACHE_DIR='%s/c'", fake_dir);
  int rc = fg_test_run_cli(NULL, env, "build-default --arch sm_90a --no-backward --d 32 --cache -j 2");
  cr_assert_eq(rc, 0, "exit %d\n%s%s", rc, fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_out, "0 failed") && strstr(fg_test_out, "stored in the kernel cache"), "%s",
            fg_test_out);
  cr_assert(strstr(fg_test_out, "fwd_d32_") && !strstr(fg_test_out, "fwd_d40_") && !strstr(fg_test_out, "bwd_"),
            "only d = 32's forward: %s", fg_test_out);
  snprintf(env, sizeof env, "FLASHGEN_CUDA_LIBRARY='%s' FLASHGEN_CACHE_DIR='%s/c'", fake_path, fake_dir);
  rc = fg_test_run_cli(NULL, env, "explain --d 32 --nq 4096 --policy exported-and-cache");
  cr_assert_eq(rc, 0, "exit %d\n%s%s", rc, fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_out, "binary: the kernel cache"), "%s", fg_test_out);
  FG_EXPECT_CLI_ERR(NULL, env, "build-default --d 32,36", 2, "--d '32,36': each head dimension");
  /* A cache it cannot use: it says so and why, and builds nothing. */
  FG_EXPECT_CLI_ERR(NULL, "FLASHGEN_CACHE_DIR=/proc/flashgen_no_such_dir",
                    "build-default --arch sm_80 --d 32 --cache", 1,
                    "--cache: the kernel cache cannot be used, nothing was compiled: ");
  cr_assert(strstr(fg_test_err, "/proc/flashgen_no_such_dir") && !strstr(fg_test_err, "compiling in memory"),
            "%s", fg_test_err);
  cr_assert(!strstr(fg_test_out, "fwd_d32"), "it compiled anyway: %s", fg_test_out);
}

Test(cli, tune_without_gpu_fails_clearly) {
  cr_assert_eq(fg_test_run_cli(NULL, NO_GPU, "tune --quick"), 1, "stdout: %s\nstderr: %s", fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_err, "tuning needs a CUDA GPU"), "%s", fg_test_err);
  cr_assert(strstr(fg_test_err, "/nonexistent/libcuda.so.1"), "the message says what was tried: %s",
            fg_test_err);
  FG_EXPECT_CLI_ERR(NULL, NO_GPU, "tune -j4 -q d=128,dtype=bf16,causal=1,n=4096", 1,
                    "tuning needs a CUDA GPU");
}

static char cache_dir[64];

static void make_cache_dir(void) {
  strcpy(cache_dir, "/tmp/fg_test_cache_XXXXXX");
  cr_assert(mkdtemp(cache_dir));
}

static void remove_cache_dir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
  cr_assert_eq(system(cmd), 0);
}

/* Stores one kernel and one tuning record with the library. */
static void fill_cache(void) {
  char warn[1024] = "", dbdir[128];
  snprintf(dbdir, sizeof dbdir, "%s/c", cache_dir);
  fg_cache *c = fg_cache_open(dbdir, warn, sizeof warn);
  cr_assert(c, "%s", warn);
  static unsigned char cubin[2048];
  static char ptx[1024];
  for (size_t i = 0; i < sizeof cubin; i++) cubin[i] = (unsigned char)(i * 7);
  memset(ptx, 'p', sizeof ptx - 1);
  fg_kernel_image img;
  memset(&img, 0, sizeof img);
  snprintf(img.variant, sizeof img.variant, "fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm90a");
  img.arch = FG_ARCH_SM90A;
  img.cubin = cubin;
  img.cubin_size = sizeof cubin;
  img.ptx = ptx;
  img.ptx_size = sizeof ptx - 1;
  fg_kernel_meta_single(&img.meta, "fg_fwd", FG_GRID_Q_TILES, 128, 128, 1024);
  fg_cache_key key = {img.variant, FG_ARCH_SM90A, 13000, 0x1234, "0.1.0"};
  cr_assert_eq(fg_cache_put_kernel(c, &key, &img, warn, sizeof warn), 0, "%s", warn);
  fg_device_id dev = {"NVIDIA H100 80GB HBM3", 9, 0, 132, 13000};
  fg_tune_candidate cand[2];
  memset(cand, 0, sizeof cand);
  snprintf(cand[0].variant, sizeof cand[0].variant, "%s", img.variant);
  cand[0].ok = 1;
  cand[0].ms = 1.5;
  cand[0].tflops = 300;
  snprintf(cand[1].variant, sizeof cand[1].variant,
           "fwd_d128_br64_bc64_bf16_causal_kvouter_w4_s1_sm90a");
  snprintf(cand[1].reason, sizeof cand[1].reason, "wrong");
  cr_assert_eq(fg_cache_put_tuning(c, &dev, "fwd_d128_bf16_causal_nk4096", cand, 2, img.variant,
                                   warn, sizeof warn),
               0, "%s", warn);
  fg_cache_close(c);
}

Test(cli, cache_actions, .init = make_cache_dir, .fini = remove_cache_dir) {
  char args[512];
  cr_assert_eq(fg_test_run_cli(NULL, NULL, "cache --help"), 0);
  cr_assert(strstr(fg_test_out, "usage: flashgen cache") && strstr(fg_test_out, "verify"));
  cr_assert_eq(fg_test_run_cli(NULL, NULL, "cache"), 2);
  FG_EXPECT_CLI_ERR(NULL, NULL, "cache frobnicate", 2, "unknown action 'frobnicate'");
  cr_assert_eq(fg_test_run_cli(NULL, NULL, "cache ls stats"), 2);
  cr_assert_eq(fg_test_run_cli(NULL, NULL, "cache --dir"), 2);

  snprintf(args, sizeof args, "cache --dir '%s/c' ls", cache_dir);
  cr_assert_eq(fg_test_run_cli(NULL, NULL, args), 0, "%s", fg_test_err);
  cr_assert(strstr(fg_test_out, "0 kernels in"), "%s", fg_test_out);

  fill_cache();
  cr_assert_eq(fg_test_run_cli(NULL, NULL, args), 0, "%s", fg_test_err);
  cr_assert(strstr(fg_test_out, "fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm90a") &&
                strstr(fg_test_out, "1 kernel in"),
            "%s", fg_test_out);

  char env[256];
  snprintf(env, sizeof env, "FLASHGEN_CACHE_DIR='%s/c'", cache_dir);
  cr_assert_eq(fg_test_run_cli(NULL, env, "cache stats"), 0, "FLASHGEN_CACHE_DIR is the default: %s", fg_test_err);
  cr_assert(strstr(fg_test_out, "1 entries") && strstr(fg_test_out, "1 buckets"), "%s", fg_test_out);

  cr_assert_eq(fg_test_run_cli(NULL, env, "cache tuning"), 0, "%s", fg_test_err);
  cr_assert(strstr(fg_test_out, "fwd_d128_bf16_causal_nk4096") && strstr(fg_test_out, "300.0") &&
                strstr(fg_test_out, "1 tuning record"),
            "%s", fg_test_out);

  cr_assert_eq(fg_test_run_cli(NULL, env, "cache verify"), 0, "%s%s", fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_out, "all 1 entries ok"), "%s", fg_test_out);

  /* Flip a byte of the cubin behind the library's back: verify reports it and exits 1. */
  char db[256];
  snprintf(db, sizeof db, "%s/c/cache.sqlite", cache_dir);
  sqlite3 *h = NULL;
  if (access(db, F_OK) != 0) { /* the file name is the cache library's business: find it */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls '%s/c' | grep -v -- '-wal$' | grep -v -- '-shm$' | grep -v lock | head -1",
             cache_dir);
    FILE *p = popen(cmd, "r");
    char name[128] = "";
    cr_assert(p && fgets(name, sizeof name, p));
    pclose(p);
    name[strcspn(name, "\n")] = '\0';
    snprintf(db, sizeof db, "%s/c/%s", cache_dir, name);
  }
  cr_assert_eq(sqlite3_open(db, &h), SQLITE_OK, "%s", db);
  char *msg = NULL;
  int rc = sqlite3_exec(h, "UPDATE kernels SET cubin = zeroblob(length(cubin))", NULL, NULL, &msg);
  cr_assert_eq(rc, SQLITE_OK, "%s", msg ? msg : "");
  sqlite3_close(h);
  cr_assert_eq(fg_test_run_cli(NULL, env, "cache verify"), 1, "%s", fg_test_out);
  cr_assert(strstr(fg_test_out, "BAD") && strstr(fg_test_out, "fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm90a"),
            "%s", fg_test_out);

  cr_assert_eq(fg_test_run_cli(NULL, env, "cache clear"), 0, "%s", fg_test_err);
  cr_assert(strstr(fg_test_out, "removed 1 kernel") && strstr(fg_test_out, "1 tuning record"), "%s",
            fg_test_out);
  cr_assert_eq(fg_test_run_cli(NULL, env, "cache ls"), 0);
  cr_assert(strstr(fg_test_out, "0 kernels in"), "%s", fg_test_out);
  cr_assert_eq(fg_test_run_cli(NULL, env, "cache verify"), 0);
}

Test(cli, cache_unusable_dir_fails) {
  cr_assert_eq(fg_test_run_cli(NULL, NULL, "cache --dir /proc/flashgen-cannot-exist ls"), 1);
  cr_assert(strstr(fg_test_err, "cannot use the cache in /proc/flashgen-cannot-exist"), "%s",
            fg_test_err);
}

/* ---- a whole tuning run on the fake driver (tests/fake_cuda/libcuda.c) ------------------- */

static char fake_lib[128];

/* Builds the fake driver (-O2: a whole tuning run computes every fake kernel on the host);
 * skips the test when that or NVRTC is missing. */
static void build_fake_driver(void) {
  char err[1024];
  if (fg_nvrtc_load(err, sizeof err) != 0) cr_skip_test("no NVRTC: %s", err);
  fgt_fake_driver_build(cache_dir, "-O2", fake_lib, sizeof fake_lib);
}

/* A kernel that never finishes (the fake driver's waits block for good once a kernel has been
 * launched): the hang watchdog ends `flashgen check` with exit status 3, naming the last kernel
 * launched, after FLASHGEN_HANG_TIMEOUT seconds; a value that is not a number is refused. */
Test(tune_fake_gpu, a_hung_kernel_stops_check_with_its_name, .init = make_cache_dir,
     .fini = remove_cache_dir, .timeout = 300) {
  build_fake_driver();
  char env[512];
  snprintf(env, sizeof env,
           "FLASHGEN_CUDA_LIBRARY='%s' FLASHGEN_CACHE_DIR='%s/c' FAKE_CUDA_HANG=1 "
           "FLASHGEN_HANG_TIMEOUT=1",
           fake_lib, cache_dir);
  const int rc = fg_test_run_cli(NULL, env, "check --filter seqlen/nq17_nk129_f16_noncausal");
  cr_assert_eq(rc, 3, "exit %d\nstdout:\n%s\nstderr:\n%s", rc, fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_err, "flashgen check: the GPU has not finished after 1 s") &&
                strstr(fg_test_err, "the last kernel launched: fg_") &&
                strstr(fg_test_err, "FLASHGEN_HANG_TIMEOUT"),
            "%s", fg_test_err);
  snprintf(env, sizeof env, "FLASHGEN_CUDA_LIBRARY='%s' FLASHGEN_CACHE_DIR='%s/c' "
           "FLASHGEN_HANG_TIMEOUT=soon", fake_lib, cache_dir);
  FG_EXPECT_CLI_ERR(NULL, env, "check --filter seqlen/nq17_nk129_f16_noncausal", 2,
                    "FLASHGEN_HANG_TIMEOUT='soon' is not a number");
}

/* A backward case whose gradients are not finite (the fake driver records the backward's launches
 * but leaves its outputs poisoned) names the first non-finite index of each and says whether the
 * forward's O and LSE, the backward's other inputs, were finite: here they were (the forward ran),
 * so the failure is the backward's; how many elements still hold the poison (all: the gradients
 * were never written); and that the same call, run again after a device synchronisation, fails
 * the same way (the fake backward writes nothing either time). */
Test(tune_fake_gpu, a_nonfinite_backward_case_tells_the_forward_from_the_backward,
     .init = make_cache_dir, .fini = remove_cache_dir, .timeout = 300) {
  build_fake_driver();
  char env[512];
  snprintf(env, sizeof env,
           "FLASHGEN_CUDA_LIBRARY='%s' FLASHGEN_CACHE_DIR='%s/c' FAKE_CUDA_BACKWARD_RECORD_ONLY=1",
           fake_lib, cache_dir);
  const int rc = fg_test_run_cli(NULL, env, "check -j 2 --filter bwd/seqlen/d64_nq1_nk17_noncausal");
  cr_assert_eq(rc, 1, "exit %d\nstdout:\n%s\nstderr:\n%s", rc, fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_out, "FAIL") && strstr(fg_test_out, "dQ[0] = nan is not finite") &&
                strstr(fg_test_out, "first non-finite dQ/dK/dV index 0/0/0") &&
                strstr(fg_test_out, "non-finite dQ 128 of 128 (128 poison), dK 2176 of 2176 (2176 poison)") &&
                strstr(fg_test_out, "the forward's O: all 128 finite; its LSE: all 2 finite or -inf; "
                                    "Q, K, V, dO read back as uploaded") &&
                strstr(fg_test_out, "the same call again after a device synchronisation: "
                                    "non-finite dQ 128 of 128 (128 poison), dK 2176 of 2176 "
                                    "(2176 poison), dV 2176 of 2176 (2176 poison)"),
            "%s", fg_test_out);
}

/* A backward call that writes over one of its inputs (the fake driver's backward puts a NaN in
 * dO's first element): the failure says which input no longer holds what was uploaded, where,
 * and what it holds. */
Test(tune_fake_gpu, a_nonfinite_backward_case_tells_a_clobbered_input,
     .init = make_cache_dir, .fini = remove_cache_dir, .timeout = 300) {
  build_fake_driver();
  char env[512];
  snprintf(env, sizeof env,
           "FLASHGEN_CUDA_LIBRARY='%s' FLASHGEN_CACHE_DIR='%s/c' FAKE_CUDA_BACKWARD_RECORD_ONLY=1 "
           "FAKE_CUDA_BACKWARD_CLOBBER_DO=1",
           fake_lib, cache_dir);
  const int rc = fg_test_run_cli(NULL, env, "check -j 2 --filter bwd/seqlen/d64_nq1_nk17_noncausal");
  cr_assert_eq(rc, 1, "exit %d\nstdout:\n%s\nstderr:\n%s", rc, fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_out, "Q, K, V, dO read back: dO: 1 of 128 elements differ from the "
                                "upload (dO[0] = 0x7fc0, uploaded 0x"),
            "%s", fg_test_out);
}

/* The lines of the fake driver's log (FAKE_CUDA_LOG) from the first forward launch on: whether a
 * device synchronisation comes between it and the first backward launch after it. */
static int synced_between_forward_and_backward(const char *log_path) {
  FILE *f = fopen(log_path, "r");
  cr_assert_not_null(f, "no log at %s", log_path);
  char line[512];
  int seen_fwd = 0, synced = 0, found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    if (!strncmp(line, "launch fg_fwd_", 14)) seen_fwd = 1, synced = 0;
    else if (seen_fwd && !strncmp(line, "ctx_sync", 8)) synced = 1;
    else if (seen_fwd && !strncmp(line, "launch fg_bwd_", 14)) found = 1;
  }
  fclose(f);
  cr_assert(found, "no forward launch followed by a backward one in %s", log_path);
  return synced;
}

/* `check --sync`: in a backward case the GPU is waited for between the forward call that makes O
 * and LSE and the backward call (the fake driver logs launches and device synchronisations);
 * without it, nothing waits there; the case passes either way. */
Test(tune_fake_gpu, check_sync_waits_between_the_forward_and_the_backward,
     .init = make_cache_dir, .fini = remove_cache_dir, .timeout = 300) {
  build_fake_driver();
  for (int sync = 0; sync <= 1; sync++) {
    char env[768], log_path[160], args[160];
    snprintf(log_path, sizeof log_path, "%s/fake%d.log", cache_dir, sync);
    snprintf(env, sizeof env, "FLASHGEN_CUDA_LIBRARY='%s' FLASHGEN_CACHE_DIR='%s/c' FAKE_CUDA_LOG='%s'",
             fake_lib, cache_dir, log_path);
    snprintf(args, sizeof args, "check -j 2%s --filter bwd/seqlen/d64_nq17_nk129_noncausal",
             sync ? " --sync" : "");
    const int rc = fg_test_run_cli(NULL, env, args);
    cr_assert_eq(rc, 0, "%s: exit %d\nstdout:\n%s\nstderr:\n%s", args, rc, fg_test_out, fg_test_err);
    cr_assert(strstr(fg_test_out, "1 passed, 0 failed"), "%s", fg_test_out);
    cr_assert_eq(synced_between_forward_and_backward(log_path), sync, "%s", args);
  }
}

Test(tune_fake_gpu, tunes_records_and_skips_what_is_recorded, .init = make_cache_dir,
     .fini = remove_cache_dir, .timeout = 600) {
  build_fake_driver();
  char env[512], args[512];
  snprintf(env, sizeof env, "FLASHGEN_CUDA_LIBRARY='%s' FLASHGEN_CACHE_DIR='%s/c'", fake_lib,
           cache_dir);
  snprintf(args, sizeof args,
           "tune -j 4 --seed 42 --report '%s/report.md' d=64,n=128,batch=1,heads=1,causal=1 "
           "d=64,n=600,batch=1,heads=1,causal=1 d=64,n=100,batch=1,heads=1,causal=1",
           cache_dir);
  cr_assert_eq(fg_test_run_cli(NULL, env, args), 0, "stdout:\n%s\nstderr:\n%s", fg_test_out, fg_test_err);
  cr_assert(strstr(fg_test_err, "candidates fit; pruned"), "pruning reported: %s", fg_test_err);
  cr_assert(strstr(fg_test_err, "compiled, 0 failed"), "progress reported: %s", fg_test_err);
  cr_assert(strstr(fg_test_out, "d=64 bf16 causal N=128") && strstr(fg_test_out, "d=64 bf16 causal N=600"),
            "%s", fg_test_out);
  cr_assert(strstr(fg_test_out, "total tune time"), "%s", fg_test_out);
  cr_assert_null(strstr(fg_test_out, " *"), "nothing was recorded before: %s", fg_test_out);

  /* The records: planted faults rejected with their reason, slow ones stopped early, the
   * winner correct. */
  char dbdir[128], warn[512] = "";
  snprintf(dbdir, sizeof dbdir, "%s/c", cache_dir);
  fg_cache *c = fg_cache_open(dbdir, warn, sizeof warn);
  cr_assert(c, "%s", warn);
  fg_device_id dev;
  memset(&dev, 0, sizeof dev);
  snprintf(dev.name, sizeof dev.name, "Fake H100 (flashgen test driver)");
  dev.cc_major = 9;
  dev.sm_count = 132;
  dev.driver_version = 13000;
  const char *buckets[] = {"fwd_d64_bf16_causal_nk512", "fwd_d64_bf16_causal_nk1024"};
  char first_wrong[FG_VARIANT_NAME_MAX] = "", first_reason[512] = "";
  for (int b = 0; b < 2; b++) {
    fg_tune_candidate *cands = NULL;
    int n = 0;
    char winner[FG_VARIANT_NAME_MAX];
    cr_assert_eq(fg_cache_get_tuning(c, &dev, buckets[b], &cands, &n, winner, sizeof winner), 1,
                 "no record of %s", buckets[b]);
    cr_assert_gt(n, 4);
    /* The winner is any correct candidate that is not slowed: the fake driver times its CPU
     * reference by the wall clock, so under a loaded sanitizer build a qtma candidate may beat
     * the qouter ones (CI saw fwd_d64_br192_bc64_bf16_causal_qtma_w12_s2_sm90a win). */
    cr_assert(winner[0] && !strstr(winner, "kvouter") && !strstr(winner, "br128_bc128") &&
                  !strstr(winner, "_w8_"),
              "%s: winner %s", buckets[b], winner);
    int kv = 0, wrong = 0, slower = 0, w8 = 0;
    for (int i = 0; i < n; i++) {
      const fg_tune_candidate *k = &cands[i];
      if (strstr(k->variant, "kvouter")) {
        kv++;
        cr_assert(!k->ok && strstr(k->reason, "not finite"), "%s: %s", k->variant, k->reason);
      } else if (strstr(k->variant, "br128_bc128")) {
        wrong++;
        cr_assert(!k->ok && strstr(k->reason, "max|O - ref|") && strstr(k->reason, "seed"), "%s: %s",
                  k->variant, k->reason);
        /* Checked once per triple: the second bucket rejects it with the first one's verdict
         * (a new check would name its own seed and N). */
        if (b == 0 && !first_wrong[0]) {
          snprintf(first_wrong, sizeof first_wrong, "%s", k->variant);
          snprintf(first_reason, sizeof first_reason, "%s", k->reason);
        } else if (b == 1 && strcmp(k->variant, first_wrong) == 0) {
          cr_assert_str_eq(k->reason, first_reason, "%s checked again", k->variant);
        }
      } else if (strstr(k->variant, "qtma") && strstr(k->reason, "spills registers")) {
        /* a TMA candidate past its registers (causal at Bc 128): dropped after compiling */
        cr_assert(!k->ok, "%s: %s", k->variant, k->reason);
      } else {
        cr_assert(k->ok && k->ms > 0 && k->tflops > 0, "%s: %s", k->variant, k->reason);
        if (strstr(k->variant, "_w8_")) slower += strstr(k->reason, "slower") != NULL, w8++;
      }
      if (strcmp(k->variant, winner) == 0) cr_assert(k->ok && !k->reason[0]);
    }
    cr_assert_gt(kv + wrong, 0, "the planted faults are among the candidates");
    if (b == 0) {
      cr_assert_gt(slower, 0, "%s: the 5x slower variants were stopped early", buckets[b]);
    } else {
      /* They lost by 5x at the previous bucket: not timed (nor recorded) at this one. */
      cr_assert_eq(w8, 0, "%s: %d losers of the previous bucket were timed again", buckets[b], w8);
    }
    free(cands);
  }
  fg_cache_close(c);

  char path[256];
  snprintf(path, sizeof path, "%s/report.md", cache_dir);
  static char md[65536];
  fg_test_slurp(path, md, sizeof md);
  cr_assert(strstr(md, "| problem |") && strstr(md, "| d=64 bf16 causal N=600 | 1x1 | `fwd_d64_"),
            "%s", md);

  /* A second run finds everything recorded: nothing compiled, nothing measured. */
  cr_assert_eq(fg_test_run_cli(NULL, env, "tune -q d=64,n=128,batch=1,heads=1,causal=1"), 0, "%s", fg_test_err);
  cr_assert(strstr(fg_test_out, "_sm90a *") && strstr(fg_test_out, "kernels: 0 "), "%s", fg_test_out);
  cr_assert_eq(fg_test_err[0], '\0', "--quiet: %s", fg_test_err);

  cr_assert_eq(fg_test_run_cli(NULL, env, "cache verify"), 0, "%s", fg_test_out);
}
