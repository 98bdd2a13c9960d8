/* check_run.c: running one forward case of `flashgen check` on the GPU (fg_check_run): fresh
 * random inputs (a different seed per case, never zeros), O and LSE poisoned with NaN, the
 * forward call, the fp64 and the naive same-dtype reference kernels, then the gate that
 * `flashgen tune` applies too (fg_gate_forward, autotune/gate.c): every element of O checked as
 * written and compared: max|O - ref| <= 2 * max|lowp - ref| + eps(dtype) * max|ref|, LSE within
 * 1e-3 (relative + absolute) of the fp64 LSE, rows that see no key exactly 0 with LSE = -inf.
 * Q and O of more than 2^31 elements are compared on windows of rows. The bad-input cases that
 * need a GPU: the call fails (or, for an empty problem, succeeds) and nothing is written. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fg_autotune.h"
#include "fg_check.h"
#include "fg_runtime_internal.h"

/* Numbers: random inputs from the gate's never-zero fill (fg_fill_random), a seed per case. */
typedef fg_rng rng;

static double half_to_f64(uint16_t h, fg_dtype dt) { return fg_half_to_f32(h, dt); }

double fg_check_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ------------------------------------------------------------------------------------------ */
/* Running a case. */
static void fail(fg_check_result *r, const char *fmt, ...) FG_PRINTF(2, 3);
static void fail(fg_check_result *r, const char *fmt, ...) {
  if (!r->pass && r->reason[0]) return; /* keep the first reason */
  r->pass = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->reason, sizeof r->reason, fmt, ap);
  va_end(ap);
}

/* Element strides of one tensor in a case's layout. */
static void case_strides(const fg_check_case *c, char which, int64_t s[3]) {
  const int qo = which == 'q' || which == 'o';
  const int64_t H = qo ? c->Hq : c->Hkv, N = qo ? c->Nq : c->Nk, d = c->d;
  int layout = c->layout;
  if (layout == FG_CHECK_MIXED) layout = qo ? FG_CHECK_BNHD : FG_CHECK_BHND;
  if (layout == FG_CHECK_BNHD) {
    s[0] = N * H * d, s[1] = d, s[2] = H * d;
  } else if (layout == FG_CHECK_PADDED) {
    const int64_t row = d + 16;
    s[0] = H * N * row, s[1] = N * row, s[2] = row;
  } else {
    s[0] = H * N * d, s[1] = N * d, s[2] = d;
  }
}

/* Device buffers of one case. */
typedef struct bufs {
  CUdeviceptr q, k, v, o, lse, ref_o, ref_lse, low_o, low_lse;
  int64_t nq, nk, nv, no, nrows;
} bufs;

static void free_bufs(fg_context *ctx, bufs *b) {
  CUdeviceptr *p[] = {&b->q, &b->k, &b->v, &b->o, &b->lse, &b->ref_o, &b->ref_lse, &b->low_o,
                      &b->low_lse};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
    fg_dev_free(ctx, *p[i]);
    *p[i] = 0;
  }
}

#define TRY(r, call, what)                                                           \
  do {                                                                               \
    if ((call) != FG_OK) {                                                           \
      fail(r, "%s: %s", what, fg_context_last_error(env->ctx));                      \
      goto done;                                                                     \
    }                                                                                \
  } while (0)

/* Uploads random inputs for Q, K, V (whole allocations, padding included). */
static fg_status upload_random(fg_check_env *env, CUdeviceptr p, int64_t n, rng *r, fg_dtype dt,
                               int normal) {
  if (n == 0) return FG_OK;
  uint16_t *h = malloc((size_t)n * 2);
  if (!h)
    return fg_fail(env->ctx, FG_ERROR_OUT_OF_MEMORY, "out of host memory (%" PRId64 " elements)",
                   n);
  fg_fill_random(h, n, r, dt, normal);
  fg_status st = fg_dev_upload(env->ctx, p, h, (size_t)n * 2);
  free(h);
  return st;
}

