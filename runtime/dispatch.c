/* dispatch.c: problem -> key (pass, d, dtype, causal, shape bucket) -> variant, memoised per
 * context, the same way for every pass (forward, backward): exported choice, tuned record
 * (exact bucket, then nearest), the pass's built-in rule (the key and its buckets are
 * core/fg_problem.h's); and fg_explain / fg_explain_backward, which say what would run and why
 * without compiling or launching anything. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_runtime_internal.h"

/* ------------------------------------------------------------------------------------------ */
/* The memo: packed key -> decision. Entries are never freed before the context (callers keep
 * pointers); fg_dispatch_forget starts a new generation instead. */
#define FG_MEMO_BUCKETS 64

typedef struct fg_memo_entry {
  uint32_t key;
  uint64_t gen;
  uint64_t exp_gen; /* exported tables registered when decided */
  fg_dispatch d;
  const fg_loaded_kernel *kernel; /* guarded by the memo lock */
  struct fg_memo_entry *next;
} fg_memo_entry;

struct fg_dispatch_memo {
  pthread_mutex_t lock;
  uint64_t gen;
  fg_memo_entry *buckets[FG_MEMO_BUCKETS];
};

fg_status fg_dispatch_memo_create(fg_context *ctx) {
  fg_dispatch_memo *m = calloc(1, sizeof *m);
  if (!m) return FG_ERROR_OUT_OF_MEMORY;
  pthread_mutex_init(&m->lock, NULL);
  ctx->memo = m;
  return FG_OK;
}

void fg_dispatch_memo_destroy(fg_context *ctx) {
  fg_dispatch_memo *m = ctx->memo;
  if (!m) return;
  for (int b = 0; b < FG_MEMO_BUCKETS; b++) {
    fg_memo_entry *e = m->buckets[b];
    while (e) {
      fg_memo_entry *n = e->next;
      free(e);
      e = n;
    }
  }
  pthread_mutex_destroy(&m->lock);
  free(m);
  ctx->memo = NULL;
}

void fg_dispatch_forget(fg_context *ctx) {
  pthread_mutex_lock(&ctx->memo->lock);
  ctx->memo->gen++;
  pthread_mutex_unlock(&ctx->memo->lock);
}

static uint32_t fg_pack_key(const fg_problem *p) {
  int lg = 0;
  while (((int64_t)1 << lg) < p->nk) lg++;
  return ((((uint32_t)p->pass * 512u + (uint32_t)p->d) * 4u + (uint32_t)p->dtype) * 2u +
          (uint32_t)(p->causal != 0)) * 64u + (uint32_t)lg;
}

