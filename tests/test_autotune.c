/* test_autotune.c: the parts of tuning that need no GPU: the problem syntax (with the pass) and
 * problem files, the default set (forward and backward), the TFLOP/s formula, the median, the L2
 * rotation count, the forward and backward candidates on H100 / A100 / RTX 4090 limits, the
 * backward's problem key, the correctness gate (forward and backward) and its never-zero random
 * fill on host arrays. The commands that tune, check and explain are test_tune_cli.c's. */
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
#include "fg_jit.h"
#include "support_plan.h"

/* ---- problems ---------------------------------------------------------------------------- */

static fg_tune_problem parse_ok(const char *s) {
  fg_tune_problem p;
  char err[512] = "";
  cr_assert_eq(fg_tune_problem_parse(s, &p, err, sizeof err), 0, "'%s' rejected: %s", s, err);
  return p;
}

static void parse_bad(const char *s, const char *expect) {
  fg_tune_problem p;
  char err[512] = "";
  cr_assert_eq(fg_tune_problem_parse(s, &p, err, sizeof err), -1, "'%s' accepted", s);
  cr_assert(strstr(err, expect), "'%s': message '%s' lacks '%s'", s, err, expect);
}

Test(problems, parses_full_syntax) {
  fg_tune_problem p = parse_ok("d=128,dtype=bf16,causal=1,n=4096");
  cr_assert_eq(p.d, 128);
  cr_assert_eq(p.dtype, FG_DTYPE_BF16);
  cr_assert_eq(p.causal, 1);
  cr_assert_eq(p.n, 4096);
  cr_assert_eq(p.batch, 4, "B*N = 16384: batch %lld", (long long)p.batch);
  cr_assert_eq(p.heads, 16, "hidden 2048: heads %lld", (long long)p.heads);
}

Test(problems, defaults_and_suffixes) {
  fg_tune_problem p = parse_ok("d=64,n=16k");
  cr_assert_eq(p.dtype, FG_DTYPE_BF16);
  cr_assert_eq(p.causal, 0);
  cr_assert_eq(p.n, 16384);
  cr_assert_eq(p.batch, 1);
  cr_assert_eq(p.heads, 32);
  p = parse_ok(" d = 96 , dtype=f16, causal=yes , n=1000,batch=3,heads=7 ");
  cr_assert_eq(p.d, 96);
  cr_assert_eq(p.dtype, FG_DTYPE_F16);
  cr_assert_eq(p.causal, 1);
  cr_assert_eq(p.n, 1000);
  cr_assert_eq(p.batch, 3);
  cr_assert_eq(p.heads, 7);
  p = parse_ok("d=128,n=32768,causal=false,pass=fwd");
  cr_assert_eq(p.batch, 1, "more than 16384 tokens per sequence still has one sequence");
  cr_assert_eq(p.causal, 0);
}

Test(problems, rejects_bad_input_with_messages) {
  parse_bad("", "empty problem");
  parse_bad("d=128", "n= missing");
  parse_bad("n=4096", "d= missing");
  parse_bad("d=12,n=4k", "multiple of 8 from 32 to 256");
  parse_bad("d=264,n=4k", "multiple of 8 from 32 to 256");
  parse_bad("d=128,n=4k,dtype=fp32", "dtype=fp32: expected f16 or bf16");
  parse_bad("d=128,n=4k,foo=1", "unknown key 'foo'");
  parse_bad("d=128,n=0", "n=0: sequence length");
  parse_bad("d=128,n=-5", "sequence length");
  parse_bad("d=128,n=4x", "n=4x");
  parse_bad("d=128,n=4k,causal=2", "causal=2: expected 0 or 1");
  parse_bad("d=128,d=64,n=1", "d given twice");
  parse_bad("d128,n=4", "'d128' is not key=value");
  parse_bad("d=128,n=4k,pass=sideways", "pass=sideways: expected fwd or bwd");
  parse_bad("d=128,n=4k,bwd=2", "bwd=2: expected 0 or 1");
  parse_bad("d=128,n=4k,pass=bwd,bwd=1", "pass given twice");
  parse_bad("d=128,n=4k,batch=0", "batch=0");
  parse_bad("d=256,n=1048576,batch=65536,heads=65536", "at most 2^31");
}

Test(problems, format_round_trips) {
  fg_tune_problem p = parse_ok("d=128,dtype=f16,causal=1,n=2048,batch=8,heads=16"), q;
  char buf[256], err[256];
  fg_tune_problem_format(&p, buf, sizeof buf);
  cr_assert_str_eq(buf, "d=128,dtype=f16,causal=1,n=2048,batch=8,heads=16");
  cr_assert_eq(fg_tune_problem_parse(buf, &q, err, sizeof err), 0, "%s", err);
  /* Field by field: the struct has padding, whose bytes memcmp would compare too. */
  cr_assert_eq(p.d, q.d);
  cr_assert_eq(p.dtype, q.dtype);
  cr_assert_eq(p.causal, q.causal);
  cr_assert_eq(p.batch, q.batch);
  cr_assert_eq(p.heads, q.heads);
  cr_assert_eq(p.n, q.n);
}

Test(problems, parses_the_pass) {
  fg_tune_problem p = parse_ok("d=128,n=4k,causal=1");
  cr_assert_eq(p.pass, FG_PASS_FWD, "forward by default");
  p = parse_ok("d=128,n=4k,causal=1,pass=bwd");
  cr_assert_eq(p.pass, FG_PASS_BWD);
  cr_assert_eq(p.d, 128);
  cr_assert_eq(p.n, 4096);
  cr_assert_eq(p.batch, 4, "the same default shape as the forward");
  cr_assert_eq(p.heads, 16);
  cr_assert_eq(parse_ok("bwd=1,d=64,n=1k").pass, FG_PASS_BWD, "bwd=1 is pass=bwd");
  cr_assert_eq(parse_ok("d=64,n=1k,bwd=yes").pass, FG_PASS_BWD);
  cr_assert_eq(parse_ok("d=64,n=1k,bwd=0").pass, FG_PASS_FWD);
  cr_assert_eq(parse_ok("d=64,n=1k,pass=backward").pass, FG_PASS_BWD);
  cr_assert_eq(parse_ok("d=64,n=1k,pass=fwd").pass, FG_PASS_FWD);

  /* The format says pass=bwd for a backward problem and reads back the same. */
  char buf[256], err[256];
  fg_tune_problem q;
  p = parse_ok("d=64,dtype=f16,n=2k,bwd=1");
  fg_tune_problem_format(&p, buf, sizeof buf);
  cr_assert_str_eq(buf, "d=64,dtype=f16,causal=0,n=2048,batch=8,heads=32,pass=bwd");
  cr_assert_eq(fg_tune_problem_parse(buf, &q, err, sizeof err), 0, "%s", err);
  cr_assert_eq(q.pass, FG_PASS_BWD);
  cr_assert_eq(q.n, 2048);
  cr_assert_eq(q.dtype, FG_DTYPE_F16);
}

