/* main.c: embedding flashgen without a compiler: attention forward and backward through kernels
 * exported ahead of time (`flashgen export`), with only flashgen_runtime linked (no Lua, NVRTC
 * or SQLite), checked against a CPU reference computed in double.
 *
 * Build (against an installed flashgen; see README.md beside this file):
 *     cmake -S examples/embed -B build-embed -DCMAKE_PREFIX_PATH=/path/to/prefix
 *     cmake --build build-embed && ./build-embed/flashgen_embed
 * It prints, per forward problem, the kernel the dispatcher chose, the max error against the
 * reference and PASS or FAIL; then that a head_dim the export lacks fails with
 * FG_ERROR_KERNEL_MISSING and the message naming the problem, the GPU and what the export
 * holds; then, per backward problem (forward with lse, then fg_attention_backward), the max
 * errors of dQ, dK and dV against the reference and PASS or FAIL, and the same
 * FG_ERROR_KERNEL_MISSING for a backward the export lacks. Exit status 0 when everything
 * passed. Built with EMBED_HOPPER (-DFLASHGEN_EMBED_HOPPER=ON: the export holds the sm_90a TMA
 * kernels of variants_hopper.txt) it also runs head_dim 256 problems, and every problem must
 * have run a Hopper kernel with tensor maps (its fg_explain / fg_explain_backward says so).
 *
 * Device memory: the example loads the CUDA driver itself (dlopen, like flashgen: nothing here
 * needs the CUDA toolkit at build time) and works in the device's primary context, which is
 * the one flashgen uses. FLASHGEN_CUDA_LIBRARY, when set, names the driver library for both. */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flashgen.h>

#include "embed_kernels.h" /* written by `flashgen export --prefix embed` */

/* ---- the few driver calls the example needs ---------------------------------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;

static struct {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*PrimaryCtxRelease)(CUdevice);
  CUresult (*CtxPush)(CUcontext);
  CUresult (*CtxPop)(CUcontext *);
  CUresult (*CtxSynchronize)(void);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*HtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*DtoH)(void *, CUdeviceptr, size_t);
} cu;

static int load_driver(void) {
  const char *path = getenv("FLASHGEN_CUDA_LIBRARY");
  void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "embed: cannot load the CUDA driver: %s\n", dlerror());
    return -1;
  }
  struct {
    void **fn;
    const char *name;
  } syms[] = {
      {(void **)&cu.Init, "cuInit"},
      {(void **)&cu.DeviceGet, "cuDeviceGet"},
      {(void **)&cu.PrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
      {(void **)&cu.PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
      {(void **)&cu.CtxPush, "cuCtxPushCurrent_v2"},
      {(void **)&cu.CtxPop, "cuCtxPopCurrent_v2"},
      {(void **)&cu.CtxSynchronize, "cuCtxSynchronize"},
      {(void **)&cu.MemAlloc, "cuMemAlloc_v2"},
      {(void **)&cu.MemFree, "cuMemFree_v2"},
      {(void **)&cu.HtoD, "cuMemcpyHtoD_v2"},
      {(void **)&cu.DtoH, "cuMemcpyDtoH_v2"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].fn = dlsym(h, syms[i].name);
    if (!*syms[i].fn) {
      fprintf(stderr, "embed: the CUDA driver lacks %s\n", syms[i].name);
      return -1;
    }
  }
  return 0;
}

#define CU_CHECK(call)                                                      \
  do {                                                                      \
    CUresult r_ = (call);                                                   \
    if (r_ != 0) {                                                          \
      fprintf(stderr, "embed: %s failed with CUDA error %d\n", #call, r_); \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

/* ---- half-precision conversions (round to nearest even) ----------------------------------- */
static uint16_t to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}
static double from_bf16(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t to_f16(float f) { /* normal range and zero: enough for inputs in [-1, 1] */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int e = (int)((x >> 23) & 0xFF) - 127 + 15;
  if (e <= 0) return (uint16_t)sign;
  uint32_t h = sign | ((uint32_t)e << 10) | ((x & 0x7FFFFFu) >> 13), rem = x & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)h;
}
static double from_f16(uint16_t h) {
  uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  double v = e == 0 ? ldexp(m, -24) : ldexp(m | 0x400u, (int)e - 25);
  return (h & 0x8000u) ? -v : v;
}