static fg_memo_entry *fg_memo_find(fg_dispatch_memo *m, uint32_t key) {
  for (fg_memo_entry *e = m->buckets[key % FG_MEMO_BUCKETS]; e; e = e->next)
    if (e->key == key && e->gen == m->gen && e->exp_gen == fg_exported_generation()) return e;
  return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Deciding. */
typedef struct fg_candidate {
  fg_variant v;
  char rule[768];
} fg_candidate;

static fg_status fg_decide(fg_context *ctx, fg_pass pass, const fg_attention_args *a,
                           fg_dispatch *out) {
  const int d = (int)a->head_dim, causal = a->causal != 0;
  const fg_dtype dtype = a->dtype;
  const fg_problem prob = fg_problem_make(pass, d, dtype, causal, a->seqlen_k);
  char prefix[FG_PROBLEM_KEY_MAX];
  memset(out, 0, sizeof *out);
  fg_problem_format(&prob, out->key, sizeof out->key);
  fg_problem_prefix(&prob, prefix, sizeof prefix);

  fg_candidate cand[4];
  int n = 0;
  char why[512];
  if (fg_exported_choice_for(ctx, &prob, &cand[n].v, why, sizeof why) &&
      fg_problem_served_by(&prob, &cand[n].v)) {
    snprintf(cand[n].rule, sizeof cand[n].rule, "%s", why);
    n++;
  }
  if (ctx->loader && ctx->loader->tuned(ctx, &prob, &cand[n].v, cand[n].rule, sizeof cand[n].rule))
    n++;
  cand[n].v = fg_problem_builtin(&prob, ctx->arch);
  snprintf(cand[n].rule, sizeof cand[n].rule, "the built-in rule (%s)",
           n ? "after the tuned choice above" : "no tuning record for this key");
  n++;
  const int jit = fg_policy_allows_jit(ctx);
  if (!jit && fg_exported_any(ctx, &cand[n - 1].v, &cand[n].v)) {
    snprintf(cand[n].rule, sizeof cand[n].rule,
             "an exported kernel with the same head_dim, dtype and masking (no tuned or built-in "
             "choice is available under the policy '%s')",
             fg_policy_name(ctx->policy));
    n++;
  }

  int pick = -1;
  char tried[1536] = "";
  if (jit) {
    pick = 0;
  } else {
    for (int i = 0; i < n && pick < 0; i++) {
      char desc[1024];
      fg_kernel_meta meta;
      int known;
      fg_binary_source src = fg_registry_probe(ctx, &cand[i].v, desc, sizeof desc, &meta, &known);
      if (src == FG_BINARY_LOADED || src == FG_BINARY_EXPORTED || src == FG_BINARY_CACHED) {
        pick = i;
      } else {
        char name[FG_VARIANT_NAME_MAX];
        fg_variant_name(&cand[i].v, name, sizeof name);
        size_t l = strlen(tried);
        snprintf(tried + l, sizeof tried - l, "%s%s (%s)", l ? "; " : "", name, desc);
      }
    }
  }
  if (pick < 0) {
    char summary[768];
    fg_exported_summary(ctx, summary, sizeof summary);
    return fg_fail(ctx, FG_ERROR_KERNEL_MISSING,
                   "no %s kernel for problem %s (batch %" PRId64 ", heads_q %" PRId64
                   ", heads_kv %" PRId64 ", seqlen_q %" PRId64 ", seqlen_k %" PRId64
                   ", head_dim %d, %s, %s) on %s (%s) under the policy '%s', which forbids "
                   "compiling. Tried: %s. Exported kernels: %s.",
                   pass == FG_PASS_BWD ? "backward" : "forward", out->key, a->batch, a->heads_q, a->heads_kv, a->seqlen_q, a->seqlen_k, d,
                   fg_dtype_name(dtype), causal ? "causal" : "non-causal", ctx->limits.name,
                   fg_arch_name(ctx->arch), fg_policy_name(ctx->policy), tried, summary);
  }
  out->variant = cand[pick].v;
  fg_variant_name(&out->variant, out->variant_name, sizeof out->variant_name);
  snprintf(out->rule, sizeof out->rule, "%s", cand[pick].rule);
  return FG_OK;
}

fg_status fg_dispatch_choose(fg_context *ctx, const fg_attention_args *a, int load_kernel,
                             const fg_dispatch **out, const fg_loaded_kernel **kernel) {
  return fg_dispatch_choose_pass(ctx, FG_PASS_FWD, a, load_kernel, out, kernel);
}

fg_status fg_dispatch_backward(fg_context *ctx, const fg_attention_backward_args *b,
                               const fg_loaded_kernel **kernel) {
  fg_attention_args f;
  fg_backward_forward_args(b, &f);
  const fg_dispatch *d = NULL;
  return fg_dispatch_choose_pass(ctx, FG_PASS_BWD, &f, 1, &d, kernel);
}

fg_status fg_dispatch_choose_pass(fg_context *ctx, fg_pass pass, const fg_attention_args *a,
                                  int load_kernel, const fg_dispatch **out,
                                  const fg_loaded_kernel **kernel) {
  fg_dispatch_memo *m = ctx->memo;
  const fg_problem prob = fg_problem_make(pass, (int)a->head_dim, a->dtype, a->causal,
                                         a->seqlen_k);
  const uint32_t key = fg_pack_key(&prob);
  *out = NULL;
  pthread_mutex_lock(&m->lock);
  fg_memo_entry *e = fg_memo_find(m, key);
  if (e && (!load_kernel || e->kernel)) {
    if (load_kernel) *kernel = e->kernel;
    pthread_mutex_unlock(&m->lock);
    *out = &e->d;
    return FG_OK;
  }
  pthread_mutex_unlock(&m->lock);

  if (!e) {
    const uint64_t exp_gen = fg_exported_generation(); /* before deciding: never newer than seen */
    fg_memo_entry *ne = calloc(1, sizeof *ne);
    if (!ne) return fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "out of host memory in the dispatcher");
    fg_status st = fg_decide(ctx, pass, a, &ne->d);
    if (st != FG_OK) { /* not memoised: an exported table registered later may change it */
      free(ne);
      return st;
    }
    ne->key = key;
    ne->exp_gen = exp_gen;
    pthread_mutex_lock(&m->lock);
    e = fg_memo_find(m, key); /* another thread may have decided meanwhile */
    if (!e) {
      ne->gen = m->gen;
      ne->next = m->buckets[key % FG_MEMO_BUCKETS];
      m->buckets[key % FG_MEMO_BUCKETS] = ne;
      e = ne;
      ne = NULL;
    }
    pthread_mutex_unlock(&m->lock);
    free(ne);
  }
  *out = &e->d;
  if (!load_kernel) return FG_OK;
  const fg_loaded_kernel *k = NULL;
  fg_status st = fg_registry_get(ctx, &e->d.variant, &k);
  if (st != FG_OK) return st;
  pthread_mutex_lock(&m->lock);
  e->kernel = k;
  pthread_mutex_unlock(&m->lock);
  *kernel = k;
  return FG_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* fg_explain */
typedef struct fg_text {
  char *buf;
  size_t len, used;
} fg_text;

static void fg_text_add(fg_text *t, const char *fmt, ...) FG_PRINTF(2, 3);
static void fg_text_add(fg_text *t, const char *fmt, ...) {
  if (!t->buf || t->len == 0 || t->used + 1 >= t->len) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->buf + t->used, t->len - t->used, fmt, ap);
  va_end(ap);
  if (n > 0) t->used += (size_t)n < t->len - t->used ? (size_t)n : t->len - t->used - 1;
}

