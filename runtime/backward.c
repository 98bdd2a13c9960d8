/* backward.c: fg_attention_backward: validate, choose the backward variant, and launch its plan
 * (templates/bwd.lua, launch(v); carried in fg_kernel_meta): its steps in order (today D =
 * rowsum(dO * O) and the dQ accumulator zeroed, the main K/V-outer kernel, dQ converted; past
 * the plan's threshold of query rows per KV head the main kernel's grid splits them along z and
 * the last step converts dK/dV too, fg_plan_grid; without a mask, a partial last wave of its
 * blocks is split into pieces the same way, fg_bwd_tail); split along the batch past the grid's y
 * limit, with the workspaces the plan declares from the caller or allocated on the stream; a plan
 * with params bwd_tma gets its tensor maps (q, do, k, v) encoded for each launch and passes
 * fg_bwd_tma_params to every step. fg_attention_backward_workspace_size sizes the workspaces from
 * the same plan. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fg_runtime_internal.h"


/* The tail of the main step of plan m for a on ctx's device (core/fg_tail.h): none where the
 * batch goes in several launches (the grid's y limit) or the pieces would not fit the grid's y.
 * A function of the plan and the device only, so the size query and the launch agree. */
fg_plan_tail fg_bwd_tail(const fg_context *ctx, const fg_kernel_meta *m,
                         const fg_attention_backward_args *a) {
  const fg_plan_tail none = {0, 0, 0};
  const fg_plan_step *s = fg_kernel_main(m);
  const uint64_t grid_y = (uint64_t)ctx->limits.max_grid_y;
  if (!s->tail || a->heads_q <= 0 || (uint64_t)a->batch > grid_y / (uint64_t)a->heads_q) return none;
  const uint64_t slots =
      (uint64_t)ctx->limits.sm_count *
      (uint64_t)fg_plan_step_blocks_per_sm(s, ctx->limits.smem_per_sm, ctx->limits.max_threads_per_sm);
  fg_plan_tail t = fg_plan_step_tail(s, slots, a->batch, a->heads_q, a->heads_kv, a->seqlen_q,
                                     a->seqlen_k, a->causal != 0, a->deterministic != 0);
  const uint64_t nkb = ((uint64_t)a->seqlen_k + (uint64_t)s->br - 1) / (uint64_t)s->br;
  return t.blocks && fg_plan_tail_grid_y(&t, nkb) <= grid_y ? t : none;
}

/* Bytes of the workspaces of a plan for a with tail t: what it declares (templates/bwd.lua: the
 * fp32 dQ accumulator, D, in deterministic mode the semaphores, for long query ranges the fp32
 * dK/dV partial sums per key row, and with a tail those of its key blocks). -1 past 2^63. */
static int fg_bwd_workspace_bytes(const fg_kernel_meta *m, const fg_attention_backward_args *a,
                                  const fg_plan_tail *t, uint64_t *bytes,
                                  uint64_t offsets[FG_PLAN_MAX_WORKSPACES]) {
  return fg_plan_workspace_bytes_tail(m, a->batch, a->heads_q, a->heads_kv, a->seqlen_q,
                                      a->seqlen_k, a->deterministic != 0, t->blocks, bytes,
                                      offsets) ||
                 *bytes > (uint64_t)INT64_MAX
             ? -1
             : 0;
}

/* The kernel that serves a (normalised, non-empty) backward problem: forced, or the
 * dispatcher's. ctx is current. */
static fg_status fg_backward_kernel(fg_context *ctx, const fg_attention_backward_args *a,
                                    const fg_variant *forced, const fg_loaded_kernel **k) {
  return forced ? fg_registry_get(ctx, forced, k) : fg_dispatch_backward(ctx, a, k);
}

/* The plan of the kernel that serves a (forced, or the dispatcher's) into *m, read without loading
 * or compiling anything where the binary or the template says it (fg_registry_probe: an exported
 * table, a loaded kernel, the kernel cache, the manifest), else from the kernel, loaded. ctx is
 * current. */
