/* registry.c: the per-context module registry (variant name -> loaded CUfunction and its launch
 * contract; one load per variant, other threads wait; failures remembered), loading an
 * fg_kernel_image into the driver, and the process-wide list of exported tables. A variant is
 * looked for in the order of the policy (DESIGN.md, "Dispatch order and policies"): exported
 * table, then the context's loader (the full library's: disk cache -> NVRTC, jit/loader.c). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_runtime_internal.h"

#define FG_SMEM_DEFAULT_LIMIT \
  (48 * 1024) /* dynamic shared memory a kernel gets without opting in */

/* ------------------------------------------------------------------------------------------ */
/* Arch compatibility. */
static void fg_arch_cc(fg_arch a, int *major, int *minor) {
  switch (a) {
    case FG_ARCH_SM80: *major = 8, *minor = 0; break;
    case FG_ARCH_SM86: *major = 8, *minor = 6; break;
    case FG_ARCH_SM89: *major = 8, *minor = 9; break;
    default: *major = 9, *minor = 0; break;
  }
}

int fg_arch_compat(fg_arch img, int cc_major, int cc_minor) {
  if (img < 0 || img >= FG_ARCH_COUNT) return 0;
  if (fg_arch_for_cc(cc_major, cc_minor) == img &&
      (img != FG_ARCH_SM90A || (cc_major == 9 && cc_minor == 0)))
    return 3;
  int maj, min;
  fg_arch_cc(img, &maj, &min);
  /* Arch-specific code (sm_90a) runs on exactly 9.0, cubin and PTX alike. */
  if (img == FG_ARCH_SM90A) return cc_major == 9 && cc_minor == 0 ? 2 : 0;
  if (maj == cc_major && min <= cc_minor) return 2;
  if (maj * 10 + min <= cc_major * 10 + cc_minor) return 1;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Exported tables (process-wide). */
static pthread_mutex_t fg_exp_lock = PTHREAD_MUTEX_INITIALIZER;
static const fg_exported_table **fg_exp_tables;
static size_t fg_exp_count;
static _Atomic uint64_t fg_exp_generation; /* bumped by every registration */

fg_status fg_register_exported(const fg_exported_table *t, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!t) {
    if (err) snprintf(err, errlen, "fg_register_exported: the table is NULL");
    return FG_ERROR_INVALID_ARGUMENT;
  }
  if ((t->n_kernels && !t->kernels) || (t->n_choices && !t->choices)) {
    if (err) snprintf(err, errlen, "exported table '%s': a count is set but its array is NULL",
                      t->description ? t->description : "");
    return FG_ERROR_INVALID_ARGUMENT;
  }
  for (size_t i = 0; i < t->n_kernels; i++) {
    const fg_kernel_image *k = &t->kernels[i];
    fg_variant v;
    char perr[256];
    const char *why = NULL;
    if (!k->variant[0]) why = "has no variant name";
    else if (fg_variant_parse(k->variant, &v, perr, sizeof perr) != 0) why = perr;
    else if ((!k->cubin || !k->cubin_size) && (!k->ptx || !k->ptx_size))
      why = "has neither cubin nor PTX";
    else if ((why = fg_kernel_meta_invalid(&k->meta)) != NULL) {
      snprintf(perr, sizeof perr, "has a malformed launch contract: %s", why);
      why = perr;
    }
    if (why) {
      if (err) snprintf(err, errlen, "exported table '%s': kernel %zu ('%s') %s",
                        t->description ? t->description : "", i, k->variant, why);
      return FG_ERROR_INVALID_ARGUMENT;
    }
  }
  for (size_t i = 0; i < t->n_choices; i++) {
    fg_variant v;
    char perr[256];
    const fg_exported_choice *c = &t->choices[i];
    if (!c->bucket || !c->variant || fg_variant_parse(c->variant, &v, perr, sizeof perr) != 0) {
      if (err) snprintf(err, errlen, "exported table '%s': choice %zu is malformed (%s)",
                        t->description ? t->description : "", i,
                        !c->bucket || !c->variant ? "NULL bucket or variant" : perr);
      return FG_ERROR_INVALID_ARGUMENT;
    }
  }
  pthread_mutex_lock(&fg_exp_lock);
  for (size_t i = 0; i < fg_exp_count; i++)
    if (fg_exp_tables[i] == t) {
      pthread_mutex_unlock(&fg_exp_lock);
      return FG_OK;
    }
  const fg_exported_table **nt = realloc(fg_exp_tables, (fg_exp_count + 1) * sizeof *nt);
  if (!nt) {
    pthread_mutex_unlock(&fg_exp_lock);
    if (err) snprintf(err, errlen, "out of host memory registering an exported table");
    return FG_ERROR_OUT_OF_MEMORY;
  }
  nt[fg_exp_count++] = t;
  fg_exp_tables = nt;
  atomic_fetch_add(&fg_exp_generation, 1);
  pthread_mutex_unlock(&fg_exp_lock);
  return FG_OK;
}