/* The lines every explanation starts with: the problem (a: the forward view, normalised), the
 * device and the policy; for an empty call (nothing launched) that line too, and returns 1. */
static int fg_explain_head(fg_context *ctx, fg_text *t, const char *what,
                           const fg_attention_args *a) {
  fg_text_add(t,
              "problem: %s, batch %" PRId64 ", heads_q %" PRId64 ", heads_kv %" PRId64
              ", seqlen_q %" PRId64 ", seqlen_k %" PRId64 ", head_dim %" PRId64
              ", %s, %s, scale %g%s\n",
              what, a->batch, a->heads_q, a->heads_kv, a->seqlen_q, a->seqlen_k, a->head_dim,
              fg_dtype_name(a->dtype), a->causal ? "causal (bottom-right aligned)" : "non-causal",
              (double)a->scale, what[0] == 'f' && a->lse ? ", writes LSE" : "");
  fg_text_add(
      t, "device: %d, %s (compute capability %d.%d, %s, %d SMs, %d B shared memory per block)\n",
      ctx->device, ctx->limits.name, ctx->limits.cc_major, ctx->limits.cc_minor,
      fg_arch_name(ctx->arch), ctx->limits.sm_count, ctx->limits.smem_optin_per_block);
  fg_text_add(t, "policy: %s\n", fg_policy_name(ctx->policy));
  if (!fg_args_empty(a)) return 0;
  fg_text_add(t, "nothing to launch: batch, heads_q or seqlen_q is 0 (the call returns at once "
                 "and touches nothing)\n");
  return 1;
}

/* The dispatcher's decision for pass, in lines: key, choice, variant, binary. Returns FG_OK with
 * the decision in *d, the binary's source in *src and its launch contract in *meta (when
 * *known), or the failure (also in the text). */
