/* host_call.c: host time of one fg_attention_forward call once its kernel is loaded (the
 * dispatcher, validation and launch; not the kernel): the median over 10^4 calls on a small
 * problem, and the time of the first call in this process (cubin from the cache or compiled).
 * With a forward variant name, that variant's calls (fg_attention_forward_variant: the registry
 * instead of the dispatcher), e.g. a qtma one, whose launches encode three tensor maps (timed
 * alone in the breakdown). With `backward`, the host time of fg_attention_backward instead (its
 * plan's three launches, four tensor maps on sm_90a, the workspace from the context's pool or
 * the caller's). Run on a machine with a GPU:
 *   build/fg_bench_host [calls] [breakdown] [VARIANT]
 *   build/fg_bench_host [calls] backward */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fg_jit.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One call: the public entry point, or the forced variant's. */
static fg_status call(fg_context *ctx, const fg_attention_args *a, const fg_variant *forced) {
  return forced ? fg_attention_forward_variant(ctx, a, NULL, forced)
                : fg_attention_forward(ctx, a, NULL);
}

/* The median of `calls` host times of fg_attention_backward on a (synchronising every 256
 * calls, so the launch queue never fills); -1 on an error (printed). */
static double backward_median(fg_context *ctx, const fg_attention_backward_args *a, int calls,
                              double *t) {
  for (int i = 0; i < calls; i++) {
    double s = now_us();
    if (fg_attention_backward(ctx, a, NULL) != FG_OK) {
      fprintf(stderr, "fg_bench_host: %s\n", fg_context_last_error(ctx));
      return -1;
    }
    t[i] = now_us() - s;
    if (i % 256 == 255) fg_dev_synchronize(ctx);
  }
  fg_dev_synchronize(ctx);
  qsort(t, (size_t)calls, sizeof(double), cmp);
  return t[calls / 2];
}

/* `fg_bench_host [calls] backward`: a small backward problem (B 1, H 2, N 128, d 64, f16), its
 * kernels loaded by a first call; the median host time per call with the workspace from the
 * context's pool and with the caller's. */
static int backward_main(int calls) {
  fg_context *ctx;
  if (fg_context_create(&ctx, NULL) != FG_OK) {
    fprintf(stderr, "fg_bench_host: %s\n", fg_last_create_error());
    return 1;
  }
  const int64_t B = 1, H = 2, N = 128, d = 64;
  const size_t n = (size_t)(B * H * N * d);
  CUdeviceptr buf[8], lse = 0;
  for (int i = 0; i < 8; i++)
    if (fg_dev_alloc(ctx, &buf[i], n * 2) || fg_dev_fill16(ctx, buf[i], 0x3c00, n)) {
      fprintf(stderr, "fg_bench_host: %s\n", fg_context_last_error(ctx));
      return 1;
    }
  if (fg_dev_alloc(ctx, &lse, (size_t)(B * H * N) * 4)) {
    fprintf(stderr, "fg_bench_host: %s\n", fg_context_last_error(ctx));
    return 1;
  }
  fg_attention_args f = {0};
  f.dtype = FG_DTYPE_F16;
  f.batch = B; f.heads_q = H; f.heads_kv = H; f.seqlen_q = N; f.seqlen_k = N; f.head_dim = d;
  f.q = (void *)buf[0]; f.k = (void *)buf[1]; f.v = (void *)buf[2]; f.o = (void *)buf[3];
  f.lse = (float *)lse;
  fg_attention_backward_args a = {0};
  a.size = sizeof a;
  a.dtype = f.dtype;
  a.batch = B; a.heads_q = H; a.heads_kv = H; a.seqlen_q = N; a.seqlen_k = N; a.head_dim = d;
  a.q = f.q; a.k = f.k; a.v = f.v; a.o = f.o; a.lse = f.lse;
  a.d_o = (void *)buf[4]; a.dq = (void *)buf[5]; a.dk = (void *)buf[6]; a.dv = (void *)buf[7];
  double t0 = now_us();
  if (fg_attention_forward(ctx, &f, NULL) != FG_OK || fg_attention_backward(ctx, &a, NULL) != FG_OK ||
      fg_dev_synchronize(ctx) != FG_OK) {
    fprintf(stderr, "fg_bench_host: %s\n", fg_context_last_error(ctx));
    return 1;
  }
  printf("first forward + backward (load or compile + launch, synchronised): %.2f ms\n",
         (now_us() - t0) / 1e3);
  double *t = malloc(sizeof(double) * (size_t)calls);
  const double pool = backward_median(ctx, &a, calls, t);
  size_t ws = 0;
  CUdeviceptr wp = 0;
  if (pool < 0 || fg_attention_backward_workspace_size(ctx, &a, &ws) != FG_OK ||
      (ws && fg_dev_alloc(ctx, &wp, ws))) {
    if (pool >= 0) fprintf(stderr, "fg_bench_host: %s\n", fg_context_last_error(ctx));
    return 1;
  }
  a.workspace = (void *)wp;
  a.workspace_size = ws;
  const double own = backward_median(ctx, &a, calls, t);
  if (own < 0) return 1;
  printf("backward host time per call, kernels loaded: median %.2f us (workspace from the "
         "context's pool), %.2f us (the caller's %zu B) over %d calls\n",
         pool, own, ws, calls);
  free(t);
  fg_dev_free(ctx, wp);
  for (int i = 0; i < 8; i++) fg_dev_free(ctx, buf[i]);
  fg_dev_free(ctx, lse);
  fg_context_destroy(ctx);
  return 0;
}