/* Runs both references for args (normalised) into b->ref_* and b->low_*. */
static fg_status run_references(fg_check_env *env, const fg_attention_args *a, bufs *b) {
  const fg_loaded_kernel *exact, *low;
  fg_status st = fg_registry_get_reference(env->ctx, a->dtype, 1, &exact);
  if (st != FG_OK) return st;
  if ((st = fg_registry_get_reference(env->ctx, a->dtype, 0, &low)) != FG_OK) return st;
  fg_fwd_params p;
  fg_params_from_args(a, &p);
  p.o_sb = a->heads_q * a->seqlen_q * a->head_dim;
  p.o_sh = a->seqlen_q * a->head_dim;
  p.o_sn = a->head_dim;
  p.o = b->ref_o;
  p.lse = b->ref_lse;
  if ((st = fg_kernel_launch(env->ctx, exact, &p, FG_ELEMS_REFERENCE, env->stream)) != FG_OK)
    return st;
  p.o = b->low_o;
  p.lse = b->low_lse;
  return fg_kernel_launch(env->ctx, low, &p, FG_ELEMS_REFERENCE, env->stream);
}

/* Compares O (host copy of the whole allocation, strides of a) and LSE with the references,
 * rows [0, a->seqlen_q) of every (b, h); the references hold rows [0, nrows_ref) contiguous.
 * The rule is the gate's (fg_gate_forward), the one `flashgen tune` applies. */
static void compare(const fg_attention_args *a, const uint16_t *o, const float *lse,
                    const double *ref_o, const double *ref_lse, const double *low_o,
                    fg_check_result *r) {
  const fg_gate_fwd f = {a->dtype, a->causal, a->batch, a->heads_q, a->seqlen_q, a->seqlen_k,
                         a->head_dim, o, {a->o_stride[0], a->o_stride[1], a->o_stride[2]}, lse,
                         ref_o, ref_lse, low_o};
  fg_gate_result g;
  fg_gate_forward(&f, &g);
  r->max_err = g.err[0];
  r->tol = g.tol[0];
  r->lse_err = g.err[1];
  if (!g.pass) fail(r, "%s", g.reason);
}