Test(problems, backward_key) {
  char k[64], pre[64];
  fg_problem pr = fg_problem_make(FG_PASS_BWD, 128, FG_DTYPE_BF16, 1, 4096);
  fg_problem_format(&pr, k, sizeof k);
  cr_assert_str_eq(k, "bwd_d128_bf16_causal_nk4096");
  pr.pass = FG_PASS_FWD;
  fg_problem_format(&pr, k, sizeof k);
  cr_assert_str_eq(k, "fwd_d128_bf16_causal_nk4096", "the forward's keys are unchanged");
  pr = fg_problem_make(FG_PASS_BWD, 64, FG_DTYPE_F16, 0, 1);
  fg_problem_prefix(&pr, pre, sizeof pre);
  cr_assert_str_eq(pre, "bwd_d64_f16_noncausal_nk");
  cr_assert_eq(fg_problem_key_bucket("bwd_d64_f16_noncausal_nk1024", pre), 1024);
  cr_assert_eq(fg_problem_key_bucket("fwd_d64_f16_noncausal_nk1024", pre), -1,
               "a forward record is no backward bucket");
  /* What a tuning run names the records of a backward problem. */
  fg_tune_problem p = parse_ok("d=128,n=3000,causal=1,pass=bwd");
  pr = fg_tune_problem_key(&p);
  cr_assert_eq(pr.pass, FG_PASS_BWD);
  cr_assert_eq(pr.d, 128);
  cr_assert_eq(pr.causal, 1);
  cr_assert_eq(pr.nk, 4096, "n = 3000 falls in the 4096 bucket");
  fg_problem_format(&pr, k, sizeof k);
  cr_assert_str_eq(k, "bwd_d128_bf16_causal_nk4096");
}

static char *write_tmp(const char *text) {
  static char path[64];
  strcpy(path, "/tmp/fg_test_problems_XXXXXX");
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs(text, f);
  fclose(f);
  return path;
}

Test(problems, reads_files) {
  fg_tune_problem p[8];
  char err[512] = "";
  char *path = write_tmp("# the problems\n\nd=64,n=512   # short\n  d=128,dtype=f16,causal=1,n=8k\n"
                         "d=128,n=8k,pass=bwd\n");
  int n = fg_tune_problems_read(path, p, 8, err, sizeof err);
  cr_assert_eq(n, 3, "read %d: %s", n, err);
  cr_assert_eq(p[0].d, 64);
  cr_assert_eq(p[0].n, 512);
  cr_assert_eq(p[1].n, 8192);
  cr_assert_eq(p[1].dtype, FG_DTYPE_F16);
  cr_assert_eq(p[1].pass, FG_PASS_FWD);
  cr_assert_eq(p[2].pass, FG_PASS_BWD);
  unlink(path);

  path = write_tmp("d=64,n=512\n# fine\nd=64,n=512,dtype=f32\n");
  cr_assert_eq(fg_tune_problems_read(path, p, 8, err, sizeof err), -1);
  char expect[128];
  snprintf(expect, sizeof expect, "%s:3: ", path);
  cr_assert(strstr(err, expect) && strstr(err, "expected f16 or bf16"), "message: %s", err);
  unlink(path);

  path = write_tmp("# nothing\n\n");
  cr_assert_eq(fg_tune_problems_read(path, p, 8, err, sizeof err), -1);
  cr_assert(strstr(err, "no problems"), "message: %s", err);
  unlink(path);

  cr_assert_eq(fg_tune_problems_read("/nonexistent/problems.txt", p, 8, err, sizeof err), -1);
  cr_assert(strstr(err, "/nonexistent/problems.txt: cannot open"), "message: %s", err);
}

Test(problems, default_set) {
  fg_tune_problem p[128];
  int n = fg_tune_default_problems(0, p, 128);
  cr_assert_eq(n, FG_TUNE_DEFAULT_FWD + FG_TUNE_DEFAULT_BWD);
  cr_assert_eq(n, 64);
  int count[2][2][2][2] = {{{{0}}}}; /* [pass][d == 128][bf16][causal] */
  for (int i = 0; i < n; i++) {
    cr_assert(p[i].d == 64 || p[i].d == 128);
    cr_assert(p[i].dtype == FG_DTYPE_F16 || p[i].dtype == FG_DTYPE_BF16);
    cr_assert(p[i].pass == FG_PASS_FWD || p[i].pass == FG_PASS_BWD);
    cr_assert(i < FG_TUNE_DEFAULT_FWD ? p[i].pass == FG_PASS_FWD : p[i].pass == FG_PASS_BWD,
              "problem %d: the forward problems come first", i);
    cr_assert_eq(p[i].batch * p[i].n, FG_TUNE_TOKENS, "problem %d: B*N", i);
    cr_assert_eq(p[i].heads * p[i].d, FG_TUNE_HIDDEN, "problem %d: H*d", i);
    cr_assert(p[i].n >= 512 && p[i].n <= 16384 && (p[i].n & (p[i].n - 1)) == 0);
    if (p[i].pass == FG_PASS_BWD)
      cr_assert(p[i].n == 1024 || p[i].n == 4096, "backward N = %lld",
                (long long)p[i].n);
    count[p[i].pass][p[i].d == 128][p[i].dtype == FG_DTYPE_BF16][p[i].causal]++;
    for (int j = 0; j < i; j++)
      cr_assert(!(p[i].pass == p[j].pass && p[i].d == p[j].d && p[i].dtype == p[j].dtype &&
                  p[i].causal == p[j].causal && p[i].batch == p[j].batch &&
                  p[i].heads == p[j].heads && p[i].n == p[j].n),
                "problems %d and %d are the same", i, j);
  }
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 2; b++)
      for (int c = 0; c < 2; c++) {
        cr_assert_eq(count[FG_PASS_FWD][a][b][c], 6, "forward: 6 sequence lengths each");
        cr_assert_eq(count[FG_PASS_BWD][a][b][c], 2, "backward: 2 sequence lengths each");
      }

  n = fg_tune_default_problems(1, p, 128);
  cr_assert_eq(n, 12);
  int bwd = 0;
  for (int i = 0; i < n; i++) {
    cr_assert_eq(p[i].dtype, FG_DTYPE_BF16);
    if (p[i].pass == FG_PASS_BWD) {
      bwd++;
      cr_assert_eq(p[i].n, 4096);
    } else {
      cr_assert(p[i].n == 1024 || p[i].n == 4096);
    }
  }
  cr_assert_eq(bwd, 4, "quick: backward d 64 and 128, causal or not, at 4k");
  cr_assert_eq(fg_tune_default_problems(0, p, 5), 5, "the cap is respected");
}