uint64_t fg_exported_generation(void) { return atomic_load(&fg_exp_generation); }

static int fg_same_but_arch(const fg_variant *a, const fg_variant *b) {
  return a->pass == b->pass && a->d == b->d && a->br == b->br && a->bc == b->bc &&
         a->dtype == b->dtype && a->causal == b->causal && a->loop == b->loop &&
         a->warps == b->warps && a->stages == b->stages;
}

/* The usable compatibility of an image on ctx's device (PTX-only needs PTX, the rest a cubin
 * or PTX). */
static int fg_image_compat(const fg_context *ctx, const fg_kernel_image *k) {
  int c = fg_arch_compat(k->arch, ctx->limits.cc_major, ctx->limits.cc_minor);
  int has_cubin = k->cubin && k->cubin_size, has_ptx = k->ptx && k->ptx_size;
  if (c >= 2 && !has_cubin) c = has_ptx ? 1 : 0;
  if (c == 1 && !has_ptx) c = 0;
  return c;
}

const fg_kernel_image *fg_exported_find(const fg_context *ctx, const fg_variant *v,
                                        const char **table_desc) {
  const fg_kernel_image *best = NULL;
  int best_c = 0;
  pthread_mutex_lock(&fg_exp_lock);
  for (size_t t = 0; t < fg_exp_count; t++)
    for (size_t i = 0; i < fg_exp_tables[t]->n_kernels; i++) {
      const fg_kernel_image *k = &fg_exp_tables[t]->kernels[i];
      fg_variant kv;
      char perr[8];
      if (fg_variant_parse(k->variant, &kv, perr, sizeof perr) != 0 || !fg_same_but_arch(&kv, v))
        continue;
      int c = fg_image_compat(ctx, k);
      if (kv.arch == v->arch && c > 0) c += 10; /* the very arch asked for comes first */
      if (c > best_c) {
        best_c = c;
        best = k;
        if (table_desc)
          *table_desc = fg_exp_tables[t]->description ? fg_exp_tables[t]->description : "";
      }
    }
  pthread_mutex_unlock(&fg_exp_lock);
  return best;
}

int fg_exported_any(const fg_context *ctx, const fg_variant *v, fg_variant *out) {
  int best_c = 0;
  pthread_mutex_lock(&fg_exp_lock);
  for (size_t t = 0; t < fg_exp_count; t++)
    for (size_t i = 0; i < fg_exp_tables[t]->n_kernels; i++) {
      const fg_kernel_image *k = &fg_exp_tables[t]->kernels[i];
      fg_variant kv;
      char perr[8];
      if (fg_variant_parse(k->variant, &kv, perr, sizeof perr) != 0) continue;
      if (kv.pass != v->pass || kv.d != v->d || kv.dtype != v->dtype || kv.causal != v->causal)
        continue;
      int c = fg_image_compat(ctx, k) * 2 + (kv.loop == FG_LOOP_Q_OUTER);
      if (fg_image_compat(ctx, k) > 0 && c > best_c) {
        best_c = c;
        *out = kv;
      }
    }
  pthread_mutex_unlock(&fg_exp_lock);
  return best_c > 0;
}