static fg_status fg_explain_choice(fg_context *ctx, fg_text *t, fg_pass pass,
                                   const fg_attention_args *a, const fg_dispatch **d,
                                   fg_binary_source *src, fg_kernel_meta *meta, int *known) {
  fg_status st = fg_dispatch_choose_pass(ctx, pass, a, 0, d, NULL);
  const fg_problem prob = fg_problem_make(pass, (int)a->head_dim, a->dtype, a->causal,
                                         a->seqlen_k);
  char key[FG_PROBLEM_KEY_MAX];
  fg_problem_format(&prob, key, sizeof key);
  fg_text_add(t, "key: %s (seqlen_k %" PRId64 " -> bucket %" PRId64 ")\n", key, a->seqlen_k,
              prob.nk);
  if (st != FG_OK) {
    fg_text_add(t, "no kernel: %s\n", fg_context_last_error(ctx));
    return st;
  }
  fg_text_add(t, "choice: %s\n", (*d)->rule);
  fg_text_add(t, "variant: %s\n", (*d)->variant_name);
  char desc[1024];
  *known = 0;
  *src = fg_registry_probe(ctx, &(*d)->variant, desc, sizeof desc, meta, known);
  fg_text_add(t, "binary: %s\n", desc);
  if (*src == FG_BINARY_MISSING || *src == FG_BINARY_FAILED) {
    fg_set_error(ctx, "%s", desc);
    return *src == FG_BINARY_MISSING ? FG_ERROR_KERNEL_MISSING : FG_ERROR_COMPILE;
  }
  return FG_OK;
}

/* The tensor maps the runtime encodes for each launch of the plan m (runtime/tmap.c), box rows
 * each, in the plan's order: "TMA: q 128 rows, k 64, v 64" (nothing when it has none). */
static void fg_explain_tmaps(fg_text *t, const fg_kernel_meta *m) {
  for (int i = 0; i < m->n_tmaps && i < FG_PLAN_MAX_TMAPS; i++)
    fg_text_add(t, i ? ", %s %d" : "TMA: %s %d rows", fg_tmap_tensor_name(m->tmaps[i].tensor),
                m->tmaps[i].rows);
  if (m->n_tmaps > 0) fg_text_add(t, "\n");
}

FG_API fg_status fg_explain(fg_context *ctx, const fg_attention_args *args, char *buf, size_t len) {
  fg_text t = {buf, len, 0};
  if (buf && len) buf[0] = 0;
  if (!ctx) {
    fg_text_add(&t, "fg_explain: ctx is NULL");
    return FG_ERROR_INVALID_ARGUMENT;
  }
  fg_clear_error(ctx);
  fg_attention_args a;
  char err[1024];
  fg_status st = fg_validate_args(args, FG_VALIDATE_SHAPES, &a, err, sizeof err);
  if (st != FG_OK) {
    fg_text_add(&t, "invalid arguments: %s\n", err);
    return fg_fail(ctx, st, "%s", err);
  }
  if (fg_explain_head(ctx, &t, "forward", &a)) return FG_OK;
  const fg_dispatch *d = NULL;
  fg_binary_source src;
  fg_kernel_meta meta;
  int known = 0;
  st = fg_explain_choice(ctx, &t, FG_PASS_FWD, &a, &d, &src, &meta, &known);
  if (d && known) {
    fg_fwd_params p;
    fg_params_from_args(&a, &p);
    uint64_t grid[3];
    const fg_plan_step *sp = fg_kernel_main(&meta);
    fg_launch_grid(sp, ctx->limits.sm_count, &p, grid);
    fg_text_add(&t,
                "launch: grid (%" PRIu64 ", %" PRIu64 ", %" PRIu64
                ") x %d threads, %d B dynamic "
                "shared memory",
                grid[0], grid[1], grid[2], sp->threads, sp->smem_bytes);
    uint64_t ws = 0;
    if (fg_plan_workspace_bytes(&meta, a.batch, a.heads_q, a.heads_kv, a.seqlen_q, a.seqlen_k, 0,
                                &ws, NULL) == 0 &&
        ws)
      fg_text_add(&t, ws < 1024 * 1024 ? ", %.0f B workspace (%s)" : ", %.1f MiB workspace (%s)",
                  ws < 1024 * 1024 ? (double)ws : (double)ws / (1024.0 * 1024.0),
                  meta.n_workspaces > 0 ? meta.workspaces[0].name : "?");
    if (meta.regs >= 0) fg_text_add(&t, ", %d registers per thread", meta.regs);
    if (d->variant.loop == FG_LOOP_Q_TMA_D || d->variant.loop == FG_LOOP_Q_TMA_DP)
      fg_text_add(&t, ", each block taking its next tile from the counter as it comes free");
    if (d->variant.loop == FG_LOOP_Q_TMA_DP)
      fg_text_add(&t, ", its two consumer warpgroups taking turns at the softmax (ping-pong)");
    if (sp->grid == FG_GRID_Q_TILE_PAIRS)
      fg_text_add(&t, a.causal ? ", clusters of two blocks along x (two neighbouring query tiles "
                                 "sharing each K/V block: the later tile's, the earlier one "
                                 "skipping those past its own)"
                               : ", clusters of two blocks along x (two query tiles sharing each "
                                 "K/V block)");
    uint64_t limit = sp->grid == FG_GRID_HEADS ? 2147483647u : (uint64_t)ctx->limits.max_grid_y;
    uint64_t bh = (uint64_t)a.batch * (uint64_t)a.heads_q;
    if (bh > limit) {
      uint64_t per = limit / (uint64_t)a.heads_q;
      fg_text_add(&t, " (split into %" PRIu64 " launches of at most %" PRIu64 " batches)",
                  ((uint64_t)a.batch + per - 1) / per, per);
    }
    fg_text_add(&t, "\n");
    fg_explain_tmaps(&t, &meta);
  }
  return st;
}


