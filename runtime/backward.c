/* backward.c: fg_attention_backward: validate, choose the backward variant, and launch its plan
 * (templates/bwd.lua): D = rowsum(dO * O) and the dQ accumulator zeroed, the main K/V-outer
 * kernel, dQ converted; split along the batch past the grid's y limit, with the fp32 workspace
 * from the caller or allocated on the stream. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fg_runtime_internal.h"


/* Bytes of workspace: (d + 1) floats per (batch, query head, query row), and in deterministic
 * mode a 4-byte semaphore per 16 query rows of each (batch, query head). */
static int fg_bwd_workspace_bytes(const fg_attention_backward_args *a, uint64_t *bytes) {
  uint64_t bh, rows, sems = 0;
  if (__builtin_mul_overflow((uint64_t)a->batch, (uint64_t)a->heads_q, &bh) ||
      __builtin_mul_overflow(bh, (uint64_t)a->seqlen_q, &rows) ||
      __builtin_mul_overflow(rows, (uint64_t)(a->head_dim + 1) * 4u, bytes))
    return -1;
  if (a->deterministic &&
      (__builtin_mul_overflow(bh, ((uint64_t)a->seqlen_q + 15) / 16 * 4, &sems) ||
       __builtin_add_overflow(*bytes, sems, bytes)))
    return -1;
  return 0;
}

FG_API fg_status fg_attention_backward_workspace_size(fg_context *ctx,
                                                      const fg_attention_backward_args *args,
                                                      size_t *bytes) {
  if (!ctx) return FG_ERROR_INVALID_ARGUMENT;
  fg_clear_error(ctx);
  if (!bytes) return fg_fail(ctx, FG_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  fg_attention_backward_args a;
  char err[1024];
  fg_status st = fg_validate_backward_args(args, FG_VALIDATE_SHAPES, &a, err, sizeof err);
  if (st != FG_OK) return fg_fail(ctx, st, "%s", err);
  uint64_t b = 0;
  if (!fg_args_empty(&(fg_attention_args){.batch = a.batch, .heads_q = a.heads_q,
                                          .seqlen_q = a.seqlen_q}) &&
      fg_bwd_workspace_bytes(&a, &b))
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED, "the backward workspace would exceed 2^64 bytes");
  *bytes = (size_t)b;
  return FG_OK;
}

static fg_status fg_launch_one(fg_context *ctx, const fg_loaded_kernel *k, CUfunction fn,
                               const char *what, const uint64_t g[3], int threads, int smem,
                               fg_bwd_params *p, CUstream s) {
  if (g[0] == 0 || g[1] == 0) return FG_OK;
  void *params[] = {p};
  CUresult r = fg_cu.cuLaunchKernel(fn, (unsigned)g[0], (unsigned)g[1], (unsigned)g[2],
                                    (unsigned)threads, 1, 1, (unsigned)smem, s, params, NULL);
  if (r == FG_CUDA_SUCCESS) return FG_OK;
  char d[512];
  fg_cuda_describe(d, sizeof d, "cuLaunchKernel", r);
  return fg_fail(ctx, fg_cuda_status(r),
                 "launching the %s kernel of %s (grid %" PRIu64 " x %" PRIu64
                 ", %d threads, %d B dynamic shared memory): %s",
                 what, k->name, g[0], g[1], threads, smem, d);
}