/* ---- arithmetic -------------------------------------------------------------------------- */

Test(arith, tflops_formula) {
  fg_tune_problem p = {128, FG_DTYPE_BF16, 0, 4, 16, 4096, FG_PASS_FWD};
  const double flops = 4.0 * 4 * 16 * 4096.0 * 4096.0 * 128;
  cr_assert_float_eq(fg_tune_flops(&p), flops, 1);
  cr_assert_float_eq(fg_tune_tflops(&p, 1.0), flops / 1e9, 1e-9, "1 ms");
  cr_assert_float_eq(fg_tune_tflops(&p, 2.0), flops / 2e9, 1e-9);
  p.causal = 1;
  cr_assert_float_eq(fg_tune_flops(&p), flops / 2, 1, "causal halves the count");
  cr_assert_float_eq(fg_tune_tflops(&p, 1.0), flops / 2e9, 1e-9);
  cr_assert_eq(fg_tune_tflops(&p, 0), 0.0);
  p.pass = FG_PASS_BWD;
  cr_assert_float_eq(fg_tune_flops(&p), 2.5 * flops / 2, 1, "backward: 2.5 x the forward");
  cr_assert_float_eq(fg_tune_tflops(&p, 2.0), 2.5 * flops / 4e9, 1e-9);
  p.causal = 0;
  cr_assert_float_eq(fg_tune_flops(&p), 2.5 * flops, 1);
}

Test(arith, median) {
  double odd[] = {5, 1, 4, 2, 3};
  cr_assert_eq(fg_tune_median(odd, 5), 3.0);
  cr_assert_eq(odd[0], 5.0, "the input is not reordered");
  double even[] = {10, 1, 3, 7};
  cr_assert_eq(fg_tune_median(even, 4), 5.0);
  double one[] = {2.5};
  cr_assert_eq(fg_tune_median(one, 1), 2.5);
  cr_assert(isnan(fg_tune_median(one, 0)));
  double many[101];
  for (int i = 0; i < 101; i++) many[i] = (double)((i * 37) % 101); /* a permutation of 0..100 */
  cr_assert_eq(fg_tune_median(many, 101), 50.0);
}

Test(arith, runoff_finalists) {
  /* ms of 7 candidates; 3 and 5 are not eligible (failed, or stopped early). */
  const double ms[] = {1.00, 1.02, 1.10, 0.50, 1.025, 0.90, 1.01};
  const int ok[] = {1, 1, 1, 0, 1, 0, 1};
  int out[4];
  /* The best eligible is 1.00: within 3% are 0 (1.00), 1 (1.02), 4 (1.025), 6 (1.01). */
  cr_assert_eq(fg_tune_finalists(ms, ok, 7, 1.03, 4, out), 4);
  cr_assert(out[0] == 0 && out[1] == 1 && out[2] == 4 && out[3] == 6, "%d %d %d %d", out[0],
            out[1], out[2], out[3]);
  /* At most 2: the two fastest (0 and 6), in index order. */
  cr_assert_eq(fg_tune_finalists(ms, ok, 7, 1.03, 2, out), 2);
  cr_assert(out[0] == 0 && out[1] == 6, "%d %d", out[0], out[1]);
  /* Within 1.5%: 0, 6; a lone best has no runoff partner but is still returned. */
  cr_assert_eq(fg_tune_finalists(ms, ok, 7, 1.015, 4, out), 2);
  const int only[] = {0, 0, 1, 0, 0, 0, 0};
  cr_assert_eq(fg_tune_finalists(ms, only, 7, 1.03, 4, out), 1);
  cr_assert_eq(out[0], 2);
  const int none[7] = {0};
  cr_assert_eq(fg_tune_finalists(ms, none, 7, 1.03, 4, out), 0);
}

Test(arith, winner_hysteresis) {
  const double ms[] = {1.00, 1.02, 1.05, 0.50};
  const int ok[] = {1, 1, 1, 0};
  cr_assert_eq(fg_tune_pick_winner(ms, ok, 4, -1, 1.03), 0, "no previous winner: the fastest");
  cr_assert_eq(fg_tune_pick_winner(ms, ok, 4, 1, 1.03), 1, "2% behind: the previous winner stays");
  cr_assert_eq(fg_tune_pick_winner(ms, ok, 4, 2, 1.03), 0, "5% behind: it is replaced");
  cr_assert_eq(fg_tune_pick_winner(ms, ok, 4, 3, 1.03), 0, "an ineligible one never wins");
  cr_assert_eq(fg_tune_pick_winner(ms, ok, 4, 1, 1.0), 0, "no margin: the fastest");
  const int none[4] = {0};
  cr_assert_eq(fg_tune_pick_winner(ms, none, 4, 1, 1.03), -1);
}

Test(arith, rotation_sets) {
  const size_t l2 = 50u << 20, mib = 1u << 20;
  cr_assert_eq(fg_tune_rotation_sets(256 * mib, l2), 1, "one set already exceeds 2 x L2");
  cr_assert_eq(fg_tune_rotation_sets(30 * mib, l2), 4, "4 x 30 MiB > 100 MiB > 3 x 30 MiB");
  cr_assert_eq(fg_tune_rotation_sets(50 * mib, l2), 3, "exactly 2 x L2 is not more than it");
  cr_assert_eq(fg_tune_rotation_sets(1 * mib, l2), 8, "at most 8 sets");
  cr_assert_eq(fg_tune_rotation_sets(0, l2), 1);
  for (size_t b = 1 * mib; b < 300 * mib; b += 7 * mib) {
    int s = fg_tune_rotation_sets(b, l2);
    cr_assert(s >= 1 && s <= 8);
    if (s < 8) cr_assert(s * b > 2 * l2 && (s == 1 || (s - 1) * b <= 2 * l2), "b=%zu s=%d", b, s);
  }
}