static void run_case(fg_check_env *env, const fg_check_case *cs, fg_check_result *r) {
  bufs b;
  memset(&b, 0, sizeof b);
  uint16_t *ho = NULL;
  float *hl = NULL;
  double *hr = NULL, *hrl = NULL, *hlow = NULL;
  r->pass = 1;
  fg_context *ctx = env->ctx;
  fg_attention_args a;
  fg_check_case_args(cs, &a);
  int64_t sq[3], sk[3], sv[3], so[3];
  case_strides(cs, 'q', sq);
  case_strides(cs, 'k', sk);
  case_strides(cs, 'v', sv);
  case_strides(cs, 'o', so);
  if (cs->layout != FG_CHECK_BHND) {
    memcpy(a.q_stride, sq, sizeof sq);
    memcpy(a.k_stride, sk, sizeof sk);
    memcpy(a.v_stride, sv, sizeof sv);
    memcpy(a.o_stride, so, sizeof so);
  }
  b.nq = fg_tensor_extent(cs->B, cs->Hq, cs->Nq, cs->d, sq);
  b.nk = fg_tensor_extent(cs->B, cs->Hkv, cs->Nk, cs->d, sk);
  b.nv = fg_tensor_extent(cs->B, cs->Hkv, cs->Nk, cs->d, sv);
  b.no = fg_tensor_extent(cs->B, cs->Hq, cs->Nq, cs->d, so);
  b.nrows = cs->B * cs->Hq * cs->Nq;
  rng rg = {env->seed ^ fg_seed_of_name(cs->name)};

  TRY(r, fg_dev_alloc(ctx, &b.q, (size_t)b.nq * 2), "allocating Q");
  TRY(r, fg_dev_alloc(ctx, &b.k, (size_t)b.nk * 2), "allocating K");
  TRY(r, fg_dev_alloc(ctx, &b.v, (size_t)b.nv * 2), "allocating V");
  TRY(r, fg_dev_alloc(ctx, &b.o, (size_t)b.no * 2), "allocating O");
  if (cs->lse) TRY(r, fg_dev_alloc(ctx, &b.lse, (size_t)b.nrows * 4), "allocating LSE");
  TRY(r, fg_dev_alloc(ctx, &b.ref_o, (size_t)(b.nrows * cs->d) * 8), "allocating the reference O");
  TRY(r, fg_dev_alloc(ctx, &b.ref_lse, (size_t)b.nrows * 8), "allocating the reference LSE");
  TRY(r, fg_dev_alloc(ctx, &b.low_o, (size_t)(b.nrows * cs->d) * 8), "allocating the lowp O");
  TRY(r, fg_dev_alloc(ctx, &b.low_lse, (size_t)b.nrows * 8), "allocating the lowp LSE");
  TRY(r, upload_random(env, b.q, b.nq, &rg, cs->dtype, 1), "uploading Q");
  TRY(r, upload_random(env, b.k, b.nk, &rg, cs->dtype, 1), "uploading K");
  TRY(r, upload_random(env, b.v, b.nv, &rg, cs->dtype, 0), "uploading V");
  TRY(r, fg_dev_fill16(ctx, b.o, 0xFFFF, (size_t)b.no), "poisoning O");
  if (b.lse) TRY(r, fg_dev_fill32(ctx, b.lse, 0xFFFFFFFFu, (size_t)b.nrows), "poisoning LSE");
  TRY(r, fg_dev_fill32(ctx, b.ref_lse, 0xFFFFFFFFu, (size_t)b.nrows * 2),
      "poisoning the reference");
  TRY(r, fg_dev_synchronize(ctx), "setting up");

  a.q = (const void *)(uintptr_t)b.q;
  a.k = (const void *)(uintptr_t)b.k;
  a.v = (const void *)(uintptr_t)b.v;
  a.o = (void *)(uintptr_t)b.o;
  a.lse = (float *)(uintptr_t)b.lse;
  if (cs->forced) {
    fg_variant_name(&cs->v, r->variant, sizeof r->variant);
  } else {
    fg_attention_args n;
    char err[512];
    const fg_dispatch *d;
    if (fg_validate_args(&a, FG_VALIDATE_CALL, &n, err, sizeof err) == FG_OK &&
        fg_dispatch_choose(ctx, &n, 0, &d, NULL) == FG_OK)
      snprintf(r->variant, sizeof r->variant, "%s", d->variant_name);
  }
  fg_status st = cs->forced ? fg_attention_forward_variant(ctx, &a, env->stream, &cs->v)
                            : fg_attention_forward(ctx, &a, env->stream);
  if (st != FG_OK) {
    fail(r, "fg_attention_forward: %s: %s", fg_status_string(st), fg_context_last_error(ctx));
    goto done;
  }
  fg_attention_args n;
  char err[512];
  if (fg_validate_args(&a, FG_VALIDATE_CALL, &n, err, sizeof err) != FG_OK) {
    fail(r, "validation: %s", err);
    goto done;
  }
  TRY(r, run_references(env, &n, &b), "running the references");
  TRY(r, fg_stream_synchronize(ctx, env->stream), "synchronising (a kernel failed)");

  ho = malloc((size_t)b.no * 2 + 2);
  hl = malloc((size_t)b.nrows * 4 + 4);
  hr = malloc((size_t)(b.nrows * cs->d) * 8 + 8);
  hrl = malloc((size_t)b.nrows * 8 + 8);
  hlow = malloc((size_t)(b.nrows * cs->d) * 8 + 8);
  if (!ho || !hl || !hr || !hrl || !hlow) {
    fail(r, "out of host memory");
    goto done;
  }
  TRY(r, fg_dev_download(ctx, ho, b.o, (size_t)b.no * 2), "downloading O");
  if (b.lse) TRY(r, fg_dev_download(ctx, hl, b.lse, (size_t)b.nrows * 4), "downloading LSE");
  TRY(r, fg_dev_download(ctx, hr, b.ref_o, (size_t)(b.nrows * cs->d) * 8),
      "downloading the reference");
  TRY(r, fg_dev_download(ctx, hrl, b.ref_lse, (size_t)b.nrows * 8), "downloading the reference");
  TRY(r, fg_dev_download(ctx, hlow, b.low_o, (size_t)(b.nrows * cs->d) * 8), "downloading lowp");
  compare(&n, ho, b.lse ? hl : NULL, hr, hrl, hlow, r);
done:
  free(ho);
  free(hl);
  free(hr);
  free(hrl);
  free(hlow);
  free_bufs(ctx, &b);
}