/* Prints text indented, one line each. */
static void print_indented(const char *text) {
  for (const char *line = text; *line;) {
    size_t n = strcspn(line, "\n");
    if (n) printf("    %.*s\n", (int)n, line);
    line += n + (line[n] == '\n');
  }
}

/* EMBED_HOPPER: whether the plan explained in `why` is an sm_90a kernel's with tensor maps (the
 * export holds no other), else 1. */
static int hopper_plan(const char *why, const char *loop) {
#ifdef EMBED_HOPPER
  const int ok = strstr(why, "TMA:") != NULL && strstr(why, "_sm90a") != NULL && strstr(why, loop) != NULL;
  if (!ok) printf("  not a Hopper TMA plan (fg_explain names no \"TMA:\", \"_sm90a\" and \"%s\"): FAIL\n", loop);
  return ok;
#else
  (void)why, (void)loop;
  return 1;
#endif
}

/* ---- one problem ---------------------------------------------------------------------------- */
typedef struct problem {
  fg_dtype dtype;
  int causal;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, d;
  double tol; /* forward: max |O - reference|, a few units in the last place of the output
                 dtype; backward: max |gradient - reference| as a fraction of max |reference| */
} problem;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) { /* [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Runs one problem; returns 1 when it passed. */
static int run(fg_context *ctx, CUcontext cuctx, const problem *p) {
  const int bf = p->dtype == FG_DTYPE_BF16;
  const size_t nq = (size_t)(p->batch * p->heads_q * p->seqlen_q * p->d);
  const size_t nk = (size_t)(p->batch * p->heads_kv * p->seqlen_k * p->d);
  uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *v = malloc(nk * 2), *o = malloc(nq * 2);
  for (size_t i = 0; i < nq; i++) q[i] = bf ? to_bf16(uniform()) : to_f16(uniform());
  for (size_t i = 0; i < nk; i++) k[i] = bf ? to_bf16(uniform()) : to_f16(uniform());
  for (size_t i = 0; i < nk; i++) v[i] = bf ? to_bf16(uniform()) : to_f16(uniform());

  CUdeviceptr dq, dk, dv, dout;
  CU_CHECK(cu.CtxPush(cuctx));
  CU_CHECK(cu.MemAlloc(&dq, nq * 2));
  CU_CHECK(cu.MemAlloc(&dk, nk * 2));
  CU_CHECK(cu.MemAlloc(&dv, nk * 2));
  CU_CHECK(cu.MemAlloc(&dout, nq * 2));
  CU_CHECK(cu.HtoD(dq, q, nq * 2));
  CU_CHECK(cu.HtoD(dk, k, nk * 2));
  CU_CHECK(cu.HtoD(dv, v, nk * 2));

  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = p->dtype;
  a.causal = p->causal;
  a.batch = p->batch, a.heads_q = p->heads_q, a.heads_kv = p->heads_kv;
  a.seqlen_q = p->seqlen_q, a.seqlen_k = p->seqlen_k, a.head_dim = p->d;
  a.q = (const void *)(uintptr_t)dq, a.k = (const void *)(uintptr_t)dk;
  a.v = (const void *)(uintptr_t)dv, a.o = (void *)(uintptr_t)dout;
  char why[2048];
  if (fg_explain(ctx, &a, why, sizeof why) != FG_OK) snprintf(why, sizeof why, "?");
  fg_status s = fg_attention_forward(ctx, &a, NULL);
  int pass = 0;
  printf("problem: %s d=%lld B=%lld Hq=%lld Hkv=%lld Nq=%lld Nk=%lld %s\n", bf ? "bf16" : "f16",
         (long long)p->d, (long long)p->batch, (long long)p->heads_q, (long long)p->heads_kv,
         (long long)p->seqlen_q, (long long)p->seqlen_k, p->causal ? "causal" : "non-causal");
  if (s != FG_OK) {
    printf("  FAIL: fg_attention_forward: %s: %s\n", fg_status_string(s), fg_context_last_error(ctx));
  } else {
    CU_CHECK(cu.CtxSynchronize());
    CU_CHECK(cu.DtoH(o, dout, nq * 2));
    /* The reference, in double, from the same rounded inputs. */
    const double scale = 1.0 / sqrt((double)p->d);
    double max_err = 0;
    double *srow = malloc(sizeof(double) * (size_t)p->seqlen_k);
    for (int64_t b = 0; b < p->batch; b++)
      for (int64_t h = 0; h < p->heads_q; h++) {
        const int64_t hk = h / (p->heads_q / p->heads_kv);
        const uint16_t *qh = q + ((b * p->heads_q + h) * p->seqlen_q) * p->d;
        const uint16_t *kh = k + ((b * p->heads_kv + hk) * p->seqlen_k) * p->d;
        const uint16_t *vh = v + ((b * p->heads_kv + hk) * p->seqlen_k) * p->d;
        const uint16_t *oh = o + ((b * p->heads_q + h) * p->seqlen_q) * p->d;
        for (int64_t i = 0; i < p->seqlen_q; i++) {
          int64_t n = p->seqlen_k;
          if (p->causal && i + p->seqlen_k - p->seqlen_q + 1 < n) n = i + p->seqlen_k - p->seqlen_q + 1;
          if (n < 0) n = 0;
          double mx = -INFINITY, sum = 0;
          for (int64_t j = 0; j < n; j++) {
            double acc = 0;
            for (int64_t c = 0; c < p->d; c++) {
              double x = bf ? from_bf16(qh[i * p->d + c]) : from_f16(qh[i * p->d + c]);
              double y = bf ? from_bf16(kh[j * p->d + c]) : from_f16(kh[j * p->d + c]);
              acc += x * y;
            }
            srow[j] = acc * scale;
            if (srow[j] > mx) mx = srow[j];
          }
          for (int64_t j = 0; j < n; j++) sum += (srow[j] = exp(srow[j] - mx));
          for (int64_t c = 0; c < p->d; c++) {
            double ref = 0;
            for (int64_t j = 0; j < n; j++)
              ref += srow[j] * (bf ? from_bf16(vh[j * p->d + c]) : from_f16(vh[j * p->d + c]));
            ref = n ? ref / sum : 0;
            double got = bf ? from_bf16(oh[i * p->d + c]) : from_f16(oh[i * p->d + c]);
            double err = fabs(got - ref);
            if (!(err <= max_err)) max_err = err; /* NaN counts as the worst */
          }
        }
      }
    free(srow);
    pass = max_err <= p->tol;
    printf("  fg_explain:\n");
    print_indented(why);
    pass &= hopper_plan(why, "qtma");
    printf("  max error %.3g (tolerance %.3g): %s\n", max_err, p->tol, pass ? "PASS" : "FAIL");
  }
  cu.MemFree(dq), cu.MemFree(dk), cu.MemFree(dv), cu.MemFree(dout);
  CUcontext popped;
  cu.CtxPop(&popped);
  free(q), free(k), free(v), free(o);
  return pass;
}

/* ---- the backward ------------------------------------------------------------------------ */
static double half_to_double(int bf, uint16_t h) { return bf ? from_bf16(h) : from_f16(h); }

/* The gradients in double from the rounded inputs, for contiguous (B, H, N, d) tensors: with
 * P = softmax(scale Q K^T) (masked), dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)),
 * dQ = scale dS K, dK = scale dS^T Q; dK and dV of a KV head summed over its query heads. */
static void backward_reference(const problem *p, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, const uint16_t *dout, double *gq, double *gk,
                               double *gv) {
  const int bf = p->dtype == FG_DTYPE_BF16;
  const int64_t d = p->d, nq = p->seqlen_q, nk = p->seqlen_k, group = p->heads_q / p->heads_kv;
  const double scale = 1.0 / sqrt((double)d);
  double *pr = malloc(sizeof(double) * (size_t)nk), *dp = malloc(sizeof(double) * (size_t)nk);
  memset(gk, 0, sizeof(double) * (size_t)(p->batch * p->heads_kv * nk * d));
  memset(gv, 0, sizeof(double) * (size_t)(p->batch * p->heads_kv * nk * d));
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t h = 0; h < p->heads_q; h++) {
      const int64_t hk = h / group, qo = (b * p->heads_q + h) * nq * d,
                    ko = (b * p->heads_kv + hk) * nk * d;
      for (int64_t i = 0; i < nq; i++) {
        int64_t n = nk;
        if (p->causal && i + nk - nq + 1 < n) n = i + nk - nq + 1;
        if (n < 0) n = 0;
        double mx = -INFINITY, sum = 0, rowsum = 0;
        for (int64_t j = 0; j < n; j++) {
          double acc = 0;
          for (int64_t c = 0; c < d; c++)
            acc += half_to_double(bf, q[qo + i * d + c]) * half_to_double(bf, k[ko + j * d + c]);
          pr[j] = acc * scale;
          if (pr[j] > mx) mx = pr[j];
        }
        for (int64_t j = 0; j < n; j++) sum += (pr[j] = exp(pr[j] - mx));
        for (int64_t j = 0; j < n; j++) {
          pr[j] /= sum;
          dp[j] = 0;
          for (int64_t c = 0; c < d; c++)
            dp[j] += half_to_double(bf, dout[qo + i * d + c]) * half_to_double(bf, v[ko + j * d + c]);
          rowsum += pr[j] * dp[j]; /* rowsum(dO * O), O = P V */
        }
        for (int64_t c = 0; c < d; c++) {
          double g = 0;
          const double qc = half_to_double(bf, q[qo + i * d + c]);
          const double doc = half_to_double(bf, dout[qo + i * d + c]);
          for (int64_t j = 0; j < n; j++) {
            const double ds = pr[j] * (dp[j] - rowsum);
            g += ds * half_to_double(bf, k[ko + j * d + c]);
            gk[ko + j * d + c] += scale * ds * qc;
            gv[ko + j * d + c] += pr[j] * doc;
          }
          gq[qo + i * d + c] = scale * g;
        }
      }
    }
  free(pr), free(dp);
}