/* ---- candidates -------------------------------------------------------------------------- */

static fg_generator *gen(void) {
  fg_generator *g;
  char err[2048];
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "%s", err);
  return g;
}

static int total_pruned(const fg_prune_counts *p) { return p->smem + p->regs + p->threads + p->rules; }

/* n + pruned for a device, and the checks that need no grid knowledge. */
static int check_device(fg_generator *g, const fg_device_limits *lim, fg_arch arch, int d,
                        fg_dtype dt, int causal, fg_prune_counts *pc_out) {
  fg_variant v[256];
  fg_prune_counts pc = {-1, -1, -1, -1};
  const fg_problem p = {FG_PASS_FWD, d, dt, causal, 0, 0};
  int n = fg_candidates(g, &p, arch, lim, v, 256, &pc);
  cr_assert_gt(n, 0, "%s d=%d: no candidates", lim->name, d);
  cr_assert_lt(n, 256, "the cap was reached: counts would be inconsistent");
  cr_assert(pc.smem >= 0 && pc.regs >= 0 && pc.threads >= 0 && pc.rules >= 0);
  fg_variant seed = fg_seed_rule_variant(g, &p, arch, lim);
  cr_assert_eq(memcmp(&v[0], &seed, sizeof seed), 0, "%s d=%d: the seed-rule candidate is first",
               lim->name, d);
  char why[256];
  for (int i = 0; i < n; i++) {
    char name[FG_VARIANT_NAME_MAX], err[256];
    fg_variant_name(&v[i], name, sizeof name);
    cr_assert_eq(fg_variant_fits(g, &v[i], lim, why, sizeof why), 1, "%s on %s: %s", name,
                 lim->name, why);
    cr_assert_eq(fg_variant_check(&v[i], err, sizeof err), 0, "%s: %s", name, err);
    cr_assert_eq(v[i].d, d);
    cr_assert_eq(v[i].dtype, dt);
    cr_assert_eq(v[i].causal, causal);
    cr_assert_eq(v[i].arch, arch);
    for (int j = 0; j < i; j++)
      cr_assert(memcmp(&v[i], &v[j], sizeof v[i]) != 0, "%s listed twice", name);
  }
  /* Fewer candidates with a smaller cap tells nothing about pruning: the count is the cap. */
  fg_variant few[2];
  fg_prune_counts pc2;
  cr_assert_eq(fg_candidates(g, &p, arch, lim, few, 2, &pc2), 2);
  *pc_out = pc;
  return n;
}

Test(candidates, h100_a100_4090, .timeout = 120) {
  fg_generator *g = gen();
  /* Limits no variant exceeds: only the rules prune. The grid is the same on every device, so
   * candidates + pruned is the same everywhere, give or take the seed-rule candidate (added
   * when it is not one of the grid's points). */
  fg_device_limits big = fg_limits_h100;
  big.name = "unlimited";
  big.smem_optin_per_block = big.smem_per_sm = 1 << 30;
  big.regs_per_sm = 1 << 30;
  big.max_threads_per_block = 1 << 20;
  const struct {
    const fg_device_limits *lim;
    fg_arch arch;
  } devs[] = {{&fg_limits_h100, FG_ARCH_SM90A}, {&fg_limits_a100, FG_ARCH_SM80},
              {&fg_limits_rtx4090, FG_ARCH_SM89}};
  for (int d = 64; d <= 128; d += 64)
    for (int causal = 0; causal <= 1; causal++) {
      int smem[3];
      for (int i = 0; i < 3; i++) {
        /* The unlimited device of the same arch (the wgmma loop orders' rule is the arch's).
         * What still prunes there does not depend on the device: the rules, and the per-thread
         * register cap (255, counted under registers). */
        fg_prune_counts pb;
        int nb = check_device(g, &big, devs[i].arch, d, FG_DTYPE_BF16, causal, &pb);
        cr_assert_eq(pb.smem + pb.threads, 0, "unlimited device: shared memory or threads prune");
        const int total = nb + total_pruned(&pb);
        fg_prune_counts pc;
        int n = check_device(g, devs[i].lim, devs[i].arch, d, FG_DTYPE_BF16, causal, &pc);
        const int sum = n + total_pruned(&pc);
        cr_assert(sum >= total - 1 && sum <= total + 1,
                  "%s d=%d causal=%d: %d candidates + %d pruned != %d enumerated (+-1 seed)",
                  devs[i].lim->name, d, causal, n, total_pruned(&pc), total);
        cr_assert_eq(pc.rules, pb.rules, "%s: the rules do not depend on the device",
                     devs[i].lim->name);
        cr_assert_leq(pc.regs, pb.regs + pc.smem, "%s: registers prune only what the unlimited "
                      "device loses to them, unless shared memory pruned it first",
                      devs[i].lim->name);
        cr_assert_geq(pc.regs + pc.smem, pb.regs, "%s: the per-thread register cap prunes "
                      "everywhere", devs[i].lim->name);
        smem[i] = pc.smem;
        printf("%s d=%d %s: %d candidates, pruned %d smem %d regs %d threads %d rules\n",
               devs[i].lim->name, d, causal ? "causal" : "noncausal", n, pc.smem, pc.regs,
               pc.threads, pc.rules);
      }
      cr_assert(smem[0] <= smem[1] && smem[1] <= smem[2],
                "less shared memory prunes more: H100 %d, A100 %d, 4090 %d", smem[0], smem[1],
                smem[2]);
    }
  /* d = 128 on the 4090's 99 KB must lose something to shared memory. */
  fg_variant v[256];
  fg_prune_counts pc;
  fg_candidates(g, &(fg_problem){FG_PASS_FWD, 128, FG_DTYPE_F16, 0, 0, 0}, FG_ARCH_SM89,
                &fg_limits_rtx4090, v, 256, &pc);
  cr_assert_gt(pc.smem, 0, "RTX 4090 d=128: nothing pruned by shared memory");
  fg_generator_destroy(g);
}

/* The backward candidates of (d, dtype, causal) on a device: checks that hold everywhere;
 * returns the count. */