static fg_status fg_backward_plan(fg_context *ctx, const fg_attention_backward_args *a,
                                  const fg_variant *forced, fg_kernel_meta *m) {
  const fg_variant *v = forced;
  if (!v) {
    fg_attention_args f;
    fg_backward_forward_args(a, &f);
    const fg_dispatch *d = NULL;
    fg_status st = fg_dispatch_choose_pass(ctx, FG_PASS_BWD, &f, 0, &d, NULL);
    if (st != FG_OK) return st;
    v = &d->variant;
  }
  char desc[512];
  int known = 0;
  (void)fg_registry_probe(ctx, v, desc, sizeof desc, m, &known);
  if (known) return FG_OK;
  const fg_loaded_kernel *k = NULL;
  fg_status st = fg_backward_kernel(ctx, a, forced, &k);
  if (st == FG_OK) *m = k->meta;
  return st;
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
  *bytes = 0;
  if (a.batch == 0 || a.heads_q == 0 || a.seqlen_q == 0) return FG_OK;
  /* The plan of the kernel that serves the problem declares its workspaces. */
  st = fg_ctx_push(ctx);
  if (st != FG_OK) return st;
  fg_kernel_meta meta;
  st = fg_backward_plan(ctx, &a, NULL, &meta);
  fg_ctx_pop(ctx);
  if (st != FG_OK) return st;
  uint64_t b = 0;
  const fg_plan_tail tail = fg_bwd_tail(ctx, &meta, &a);
  if (fg_bwd_workspace_bytes(&meta, &a, &tail, &b, NULL))
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED, "the backward workspace would exceed 2^63 bytes");
  *bytes = (size_t)b;
  return FG_OK;
}

/* Launches step i of k's plan on grid g with the parameter block at block (fg_bwd_params, or
 * fg_bwd_tma_params for a bwd_tma plan). */
static fg_status fg_launch_one(fg_context *ctx, const fg_loaded_kernel *k, int i,
                               const uint64_t g[3], void *block, CUstream s) {
  if (g[0] == 0 || g[1] == 0) return FG_OK;
  const fg_plan_step *sp = &k->meta.steps[i];
  void *params[] = {block};
  fg_watchdog_launched(sp->entry);
  CUresult r = fg_cu.cuLaunchKernel(k->fn[i], (unsigned)g[0], (unsigned)g[1], (unsigned)g[2],
                                    (unsigned)sp->threads, 1, 1, (unsigned)sp->smem_bytes, s,
                                    params, NULL);
  if (r == FG_CUDA_SUCCESS) return FG_OK;
  char d[512];
  fg_cuda_describe(d, sizeof d, "cuLaunchKernel", r);
  return fg_fail(ctx, fg_cuda_status(r),
                 "launching %s (step %d of the plan of %s; grid %" PRIu64 " x %" PRIu64
                 " x %" PRIu64 ", %d threads, %d B dynamic shared memory): %s",
                 sp->entry, i + 1, k->name, g[0], g[1], g[2], sp->threads, sp->smem_bytes, d);
}

/* The field of the backward parameter block that a workspace is passed in (its plan's param),
 * or NULL when the block has none of that name. */
static unsigned long long *fg_bwd_param_slot(fg_bwd_params *p, const char *param) {
  if (strcmp(param, "workspace") == 0) return &p->workspace;
  if (strcmp(param, "dsum") == 0) return &p->dsum;
  if (strcmp(param, "sem") == 0) return &p->sem;
  if (strcmp(param, "dkv") == 0) return &p->dkv;
  if (strcmp(param, "dkv_tail") == 0) return &p->dkv_tail;
  return NULL;
}

/* ---- tensor maps (plans with params bwd_tma) ---- */

/* The view of map t's tensor in the launch block c: q and do have heads_q heads of seqlen_q rows,
 * k and v heads_kv of seqlen_k; elements of 2 bytes. */
static fg_tmap_view fg_bwd_tmap_view(const fg_plan_tmap *t, const fg_bwd_params *c) {
  fg_tmap_view w = {t->tensor, 0, 0, 0, 0, c->heads_kv, c->seqlen_k, c->batch, c->head_dim, 2};
  switch (t->tensor) {
    case FG_TMAP_Q:
      w.addr = c->q, w.sb = c->q_sb, w.sh = c->q_sh, w.sn = c->q_sn;
      w.heads = c->heads_q, w.rows = c->seqlen_q;
      break;
    case FG_TMAP_DO:
      w.addr = c->d_o, w.sb = c->do_sb, w.sh = c->do_sh, w.sn = c->do_sn;
      w.heads = c->heads_q, w.rows = c->seqlen_q;
      break;
    case FG_TMAP_K: w.addr = c->k, w.sb = c->k_sb, w.sh = c->k_sh, w.sn = c->k_sn; break;
    case FG_TMAP_V: w.addr = c->v, w.sb = c->v_sb, w.sh = c->v_sh, w.sn = c->v_sn; break;
    default: w.tensor = (fg_tmap_tensor)0; break; /* not a backward map (fg_kernel_meta_invalid) */
  }
  return w;
}