/* Max |got - ref| over n elements, and max |ref| into *mag; NaN counts as the worst. */
static double max_error(int bf, const uint16_t *got, const double *ref, size_t n, double *mag) {
  double err = 0;
  *mag = 0;
  for (size_t i = 0; i < n; i++) {
    const double e = fabs(half_to_double(bf, got[i]) - ref[i]);
    if (!(e <= err)) err = e;
    if (fabs(ref[i]) > *mag) *mag = fabs(ref[i]);
  }
  return err;
}

/* Runs the forward (for O and lse) and then the backward of one problem; returns 1 when dQ, dK
 * and dV are each within p->tol * max|reference| of the reference. */
static int run_backward(fg_context *ctx, CUcontext cuctx, const problem *p) {
  const int bf = p->dtype == FG_DTYPE_BF16;
  const size_t nq = (size_t)(p->batch * p->heads_q * p->seqlen_q * p->d);
  const size_t nk = (size_t)(p->batch * p->heads_kv * p->seqlen_k * p->d);
  const size_t rows = (size_t)(p->batch * p->heads_q * p->seqlen_q);
  uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *v = malloc(nk * 2), *dout = malloc(nq * 2);
  uint16_t *gq = malloc(nq * 2), *gk = malloc(nk * 2), *gv = malloc(nk * 2);
  double *rq = malloc(nq * sizeof(double)), *rk = malloc(nk * sizeof(double)),
         *rv = malloc(nk * sizeof(double));
  for (size_t i = 0; i < nq; i++) q[i] = bf ? to_bf16(uniform()) : to_f16(uniform());
  for (size_t i = 0; i < nk; i++) k[i] = bf ? to_bf16(uniform()) : to_f16(uniform());
  for (size_t i = 0; i < nk; i++) v[i] = bf ? to_bf16(uniform()) : to_f16(uniform());
  for (size_t i = 0; i < nq; i++) dout[i] = bf ? to_bf16(uniform()) : to_f16(uniform());

  CUdeviceptr dq_in, dk_in, dv_in, d_o, d_dout, d_lse, d_gq, d_gk, d_gv, d_ws = 0;
  CU_CHECK(cu.CtxPush(cuctx));
  CU_CHECK(cu.MemAlloc(&dq_in, nq * 2));
  CU_CHECK(cu.MemAlloc(&dk_in, nk * 2));
  CU_CHECK(cu.MemAlloc(&dv_in, nk * 2));
  CU_CHECK(cu.MemAlloc(&d_o, nq * 2));
  CU_CHECK(cu.MemAlloc(&d_dout, nq * 2));
  CU_CHECK(cu.MemAlloc(&d_lse, rows * 4));
  CU_CHECK(cu.MemAlloc(&d_gq, nq * 2));
  CU_CHECK(cu.MemAlloc(&d_gk, nk * 2));
  CU_CHECK(cu.MemAlloc(&d_gv, nk * 2));
  CU_CHECK(cu.HtoD(dq_in, q, nq * 2));
  CU_CHECK(cu.HtoD(dk_in, k, nk * 2));
  CU_CHECK(cu.HtoD(dv_in, v, nk * 2));
  CU_CHECK(cu.HtoD(d_dout, dout, nq * 2));

  printf("backward: %s d=%lld B=%lld Hq=%lld Hkv=%lld Nq=%lld Nk=%lld %s\n", bf ? "bf16" : "f16",
         (long long)p->d, (long long)p->batch, (long long)p->heads_q, (long long)p->heads_kv,
         (long long)p->seqlen_q, (long long)p->seqlen_k, p->causal ? "causal" : "non-causal");
  /* 1. The forward, keeping lse (the backward recomputes P from it). */
  fg_attention_args f;
  memset(&f, 0, sizeof f);
  f.size = sizeof f;
  f.dtype = p->dtype;
  f.causal = p->causal;
  f.batch = p->batch, f.heads_q = p->heads_q, f.heads_kv = p->heads_kv;
  f.seqlen_q = p->seqlen_q, f.seqlen_k = p->seqlen_k, f.head_dim = p->d;
  f.q = (const void *)(uintptr_t)dq_in, f.k = (const void *)(uintptr_t)dk_in;
  f.v = (const void *)(uintptr_t)dv_in, f.o = (void *)(uintptr_t)d_o;
  f.lse = (float *)(uintptr_t)d_lse;
  /* 2. The backward: the forward's arguments again, its outputs, dO and the gradients. */
  fg_attention_backward_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = f.dtype;
  a.causal = f.causal;
  a.batch = f.batch, a.heads_q = f.heads_q, a.heads_kv = f.heads_kv;
  a.seqlen_q = f.seqlen_q, a.seqlen_k = f.seqlen_k, a.head_dim = f.head_dim;
  a.q = f.q, a.k = f.k, a.v = f.v, a.o = f.o, a.lse = f.lse;
  a.d_o = (const void *)(uintptr_t)d_dout;
  a.dq = (void *)(uintptr_t)d_gq, a.dk = (void *)(uintptr_t)d_gk, a.dv = (void *)(uintptr_t)d_gv;
  /* The fp32 workspace, ours (without it flashgen allocates one per call). */
  size_t ws = 0;
  fg_status s = fg_attention_forward(ctx, &f, NULL);
  const char *what = "fg_attention_forward";
  if (s == FG_OK) {
    what = "fg_attention_backward_workspace_size";
    s = fg_attention_backward_workspace_size(ctx, &a, &ws);
  }
  if (s == FG_OK && ws) {
    CU_CHECK(cu.MemAlloc(&d_ws, ws));
    a.workspace = (void *)(uintptr_t)d_ws, a.workspace_size = ws;
  }
  if (s == FG_OK) {
    what = "fg_attention_backward";
    s = fg_attention_backward(ctx, &a, NULL);
  }
#ifdef EMBED_HOPPER
  char why[4096] = "?";
  if (s == FG_OK) {
    what = "fg_explain_backward";
    s = fg_explain_backward(ctx, &a, why, sizeof why);
  }
#endif
  int pass = 0;
  if (s != FG_OK) {
    printf("  FAIL: %s: %s: %s\n", what, fg_status_string(s), fg_context_last_error(ctx));
  } else {
    CU_CHECK(cu.CtxSynchronize());
    CU_CHECK(cu.DtoH(gq, d_gq, nq * 2));
    CU_CHECK(cu.DtoH(gk, d_gk, nk * 2));
    CU_CHECK(cu.DtoH(gv, d_gv, nk * 2));
    backward_reference(p, q, k, v, dout, rq, rk, rv);
    static const char *const names[3] = {"dQ", "dK", "dV"};
    const uint16_t *got[3] = {gq, gk, gv};
    const double *ref[3] = {rq, rk, rv};
    const size_t n[3] = {nq, nk, nk};
    pass = 1;
#ifdef EMBED_HOPPER
    printf("  fg_explain_backward:\n");
    print_indented(why);
    pass = hopper_plan(why, "kvtma");
#endif
    printf("  workspace %zu bytes (fg_attention_backward_workspace_size)\n", ws);
    for (int t = 0; t < 3; t++) {
      double mag;
      const double err = max_error(bf, got[t], ref[t], n[t], &mag), tol = p->tol * mag + 1e-6;
      const int ok = err <= tol;
      pass &= ok;
      printf("  %s: max error %.3g (tolerance %.3g = %.3g of max|%s| %.3g): %s\n", names[t], err,
             tol, p->tol, names[t], mag, ok ? "PASS" : "FAIL");
    }
  }
  cu.MemFree(dq_in), cu.MemFree(dk_in), cu.MemFree(dv_in), cu.MemFree(d_o), cu.MemFree(d_dout);
  cu.MemFree(d_lse), cu.MemFree(d_gq), cu.MemFree(d_gk), cu.MemFree(d_gv);
  if (d_ws) cu.MemFree(d_ws);
  CUcontext popped;
  cu.CtxPop(&popped);
  free(q), free(k), free(v), free(dout), free(gq), free(gk), free(gv), free(rq), free(rk), free(rv);
  return pass;
}