static int check_bwd_device(fg_generator *g, const fg_device_limits *lim, fg_arch arch, int d,
                            fg_dtype dt, int causal) {
  fg_variant v[64];
  fg_prune_counts pc = {-1, -1, -1, -1};
  const fg_problem p = {FG_PASS_BWD, d, dt, causal, 0, 0};
  const int n = fg_candidates(g, &p, arch, lim, v, 64, &pc);
  cr_assert_gt(n, 0, "%s d=%d: no backward candidates", lim->name, d);
  cr_assert(pc.smem >= 0 && pc.regs >= 0 && pc.threads >= 0 && pc.rules >= 0);
  cr_assert_eq(n + total_pruned(&pc), 108,
               "%s d=%d: 3 loops x 3 Br x 3 Bc x 2 warps x 2 stages = %d + %d",
               lim->name, d, n, total_pruned(&pc));
  const fg_variant builtin = fg_builtin_backward_variant(d, dt, causal, arch);
  fg_variant base = fg_baseline_variant(g, &p, arch, lim);
  cr_assert_eq(memcmp(&base, &builtin, sizeof base), 0, "the backward's baseline is the built-in");
  char why[256];
  if (fg_variant_fits(g, &builtin, lim, why, sizeof why) == 1)
    cr_assert_eq(memcmp(&v[0], &builtin, sizeof builtin), 0,
                 "%s d=%d: the built-in rule's variant is first", lim->name, d);
  for (int i = 0; i < n; i++) {
    char name[FG_VARIANT_NAME_MAX], err[256];
    fg_variant_name(&v[i], name, sizeof name);
    cr_assert_eq(fg_variant_fits(g, &v[i], lim, why, sizeof why), 1, "%s on %s: %s", name,
                 lim->name, why);
    cr_assert_eq(fg_variant_check(&v[i], err, sizeof err), 0, "%s: %s", name, err);
    cr_assert_eq(v[i].pass, FG_PASS_BWD, "%s", name);
    /* kv_wgmma and kv_tma only on sm_90a, and there at d = 64 and 128 (bwd.lua) */
    const int wgmma = arch == FG_ARCH_SM90A && (d == 64 || d == 128);
    cr_assert(v[i].loop == FG_LOOP_KV_OUTER ||
                  (wgmma && (v[i].loop == FG_LOOP_KV_WGMMA || v[i].loop == FG_LOOP_KV_TMA)),
              "%s", name);
    cr_assert(strncmp(name, "bwd_", 4) == 0 &&
                  (strstr(name, "_kvouter_") ||
                   (wgmma && (strstr(name, "_kvwgmma_") || strstr(name, "_kvtma_")))),
              "%s", name);
    cr_assert(v[i].br == 32 || v[i].br == 64 || v[i].br == 128, "%s", name);
    cr_assert(v[i].bc == 32 || v[i].bc == 64 || v[i].bc == 128, "%s", name);
    cr_assert(v[i].warps == 4 || v[i].warps == 8, "%s", name);
    cr_assert(v[i].stages == 1 || v[i].stages == 2, "%s", name);
    cr_assert_eq(v[i].d, d);
    cr_assert_eq(v[i].dtype, dt);
    cr_assert_eq(v[i].causal, causal);
    cr_assert_eq(v[i].arch, arch);
    for (int j = 0; j < i; j++)
      cr_assert(memcmp(&v[i], &v[j], sizeof v[i]) != 0, "%s listed twice", name);
  }
  printf("bwd %s d=%d %s: %d candidates, pruned %d smem %d regs %d threads %d rules\n", lim->name,
         d, causal ? "causal" : "noncausal", n, pc.smem, pc.regs, pc.threads, pc.rules);
  return n;
}

Test(candidates, backward_h100_a100_4090, .timeout = 120) {
  fg_generator *g = gen();
  const struct {
    const fg_device_limits *lim;
    fg_arch arch;
  } devs[] = {{&fg_limits_h100, FG_ARCH_SM90A}, {&fg_limits_a100, FG_ARCH_SM80},
              {&fg_limits_rtx4090, FG_ARCH_SM89}};
  int total = 0;
  for (int i = 0; i < 3; i++)
    for (int d = 64; d <= 128; d += 64)
      for (int causal = 0; causal <= 1; causal++) {
        const int n = check_bwd_device(g, devs[i].lim, devs[i].arch, d, FG_DTYPE_BF16, causal);
        cr_assert_eq(check_bwd_device(g, devs[i].lim, devs[i].arch, d, FG_DTYPE_F16, causal), n,
                     "the dtype does not change what fits");
        if (i == 0) total += 2 * n; /* H100: both dtypes */
      }
  /* The default set's backward part on an H100: 8 (d, dtype, causal), all compiled in one pool
   * (about 0.5-1 s per variant, 16 threads): keep it small enough for the 60 s budget. */
  cr_assert_leq(total, 8 * 8, "%d backward candidates on an H100", total);
  /* d = 256 on the 4090's 99 KB: something still fits (the built-in rule's 32 x 32, 4 warps). */
  cr_assert_gt(check_bwd_device(g, &fg_limits_rtx4090, FG_ARCH_SM89, 256, FG_DTYPE_BF16, 0), 0);
  fg_variant v[64];
  fg_prune_counts pc;
  fg_candidates(g, &(fg_problem){FG_PASS_BWD, 128, FG_DTYPE_BF16, 0, 0, 0}, FG_ARCH_SM89,
                &fg_limits_rtx4090, v, 64, &pc);
  cr_assert_gt(pc.smem, 0, "RTX 4090 d=128: nothing pruned by shared memory");
  /* A forward problem gives forward candidates. */
  int n = fg_candidates(g, &(fg_problem){FG_PASS_FWD, 64, FG_DTYPE_BF16, 0, 0, 0}, FG_ARCH_SM90A,
                        &fg_limits_h100, v, 64, NULL);
  cr_assert_gt(n, 0);
  for (int i = 0; i < n; i++) cr_assert_eq(v[i].pass, FG_PASS_FWD);
  fg_generator_destroy(g);
}

/* The candidates are those of the op, d, dtype and mask: a problem's length buckets do not change
 * them (tune keeps one list per (op, d, dtype, causal) for every bucket). */