int fg_exported_choice_for(const fg_context *ctx, const fg_problem *prob, fg_variant *out,
                           char *why, size_t whylen) {
  char key[FG_PROBLEM_KEY_MAX], prefix[FG_PROBLEM_KEY_MAX];
  fg_problem_format(prob, key, sizeof key);
  fg_problem_prefix(prob, prefix, sizeof prefix);
  const int64_t want = prob->nk;
  if (want <= 0) return 0;
  int found = 0, best_c = 0;
  int64_t best_dist = 0, best_b = 0;
  const char *best_desc = "";
  pthread_mutex_lock(&fg_exp_lock);
  for (size_t t = 0; t < fg_exp_count; t++)
    for (size_t i = 0; i < fg_exp_tables[t]->n_choices; i++) {
      const fg_exported_choice *c = &fg_exp_tables[t]->choices[i];
      int64_t b = fg_problem_key_bucket(c->bucket, prefix);
      if (b <= 0) continue;
      fg_variant v;
      char perr[8];
      if (fg_variant_parse(c->variant, &v, perr, sizeof perr) != 0) continue;
      int compat = fg_arch_compat(v.arch, ctx->limits.cc_major, ctx->limits.cc_minor);
      if (compat == 0) continue;
      /* distance in powers of two; on a tie the larger bucket */
      int64_t dist = 0;
      for (int64_t x = b < want ? b : want, y = b < want ? want : b; x < y; x *= 2) dist++;
      int better = !found || compat > best_c || (compat == best_c && dist < best_dist) ||
                   (compat == best_c && dist == best_dist && b > best_b);
      if (better) {
        found = 1;
        best_c = compat;
        best_dist = dist;
        best_b = b;
        *out = v;
        best_desc = fg_exp_tables[t]->description ? fg_exp_tables[t]->description : "";
      }
    }
  pthread_mutex_unlock(&fg_exp_lock);
  if (found) {
    if (best_b == want)
      snprintf(why, whylen, "the tuned choice for %s in the exported table '%s'", key, best_desc);
    else
      snprintf(why, whylen,
               "the tuned choice for the nearest bucket %s%lld in the exported table '%s' (it has "
               "no choice for %s)",
               prefix, (long long)best_b, best_desc, key);
  }
  return found;
}

void fg_exported_summary(const fg_context *ctx, char *buf, size_t len) {
  size_t kernels = 0, usable = 0, tables;
  char names[512] = "";
  pthread_mutex_lock(&fg_exp_lock);
  tables = fg_exp_count;
  for (size_t t = 0; t < fg_exp_count; t++)
    for (size_t i = 0; i < fg_exp_tables[t]->n_kernels; i++) {
      const fg_kernel_image *k = &fg_exp_tables[t]->kernels[i];
      kernels++;
      if (fg_image_compat(ctx, k) > 0) {
        if (usable < 4) {
          size_t n = strlen(names);
          snprintf(names + n, sizeof names - n, "%s%s", usable ? ", " : "", k->variant);
        }
        usable++;
      }
    }
  pthread_mutex_unlock(&fg_exp_lock);
  if (tables == 0)
    snprintf(buf, len, "no exported table is registered");
  else if (usable == 0)
    snprintf(buf, len,
             "the %zu exported table%s hold%s %zu kernel%s, none of which runs on %s (%s, compute "
             "capability %d.%d): export for %s",
             tables, tables == 1 ? "" : "s", tables == 1 ? "s" : "", kernels,
             kernels == 1 ? "" : "s", ctx->limits.name, fg_arch_name(ctx->arch),
             ctx->limits.cc_major, ctx->limits.cc_minor, fg_arch_name(ctx->arch));
  else
    snprintf(buf, len, "the %zu exported table%s hold%s %zu kernel%s for this GPU (%s%s)", tables,
             tables == 1 ? "" : "s", tables == 1 ? "s" : "", usable, usable == 1 ? "" : "s",
             names, usable > 4 ? ", ..." : "");
}

/* ------------------------------------------------------------------------------------------ */
/* Loading an image into the driver. */
/* Resolves step i of img's plan in mod into out->fn[i]: opts it into its dynamic shared memory,
 * checks what the compiled function needs (static shared memory, registers against its
 * threads), and records the main step's registers when ptxas's are unknown. ctx is current. */
