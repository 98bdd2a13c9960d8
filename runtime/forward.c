/* forward.c: fg_attention_forward (validate, empty problems, dispatch, launch) and launching a
 * loaded kernel from its contract: the grid, splitting along the batch past the grid's y limit,
 * the stream-ordered workspace, and the tensor maps of plans that take them (fwd_tma: q, k, v, o
 * picked from each launch's block and encoded by tmap.c). */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "fg_runtime_internal.h"

#define FG_GRID_X_LIMIT 2147483647ull

void fg_plan_grid(const fg_plan_step *s, int sm_count, int64_t batch, int64_t heads_q,
                  int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, uint64_t grid[3]) {
  const uint64_t bh = (uint64_t)batch * (uint64_t)heads_q, br = s->br > 0 ? (uint64_t)s->br : 0;
  grid[0] = grid[1] = grid[2] = 1;
  switch (s->grid) {
    case FG_GRID_Q_TILES:
    case FG_GRID_Q_TILE_PAIRS: /* clusters of two blocks along x: an even count */
      grid[0] = br ? ((uint64_t)seqlen_q + br - 1) / br : 0;
      if (s->grid == FG_GRID_Q_TILE_PAIRS) grid[0] += grid[0] % 2;
      grid[1] = bh;
      break;
    case FG_GRID_HEADS: grid[0] = bh; break;
    case FG_GRID_ROWS:
      grid[0] = (uint64_t)seqlen_q;
      grid[1] = bh;
      break;
    case FG_GRID_KV_TILES:
      grid[0] = br ? ((uint64_t)seqlen_k + br - 1) / br : 0;
      grid[1] = (uint64_t)batch * (uint64_t)heads_kv;
      grid[2] = fg_plan_step_splits(s, heads_q, heads_kv, seqlen_q); /* long query ranges */
      break;
    case FG_GRID_PERSISTENT: {
      /* bh is at most the grid's y limit per launch (the batch is split as for q_tiles) and the
       * query tiles below 2^31, so the product fits. */
      const uint64_t tiles = (br ? ((uint64_t)seqlen_q + br - 1) / br : 0) * bh;
      grid[0] = sm_count > 0 && tiles > (uint64_t)sm_count ? (uint64_t)sm_count : tiles;
      break;
    }
  }
}

void fg_launch_grid(const fg_plan_step *s, int sm_count, const fg_fwd_params *p,
                    uint64_t grid[3]) {
  fg_plan_grid(s, sm_count, p->batch, p->heads_q, p->heads_kv, p->seqlen_q, p->seqlen_k, grid);
}

/* ---- tensor maps (plans with params fwd_tma) ---- */

/* The view of map t's tensor in the launch block c (elements of el's sizes). */
static fg_tmap_view fg_fwd_tmap_view(const fg_plan_tmap *t, const fg_fwd_params *c,
                                     fg_launch_elems el) {
  fg_tmap_view w = {t->tensor, 0, 0, 0, 0, c->heads_kv, c->seqlen_k, c->batch, c->head_dim, el.in};
  switch (t->tensor) {
    case FG_TMAP_Q:
      w.addr = c->q, w.sb = c->q_sb, w.sh = c->q_sh, w.sn = c->q_sn;
      w.heads = c->heads_q, w.rows = c->seqlen_q;
      break;
    case FG_TMAP_K: w.addr = c->k, w.sb = c->k_sb, w.sh = c->k_sh, w.sn = c->k_sn; break;
    case FG_TMAP_V: w.addr = c->v, w.sb = c->v_sb, w.sh = c->v_sh, w.sn = c->v_sn; break;
    case FG_TMAP_O:
      w.addr = c->o, w.sb = c->o_sb, w.sh = c->o_sh, w.sn = c->o_sn;
      w.heads = c->heads_q, w.rows = c->seqlen_q, w.elem_size = el.out;
      break;
    default: w.tensor = (fg_tmap_tensor)0; break; /* not a forward map (fg_kernel_meta_invalid) */
  }
  return w;
}

fg_status fg_fwd_tma_params_fill(fg_context *ctx, const fg_loaded_kernel *k, const fg_fwd_params *p,
                                 fg_launch_elems elems, fg_fwd_tma_params *out) {
  const fg_kernel_meta *m = &k->meta;
  out->p = *p;
  fg_tmap_view views[FG_PLAN_MAX_TMAPS] = {{(fg_tmap_tensor)0}};
  for (int i = 0; i < m->n_tmaps && i < FG_PLAN_MAX_TMAPS; i++)
    views[i] = fg_fwd_tmap_view(&m->tmaps[i], p, elems);
  return fg_tmaps_encode(ctx, k, views, out->tmap);
}

/* Launch numbers (fg_fwd_params.tile_epoch): the epoch a q_tma_d kernel writes into its tile
 * counter, a word of its workspace that holds whatever the memory held before (templates/
 * fwd_tma.cu, dyn_ticket). They run through 0x7F800001 .. 0x7FBFFFFE: as the high half of that
 * word, the bits of a signalling NaN, which no float of another workspace holds (arithmetic gives
 * quiet NaNs) and which the integers there (semaphores, counts) never reach; never 0, the value
 * the kernels leave their counter at, nor 0xFFFFFFFF, flashgen check's poison. */