/* Q and O of more than 2^31 elements: a periodic random pattern (period 8191 rows, which divides
 * no power of two, so an offset that wrapped at 32 bits reads different data), every element
 * of O checked as written, and windows of rows (at the start, around element 2^31, at the end)
 * compared with the references run on those rows alone (non-causal rows are independent). */
static void run_big_case(fg_check_env *env, const fg_check_case *cs, fg_check_result *r) {
  fg_context *ctx = env->ctx;
  const int64_t N = cs->Nq, d = cs->d, Nk = cs->Nk, P = 8191, W = 256;
  CUdeviceptr q = 0, k = 0, v = 0, o = 0, lse = 0, ro = 0, rl = 0, lo = 0, ll = 0;
  uint16_t *pat = NULL, *ho = NULL;
  float *hl = NULL;
  double *hr = NULL, *hrl = NULL, *hlow = NULL;
  r->pass = 1;
  snprintf(r->variant, sizeof r->variant, "(dispatcher)");
  rng rg = {env->seed ^ fg_seed_of_name(cs->name)};
  const size_t qbytes = (size_t)(N * d) * 2;
  size_t free_b = 0, total_b = 0;
  if (fg_ctx_push(ctx) == FG_OK) {
    fg_cu.cuMemGetInfo(&free_b, &total_b);
    fg_ctx_pop(ctx);
  }
  if (free_b < 2 * qbytes + ((size_t)N * 4) + ((size_t)1 << 28)) {
    fail(r, "needs %.1f GiB of free device memory, the device has %.1f GiB free",
         (double)(2 * qbytes) / 1073741824.0, (double)free_b / 1073741824.0);
    return;
  }
  TRY(r, fg_dev_alloc(ctx, &q, qbytes), "allocating Q");
  TRY(r, fg_dev_alloc(ctx, &o, qbytes), "allocating O");
  TRY(r, fg_dev_alloc(ctx, &lse, (size_t)N * 4), "allocating LSE");
  TRY(r, fg_dev_alloc(ctx, &k, (size_t)(Nk * d) * 2), "allocating K");
  TRY(r, fg_dev_alloc(ctx, &v, (size_t)(Nk * d) * 2), "allocating V");
  pat = malloc((size_t)(P * d) * 2);
  if (!pat) {
    fail(r, "out of host memory");
    goto done;
  }
  fg_fill_random(pat, P * d, &rg, cs->dtype, 1);
  for (int64_t row = 0; row < N; row += P) {
    const int64_t rows = N - row < P ? N - row : P;
    TRY(r, fg_dev_upload(ctx, q + (CUdeviceptr)(row * d * 2), pat, (size_t)(rows * d) * 2),
        "uploading Q");
  }
  TRY(r, upload_random(env, k, Nk * d, &rg, cs->dtype, 1), "uploading K");
  TRY(r, upload_random(env, v, Nk * d, &rg, cs->dtype, 0), "uploading V");
  TRY(r, fg_dev_fill16(ctx, o, 0xFFFF, (size_t)(N * d)), "poisoning O");
  TRY(r, fg_dev_fill32(ctx, lse, 0xFFFFFFFFu, (size_t)N), "poisoning LSE");
  TRY(r, fg_dev_synchronize(ctx), "setting up");

  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = cs->dtype;
  a.batch = a.heads_q = a.heads_kv = 1;
  a.seqlen_q = N;
  a.seqlen_k = Nk;
  a.head_dim = d;
  a.q = (const void *)(uintptr_t)q;
  a.k = (const void *)(uintptr_t)k;
  a.v = (const void *)(uintptr_t)v;
  a.o = (void *)(uintptr_t)o;
  a.lse = (float *)(uintptr_t)lse;
  {
    fg_attention_args n;
    char err[512];
    const fg_dispatch *dd;
    if (fg_validate_args(&a, FG_VALIDATE_CALL, &n, err, sizeof err) == FG_OK &&
        fg_dispatch_choose(ctx, &n, 0, &dd, NULL) == FG_OK)
      snprintf(r->variant, sizeof r->variant, "%s", dd->variant_name);
  }
  fg_status st = fg_attention_forward(ctx, &a, env->stream);
  if (st != FG_OK) {
    fail(r, "fg_attention_forward: %s: %s", fg_status_string(st), fg_context_last_error(ctx));
    goto done;
  }
  TRY(r, fg_stream_synchronize(ctx, env->stream), "synchronising (the kernel failed)");

  /* Every element of O written and finite, in chunks. */
  {
    const int64_t chunk = INT64_C(1) << 25; /* elements */
    ho = malloc((size_t)chunk * 2);
    if (!ho) {
      fail(r, "out of host memory");
      goto done;
    }
    int64_t bad = 0, first = -1;
    for (int64_t off = 0; off < N * d; off += chunk) {
      const int64_t n = N * d - off < chunk ? N * d - off : chunk;
      TRY(r, fg_dev_download(ctx, ho, o + (CUdeviceptr)(off * 2), (size_t)n * 2), "downloading O");
      for (int64_t i = 0; i < n; i++)
        if (!isfinite(half_to_f64(ho[i], cs->dtype)) && !bad++) first = off + i;
    }
    if (bad) {
      fail(r,
           "%" PRId64 " elements of O are not finite (unwritten or NaN), first at element %" PRId64
           " (row %" PRId64 ")",
           bad, first, first / d);
      goto done;
    }
    free(ho);
    ho = NULL;
  }

  /* Windows of rows against the references. */
  fg_attention_args n;
  char err[512];
  if (fg_validate_args(&a, FG_VALIDATE_CALL, &n, err, sizeof err) != FG_OK) {
    fail(r, "validation: %s", err);
    goto done;
  }
  TRY(r, fg_dev_alloc(ctx, &ro, (size_t)(W * d) * 8), "allocating the reference");
  TRY(r, fg_dev_alloc(ctx, &rl, (size_t)W * 8), "allocating the reference");
  TRY(r, fg_dev_alloc(ctx, &lo, (size_t)(W * d) * 8), "allocating the reference");
  TRY(r, fg_dev_alloc(ctx, &ll, (size_t)W * 8), "allocating the reference");
  ho = malloc((size_t)(W * d) * 2);
  hl = malloc((size_t)W * 4);
  hr = malloc((size_t)(W * d) * 8);
  hrl = malloc((size_t)W * 8);
  hlow = malloc((size_t)(W * d) * 8);
  if (!ho || !hl || !hr || !hrl || !hlow) {
    fail(r, "out of host memory");
    goto done;
  }
  const int64_t starts[4] = {0, (INT64_C(1) << 31) / d - W / 2, N / 2 + 7, N - W};
  double max_err = 0, tol = 1e300, lse_err = 0;
  for (int w = 0; w < 4; w++) {
    const int64_t r0 = starts[w];
    fg_attention_args win = n;
    win.seqlen_q = W;
    win.q = (const char *)n.q + r0 * n.q_stride[2] * 2;
    win.o = (char *)n.o + r0 * n.o_stride[2] * 2;
    win.q_stride[0] = win.q_stride[1] = W * d; /* batch = heads = 1: unused */
    win.o_stride[0] = win.o_stride[1] = W * d;
    bufs b;
    memset(&b, 0, sizeof b);
    b.ref_o = ro, b.ref_lse = rl, b.low_o = lo, b.low_lse = ll;
    TRY(r, run_references(env, &win, &b), "running the references");
    TRY(r, fg_stream_synchronize(ctx, env->stream), "synchronising (a reference failed)");
    TRY(r, fg_dev_download(ctx, ho, o + (CUdeviceptr)(r0 * d * 2), (size_t)(W * d) * 2),
        "downloading O");
    TRY(r, fg_dev_download(ctx, hl, lse + (CUdeviceptr)(r0 * 4), (size_t)W * 4), "downloading LSE");
    TRY(r, fg_dev_download(ctx, hr, ro, (size_t)(W * d) * 8), "downloading the reference");
    TRY(r, fg_dev_download(ctx, hrl, rl, (size_t)W * 8), "downloading the reference");
    TRY(r, fg_dev_download(ctx, hlow, lo, (size_t)(W * d) * 8), "downloading the reference");
    win.o_stride[2] = d; /* the host copy holds the window contiguously */
    fg_check_result wr;
    memset(&wr, 0, sizeof wr);
    wr.pass = 1;
    compare(&win, ho, hl, hr, hrl, hlow, &wr);
    max_err = fmax(max_err, wr.max_err);
    tol = fmin(tol, wr.tol);
    lse_err = fmax(lse_err, wr.lse_err);
    if (!wr.pass) fail(r, "rows %" PRId64 "..%" PRId64 ": %s", r0, r0 + W - 1, wr.reason);
  }
  r->max_err = max_err;
  r->tol = tol;
  r->lse_err = lse_err;
done:
  free(pat);
  free(ho);
  free(hl);
  free(hr);
  free(hrl);
  free(hlow);
  CUdeviceptr all[] = {q, k, v, o, lse, ro, rl, lo, ll};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fg_dev_free(ctx, all[i]);
}