static fg_status fg_step_load(fg_context *ctx, const fg_kernel_image *img, CUmodule mod, int i,
                              fg_loaded_kernel *out) {
  const fg_plan_step *s = &img->meta.steps[i];
  const fg_rt_limits *lim = &ctx->limits;
  CUfunction fn = NULL;
  char d[512];
  CUresult r = fg_cu.cuModuleGetFunction(&fn, mod, s->entry);
  if (r != FG_CUDA_SUCCESS)
    return fg_fail(ctx, FG_ERROR_INTERNAL,
                   "kernel %s: entry point '%s' (step %d of its plan) not found in its module: %s "
                   "(rebuild or re-export it)",
                   img->variant, s->entry, i + 1,
                   fg_cuda_describe(d, sizeof d, "cuModuleGetFunction", r));
  if (s->smem_bytes > FG_SMEM_DEFAULT_LIMIT) {
    r = fg_cu.cuFuncSetAttribute(fn, FG_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 s->smem_bytes);
    if (r != FG_CUDA_SUCCESS)
      return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                     "kernel %s: opting %s into %d B of dynamic shared memory failed on %s: %s",
                     img->variant, s->entry, s->smem_bytes, lim->name,
                     fg_cuda_describe(d, sizeof d, "cuFuncSetAttribute", r));
  }
  /* Prefer the largest shared-memory carveout: the kernels are shared-memory tiled, and a
   * carveout sized for one block keeps a second from sharing the SM. A hint; failure is harmless. */
  if (s->smem_bytes > 0)
    (void)fg_cu.cuFuncSetAttribute(fn, FG_CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100);
  /* What the compiled function really needs: static shared memory and registers. */
  int static_smem = 0, max_threads = 0, regs = 0;
  if (fg_cu.cuFuncGetAttribute(&static_smem, FG_CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn) ==
          FG_CUDA_SUCCESS &&
      static_smem + s->smem_bytes > lim->smem_optin_per_block)
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                   "kernel %s (%s) needs %d B of static plus %d B of dynamic shared memory per "
                   "block; %s allows %d B",
                   img->variant, s->entry, static_smem, s->smem_bytes, lim->name,
                   lim->smem_optin_per_block);
  if (fg_cu.cuFuncGetAttribute(&max_threads, FG_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn) ==
          FG_CUDA_SUCCESS &&
      max_threads < s->threads) {
    fg_cu.cuFuncGetAttribute(&regs, FG_CU_FUNC_ATTRIBUTE_NUM_REGS, fn);
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                   "kernel %s (%s) uses %d registers per thread, so %s can run at most %d threads "
                   "per block, and it needs %d",
                   img->variant, s->entry, regs, lim->name, max_threads, s->threads);
  }
  if (i == img->meta.main_step && out->meta.regs < 0 &&
      fg_cu.cuFuncGetAttribute(&regs, FG_CU_FUNC_ATTRIBUTE_NUM_REGS, fn) == FG_CUDA_SUCCESS)
    out->meta.regs = regs;
  out->fn[i] = fn;
  return FG_OK;
}