FG_API fg_status fg_explain_backward(fg_context *ctx, const fg_attention_backward_args *args,
                                     char *buf, size_t len) {
  fg_text t = {buf, len, 0};
  if (buf && len) buf[0] = 0;
  if (!ctx) {
    fg_text_add(&t, "fg_explain_backward: ctx is NULL");
    return FG_ERROR_INVALID_ARGUMENT;
  }
  fg_clear_error(ctx);
  fg_attention_backward_args b;
  char err[1024];
  fg_status st = fg_validate_backward_args(args, FG_VALIDATE_SHAPES, &b, err, sizeof err);
  if (st != FG_OK) {
    fg_text_add(&t, "invalid arguments: %s\n", err);
    return fg_fail(ctx, st, "%s", err);
  }
  fg_attention_args a;
  fg_backward_forward_args(&b, &a);
  if (fg_explain_head(ctx, &t, "backward (dQ, dK, dV)", &a)) return FG_OK;
  const fg_dispatch *d = NULL;
  fg_binary_source src;
  fg_kernel_meta meta;
  int known = 0;
  st = fg_explain_choice(ctx, &t, FG_PASS_BWD, &a, &d, &src, &meta, &known);
  if (!d) return st;
  /* The plan (templates/bwd.lua, launch): its kernels in order on the caller's stream, split
   * along the batch like the call. */
  const uint64_t grid_y = (uint64_t)ctx->limits.max_grid_y;
  const uint64_t per = grid_y / (uint64_t)a.heads_q; /* batches per launch (heads_q <= grid_y) */
  const int64_t nb = per && (uint64_t)a.batch > per ? (int64_t)per : a.batch;
  if (!known) {
    fg_text_add(&t, "plan: the kernels of %s (templates/bwd.lua, launch), known once its binary "
                    "is; its main kernel: K/V blocks of %d outer, grid (ceil(seqlen_k / %d), "
                    "batch * heads_kv)\n",
                d->variant_name, d->variant.bc, d->variant.bc);
    return st;
  }
  fg_text_add(&t, "plan: %d kernel%s in order on the stream\n", meta.n_steps,
              meta.n_steps == 1 ? "" : "s");
  const fg_plan_tail tail = fg_bwd_tail(ctx, &meta, &b);
  for (int i = 0; i < meta.n_steps; i++) {
    const fg_plan_step *sp = &meta.steps[i];
    uint64_t g[3];
    fg_plan_grid(sp, ctx->limits.sm_count, nb, a.heads_q, a.heads_kv, a.seqlen_q, a.seqlen_k,
                 g);
    fg_text_add(&t, "  %d. %s: grid %s (%" PRIu64 ", %" PRIu64, i + 1, sp->entry,
                fg_grid_kind_name(sp->grid), g[0], g[1]);
    if (g[2] > 1) fg_text_add(&t, ", %" PRIu64, g[2]);
    fg_text_add(&t, ") x %d threads", sp->threads);
    if (sp->smem_bytes > 0) fg_text_add(&t, ", %d B dynamic shared memory", sp->smem_bytes);
    if (i == meta.main_step && meta.regs >= 0)
      fg_text_add(&t, ", %d registers per thread", meta.regs);
    fg_text_add(&t, "\n");
    if (sp->split_rows > 0)
      fg_text_add(&t,
                  "     query rows per KV head (seqlen_q * heads_q / heads_kv = %" PRIu64 ") %s "
                  "%d: %s\n",
                  fg_plan_group_rows(a.heads_q, a.heads_kv, a.seqlen_q),
                  g[2] > 1 ? "past" : "within", sp->split_rows,
                  g[2] > 1 ? "each key block's query blocks split over the grid's z, the splits' "
                             "partial dK/dV summed in fp32 (dkv_accum)"
                           : "one block per key block sums them all");
    if (i == meta.main_step && tail.blocks)
      fg_text_add(&t,
                  "     tail: the last %" PRIu64 " of its %" PRIu64 " blocks (a partial wave on %d SMs) "
                  "each split into %" PRIu64 " pieces over the query blocks, the pieces' partial "
                  "dK/dV summed in fp32 (dkv_tail): grid y %" PRIu64 "\n",
                  tail.blocks, tail.first + tail.blocks, ctx->limits.sm_count, tail.splits,
                  fg_plan_tail_grid_y(&tail, g[0]));
  }
  if (per && (uint64_t)a.batch > per)
    fg_text_add(&t, "  (batch * heads_q past the grid's %" PRIu64 ": each kernel split into %" PRIu64
                    " launches of at most %" PRIu64 " batches)\n",
                grid_y, ((uint64_t)a.batch + per - 1) / per, per);
  /* A bwd_tma plan's maps, encoded for each launch and passed to every kernel of the plan. */
  fg_explain_tmaps(&t, &meta);
  uint64_t ws = 0;
  if (fg_plan_workspace_bytes_tail(&meta, a.batch, a.heads_q, a.heads_kv, a.seqlen_q, a.seqlen_k,
                                   b.deterministic != 0, tail.blocks, &ws, NULL) == 0 &&
      ws > 0) {
    fg_text_add(&t, "workspace: %.1f MiB (", (double)ws / (1024.0 * 1024.0));
    for (int i = 0, n = 0; i < meta.n_workspaces; i++) {
      const fg_plan_workspace *w = &meta.workspaces[i];
      if (w->tail ? !tail.blocks
                  : !fg_plan_workspace_units(w, fg_kernel_main(&meta)->br, a.heads_q, a.heads_kv,
                                             a.seqlen_q, a.seqlen_k, b.deterministic != 0))
        continue;
      fg_text_add(&t, "%s%s", n++ ? ", " : "", w->name);
      if (w->tail)
        fg_text_add(&t, " of the tail's %" PRIu64 " key blocks", tail.blocks);
      else if (w->per_key)
        fg_text_add(&t, w->rows > 1 ? " per key block" : " per key row");
      if (w->min_group_rows > 0)
        fg_text_add(&t, "%s only when Nq*Hq/Hkv > %lld", w->per_key ? "," : "", w->min_group_rows);
    }
    if (b.workspace)
      fg_text_add(&t, "), the caller's buffer of %zu bytes\n", b.workspace_size);
    else
      fg_text_add(&t, "), allocated on the stream for the call (or pass args->workspace)\n");
  }
  return st;
}
