/* test_compile.c: every (d, dtype, causal, loop order) of the default set, the whole candidate
 * set for d = 128 bf16, and every wgmma candidate of d = 64 and 256 (sm_90a), render and compile
 * with NVRTC for sm_80 and sm_90a with no spills, no stack, and no wgmma serialized by ptxas
 * (fg_nvrtc_compile refuses that). FLASHGEN_TEST_SAMPLE=1 (the sanitizer build) compiles every
 * 8th one. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_autotune.h"
#include "fg_gen.h"

typedef struct {
  fg_generator *g;
  const fg_variant *v;
  int max_spill; /* bytes of spill stores and loads allowed (0 but for the backward set) */
  int n, next, failures;
  double total_ms;
  pthread_mutex_t mu;
  char first_error[4096];
} job;

static void *worker(void *arg) {
  job *j = arg;
  for (;;) {
    pthread_mutex_lock(&j->mu);
    int i = j->next++;
    pthread_mutex_unlock(&j->mu);
    if (i >= j->n) return NULL;
    char name[FG_VARIANT_NAME_MAX], msg[4096] = "";
    fg_variant_name(&j->v[i], name, sizeof name);
    fg_kernel_image img;
    char *log = NULL;
    if (fg_generator_build(j->g, &j->v[i], &img, &log)) {
      snprintf(msg, sizeof msg, "%s: %s", name, log ? log : "failed");
      free(log);
    } else {
      if (img.meta.spill_store_bytes > j->max_spill || img.meta.spill_load_bytes > j->max_spill ||
          img.meta.stack_bytes > (j->max_spill ? 2 * j->max_spill : 0) ||
          img.meta.regs <= 0 || img.meta.regs > 255 || img.cubin_size < 1000 || img.ptx_size < 1000)
        snprintf(msg, sizeof msg, "%s: regs %d, spill stores %d B, spill loads %d B, stack %d B, cubin %zu B",
                 name, img.meta.regs, img.meta.spill_store_bytes, img.meta.spill_load_bytes,
                 img.meta.stack_bytes, img.cubin_size);
      pthread_mutex_lock(&j->mu);
      j->total_ms += img.compile_ms;
      pthread_mutex_unlock(&j->mu);
      fg_kernel_image_free(&img);
    }
    if (msg[0]) {
      pthread_mutex_lock(&j->mu);
      if (!j->failures++) snprintf(j->first_error, sizeof j->first_error, "%s", msg);
      fprintf(stderr, "FAIL %s\n", msg);
      pthread_mutex_unlock(&j->mu);
    }
  }
}

static void compile_all_spill(const fg_variant *v, int n, const char *what, int max_spill) {
  char err[4096];
  if (fg_nvrtc_load(err, sizeof err)) cr_assert_fail("%s", err);
  fg_generator *g;
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "%s", err);
  fg_variant *sel = malloc(sizeof *sel * (size_t)(n ? n : 1));
  int m = 0;
  const int sample = getenv("FLASHGEN_TEST_SAMPLE") && atoi(getenv("FLASHGEN_TEST_SAMPLE"));
  for (int i = 0; i < n; i++)
    if (!sample || i % 8 == 0) sel[m++] = v[i];
  job j = {.g = g, .v = sel, .n = m, .max_spill = max_spill};
  pthread_mutex_init(&j.mu, NULL);
  pthread_t th[2];
  for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, worker, &j);
  for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
  printf("%s: %d variants compiled, %d failed, mean NVRTC time %.0f ms\n", what, m, j.failures,
         m ? j.total_ms / m : 0.0);
  cr_assert_eq(j.failures, 0, "%d of %d failed; first: %s", j.failures, m, j.first_error);
  free(sel);
  fg_generator_destroy(g);
}

static void compile_all(const fg_variant *v, int n, const char *what) {
  compile_all_spill(v, n, what, 0);
}