fg_status fg_bwd_tma_params_fill(fg_context *ctx, const fg_loaded_kernel *k, const fg_bwd_params *p,
                                 fg_bwd_tma_params *out) {
  const fg_kernel_meta *m = &k->meta;
  out->p = *p;
  fg_tmap_view views[FG_PLAN_MAX_TMAPS] = {{(fg_tmap_tensor)0}};
  for (int i = 0; i < m->n_tmaps && i < FG_PLAN_MAX_TMAPS; i++)
    views[i] = fg_bwd_tmap_view(&m->tmaps[i], p);
  return fg_tmaps_encode(ctx, k, views, out->tmap);
}

/* The parameter block of the launch of batches b0 .. b0 + nb - 1 of p: its batches' base
 * addresses, its batch count, its part of every workspace of the plan m (workspace ws; each
 * starts at offsets[i] and holds per_batch[i] bytes per batch, 0: unused, passed as 0). */
static void fg_bwd_chunk(const fg_kernel_meta *m, const fg_bwd_params *p, int64_t b0, int64_t nb,
                         CUdeviceptr ws, const uint64_t *offsets, const uint64_t *per_batch,
                         fg_bwd_params *c) {
  *c = *p;
  c->batch = nb;
  for (int i = 0; i < m->n_workspaces; i++)
    *fg_bwd_param_slot(c, m->workspaces[i].param) =
        per_batch[i] ? (unsigned long long)ws + offsets[i] + (uint64_t)b0 * per_batch[i] : 0;
  if (b0 > 0) {
    c->q += (unsigned long long)(b0 * p->q_sb * 2);
    c->k += (unsigned long long)(b0 * p->k_sb * 2);
    c->v += (unsigned long long)(b0 * p->v_sb * 2);
    c->o += (unsigned long long)(b0 * p->o_sb * 2);
    c->d_o += (unsigned long long)(b0 * p->do_sb * 2);
    c->dq += (unsigned long long)(b0 * p->dq_sb * 2);
    c->dk += (unsigned long long)(b0 * p->dk_sb * 2);
    c->dv += (unsigned long long)(b0 * p->dv_sb * 2);
    c->lse += (unsigned long long)(b0 * p->heads_q * p->seqlen_q * 4);
  }
}

/* Runs the plan with ctx current: every step in order, for each chunk of batches the grid's y
 * limit allows, on stream s. */