fg_status fg_kernel_load(fg_context *ctx, const fg_kernel_image *img, fg_loaded_kernel *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", img->variant);
  out->arch = img->arch;
  out->meta = img->meta;
  const fg_kernel_meta *m = &img->meta;
  const fg_rt_limits *lim = &ctx->limits;
  const char *bad = fg_kernel_meta_invalid(m);
  if (bad)
    return fg_fail(ctx, FG_ERROR_INTERNAL,
                   "kernel %s has a malformed launch contract: %s (rebuild or re-export it)",
                   img->variant, bad);
  for (int i = 0; i < m->n_steps; i++) {
    const fg_plan_step *s = &m->steps[i];
    if (s->threads > lim->max_threads_per_block)
      return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                     "kernel %s needs %d threads per block (%s); %s allows %d", img->variant,
                     s->threads, s->entry, lim->name, lim->max_threads_per_block);
    if (s->smem_bytes > lim->smem_optin_per_block)
      return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                     "kernel %s needs %d B of shared memory per block (%s); %s allows %d B per "
                     "block",
                     img->variant, s->smem_bytes, s->entry, lim->name, lim->smem_optin_per_block);
  }
  if (m->params != FG_PARAMS_DEFAULT) {
    /* The maps are encoded per call in the variant's dtype (runtime/tmap.c); fwd_tma is the
     * forward's block, bwd_tma the backward's. */
    const int bwd = m->params == FG_PARAMS_BWD_TMA;
    fg_variant v;
    char perr[256];
    if (fg_variant_parse(img->variant, &v, perr, sizeof perr) != 0 ||
        v.pass != (bwd ? FG_PASS_BWD : FG_PASS_FWD))
      return fg_fail(ctx, FG_ERROR_INTERNAL,
                     "kernel %s takes tensor maps (parameter block %s), which only %s variants "
                     "do: its plan is damaged (rebuild or re-export it)",
                     img->variant, fg_param_block_name(m->params), bwd ? "backward" : "forward");
    if (!fg_cu.cuTensorMapEncodeTiled)
      return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                     "kernel %s loads through TMA tensor maps, but the CUDA driver %s has no "
                     "cuTensorMapEncodeTiled (it is older than CUDA 12.0): update the NVIDIA "
                     "driver, or use a variant without TMA (a loop order other than %s)",
                     img->variant, fg_cuda_library_path(), bwd ? "kvtma" : "qtma");
    out->dtype = v.dtype;
  }
  int compat = fg_arch_compat(img->arch, lim->cc_major, lim->cc_minor);
  int has_cubin = img->cubin && img->cubin_size, has_ptx = img->ptx && img->ptx_size;
  if (!has_cubin && !has_ptx)
    return fg_fail(ctx, FG_ERROR_INTERNAL, "kernel %s has neither a cubin nor PTX", img->variant);
  if (compat == 0 || (compat == 1 && !has_ptx))
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                   "kernel %s was built for %s, which does not run on %s (compute capability "
                   "%d.%d)%s",
                   img->variant, fg_arch_name(img->arch), lim->name, lim->cc_major, lim->cc_minor,
                   compat == 0 ? "" : ", and it has no PTX");

  fg_status st = fg_ctx_push(ctx);
  if (st != FG_OK) return st;
  CUresult r = FG_CUDA_ERROR_NO_BINARY_FOR_GPU, r_cubin = FG_CUDA_SUCCESS;
  CUmodule mod = NULL;
  if (has_cubin && compat >= 2) {
    r = fg_cu.cuModuleLoadDataEx(&mod, img->cubin, 0, NULL, NULL);
    r_cubin = r;
  }
  char jitlog[4096] = "";
  if (r != FG_CUDA_SUCCESS && has_ptx) {
    int opts[2] = {FG_CU_JIT_ERROR_LOG_BUFFER, FG_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[2] = {jitlog, (void *)(uintptr_t)sizeof jitlog};
    r = fg_cu.cuModuleLoadDataEx(&mod, img->ptx, 2, opts, vals);
    out->from_ptx = r == FG_CUDA_SUCCESS;
  }
  if (r != FG_CUDA_SUCCESS) {
    fg_ctx_pop(ctx);
    char d1[512], d2[512] = "";
    fg_cuda_describe(d1, sizeof d1, has_ptx ? "cuModuleLoadDataEx (PTX)" : "cuModuleLoadDataEx", r);
    if (r_cubin != FG_CUDA_SUCCESS && has_ptx && r_cubin != r)
      fg_cuda_describe(d2, sizeof d2, "; the cubin: cuModuleLoadDataEx", r_cubin);
    return fg_fail(ctx, fg_cuda_status(r),
                   "loading kernel %s (%s) on %s (compute capability %d.%d): %s%s%s%s",
                   img->variant, fg_arch_name(img->arch), lim->name, lim->cc_major, lim->cc_minor,
                   d1, d2, jitlog[0] ? "; JIT log: " : "", jitlog);
  }
  /* Every step of the plan lives in the one module (templates/fwd.lua, bwd.lua: launch). */
  for (int i = 0; i < m->n_steps; i++) {
    st = fg_step_load(ctx, img, mod, i, out);
    if (st != FG_OK) {
      fg_cu.cuModuleUnload(mod);
      fg_ctx_pop(ctx);
      return st;
    }
  }
  fg_ctx_pop(ctx);
  out->module = mod;
  return FG_OK;
}

void fg_kernel_unload(fg_context *ctx, fg_loaded_kernel *k) {
  if (!k || !k->module) return;
  if (fg_ctx_push(ctx) == FG_OK) {
    fg_cu.cuModuleUnload(k->module);
    fg_ctx_pop(ctx);
  }
  k->module = NULL;
  memset(k->fn, 0, sizeof k->fn);
}

/* ------------------------------------------------------------------------------------------ */
/* The registry. */
enum { FG_ENTRY_LOADING, FG_ENTRY_READY, FG_ENTRY_FAILED };
#define FG_REG_BUCKETS 64