Test(candidates, same_for_every_bucket, .timeout = 60) {
  fg_generator *g = gen();
  for (int pass = FG_PASS_FWD; pass <= FG_PASS_BWD; pass++) {
    fg_problem a = fg_problem_make((fg_pass)pass, 64, FG_DTYPE_BF16, 1, 512);
    fg_problem b = fg_problem_make((fg_pass)pass, 64, FG_DTYPE_BF16, 1, 16384);
    b.nq = 4096;
    fg_variant va[256], vb[256];
    const int na = fg_candidates(g, &a, FG_ARCH_SM90A, &fg_limits_h100, va, 256, NULL);
    const int nb = fg_candidates(g, &b, FG_ARCH_SM90A, &fg_limits_h100, vb, 256, NULL);
    cr_assert_gt(na, 0);
    cr_assert_eq(na, nb, "%s: %d candidates at nk 512, %d at nk 16384", fg_pass_name(a.pass), na,
                 nb);
    cr_assert_eq(memcmp(va, vb, (size_t)na * sizeof va[0]), 0);
    for (int i = 0; i < na; i++) cr_assert_eq(va[i].pass, a.pass);
  }
  fg_generator_destroy(g);
}

/* The forward candidates hold the built-in variant of every key length (fg_builtin_variants), so
 * that a tuned problem is never slower than what the dispatcher runs untuned (the length rules'
 * key blocks off the grid, three consumers off the 64-column blocks, clusters); clusters of two
 * blocks (q_tma_c) are on the grid where rows end inside a sector only. */
Test(candidates, every_builtin_of_every_length, .timeout = 120) {
  fg_generator *g = gen();
  static const int ds[] = {64, 72, 88, 128, 168, 184, 200, 248};
  for (size_t k = 0; k < sizeof ds / sizeof ds[0]; k++)
    for (int causal = 0; causal <= 1; causal++) {
      const fg_problem p = {FG_PASS_FWD, ds[k], FG_DTYPE_BF16, causal, 0, 0};
      fg_variant v[256], b[FG_BUILTIN_MAX];
      const int n = fg_candidates(g, &p, FG_ARCH_SM90A, &fg_limits_h100, v, 256, NULL);
      const int nb = fg_builtin_variants(ds[k], FG_DTYPE_BF16, causal, FG_ARCH_SM90A, b);
      cr_assert_gt(nb, 0);
      for (int j = 0; j < nb; j++) {
        int found = 0;
        for (int i = 0; i < n && !found; i++) found = memcmp(&v[i], &b[j], sizeof b[j]) == 0;
        char name[FG_VARIANT_NAME_MAX];
        fg_variant_name(&b[j], name, sizeof name);
        cr_assert(found, "d = %d causal %d: the built-in %s is not a candidate", ds[k], causal, name);
      }
      int cluster = 0;
      for (int i = 0; i < n; i++) cluster += v[i].loop == FG_LOOP_Q_TMA_C;
      if (fg_rows_mid_sector(ds[k]))
        cr_assert_geq(cluster, 1, "d = %d causal %d: q_tma_c on the grid", ds[k], causal);
      else
        cr_assert_eq(cluster, 0, "d = %d causal %d: no q_tma_c on sectors", ds[k], causal);
    }
  fg_generator_destroy(g);
}

/* ---- the backward correctness gate ------------------------------------------------------- */

/* Synthetic gradients: ref in [-2, 2], naive = ref + an error of about 1%, x = ref in dtype. */
static void gate_arrays(fg_dtype dt, int64_t n, double *ref, double *naive, uint16_t *x) {
  uint64_t s = 12345;
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u = (double)(s >> 11) * 0x1.0p-53;
    ref[i] = 4 * u - 2;
    naive[i] = ref[i] * (1 + ((i % 3) - 1) * 0.01);
    x[i] = fg_f32_to_half((float)ref[i], dt);
  }
}

Test(gate, backward_accepts_the_reference_rejects_errors_and_nan) {
  enum { NQ = 3 * 257, NK = 2 * 257 };
  static double ref[NQ + 2 * NK], naive[NQ + 2 * NK];
  static uint16_t x[NQ + 2 * NK];
  const fg_dtype dts[] = {FG_DTYPE_BF16, FG_DTYPE_F16};
  for (int t = 0; t < 2; t++) {
    const fg_dtype dt = dts[t];
    gate_arrays(dt, NQ + 2 * NK, ref, naive, x);
    uint16_t *dq = x, *dk = x + NQ, *dv = x + NQ + NK;
    fg_gate_result r;
    cr_assert_eq(fg_gate_backward(dt, dq, dk, dv, ref, naive, NQ, NK, &r), 1, "%s: %s",
                 fg_dtype_name(dt), r.reason);
    cr_assert(r.pass && !r.reason[0]);
    for (int k = 0; k < 3; k++) {
      cr_assert(r.err[k] <= r.tol[k], "slot %d: %g > %g", k, r.err[k], r.tol[k]);
      cr_assert_float_eq(r.naive_err[k], 0.02, 1e-3, "slot %d: naive error %g", k, r.naive_err[k]);
      cr_assert(r.ref_max[k] > 1.9 && r.ref_max[k] <= 2.0);
      const double eps = dt == FG_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
      cr_assert_float_eq(r.tol[k], 2 * r.naive_err[k] + eps * r.ref_max[k] + FG_GATE_FLOOR, 1e-12);
    }

    /* Perturbed past the tolerance (2 x 2% + eps x 2): one value of dK off by 0.1. */
    const uint16_t keep = dk[100];
    dk[100] = fg_f32_to_half((float)(ref[NQ + 100] + 0.1), dt);
    cr_assert_eq(fg_gate_backward(dt, dq, dk, dv, ref, naive, NQ, NK, &r), 0);
    cr_assert(!r.pass);
    cr_assert(strstr(r.reason, "dK: max error") && strstr(r.reason, "over the tolerance") &&
                  strstr(r.reason, "at index 100"),
              "%s", r.reason);
    cr_assert_eq(r.worst[1], 100);
    cr_assert(r.err[0] <= r.tol[0] && r.err[2] <= r.tol[2], "dQ and dV are still measured");
    /* Within it: 0.01 off passes. */
    dk[100] = fg_f32_to_half((float)(ref[NQ + 100] + 0.01), dt);
    cr_assert_eq(fg_gate_backward(dt, dq, dk, dv, ref, naive, NQ, NK, &r), 1, "%s", r.reason);
    dk[100] = keep;

    /* A NaN (the poison left behind) and an infinity fail, whatever the tolerance. */
    dv[NK - 1] = dt == FG_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
    cr_assert_eq(fg_gate_backward(dt, dq, dk, dv, ref, naive, NQ, NK, &r), 0);
    cr_assert(strstr(r.reason, "dV[513]") && strstr(r.reason, "is not finite"), "%s", r.reason);
    dv[NK - 1] = fg_f32_to_half((float)ref[NQ + 2 * NK - 1], dt);
    dq[0] = dt == FG_DTYPE_BF16 ? 0x7f80 : 0x7c00; /* +inf */
    cr_assert_eq(fg_gate_backward(dt, dq, dk, dv, ref, naive, NQ, NK, &r), 0);
    cr_assert(strstr(r.reason, "dQ[0]") && strstr(r.reason, "not finite"), "%s", r.reason);

    /* The first failure is the one named. */
    dk[5] = fg_f32_to_half((float)(ref[NQ + 5] + 1.0), dt);
    cr_assert_eq(fg_gate_backward(dt, dq, dk, dv, ref, naive, NQ, NK, &r), 0);
    cr_assert(strstr(r.reason, "dQ[0]"), "%s", r.reason);
    cr_assert_gt(r.err[1], r.tol[1], "dK is measured after dQ failed");
  }
  /* An exact reference of zeros: the floor keeps a tiny error from failing. */
  double z[4] = {0, 0, 0, 0};
  uint16_t zx[4] = {0, 0, 0, 0x0001}; /* f16: 2^-24 */
  fg_gate_result r;
  r.pass = 1;
  cr_assert_eq(fg_gate_tensor("dQ", zx, z, z, 4, FG_DTYPE_F16, 0, &r), 1);
  cr_assert_float_eq(r.tol[0], FG_GATE_FLOOR, 1e-15);
}