/* Bad input that needs the driver, and empty problems: checks the status, the message and that
 * O and LSE still hold their poison. */
static void run_bad_case(fg_check_env *env, const fg_check_case *cs, fg_check_result *r) {
  fg_context *ctx = env->ctx;
  fg_context *other = NULL;
  CUdeviceptr q = 0, k = 0, v = 0, o = 0, lse = 0, freed = 0, other_k = 0;
  void *host = NULL, *pinned = NULL;
  uint16_t *ho = NULL;
  uint32_t *hl = NULL;
  r->pass = 1;
  snprintf(r->variant, sizeof r->variant, "(none)");
  const int64_t n = cs->B * cs->Hq * cs->Nq * cs->d, rows = cs->B * cs->Hq * cs->Nq;
  const size_t bytes = (size_t)n * 2;
  rng rg = {env->seed ^ fg_seed_of_name(cs->name)};
  TRY(r, fg_dev_alloc(ctx, &q, bytes), "allocating Q");
  TRY(r, fg_dev_alloc(ctx, &k, bytes), "allocating K");
  TRY(r, fg_dev_alloc(ctx, &v, bytes), "allocating V");
  TRY(r, fg_dev_alloc(ctx, &o, bytes + 16), "allocating O");
  TRY(r, fg_dev_alloc(ctx, &lse, (size_t)rows * 4), "allocating LSE");
  TRY(r, upload_random(env, q, n, &rg, FG_DTYPE_BF16, 1), "uploading Q");
  TRY(r, upload_random(env, k, n, &rg, FG_DTYPE_BF16, 1), "uploading K");
  TRY(r, upload_random(env, v, n, &rg, FG_DTYPE_BF16, 0), "uploading V");
  TRY(r, fg_dev_fill16(ctx, o, 0xFFFF, (size_t)n + 8), "poisoning O");
  TRY(r, fg_dev_fill32(ctx, lse, 0xFFFFFFFFu, (size_t)rows), "poisoning LSE");

  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = FG_DTYPE_BF16;
  a.batch = cs->B;
  a.heads_q = cs->Hq;
  a.heads_kv = cs->Hkv;
  a.seqlen_q = cs->Nq;
  a.seqlen_k = cs->Nk;
  a.head_dim = cs->d;
  a.q = (const void *)(uintptr_t)q;
  a.k = (const void *)(uintptr_t)k;
  a.v = (const void *)(uintptr_t)v;
  a.o = (void *)(uintptr_t)o;
  a.lse = (float *)(uintptr_t)lse;
  fg_status want = FG_ERROR_INVALID_ARGUMENT;
  const char *needle = NULL;
  switch (cs->kind) {
    case FG_CHECK_BAD_HOST_Q:
      host = aligned_alloc(64, bytes);
      if (!host) {
        fail(r, "out of host memory");
        goto done;
      }
      memset(host, 0x3c, bytes);
      a.q = host;
      needle = "args->q";
      break;
    case FG_CHECK_BAD_PINNED_K:
      if (fg_host_alloc_pinned(ctx, &pinned, bytes) != FG_OK) {
        fail(r, "cuMemAllocHost: %s", fg_context_last_error(ctx));
        goto done;
      }
      memset(pinned, 0x3c, bytes);
      a.k = pinned;
      needle = "args->k";
      break;
    case FG_CHECK_BAD_FREED_V:
      TRY(r, fg_dev_alloc(ctx, &freed, bytes + 4096), "allocating");
      fg_dev_free(ctx, freed);
      a.v = (const void *)(uintptr_t)freed;
      needle = "args->v";
      break;
    case FG_CHECK_BAD_HOST_LSE:
      host = aligned_alloc(64, (size_t)rows * 4);
      if (!host) {
        fail(r, "out of host memory");
        goto done;
      }
      a.lse = host;
      needle = "args->lse";
      break;
    case FG_CHECK_BAD_MISALIGNED_O:
      a.o = (void *)(uintptr_t)(o + 8);
      needle = "args->o";
      break;
    case FG_CHECK_BAD_OTHER_DEV_K: {
      fg_context_options opt;
      memset(&opt, 0, sizeof opt);
      opt.size = sizeof opt;
      opt.device = env->device == 0 ? 1 : 0;
      opt.quiet = 1;
      if (fg_context_create(&other, &opt) != FG_OK) {
        fail(r, "creating a context on device %d: %s", opt.device, fg_last_create_error());
        goto done;
      }
      if (fg_dev_alloc(other, &other_k, bytes) != FG_OK) {
        fail(r, "allocating on device %d: %s", opt.device, fg_context_last_error(other));
        goto done;
      }
      a.k = (const void *)(uintptr_t)other_k;
      needle = "args->k";
      break;
    }
    case FG_CHECK_BAD_DTYPE:
      a.dtype = (fg_dtype)3;
      needle = "args->dtype";
      break;
    case FG_CHECK_BAD_HEAD_DIM:
      a.head_dim = 100;
      needle = "args->head_dim";
      break;
    case FG_CHECK_EMPTY_BATCH:
      a.batch = 0;
      want = FG_OK;
      break;
    case FG_CHECK_EMPTY_NQ:
      a.seqlen_q = 0;
      want = FG_OK;
      break;
  }
  TRY(r, fg_dev_synchronize(ctx), "setting up");
  fg_status st = fg_attention_forward(ctx, &a, env->stream);
  const char *msg = fg_context_last_error(ctx);
  if (st != want)
    fail(r, "expected %s, got %s: %s", fg_status_string(want), fg_status_string(st), msg);
  else if (needle && !strstr(msg, needle))
    fail(r, "the message does not name %s: \"%s\"", needle, msg);
  else if (env->verbose && msg[0])
    printf("      message: %s\n", msg);
  TRY(r, fg_dev_synchronize(ctx), "synchronising");
  ho = malloc(bytes + 16);
  hl = malloc((size_t)rows * 4);
  if (!ho || !hl) {
    fail(r, "out of host memory");
    goto done;
  }
  TRY(r, fg_dev_download(ctx, ho, o, bytes + 16), "downloading O");
  TRY(r, fg_dev_download(ctx, hl, lse, (size_t)rows * 4), "downloading LSE");
  for (int64_t i = 0; i < n + 8; i++)
    if (ho[i] != 0xFFFF) {
      fail(r, "O was written (element %" PRId64 " = 0x%04x) by a call that %s", i, ho[i],
           want == FG_OK ? "had nothing to do" : "failed");
      break;
    }
  for (int64_t i = 0; i < rows; i++)
    if (hl[i] != 0xFFFFFFFFu) {
      fail(r, "LSE was written (row %" PRId64 ") by a call that %s", i,
           want == FG_OK ? "had nothing to do" : "failed");
      break;
    }
done:
  free(ho);
  free(hl);
  free(host);
  if (pinned) fg_host_free_pinned(ctx, pinned);
  if (other) {
    fg_dev_free(other, other_k);
    fg_context_destroy(other);
  }
  CUdeviceptr all[] = {q, k, v, o, lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fg_dev_free(ctx, all[i]);
}
#undef TRY


void fg_check_run(fg_check_env *env, const fg_check_case *c, fg_check_result *r) {
  memset(r, 0, sizeof *r);
  if (c->kind == FG_CHECK_RUN) run_case(env, c, r);
  else if (c->kind == FG_CHECK_BIG) run_big_case(env, c, r);
  else run_bad_case(env, c, r);
}