typedef struct fg_reg_entry {
  char key[FG_VARIANT_NAME_MAX + 8];
  int state;
  int transient;         /* a failed load that the next call retries (out of memory, ...) */
  uint64_t exp_gen;      /* exported-table generation when a "missing" failure was recorded */
  fg_status status;      /* of the failure */
  char *msg;             /* of the failure */
  fg_loaded_kernel k;
  struct fg_reg_entry *next;
} fg_reg_entry;

struct fg_registry {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  fg_reg_entry *buckets[FG_REG_BUCKETS];
};

static unsigned fg_hash(const char *s) {
  unsigned h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

fg_status fg_registry_create(fg_context *ctx) {
  fg_registry *r = calloc(1, sizeof *r);
  if (!r) return FG_ERROR_OUT_OF_MEMORY;
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  ctx->registry = r;
  return FG_OK;
}

void fg_registry_destroy(fg_context *ctx) {
  fg_registry *r = ctx->registry;
  if (!r) return;
  for (int b = 0; b < FG_REG_BUCKETS; b++) {
    fg_reg_entry *e = r->buckets[b];
    while (e) {
      fg_reg_entry *n = e->next;
      if (e->state == FG_ENTRY_READY) fg_kernel_unload(ctx, &e->k);
      free(e->msg);
      free(e);
      e = n;
    }
  }
  pthread_cond_destroy(&r->cond);
  pthread_mutex_destroy(&r->lock);
  free(r);
  ctx->registry = NULL;
}

static fg_reg_entry *fg_reg_find(fg_registry *r, const char *key) {
  for (fg_reg_entry *e = r->buckets[fg_hash(key) % FG_REG_BUCKETS]; e; e = e->next)
    if (!strcmp(e->key, key)) return e;
  return NULL;
}

static int fg_failure_is_permanent(fg_status s) {
  return s == FG_ERROR_COMPILE || s == FG_ERROR_NO_COMPILER || s == FG_ERROR_UNSUPPORTED ||
         s == FG_ERROR_KERNEL_MISSING;
}

fg_status fg_registry_acquire(fg_context *ctx, const char *key, fg_load_fn load, const void *arg,
                              const fg_loaded_kernel **out) {
  fg_registry *r = ctx->registry;
  *out = NULL;
  pthread_mutex_lock(&r->lock);
  fg_reg_entry *e = fg_reg_find(r, key);
  if (e) {
    while (e->state == FG_ENTRY_LOADING) pthread_cond_wait(&r->cond, &r->lock);
    if (e->state == FG_ENTRY_READY) {
      pthread_mutex_unlock(&r->lock);
      *out = &e->k;
      return FG_OK;
    }
    int retry = e->transient || (e->status == FG_ERROR_KERNEL_MISSING &&
                                 e->exp_gen != atomic_load(&fg_exp_generation));
    if (!retry) {
      fg_status s = e->status;
      fg_set_error(ctx, "%s", e->msg ? e->msg : fg_status_string(s));
      pthread_mutex_unlock(&r->lock);
      return s;
    }
    e->state = FG_ENTRY_LOADING;
  } else {
    e = calloc(1, sizeof *e);
    if (!e) {
      pthread_mutex_unlock(&r->lock);
      return fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "out of host memory in the module registry");
    }
    snprintf(e->key, sizeof e->key, "%s", key);
    e->state = FG_ENTRY_LOADING;
    unsigned b = fg_hash(key) % FG_REG_BUCKETS;
    e->next = r->buckets[b];
    r->buckets[b] = e;
  }
  uint64_t gen = atomic_load(&fg_exp_generation);
  pthread_mutex_unlock(&r->lock);

  fg_loaded_kernel k;
  memset(&k, 0, sizeof k);
  fg_status s = load(ctx, arg, &k);
  char *msg = s == FG_OK ? NULL : strdup(fg_context_last_error(ctx));

  pthread_mutex_lock(&r->lock);
  free(e->msg);
  e->msg = msg;
  if (s == FG_OK) {
    e->k = k;
    e->state = FG_ENTRY_READY;
    *out = &e->k;
  } else {
    e->state = FG_ENTRY_FAILED;
    e->status = s;
    e->transient = !fg_failure_is_permanent(s);
    e->exp_gen = gen;
  }
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  return s;
}