static _Atomic uint64_t fg_next_launch = 0;
static unsigned long long fg_launch_epoch(void) {
  return 0x7F800001ull + atomic_fetch_add(&fg_next_launch, 1) % 0x3FFFFEull;
}

/* The parameter block of the launch of batches b0 .. b0 + chunk - 1 (fewer at the end): the
 * base addresses of its batches, its batch count, its part of the workspace ws, and with a
 * workspace its number. */
static void fg_launch_chunk(const fg_fwd_params *p, int64_t b0, int64_t chunk, fg_launch_elems el,
                            CUdeviceptr ws, uint64_t ws_per_batch, fg_fwd_params *c) {
  *c = *p;
  c->batch = p->batch - b0 < chunk ? p->batch - b0 : chunk;
  if (b0 > 0) {
    c->q += (unsigned long long)(b0 * p->q_sb * el.in);
    c->k += (unsigned long long)(b0 * p->k_sb * el.in);
    c->v += (unsigned long long)(b0 * p->v_sb * el.in);
    c->o += (unsigned long long)(b0 * p->o_sb * el.out);
    if (c->lse) c->lse += (unsigned long long)(b0 * p->heads_q * p->seqlen_q * el.lse);
  }
  if (ws) c->workspace = ws;
  if (c->workspace && b0 > 0) c->workspace += (unsigned long long)((uint64_t)b0 * ws_per_batch);
  /* Only a kernel with a workspace can read its number (q_tma_d's counter): the others' launches
   * take no atomic on a counter every thread of the process shares. */
  c->tile_epoch = c->workspace ? fg_launch_epoch() : 0;
}

/* Launches with the context already current. */
static fg_status fg_launch_current(fg_context *ctx, const fg_loaded_kernel *k,
                                   const fg_fwd_params *p, fg_launch_elems el, CUstream s) {
  const fg_kernel_meta *m = &k->meta;
  if (p->batch <= 0 || p->heads_q <= 0 || p->seqlen_q <= 0) return FG_OK;
  /* A forward plan is one kernel; its workspaces (kv_outer: O, m and l in fp32) are passed in
   * p->workspace, one after the other (templates/fwd.lua). */
  if (m->n_steps != 1)
    return fg_fail(ctx, FG_ERROR_INTERNAL,
                   "kernel %s has a plan of %d steps; a forward plan has one (rebuild it)",
                   k->name, m->n_steps);
  const fg_plan_step *sp = &m->steps[0];
  const uint64_t bh_limit =
      sp->grid == FG_GRID_HEADS ? FG_GRID_X_LIMIT : (uint64_t)ctx->limits.max_grid_y;
  if ((uint64_t)p->heads_q > bh_limit)
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                   "heads_q = %lld is more than the grid allows (%" PRIu64 ") for kernel %s",
                   p->heads_q, bh_limit, k->name);
  const int64_t chunk = (int64_t)(bh_limit / (uint64_t)p->heads_q); /* batches per launch */
  {
    uint64_t g[3];
    fg_launch_grid(sp, ctx->limits.sm_count, p, g);
    if (g[0] > FG_GRID_X_LIMIT)
      return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                     "seqlen_q = %lld needs %" PRIu64 " blocks along x for kernel %s; the grid "
                     "allows %llu",
                     p->seqlen_q, g[0], k->name, FG_GRID_X_LIMIT);
  }

  /* Workspace: what the plan declares per (batch, head, query row), stream-ordered. A forward
   * workspace is one block per batch: batch b's part starts at b * bytes / batch. */
  fg_workspace own = {0, 0};
  uint64_t ws_bytes = 0;
  if (fg_plan_workspace_bytes(m, p->batch, p->heads_q, p->heads_kv, p->seqlen_q, p->seqlen_k, 0,
                              &ws_bytes, NULL) ||
      ws_bytes > (uint64_t)INT64_MAX)
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED, "the workspace of kernel %s would exceed 2^63 B",
                   k->name);
  if (m->n_workspaces > 1)
    return fg_fail(ctx, FG_ERROR_INTERNAL,
                   "kernel %s declares %d workspaces; a forward kernel takes one (rebuild it)",
                   k->name, m->n_workspaces);
  const uint64_t ws_per_batch = ws_bytes / (uint64_t)p->batch;
  if (ws_bytes > 0 && p->workspace == 0) {
    char what[FG_VARIANT_NAME_MAX + 64];
    snprintf(what, sizeof what, "kernel %s (%s, %d B per query row)", k->name,
             m->workspaces[0].name, m->workspaces[0].bytes);
    fg_status st = fg_workspace_alloc(ctx, (size_t)ws_bytes, s, what, &own);
    if (st != FG_OK) return st;
  }
  const CUdeviceptr ws = own.ptr;

  fg_status st = FG_OK;
  fg_fwd_tma_params tp; /* 64-byte aligned (fg_tmap), as the driver's CUtensorMap must be */
  const int tma = m->params == FG_PARAMS_FWD_TMA;
  if (tma && chunk < p->batch) {
    /* Every launch encodes its own maps; all but the last have the first's shape, which fails
     * (if it does) before anything runs. The last's is tried first, so that a refusal launches
     * nothing either. */
    fg_fwd_params c;
    fg_launch_chunk(p, (p->batch - 1) / chunk * chunk, chunk, el, ws, ws_per_batch, &c);
    st = fg_fwd_tma_params_fill(ctx, k, &c, el, &tp);
  }
  for (int64_t b0 = 0; st == FG_OK && b0 < p->batch; b0 += chunk) {
    fg_fwd_params c;
    fg_launch_chunk(p, b0, chunk, el, ws, ws_per_batch, &c);
    uint64_t g[3];
    fg_launch_grid(sp, ctx->limits.sm_count, &c, g);
    void *params[] = {&c};
    if (tma) {
      /* Each launch's own maps: its batches' base addresses, batch dimension = its batches. */
      if ((st = fg_fwd_tma_params_fill(ctx, k, &c, el, &tp)) != FG_OK) break;
      params[0] = &tp;
    }
    fg_watchdog_launched(sp->entry);
    CUresult r = fg_cu.cuLaunchKernel(k->fn[0], (unsigned)g[0], (unsigned)g[1], (unsigned)g[2],
                                      (unsigned)sp->threads, 1, 1, (unsigned)sp->smem_bytes, s,
                                      params, NULL);
    if (r != FG_CUDA_SUCCESS) {
      char d[512];
      fg_cuda_describe(d, sizeof d, "cuLaunchKernel", r);
      st = fg_fail(ctx, fg_cuda_status(r),
                   "launching kernel %s (grid %" PRIu64 " x %" PRIu64 " x %" PRIu64
                   ", %d threads, %d B dynamic shared memory): %s",
                   k->name, g[0], g[1], g[2], sp->threads, sp->smem_bytes, d);
      break;
    }
  }
  fg_workspace_free(ctx, &own, s);
  return st;
}