static void default_set(fg_arch arch) {
  fg_variant v[512];
  int n = fg_default_variants(arch, 1, v, 512);
  /* sm_90a: the wgmma kernels at d = 64 and 128 and their q_outer twins */
  const int twins = arch == FG_ARCH_SM90A ? 2 * 2 * 2 : 0;
  cr_assert_eq(n, 29 * 2 * 2 * 2 + twins,
               "29 head dims x 2 dtypes x 2 maskings x (built-in, kv_outer), plus %d", twins);
  int wg = 0;
  for (int i = 0; i < n; i++) wg += v[i].loop == FG_LOOP_Q_WGMMA || v[i].loop == FG_LOOP_Q_WGMMA_OV;
  cr_assert_eq(wg, twins, "wgmma kernels in the %s default set", fg_arch_name(arch));
  compile_all(v, n, fg_arch_name(arch));
}

Test(compile, default_set_sm80, .timeout = 1800) { default_set(FG_ARCH_SM80); }
Test(compile, default_set_sm90a, .timeout = 1800) { default_set(FG_ARCH_SM90A); }

static void candidate_set(fg_arch arch, const fg_device_limits *lim) {
  char err[4096];
  fg_generator *g;
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "%s", err);
  fg_variant v[256];
  int n = 0;
  for (int causal = 0; causal <= 1; causal++)
    n += fg_candidates(g, &(fg_problem){FG_PASS_FWD, 128, FG_DTYPE_BF16, causal, 0, 0}, arch, lim,
                       v + n, 256 - n, NULL);
  fg_generator_destroy(g);
  cr_assert_gt(n, 20);
  compile_all(v, n, lim->name);
}

Test(compile, candidates_d128_bf16_h100_sm90a, .timeout = 1800) { candidate_set(FG_ARCH_SM90A, &fg_limits_h100); }

/* The wgmma candidates of the other head dims it takes (d = 128 is in the set above). */
Test(compile, wgmma_candidates_d64_d256_h100, .timeout = 1800) {
  char err[4096];
  fg_generator *g;
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "%s", err);
  fg_variant all[512], v[256];
  int n = 0, m = 0;
  static const int ds[] = {64, 256};
  for (int i = 0; i < 2; i++)
    for (int causal = 0; causal <= 1; causal++)
      n += fg_candidates(g, &(fg_problem){FG_PASS_FWD, ds[i], FG_DTYPE_BF16, causal, 0, 0},
                         FG_ARCH_SM90A, &fg_limits_h100, all + n, 512 - n, NULL);
  fg_generator_destroy(g);
  for (int i = 0; i < n; i++)
    if (all[i].loop == FG_LOOP_Q_WGMMA || all[i].loop == FG_LOOP_Q_WGMMA_OV) v[m++] = all[i];
  cr_assert_gt(m, 10, "wgmma candidates of d = 64 and 256 on an H100");
  compile_all(v, m, "wgmma d=64/256 on H100");
}
Test(compile, candidates_d128_bf16_a100_sm80, .timeout = 1800) { candidate_set(FG_ARCH_SM80, &fg_limits_a100); }

/* The backward pass: the built-in variant of every (d, dtype, causal) fits the arch's typical
 * device and compiles (the plan's three kernels are one module) with at most 128 B of spills:
 * the built-in rule's key blocks of 128 spill 8-88 B at d = 104..128 and run 1.3-1.5x the
 * spill-free blocks of 64 (H100, fg_ab; core/variant.c). */
static void backward_set(fg_arch arch, int both_dtypes) {
  char err[4096];
  fg_generator *g;
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "%s", err);
  fg_variant v[256];
  int n = 0;
  for (int d = 32; d <= 256; d += 8)
    for (int t = 0; t < (both_dtypes ? 2 : 1); t++)
      for (int causal = 0; causal <= 1; causal++) {
        v[n] = fg_builtin_backward_variant(d, t ? FG_DTYPE_F16 : FG_DTYPE_BF16, causal, arch);
        char why[512];
        cr_assert_eq(fg_variant_fits(g, &v[n], fg_limits_for_arch(arch), why, sizeof why), 1,
                     "d = %d on %s: %s", d, fg_arch_name(arch), why);
        n++;
      }
  fg_generator_destroy(g);
  compile_all_spill(v, n, "backward", fg_variant_spill_limit(&v[0]));
}

Test(compile, backward_sm80, .timeout = 1800) { backward_set(FG_ARCH_SM80, 1); }
Test(compile, backward_sm90a, .timeout = 1800) { backward_set(FG_ARCH_SM90A, 1); }
Test(compile, backward_sm86, .timeout = 1800) { backward_set(FG_ARCH_SM86, 0); }