/* Runs the plan with ctx current. */
static fg_status fg_backward_launch(fg_context *ctx, const fg_loaded_kernel *k,
                                    const fg_attention_backward_args *a, CUstream s) {
  const fg_kernel_meta *m = &k->meta;
  if (m->grid != FG_GRID_KV_TILES || !k->fn_pre || !k->fn_post || m->br <= 0)
    return fg_fail(ctx, FG_ERROR_INTERNAL, "kernel %s is not a backward plan", k->name);
  const uint64_t grid_y = (uint64_t)ctx->limits.max_grid_y;
  if ((uint64_t)a->heads_q > grid_y)
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                   "heads_q = %" PRId64 " is more than the grid allows (%" PRIu64 ")", a->heads_q,
                   grid_y);
  uint64_t bytes;
  if (fg_bwd_workspace_bytes(a, &bytes) || bytes > (uint64_t)INT64_MAX)
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED, "the backward workspace would exceed 2^63 bytes");
  CUdeviceptr ws = (CUdeviceptr)(uintptr_t)a->workspace;
  fg_workspace own = {0, 0};
  if (!ws) { /* a caller's workspace was checked against `bytes` before dispatch */
    char what[FG_VARIANT_NAME_MAX + 64];
    snprintf(what, sizeof what, "kernel %s (or pass args->workspace)", k->name);
    fg_status st = fg_workspace_alloc(ctx, (size_t)bytes, s, what, &own);
    if (st != FG_OK) return st;
    ws = own.ptr;
  }
  fg_bwd_params p;
  fg_bwd_params_from_args(a, &p);
  const int64_t chunk = (int64_t)(grid_y / (uint64_t)a->heads_q); /* batches per launch */
  /* The dQ accumulator of every batch, then D of every batch: each chunk's accumulator starts
   * 32-byte aligned (head_dim is a multiple of 8), which its 16-byte accesses need. */
  const int64_t acc_per_batch = a->heads_q * a->seqlen_q * a->head_dim * 4;
  const int64_t dsum_per_batch = a->heads_q * a->seqlen_q * 4;
  const unsigned long long dsum = (unsigned long long)ws + (unsigned long long)(a->batch * acc_per_batch);
  const int64_t sem_per_batch = a->heads_q * ((a->seqlen_q + 15) / 16) * 4;
  const unsigned long long sem = dsum + (unsigned long long)(a->batch * dsum_per_batch);
  fg_status st = FG_OK;
  for (int64_t b0 = 0; b0 < a->batch && st == FG_OK; b0 += chunk) {
    fg_bwd_params c = p;
    const int64_t nb = a->batch - b0 < chunk ? a->batch - b0 : chunk;
    c.batch = nb;
    c.workspace = (unsigned long long)ws + (unsigned long long)(b0 * acc_per_batch);
    c.dsum = dsum + (unsigned long long)(b0 * dsum_per_batch);
    c.deterministic = a->deterministic != 0;
    c.sem = c.deterministic ? sem + (unsigned long long)(b0 * sem_per_batch) : 0;
    if (b0 > 0) {
      c.q += (unsigned long long)(b0 * p.q_sb * 2);
      c.k += (unsigned long long)(b0 * p.k_sb * 2);
      c.v += (unsigned long long)(b0 * p.v_sb * 2);
      c.o += (unsigned long long)(b0 * p.o_sb * 2);
      c.d_o += (unsigned long long)(b0 * p.do_sb * 2);
      c.dq += (unsigned long long)(b0 * p.dq_sb * 2);
      c.dk += (unsigned long long)(b0 * p.dk_sb * 2);
      c.dv += (unsigned long long)(b0 * p.dv_sb * 2);
      c.lse += (unsigned long long)(b0 * a->heads_q * a->seqlen_q * 4);
    }
    const uint64_t rows_grid[3] = {
        ((uint64_t)a->seqlen_q + FG_BWD_ROWS_PER_BLOCK - 1) / FG_BWD_ROWS_PER_BLOCK,
        (uint64_t)(nb * a->heads_q), 1};
    const uint64_t main_grid[3] = {((uint64_t)a->seqlen_k + (uint64_t)m->br - 1) / (uint64_t)m->br,
                                   (uint64_t)(nb * a->heads_kv), 1};
    st = fg_launch_one(ctx, k, k->fn_pre, "preprocessing", rows_grid, FG_BWD_AUX_THREADS, 0, &c, s);
    if (st == FG_OK)
      st = fg_launch_one(ctx, k, k->fn, "main", main_grid, m->threads, m->smem_bytes, &c, s);
    if (st == FG_OK)
      st = fg_launch_one(ctx, k, k->fn_post, "dQ conversion", rows_grid, FG_BWD_AUX_THREADS, 0,
                         &c, s);
  }
  fg_workspace_free(ctx, &own, s);
  return st;
}

fg_status fg_attention_backward_variant(fg_context *ctx, const fg_attention_backward_args *args,
                                        CUstream stream, const fg_variant *forced) {
  if (!ctx) return FG_ERROR_INVALID_ARGUMENT;
  fg_clear_error(ctx);
  fg_attention_backward_args a;
  char err[1024];
  fg_status st = fg_validate_backward_args(args, FG_VALIDATE_CALL, &a, err, sizeof err);
  if (st != FG_OK) return fg_fail(ctx, st, "%s", err);
  if (forced && !(forced->pass == FG_PASS_BWD && forced->d == a.head_dim &&
                  forced->dtype == a.dtype && (forced->causal != 0) == (a.causal != 0))) {
    char name[FG_VARIANT_NAME_MAX] = "?";
    fg_variant_name(forced, name, sizeof name);
    return fg_fail(ctx, FG_ERROR_INVALID_ARGUMENT,
                   "variant %s does not serve this backward problem (head_dim %" PRId64
                   ", %s, %s)",
                   name, a.head_dim, fg_dtype_name(a.dtype), a.causal ? "causal" : "non-causal");
  }
  if (a.batch == 0 || a.heads_q == 0 || a.seqlen_q == 0) return FG_OK;
  /* A caller's workspace too small is refused before any kernel is loaded (or compiled). */
  uint64_t need;
  if (a.workspace && !fg_bwd_workspace_bytes(&a, &need) && a.workspace_size < need)
    return fg_fail(ctx, FG_ERROR_INVALID_ARGUMENT,
                   "args->workspace_size = %zu bytes is less than this call needs (%" PRIu64
                   " bytes: fg_attention_backward_workspace_size)",
                   a.workspace_size, need);

  st = fg_ctx_push(ctx);
  if (st != FG_OK) return st;
  st = fg_validate_backward_pointers(ctx, &a, err, sizeof err);
  if (st != FG_OK) {
    fg_ctx_pop(ctx);
    return fg_fail(ctx, st, "%s", err);
  }
  const fg_loaded_kernel *k = NULL;
  st = forced ? fg_registry_get(ctx, forced, &k) : fg_dispatch_backward(ctx, &a, &k);
  if (st == FG_OK) st = fg_backward_launch(ctx, k, &a, stream);
  fg_ctx_pop(ctx);
  return st;
}

FG_API fg_status fg_attention_backward(fg_context *ctx, const fg_attention_backward_args *args,
                                       CUstream stream) {
  return fg_attention_backward_variant(ctx, args, stream, NULL);
}