static fg_status fg_backward_launch(fg_context *ctx, const fg_loaded_kernel *k,
                                    const fg_attention_backward_args *a, CUstream s) {
  const fg_kernel_meta *m = &k->meta;
  fg_bwd_params probe;
  memset(&probe, 0, sizeof probe);
  for (int i = 0; i < m->n_workspaces; i++)
    if (!fg_bwd_param_slot(&probe, m->workspaces[i].param))
      return fg_fail(ctx, FG_ERROR_INTERNAL,
                     "kernel %s passes its workspace %s in parameter '%s', which the backward "
                     "parameter block lacks (workspace, dsum, sem, dkv, dkv_tail): rebuild it with this flashgen",
                     k->name, m->workspaces[i].name, m->workspaces[i].param);
  const uint64_t grid_y = (uint64_t)ctx->limits.max_grid_y;
  if ((uint64_t)a->heads_q > grid_y)
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                   "heads_q = %" PRId64 " is more than the grid allows (%" PRIu64 ")", a->heads_q,
                   grid_y);
  uint64_t bytes, offsets[FG_PLAN_MAX_WORKSPACES];
  const fg_plan_tail tail = fg_bwd_tail(ctx, m, a);
  if (fg_bwd_workspace_bytes(&k->meta, a, &tail, &bytes, offsets))
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED, "the backward workspace would exceed 2^63 bytes");
  CUdeviceptr ws = (CUdeviceptr)(uintptr_t)a->workspace;
  fg_workspace own = {0, 0};
  if (!ws && bytes) { /* a caller's workspace was checked against `bytes` before */
    char what[FG_VARIANT_NAME_MAX + 64];
    snprintf(what, sizeof what, "kernel %s (or pass args->workspace)", k->name);
    fg_status st = fg_workspace_alloc(ctx, (size_t)bytes, s, what, &own);
    if (st != FG_OK) return st;
    ws = own.ptr;
  }
  fg_bwd_params p;
  fg_bwd_params_from_args(a, &p);
  p.deterministic = a->deterministic != 0;
  if (tail.blocks) {
    p.tail_first = (long long)tail.first;
    p.tail_blocks = (long long)tail.blocks;
    p.tail_splits = (long long)tail.splits;
  }
  const int64_t chunk = (int64_t)(grid_y / (uint64_t)a->heads_q); /* batches per launch */
  /* Each workspace holds every batch, one after the other (so a chunk's part starts at its first
   * batch's; the dQ accumulator's stays 32-byte aligned, head_dim being a multiple of 8). A
   * workspace the problem does not use (per_batch 0) is passed as 0. */
  uint64_t per_batch[FG_PLAN_MAX_WORKSPACES];
  for (int i = 0; i < m->n_workspaces; i++) {
    const fg_plan_workspace *w = &m->workspaces[i];
    per_batch[i] = (uint64_t)fg_plan_workspace_heads(w, a->heads_q, a->heads_kv) *
                   fg_plan_workspace_units(w, fg_kernel_main(m)->br, a->heads_q, a->heads_kv,
                                           a->seqlen_q, a->seqlen_k, p.deterministic) *
                   (uint64_t)w->bytes;
    /* the tail's: all of it (a launch with a tail is the only one: fg_bwd_tail) */
    if (w->tail) per_batch[i] = tail.blocks * (uint64_t)w->bytes;
  }
  fg_status st = FG_OK;
  fg_bwd_tma_params tp; /* 64-byte aligned (fg_tmap), as the driver's CUtensorMap must be */
  const int tma = m->params == FG_PARAMS_BWD_TMA;
  if (tma && chunk < a->batch) {
    /* Every launch encodes its own maps; all but the last have the first's shape, which fails
     * (if it does) before anything runs. The last's is tried first, so that a refusal launches
     * nothing either. */
    const int64_t last = (a->batch - 1) / chunk * chunk;
    fg_bwd_params c;
    fg_bwd_chunk(m, &p, last, a->batch - last, ws, offsets, per_batch, &c);
    st = fg_bwd_tma_params_fill(ctx, k, &c, &tp);
  }
  for (int64_t b0 = 0; b0 < a->batch && st == FG_OK; b0 += chunk) {
    const int64_t nb = a->batch - b0 < chunk ? a->batch - b0 : chunk;
    fg_bwd_params c;
    fg_bwd_chunk(m, &p, b0, nb, ws, offsets, per_batch, &c);
    void *block = &c;
    if (tma) {
      /* This launch's maps (its batches' base addresses, batch dimension = its batches), then its
       * block with the workspaces: the same for every step of the plan. */
      if ((st = fg_bwd_tma_params_fill(ctx, k, &c, &tp)) != FG_OK) break;
      block = &tp;
    }
    for (int i = 0; i < m->n_steps && st == FG_OK; i++) {
      uint64_t g[3];
      fg_plan_grid(&m->steps[i], ctx->limits.sm_count, nb, a->heads_q, a->heads_kv, a->seqlen_q,
                   a->seqlen_k, g);
      if (i == m->main_step && tail.blocks) g[1] = fg_plan_tail_grid_y(&tail, g[0]);
      st = fg_launch_one(ctx, k, i, g, block, s);
    }
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

  st = fg_ctx_push(ctx);
  if (st != FG_OK) return st;
  st = fg_validate_backward_pointers(ctx, &a, err, sizeof err);
  if (st != FG_OK) {
    fg_ctx_pop(ctx);
    return fg_fail(ctx, st, "%s", err);
  }
  /* A caller's workspace too small for the plan is refused before anything is loaded (where the
   * plan is known without: fg_backward_plan) or launched. */
  fg_kernel_meta plan;
  uint64_t need;
  fg_plan_tail tail;
  if (a.workspace && (st = fg_backward_plan(ctx, &a, forced, &plan)) == FG_OK &&
      (tail = fg_bwd_tail(ctx, &plan, &a), !fg_bwd_workspace_bytes(&plan, &a, &tail, &need, NULL)) &&
      a.workspace_size < need)
    st = fg_fail(ctx, FG_ERROR_INVALID_ARGUMENT,
                 "args->workspace_size = %zu bytes is less than this call needs (%" PRIu64
                 " bytes: fg_attention_backward_workspace_size)",
                 a.workspace_size, need);
  const fg_loaded_kernel *k = NULL;
  if (st == FG_OK) st = fg_backward_kernel(ctx, &a, forced, &k);
  if (st == FG_OK) st = fg_backward_launch(ctx, k, &a, stream);
  fg_ctx_pop(ctx);
  return st;
}

FG_API fg_status fg_attention_backward(fg_context *ctx, const fg_attention_backward_args *args,
                                       CUstream stream) {
  return fg_attention_backward_variant(ctx, args, stream, NULL);
}