int main(int argc, char **argv) {
  int calls = argc > 1 ? atoi(argv[1]) : 10000;
  if (calls < 10) calls = 10;
  if (argc > 2 && strcmp(argv[2], "backward") == 0) return backward_main(calls);
  int breakdown = 0;
  fg_variant forced_v, *forced = NULL;
  for (int i = 2; i < argc; i++) {
    char err[256];
    if (strcmp(argv[i], "breakdown") == 0) {
      breakdown = 1;
    } else if (fg_variant_parse(argv[i], &forced_v, err, sizeof err) == 0 &&
               forced_v.pass == FG_PASS_FWD) {
      forced = &forced_v;
    } else {
      fprintf(stderr, "fg_bench_host: '%s' is neither 'breakdown' nor a forward variant (%s)\n"
              "usage: fg_bench_host [calls] [breakdown] [fwd_... variant] | [calls] backward\n", argv[i], err);
      return 2;
    }
  }
  double t0 = now_us();
  fg_context *ctx;
  if (fg_context_create(&ctx, NULL) != FG_OK) {
    fprintf(stderr, "fg_bench_host: %s\n", fg_last_create_error());
    return 1;
  }
  double t_ctx = now_us() - t0;
  const int64_t B = 1, H = 2, N = 128, d = forced ? forced->d : 64;
  size_t n = (size_t)(B * H * N * d);
  CUdeviceptr q, k, v, o;
  if (fg_dev_alloc(ctx, &q, n * 2) || fg_dev_alloc(ctx, &k, n * 2) || fg_dev_alloc(ctx, &v, n * 2) ||
      fg_dev_alloc(ctx, &o, n * 2) || fg_dev_fill16(ctx, q, 0x3c00, n) || fg_dev_fill16(ctx, k, 0x3c00, n) ||
      fg_dev_fill16(ctx, v, 0x3c00, n)) {
    fprintf(stderr, "fg_bench_host: %s\n", fg_context_last_error(ctx));
    return 1;
  }
  fg_attention_args a = {0};
  a.dtype = forced ? forced->dtype : FG_DTYPE_F16;
  a.causal = forced ? forced->causal : 0;
  a.batch = B; a.heads_q = H; a.heads_kv = H; a.seqlen_q = N; a.seqlen_k = N; a.head_dim = d;
  a.q = (void *)q; a.k = (void *)k; a.v = (void *)v; a.o = (void *)o;
  if (breakdown) {
    /* The lazy work of a first call, each part timed alone before the call does it. */
    char err[2048];
    double s = now_us();
    fg_nvrtc_load(err, sizeof err);
    double t_nvrtc = now_us() - s;
    fg_generator *g;
    s = now_us();
    fg_context_generator(ctx, &g);
    double t_gen = now_us() - s;
    s = now_us();
    fg_context_cache(ctx);
    double t_cache = now_us() - s;
    printf("first-call parts: NVRTC dlopen %.2f ms, generator (Lua + template hash) %.2f ms, "
           "cache open %.2f ms\n", t_nvrtc / 1e3, t_gen / 1e3, t_cache / 1e3);
  }
  double t1 = now_us();
  if (call(ctx, &a, forced) != FG_OK || fg_dev_synchronize(ctx) != FG_OK) {
    fprintf(stderr, "fg_bench_host: %s\n", fg_context_last_error(ctx));
    return 1;
  }
  double t_first = now_us() - t1;
  double *t = malloc(sizeof(double) * (size_t)calls);
  for (int i = 0; i < calls; i++) {
    double s = now_us();
    if (call(ctx, &a, forced) != FG_OK) {
      fprintf(stderr, "fg_bench_host: %s\n", fg_context_last_error(ctx));
      return 1;
    }
    t[i] = now_us() - s;
    if (i % 256 == 255) fg_dev_synchronize(ctx); /* keep the launch queue from filling */
  }
  fg_dev_synchronize(ctx);
  qsort(t, (size_t)calls, sizeof(double), cmp);
  printf("context create: %.1f ms\nfirst call (load or compile + launch, synchronised): %.2f ms\n",
         t_ctx / 1e3, t_first / 1e3);

  /* Where the time goes: the same call's parts, each timed alone. */
  fg_attention_args norm;
  char err[512];
  fg_validate_args(&a, FG_VALIDATE_CALL, &norm, err, sizeof err);
  const fg_dispatch *dsp;
  const fg_loaded_kernel *kern = NULL;
  if (forced) fg_registry_get(ctx, forced, &kern);
  else fg_dispatch_choose(ctx, &norm, 1, &dsp, &kern);
  fg_fwd_params prm;
  fg_params_from_args(&norm, &prm);
  const int tma = kern->meta.params == FG_PARAMS_FWD_TMA;
  fg_fwd_tma_params tp;
  double *u = malloc(sizeof(double) * (size_t)calls);
  const char *part[5] = {"validate_args", "validate_pointers", forced ? "registry_get" : "dispatch",
                         "kernel_launch", "tensor maps (encode)"};
  for (int which = 0; which < (tma ? 5 : 4); which++) {
    if (which == 4) fg_ctx_push(ctx); /* as the launch has it */
    for (int i = 0; i < calls; i++) {
      double s = now_us();
      if (which == 0) fg_validate_args(&a, FG_VALIDATE_CALL, &norm, err, sizeof err);
      else if (which == 1) {
        fg_ctx_push(ctx);
        fg_validate_pointers(ctx, &norm, err, sizeof err);
        fg_ctx_pop(ctx);
      } else if (which == 2) {
        if (forced) fg_registry_get(ctx, forced, &kern);
        else fg_dispatch_choose(ctx, &norm, 1, &dsp, &kern);
      } else if (which == 3) {
        fg_kernel_launch(ctx, kern, &prm, FG_ELEMS_FORWARD, NULL);
      } else if (fg_fwd_tma_params_fill(ctx, kern, &prm, FG_ELEMS_FORWARD, &tp) != FG_OK) {
        fprintf(stderr, "fg_bench_host: %s\n", fg_context_last_error(ctx));
        return 1;
      }
      u[i] = now_us() - s;
      if (which == 3 && i % 256 == 255) fg_dev_synchronize(ctx);
    }
    if (which == 4) fg_ctx_pop(ctx);
    fg_dev_synchronize(ctx);
    qsort(u, (size_t)calls, sizeof(double), cmp);
    printf("  part %-20s median %.2f us\n", part[which], u[calls / 2]);
  }
  /* The floor: cuLaunchKernel alone, same kernel and arguments (its tensor maps encoded once),
   * context already current. */
  fg_ctx_push(ctx);
  {
    uint64_t g[3];
    fg_launch_grid(fg_kernel_main(&kern->meta), ctx->limits.sm_count, &prm, g);
    void *kp[] = {&prm};
    if (tma) {
      if (fg_fwd_tma_params_fill(ctx, kern, &prm, FG_ELEMS_FORWARD, &tp) != FG_OK) {
        fprintf(stderr, "fg_bench_host: %s\n", fg_context_last_error(ctx));
        return 1;
      }
      kp[0] = &tp;
    }
    for (int i = 0; i < calls; i++) {
      double s = now_us();
      fg_cu.cuLaunchKernel(kern->fn[kern->meta.main_step], (unsigned)g[0], (unsigned)g[1],
                           (unsigned)g[2], (unsigned)fg_kernel_main(&kern->meta)->threads, 1, 1,
                           (unsigned)fg_kernel_main(&kern->meta)->smem_bytes, NULL, kp, NULL);
      u[i] = now_us() - s;
      if (i % 256 == 255) fg_cu.cuCtxSynchronize();
    }
    fg_cu.cuCtxSynchronize();
  }
  fg_ctx_pop(ctx);
  qsort(u, (size_t)calls, sizeof(double), cmp);
  printf("  bare cuLaunchKernel   median %.2f us (the driver's floor for any launch)\n", u[calls / 2]);
  free(u);
  printf("host time per call, kernel loaded: median %.2f us, p10 %.2f us, p90 %.2f us over %d calls\n",
         t[calls / 2], t[calls / 10], t[calls * 9 / 10], calls);
  free(t);
  fg_dev_free(ctx, q); fg_dev_free(ctx, k); fg_dev_free(ctx, v); fg_dev_free(ctx, o);
  fg_context_destroy(ctx);
  return 0;
}