static fg_status fg_load_variant(fg_context *ctx, const void *arg, fg_loaded_kernel *k) {
  const fg_variant *v = arg;
  char name[FG_VARIANT_NAME_MAX];
  fg_variant_name(v, name, sizeof name);
  fg_status st = FG_OK;
  char exported_err[1024] = "";
  const char *desc = NULL;
  const fg_kernel_image *img = fg_exported_find(ctx, v, &desc);
  if (img) {
    st = fg_kernel_load(ctx, img, k);
    if (st == FG_OK) {
      snprintf(k->source, sizeof k->source, "the exported table '%s'%s", desc,
               k->from_ptx ? " (PTX, compiled by the driver)" : "");
      return FG_OK;
    }
    snprintf(exported_err, sizeof exported_err, "%s", fg_context_last_error(ctx));
  }
  if (ctx->loader) { /* the disk cache, then compiling, as the policy allows */
    int final = 0;
    fg_status ls = ctx->loader->load(ctx, v, name, k, &final);
    if (final) return ls;
  }
  if (exported_err[0]) return fg_fail(ctx, st, "%s", exported_err);
  char summary[768];
  fg_exported_summary(ctx, summary, sizeof summary);
  return fg_fail(ctx, FG_ERROR_KERNEL_MISSING,
                 "no binary of kernel %s for %s (%s) and the policy '%s' forbids compiling%s; %s",
                 name, ctx->limits.name, fg_arch_name(ctx->arch), fg_policy_name(ctx->policy),
                 fg_policy_allows_cache(ctx) ? " (it is not in the kernel cache either)" : "",
                 summary);
}

fg_status fg_registry_get(fg_context *ctx, const fg_variant *v, const fg_loaded_kernel **out) {
  char name[FG_VARIANT_NAME_MAX];
  if (fg_variant_name(v, name, sizeof name) < 0) {
    *out = NULL;
    return fg_fail(ctx, FG_ERROR_INVALID_ARGUMENT, "the variant has a field out of range");
  }
  return fg_registry_acquire(ctx, name, fg_load_variant, v, out);
}

fg_binary_source fg_registry_probe(fg_context *ctx, const fg_variant *v, char *desc, size_t len,
                                   fg_kernel_meta *meta, int *meta_known) {
  char name[FG_VARIANT_NAME_MAX];
  *meta_known = 0;
  if (fg_variant_name(v, name, sizeof name) < 0) {
    snprintf(desc, len, "the variant has a field out of range");
    return FG_BINARY_MISSING;
  }
  fg_registry *r = ctx->registry;
  pthread_mutex_lock(&r->lock);
  fg_reg_entry *e = fg_reg_find(r, name);
  if (e && e->state == FG_ENTRY_READY) {
    snprintf(desc, len, "already loaded in this context, from %s", e->k.source);
    *meta = e->k.meta;
    *meta_known = 1;
    pthread_mutex_unlock(&r->lock);
    return FG_BINARY_LOADED;
  }
  if (e && e->state == FG_ENTRY_FAILED && !e->transient &&
      !(e->status == FG_ERROR_KERNEL_MISSING && e->exp_gen != atomic_load(&fg_exp_generation))) {
    snprintf(desc, len, "an earlier load failed (%s): %s", fg_status_string(e->status),
             e->msg ? e->msg : "");
    pthread_mutex_unlock(&r->lock);
    return FG_BINARY_FAILED;
  }
  pthread_mutex_unlock(&r->lock);

  const char *tdesc = NULL;
  const fg_kernel_image *img = fg_exported_find(ctx, v, &tdesc);
  if (img) {
    snprintf(desc, len, "the exported table '%s' (%s %s)", tdesc, img->variant,
             fg_arch_compat(img->arch, ctx->limits.cc_major, ctx->limits.cc_minor) >= 2
                 ? "cubin"
                 : "PTX, to be compiled by the driver");
    *meta = img->meta;
    *meta_known = 1;
    return FG_BINARY_EXPORTED;
  }
  if (ctx->loader) return ctx->loader->probe(ctx, v, name, desc, len, meta, meta_known);
  snprintf(desc, len,
           "missing: not in an exported table, and flashgen_runtime cannot compile (policy '%s')",
           fg_policy_name(ctx->policy));
  return FG_BINARY_MISSING;
}