int main(void) {
  char err[1024];
  /* 1. Register the exported kernels: one call, before or after creating contexts. */
  fg_status s = fg_register_export(embed_flashgen_export(), err, sizeof err);
  if (s != FG_OK) {
    fprintf(stderr, "embed: fg_register_export: %s: %s\n", fg_status_string(s), err);
    return 1;
  }
  /* 2. A context that may only use exported kernels (the default of flashgen_runtime). */
  fg_context_options opt;
  memset(&opt, 0, sizeof opt);
  opt.size = sizeof opt;
  opt.policy = FG_POLICY_EXPORTED_ONLY;
  fg_context *ctx;
  s = fg_context_create(&ctx, &opt);
  if (s != FG_OK) {
    fprintf(stderr, "embed: fg_context_create: %s: %s\n", fg_status_string(s), fg_last_create_error());
    return 1;
  }
  if (load_driver() != 0) return 1;
  CUdevice dev;
  CUcontext cuctx;
  CU_CHECK(cu.Init(0));
  CU_CHECK(cu.DeviceGet(&dev, 0));
  CU_CHECK(cu.PrimaryCtxRetain(&cuctx, dev));
  printf("flashgen %s, runtime only, exported table: %s\n", fg_version(), "embed_flashgen_export()");

  /* 3. Problems covered by the export (examples/embed/variants.txt: d = 64 and 128; with
   * EMBED_HOPPER variants_hopper.txt: d = 256 too, the head dims the backward problems below run
   * first, and a problem past 512 keys, where the built-in rule takes K/V blocks of 80). */
  const problem probs[] = {
      {FG_DTYPE_F16, 0, 2, 4, 4, 128, 128, 64, 4e-3},
      {FG_DTYPE_BF16, 1, 1, 4, 2, 200, 256, 128, 2e-2}, /* GQA, Nq != Nk, causal bottom-right */
      {FG_DTYPE_BF16, 0, 2, 2, 2, 77, 300, 128, 2e-2},  /* ragged tails */
#ifdef EMBED_HOPPER
      {FG_DTYPE_BF16, 1, 1, 4, 2, 100, 130, 256, 2e-2}, /* GQA, Nq != Nk, causal */
      {FG_DTYPE_BF16, 0, 2, 2, 2, 77, 77, 256, 2e-2},   /* a ragged tail, K/V blocks of 64 */
      {FG_DTYPE_BF16, 0, 1, 2, 2, 200, 600, 256, 2e-2}, /* past 512 keys: K/V blocks of 80 */
#endif
  };
  int passed = 0, total = 0;
  for (size_t i = 0; i < sizeof probs / sizeof probs[0]; i++, total++) passed += run(ctx, cuctx, &probs[i]);

  /* 4. A head_dim the export lacks: the documented error, not a compile. */
  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = FG_DTYPE_BF16;
  a.batch = 1, a.heads_q = 1, a.heads_kv = 1, a.seqlen_q = 16, a.seqlen_k = 16, a.head_dim = 96;
  CUdeviceptr in, out;
  CU_CHECK(cu.CtxPush(cuctx));
  CU_CHECK(cu.MemAlloc(&in, 16 * 96 * 2));
  CU_CHECK(cu.MemAlloc(&out, 16 * 96 * 2));
  a.q = a.k = a.v = (const void *)(uintptr_t)in;
  a.o = (void *)(uintptr_t)out;
  s = fg_attention_forward(ctx, &a, NULL);
  total++;
  if (s == FG_ERROR_KERNEL_MISSING && strstr(fg_context_last_error(ctx), "fwd_d96_bf16")) {
    passed++;
    printf("head_dim 96 (not exported): FG_ERROR_KERNEL_MISSING as expected: PASS\n  %s\n",
           fg_context_last_error(ctx));
  } else {
    printf("head_dim 96 (not exported): expected FG_ERROR_KERNEL_MISSING, got %s: FAIL\n  %s\n",
           fg_status_string(s), fg_context_last_error(ctx));
  }

  /* 5. The backward of problems covered by the export (variants.txt: the built-in rule's backward
   * variants of d = 128 bf16 causal and d = 64 f16 non-causal, which is what
   * fg_attention_backward runs under the exported-only policy). Tolerance: a fraction of the
   * gradient's largest magnitude, 16 units of the dtype's precision (2^-8 bf16, 2^-11 f16). */
  const problem bwd[] = {
      {FG_DTYPE_BF16, 1, 1, 4, 2, 100, 130, 128, 16 * 0x1p-8}, /* GQA, Nq != Nk, ragged tails */
      {FG_DTYPE_F16, 0, 2, 2, 2, 64, 64, 64, 16 * 0x1p-11},
#ifdef EMBED_HOPPER
      /* d = 256 (bwd_tmat.cu): causal with GQA and Nq != Nk; non-causal with a ragged tail */
      {FG_DTYPE_BF16, 1, 1, 4, 2, 100, 130, 256, 16 * 0x1p-8},
      {FG_DTYPE_BF16, 0, 2, 2, 2, 77, 77, 256, 16 * 0x1p-8},
#endif
  };
  for (size_t i = 0; i < sizeof bwd / sizeof bwd[0]; i++, total++)
    passed += run_backward(ctx, cuctx, &bwd[i]);

  /* 6. A backward the export lacks (head_dim 96): the documented error too. */
  fg_attention_backward_args b;
  memset(&b, 0, sizeof b);
  b.size = sizeof b;
  b.dtype = FG_DTYPE_BF16;
  b.batch = 1, b.heads_q = 1, b.heads_kv = 1, b.seqlen_q = 16, b.seqlen_k = 16, b.head_dim = 96;
  CUdeviceptr lse, grads;
  CU_CHECK(cu.MemAlloc(&lse, 16 * 4));
  CU_CHECK(cu.MemAlloc(&grads, 3 * 16 * 96 * 2));
  b.q = b.k = b.v = b.d_o = (const void *)(uintptr_t)in; /* inputs may share memory */
  b.o = (const void *)(uintptr_t)out;
  b.lse = (const float *)(uintptr_t)lse;
  b.dq = (void *)(uintptr_t)grads;
  b.dk = (void *)(uintptr_t)(grads + 16 * 96 * 2);
  b.dv = (void *)(uintptr_t)(grads + 2 * 16 * 96 * 2);
  s = fg_attention_backward(ctx, &b, NULL);
  total++;
  if (s == FG_ERROR_KERNEL_MISSING && strstr(fg_context_last_error(ctx), "bwd_d96")) {
    passed++;
    printf("backward head_dim 96 (not exported): FG_ERROR_KERNEL_MISSING as expected: PASS\n  %s\n",
           fg_context_last_error(ctx));
  } else {
    printf("backward head_dim 96 (not exported): expected FG_ERROR_KERNEL_MISSING, got %s: "
           "FAIL\n  %s\n",
           fg_status_string(s), fg_context_last_error(ctx));
  }
  cu.MemFree(in), cu.MemFree(out), cu.MemFree(lse), cu.MemFree(grads);
  CUcontext popped;
  cu.CtxPop(&popped);
  fg_context_destroy(ctx);
  cu.PrimaryCtxRelease(dev);
  printf("%d passed, %d failed: %s\n", passed, total - passed, passed == total ? "PASS" : "FAIL");
  return passed == total ? 0 : 1;
}