/* ---- the forward correctness gate -------------------------------------------------------- */

/* A synthetic forward result, causal with Nq > Nk (rows 0 .. Nq - Nk - 1 see no key): ref in
 * [-1, 1] (0 in rows without a key), naive = ref + about 1%, O = ref in dtype written with
 * (B, N, H, d) strides, LSE = the reference's (-inf without a key). */
enum { FB = 2, FH = 3, FNQ = 40, FNK = 33, FD = 16, FROWS = FB * FH * FNQ, FEL = FROWS * FD };
typedef struct fwd_arrays {
  double ref[FEL], naive[FEL], ref_lse[FROWS];
  uint16_t o[FEL];
  float lse[FROWS];
  fg_gate_fwd f;
} fwd_arrays;

static int fwd_nokey(int64_t i) { return i + FNK - FNQ < 0; }

static void fwd_arrays_init(fwd_arrays *a, fg_dtype dt) {
  uint64_t s = 777;
  for (int64_t row = 0; row < FROWS; row++) {
    const int64_t i = row % FNQ, h = (row / FNQ) % FH, b = row / (FNQ * FH);
    a->ref_lse[row] = fwd_nokey(i) ? -INFINITY : 3.0 + 0.01 * (double)i;
    a->lse[row] = (float)a->ref_lse[row];
    for (int64_t c = 0; c < FD; c++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const double u = (double)(s >> 11) * 0x1.0p-53;
      const int64_t e = row * FD + c;
      a->ref[e] = fwd_nokey(i) ? 0.0 : 2 * u - 1;
      a->naive[e] = a->ref[e] * (1 + ((e % 3) - 1) * 0.01);
      a->o[(b * FNQ + i) * FH * FD + h * FD + c] = fg_f32_to_half((float)a->ref[e], dt);
    }
  }
  const fg_gate_fwd f = {dt, 1, FB, FH, FNQ, FNK, FD, a->o, {FNQ * FH * FD, FD, FH * FD},
                         a->lse, a->ref, a->ref_lse, a->naive};
  a->f = f;
}

/* The index in a->o of element (b, h, i, c). */
static int64_t fwd_at(int64_t b, int64_t h, int64_t i, int64_t c) {
  return (b * FNQ + i) * FH * FD + h * FD + c;
}

Test(gate, forward_accepts_the_exact_result) {
  static fwd_arrays a;
  const fg_dtype dts[] = {FG_DTYPE_BF16, FG_DTYPE_F16};
  for (int t = 0; t < 2; t++) {
    fwd_arrays_init(&a, dts[t]);
    fg_gate_result r;
    cr_assert_eq(fg_gate_forward(&a.f, &r), 1, "%s: %s", fg_dtype_name(dts[t]), r.reason);
    cr_assert(r.pass && !r.reason[0]);
    cr_assert_eq(r.nonfinite + r.nokey_bad + r.lse_bad, 0);
    cr_assert(r.err[0] <= r.tol[0]);
    cr_assert_float_eq(r.naive_err[0], 0.01, 1e-3, "naive error %g", r.naive_err[0]);
    const double eps = dts[t] == FG_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
    cr_assert_float_eq(r.tol[0], 2 * r.naive_err[0] + eps * r.ref_max[0], 1e-12);
    cr_assert_float_eq(r.tol[1], FG_GATE_LSE_TOL, 0);
    cr_assert_lt(r.err[1], 1e-6, "the LSE is the reference's, rounded to float");
    /* Without LSE the LSE is not read (it may be garbage). */
    a.f.lse = NULL;
    a.lse[FROWS - 1] = NAN;
    cr_assert_eq(fg_gate_forward(&a.f, &r), 1, "%s", r.reason);
    /* Contiguous O (strides 0) is read as [B, H, N, d]. */
    static uint16_t oc[FEL];
    for (int64_t e = 0; e < FEL; e++) oc[e] = fg_f32_to_half((float)a.ref[e], dts[t]);
    a.f.o = oc;
    memset(a.f.o_stride, 0, sizeof a.f.o_stride);
    cr_assert_eq(fg_gate_forward(&a.f, &r), 1, "%s", r.reason);
  }
}