fg_status fg_kernel_launch(fg_context *ctx, const fg_loaded_kernel *k, const fg_fwd_params *p,
                           fg_launch_elems elems, CUstream s) {
  fg_status st = fg_ctx_push(ctx);
  if (st != FG_OK) return st;
  st = fg_launch_current(ctx, k, p, elems, s);
  fg_ctx_pop(ctx);
  return st;
}

static fg_status fg_forward(fg_context *ctx, const fg_attention_args *args, CUstream stream,
                            const fg_variant *forced) {
  if (!ctx) return FG_ERROR_INVALID_ARGUMENT;
  fg_clear_error(ctx);
  fg_attention_args a;
  char err[1024];
  fg_status st = fg_validate_args(args, FG_VALIDATE_CALL, &a, err, sizeof err);
  if (st != FG_OK) return fg_fail(ctx, st, "%s", err);
  if (forced && !(forced->pass == FG_PASS_FWD && forced->d == a.head_dim &&
                  forced->dtype == a.dtype && (forced->causal != 0) == (a.causal != 0))) {
    char name[FG_VARIANT_NAME_MAX] = "?";
    fg_variant_name(forced, name, sizeof name);
    return fg_fail(ctx, FG_ERROR_INVALID_ARGUMENT,
                   "variant %s does not serve this problem (head_dim %" PRId64 ", %s, %s)", name,
                   a.head_dim, fg_dtype_name(a.dtype), a.causal ? "causal" : "non-causal");
  }
  if (fg_args_empty(&a)) return FG_OK;

  st = fg_ctx_push(ctx);
  if (st != FG_OK) return st;
  st = fg_validate_pointers(ctx, &a, err, sizeof err);
  if (st != FG_OK) {
    fg_ctx_pop(ctx);
    return fg_fail(ctx, st, "%s", err);
  }
  const fg_loaded_kernel *k = NULL;
  if (forced) {
    st = fg_registry_get(ctx, forced, &k);
  } else {
    const fg_dispatch *d;
    st = fg_dispatch_choose(ctx, &a, 1, &d, &k);
  }
  if (st == FG_OK) {
    fg_fwd_params p;
    fg_params_from_args(&a, &p);
    st = fg_launch_current(ctx, k, &p, FG_ELEMS_FORWARD, stream);
  }
  fg_ctx_pop(ctx);
  return st;
}

FG_API fg_status fg_attention_forward(fg_context *ctx, const fg_attention_args *args,
                                      CUstream stream) {
  return fg_forward(ctx, args, stream, NULL);
}

fg_status fg_attention_forward_variant(fg_context *ctx, const fg_attention_args *args,
                                       CUstream stream, const fg_variant *v) {
  return fg_forward(ctx, args, stream, v);
}