Test(gate, forward_rejects_a_perturbed_o_wrong_lse_nan_and_nonzero_nokey_rows) {
  static fwd_arrays a;
  fg_gate_result r;
  const fg_dtype dt = FG_DTYPE_BF16;
  /* O off by 0.1 in one element (the tolerance is about 2 x 1% + 2^-8). */
  fwd_arrays_init(&a, dt);
  const int64_t row = (1 * FH + 2) * FNQ + 30; /* b = 1, h = 2, i = 30: sees keys */
  a.o[fwd_at(1, 2, 30, 5)] = fg_f32_to_half((float)(a.ref[row * FD + 5] + 0.1), dt);
  cr_assert_eq(fg_gate_forward(&a.f, &r), 0);
  cr_assert(strstr(r.reason, "max|O - ref|") && strstr(r.reason, "exceeds"), "%s", r.reason);
  cr_assert_eq(r.worst[0], row * FD + 5);
  cr_assert_gt(r.err[0], r.tol[0]);
  /* 0.005 off passes. */
  a.o[fwd_at(1, 2, 30, 5)] = fg_f32_to_half((float)(a.ref[row * FD + 5] + 0.005), dt);
  cr_assert_eq(fg_gate_forward(&a.f, &r), 1, "%s", r.reason);

  /* A wrong LSE: 1% off; within 1e-3 * (1 + |ref|) passes. */
  fwd_arrays_init(&a, dt);
  a.lse[row] = (float)(a.ref_lse[row] * 1.01);
  cr_assert_eq(fg_gate_forward(&a.f, &r), 0);
  cr_assert(strstr(r.reason, "1 LSE values are wrong, first LSE[b=1, h=2, i=30]"), "%s", r.reason);
  cr_assert_eq(r.lse_bad, 1);
  a.lse[row] = (float)(a.ref_lse[row] + 1e-3);
  cr_assert_eq(fg_gate_forward(&a.f, &r), 1, "%s", r.reason);
  /* A finite LSE in a row that sees no key (i = 0), and -inf in one that does. */
  a.lse[0] = 0.0f;
  cr_assert_eq(fg_gate_forward(&a.f, &r), 0);
  cr_assert(strstr(r.reason, "LSE[b=0, h=0, i=0]") && strstr(r.reason, "expected -inf"), "%s",
            r.reason);
  a.lse[0] = -INFINITY;
  a.lse[row] = -INFINITY;
  cr_assert_eq(fg_gate_forward(&a.f, &r), 0);
  cr_assert(strstr(r.reason, "LSE[b=1, h=2, i=30] = -inf"), "%s", r.reason);

  /* A NaN in O (the poison left behind), and an infinity. */
  fwd_arrays_init(&a, dt);
  a.o[fwd_at(0, 1, 20, 3)] = 0x7fc0;
  a.o[fwd_at(1, 0, 39, 15)] = 0x7f80;
  cr_assert_eq(fg_gate_forward(&a.f, &r), 0);
  cr_assert(strstr(r.reason, "2 elements of O are not finite") &&
                strstr(r.reason, "first O[b=0, h=1, i=20, c=3] = 0x7fc0"),
            "%s", r.reason);
  cr_assert_eq(r.nonfinite, 2);

  /* A row that sees no key (i = 6 < Nq - Nk = 7) must be exactly 0, even a tiny value. */
  fwd_arrays_init(&a, dt);
  a.o[fwd_at(1, 1, 6, 0)] = 0x0001; /* bf16: the smallest subnormal */
  cr_assert_eq(fg_gate_forward(&a.f, &r), 0);
  cr_assert(strstr(r.reason, "elements of rows with no key are not 0") &&
                strstr(r.reason, "O[b=1, h=1, i=6, c=0]"),
            "%s", r.reason);
  /* Row 7 sees one key: not held to 0. */
  fwd_arrays_init(&a, dt);
  cr_assert_eq(fg_gate_forward(&a.f, &r), 1, "%s", r.reason);

  /* seqlen_k = 0: every row sees no key. */
  fwd_arrays_init(&a, dt);
  a.f.seqlen_k = 0;
  cr_assert_eq(fg_gate_forward(&a.f, &r), 0, "rows with keys are not 0");
  cr_assert(strstr(r.reason, "rows with no key"), "%s", r.reason);

  /* The first failure in order is named: non-finite O before a wrong LSE before the error. */
  fwd_arrays_init(&a, dt);
  a.o[fwd_at(0, 0, 10, 0)] = fg_f32_to_half((float)(a.ref[10 * FD] + 0.5), dt);
  a.lse[12] = 100.0f;
  a.o[fwd_at(1, 2, 39, 1)] = 0x7fc0;
  cr_assert_eq(fg_gate_forward(&a.f, &r), 0);
  cr_assert(strstr(r.reason, "not finite"), "%s", r.reason);
  cr_assert_eq(r.lse_bad, 1);
  cr_assert_gt(r.err[0], r.tol[0], "O is measured after the NaN");

  /* A broken reference is named as such. */
  fwd_arrays_init(&a, dt);
  a.ref[FEL - 1] = NAN;
  cr_assert_eq(fg_gate_forward(&a.f, &r), 0);
  cr_assert(strstr(r.reason, "reference O are not finite"), "%s", r.reason);
}

Test(gate, random_fill_is_never_zero_and_reproducible) {
  static uint16_t x[1 << 16], y[1 << 16];
  const fg_dtype dts[] = {FG_DTYPE_BF16, FG_DTYPE_F16};
  for (int t = 0; t < 2; t++)
    for (int normal = 0; normal <= 1; normal++) {
      fg_rng r1 = {fg_seed_of_name("seqlen/nq1_nk1_bf16_causal")}, r2 = r1;
      fg_fill_random(x, 1 << 16, &r1, dts[t], normal);
      fg_fill_random(y, 1 << 16, &r2, dts[t], normal);
      cr_assert_eq(memcmp(x, y, sizeof x), 0, "the same seed gives the same values");
      double sum = 0, mx = 0;
      for (int i = 0; i < 1 << 16; i++) {
        const double v = fg_half_to_f32(x[i], dts[t]);
        cr_assert((x[i] & 0x7fffu) != 0 && isfinite(v), "x[%d] = 0x%04x", i, x[i]);
        sum += v;
        mx = fmax(mx, fabs(v));
      }
      cr_assert_lt(fabs(sum / (1 << 16)), 0.02, "mean %g", sum / (1 << 16));
      if (normal) cr_assert_gt(mx, 3.0);
      else cr_assert_leq(mx, 1.0);
    }
  /* The stream is splitmix64's: the first value from state 0. */
  fg_rng r = {0};
  cr_assert_eq(fg_rng_next(&r), 0xE220A8397B1DCDAFull);
  cr_assert_neq(fg_seed_of_name("a"), fg_seed_of_name("b"));
}
