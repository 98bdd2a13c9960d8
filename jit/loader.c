/* loader.c: the full library's loader (runtime/fg_runtime_internal.h, struct fg_loader): where
 * a kernel comes from after the exported tables (the disk cache, then NVRTC, whose result goes
 * into the cache), the tuned winners of the cache for dispatch, the reference kernels, and the
 * context's generator and cache (created on first use, kept in ctx->jit). Linked into flashgen
 * only; flashgen_runtime links runtime/loader_none.c instead. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_jit.h"

/* What the loader keeps per context (ctx->jit), guarded by ctx->lock. */
typedef struct fg_jit_state {
  fg_generator *gen;
  int gen_tried;
  char gen_err[1024];
  fg_cache *cache;
  int cache_tried;
} fg_jit_state;

/* ctx->jit, created on first use; NULL when out of memory. The caller holds ctx->lock. */
static fg_jit_state *fg_jit_state_locked(fg_context *ctx) {
  if (!ctx->jit) ctx->jit = calloc(1, sizeof(fg_jit_state));
  return ctx->jit;
}

static void fg_jit_context_destroy(fg_context *ctx) {
  fg_nvrtc_preload_wait(); /* the process may exit next: not while NVRTC is being loaded */
  fg_jit_state *j = ctx->jit;
  if (!j) return;
  fg_cache_close(j->cache);
  if (j->gen) fg_generator_destroy(j->gen);
  free(j);
  ctx->jit = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* The generator and the cache of a context. */
void fg_context_device_limits(const fg_context *ctx, fg_device_limits *out) {
  memset(out, 0, sizeof *out);
  out->name = ctx->limits.name;
  out->cc_major = ctx->limits.cc_major;
  out->cc_minor = ctx->limits.cc_minor;
  out->smem_optin_per_block = ctx->limits.smem_optin_per_block;
  out->smem_per_sm = ctx->limits.smem_per_sm;
  out->regs_per_sm = ctx->limits.regs_per_sm;
  out->max_threads_per_block = ctx->limits.max_threads_per_block;
  out->sm_count = ctx->limits.sm_count;
}

void fg_context_device_id(const fg_context *ctx, fg_device_id *out) {
  memset(out, 0, sizeof *out);
  size_t n = strnlen(ctx->limits.name, sizeof out->name - 1);
  memcpy(out->name, ctx->limits.name, n);
  out->name[n] = 0;
  out->cc_major = ctx->limits.cc_major;
  out->cc_minor = ctx->limits.cc_minor;
  out->sm_count = ctx->limits.sm_count;
  out->driver_version = ctx->limits.driver_version;
}

fg_status fg_context_generator(fg_context *ctx, fg_generator **out) {
  pthread_mutex_lock(&ctx->lock);
  fg_jit_state *j = fg_jit_state_locked(ctx);
  if (j && !j->gen_tried) {
    j->gen_tried = 1;
    if (fg_generator_create(&j->gen, j->gen_err, sizeof j->gen_err) != 0) j->gen = NULL;
  }
  fg_generator *g = j ? j->gen : NULL;
  pthread_mutex_unlock(&ctx->lock);
  *out = g;
  if (!j) return fg_fail(ctx, FG_ERROR_OUT_OF_MEMORY, "out of host memory creating the generator");
  if (!g)
    return fg_fail(ctx, FG_ERROR_INTERNAL, "the kernel generator could not be created: %s",
                   j->gen_err);
  return FG_OK;
}

fg_cache *fg_context_cache(fg_context *ctx) {
  if (!fg_policy_allows_cache(ctx)) return NULL;
  char warn[1024] = "";
  int first = 0;
  pthread_mutex_lock(&ctx->lock);
  fg_jit_state *j = fg_jit_state_locked(ctx);
  if (j && !j->cache_tried) {
    j->cache_tried = 1;
    first = 1;
    j->cache = fg_cache_open(ctx->cache_dir, warn, sizeof warn);
  }
  fg_cache *c = j ? j->cache : NULL;
  pthread_mutex_unlock(&ctx->lock);
  if (first && !c)
    fg_warn(ctx, "the kernel cache cannot be used (%s); compiled kernels are kept in memory only",
            warn[0] ? warn : "no reason given");
  return c;
}

int fg_generator_cache_key(fg_generator *g, fg_arch arch, fg_cache_key *key, char *why, size_t whylen) {
  memset(key, 0, sizeof *key);
  char err[1024];
  if (fg_nvrtc_load(err, sizeof err) != 0) {
    snprintf(why, whylen,
             "NVRTC could not be loaded (%.900s), and its version is part of the cache key", err);
    return -1;
  }
  key->arch = arch;
  key->nvrtc_version = fg_nvrtc_version();
  key->template_hash = fg_generator_template_hash(g);
  key->flashgen_version = FG_VERSION_STRING;
  return 0;
}

int fg_context_cache_key(fg_context *ctx, fg_cache_key *key, char *why, size_t whylen) {
  memset(key, 0, sizeof *key);
  fg_generator *g;
  if (fg_context_generator(ctx, &g) != FG_OK) {
    snprintf(why, whylen, "%s", fg_context_last_error(ctx));
    return -1;
  }
  return fg_generator_cache_key(g, ctx->arch, key, why, whylen);
}

/* ------------------------------------------------------------------------------------------ */
/* Loading: the cache, then compiling. */
/* Loads a kernel from the disk cache. Returns 1 on a hit (k filled), 0 on a miss (why says why
 * the cache was not consulted when it was not), -1 on a failure to load a hit (error set). */
static int fg_load_from_cache(fg_context *ctx, const char *name, fg_arch arch, fg_loaded_kernel *k,
                              fg_status *st) {
  fg_cache *c = fg_context_cache(ctx);
  if (!c) return 0;
  fg_cache_key key;
  char why[1024];
  if (fg_context_cache_key(ctx, &key, why, sizeof why) != 0) return 0;
  key.variant = name;
  key.arch = arch;
  fg_kernel_image img;
  memset(&img, 0, sizeof img);
  char warn[1024] = "";
  int hit = fg_cache_get_kernel(c, &key, &img, warn, sizeof warn);
  if (warn[0]) fg_warn(ctx, "kernel cache: %s", warn);
  if (hit != 1) return 0;
  *st = fg_kernel_load(ctx, &img, k);
  fg_kernel_image_free(&img);
  if (*st != FG_OK) return -1;
  snprintf(k->source, sizeof k->source, "the kernel cache (%s)", fg_cache_path(c));
  return 1;
}

/* Compiles with NVRTC (build = the generator call), loads, and stores into the cache. */
typedef int (*fg_build_fn)(fg_context *ctx, fg_generator *g, const void *arg, fg_kernel_image *img,
                           char **errlog);

static fg_status fg_load_by_compiling(fg_context *ctx, const char *name, fg_build_fn build,
                                      const void *arg, fg_loaded_kernel *k) {
  char err[1024];
  if (fg_nvrtc_load(err, sizeof err) != 0)
    return fg_fail(ctx, FG_ERROR_NO_COMPILER,
                   "kernel %s must be compiled, but NVRTC could not be loaded: %s", name, err);
  fg_generator *g;
  fg_status st = fg_context_generator(ctx, &g);
  if (st != FG_OK) return st;
  fg_kernel_image img;
  memset(&img, 0, sizeof img);
  char *log = NULL;
  if (build(ctx, g, arg, &img, &log) != 0) {
    st = fg_fail(ctx, FG_ERROR_COMPILE, "compiling kernel %s for %s failed: %s", name,
                 fg_arch_name(ctx->arch), log ? log : "(no log)");
    free(log);
    fg_kernel_image_free(&img);
    return st;
  }
  free(log);
  st = fg_kernel_load(ctx, &img, k);
  if (st == FG_OK) {
    fg_cache *c = fg_context_cache(ctx);
    int stored = 0;
    if (c) {
      fg_cache_key key;
      char why[1024], warn[1024] = "";
      if (fg_context_cache_key(ctx, &key, why, sizeof why) == 0) {
        key.variant = name;
        key.arch = img.arch;
        if (fg_cache_put_kernel(c, &key, &img, warn, sizeof warn) == 0) stored = 1;
        else if (warn[0]) /* empty: writing was switched off after the one warning */
          fg_warn(ctx, "kernel cache: could not store %s: %s", name, warn);
      }
    }
    snprintf(k->source, sizeof k->source, "compiled with NVRTC %d.%d in %.0f ms%s",
             fg_nvrtc_version() / 1000, (fg_nvrtc_version() % 1000) / 10, img.compile_ms,
             stored ? ", stored in the kernel cache" : ", kept in memory only");
  }
  fg_kernel_image_free(&img);
  return st;
}

static int fg_build_variant(fg_context *ctx, fg_generator *g, const void *arg, fg_kernel_image *img,
                            char **errlog) {
  (void)ctx;
  return fg_generator_build(g, (const fg_variant *)arg, img, errlog);
}

static fg_status fg_jit_load(fg_context *ctx, const fg_variant *v, const char *name,
                             fg_loaded_kernel *k, int *final) {
  fg_status st = FG_OK;
  *final = 1;
  if (fg_policy_allows_cache(ctx)) {
    int hit = fg_load_from_cache(ctx, name, v->arch, k, &st);
    if (hit == 1) return FG_OK;
    if (hit < 0 && !fg_policy_allows_jit(ctx)) return st;
  }
  if (fg_policy_allows_jit(ctx)) return fg_load_by_compiling(ctx, name, fg_build_variant, v, k);
  *final = 0;
  return FG_ERROR_KERNEL_MISSING;
}

static fg_binary_source fg_jit_probe(fg_context *ctx, const fg_variant *v, const char *name,
                                     char *desc, size_t len, fg_kernel_meta *meta,
                                     int *meta_known) {
  char why[1024] = "";
  fg_cache *c = fg_policy_allows_cache(ctx) ? fg_context_cache(ctx) : NULL;
  if (c) {
    fg_cache_key key;
    if (fg_context_cache_key(ctx, &key, why, sizeof why) == 0) {
      key.variant = name;
      key.arch = v->arch;
      fg_kernel_image ci;
      memset(&ci, 0, sizeof ci);
      char warn[1024] = "";
      if (fg_cache_get_kernel(c, &key, &ci, warn, sizeof warn) == 1) {
        snprintf(desc, len, "the kernel cache (%s)", fg_cache_path(c));
        *meta = ci.meta;
        *meta_known = 1;
        fg_kernel_image_free(&ci);
        return FG_BINARY_CACHED;
      }
      if (warn[0]) fg_warn(ctx, "kernel cache: %s", warn);
    }
  }
  if (fg_policy_allows_jit(ctx)) {
    char err[256];
    if (fg_nvrtc_load(err, sizeof err) != 0) {
      snprintf(desc, len, "would be compiled, but NVRTC cannot be loaded: %s", err);
      return FG_BINARY_MISSING;
    }
    snprintf(desc, len, "would be compiled with NVRTC %d.%d on first use (%s)",
             fg_nvrtc_version() / 1000, (fg_nvrtc_version() % 1000) / 10,
             c ? "not in the kernel cache yet" : "no kernel cache: kept in memory only");
    fg_generator *g;
    char *src = NULL;
    if (fg_context_generator(ctx, &g) == FG_OK &&
        fg_generator_render(g, v, &src, meta, err, sizeof err) == 0)
      *meta_known = 1;
    free(src);
    return FG_BINARY_COMPILE;
  }
  snprintf(desc, len, "missing: not in an exported table%s, and the policy '%s' forbids compiling",
           c ? " nor in the kernel cache" : "", fg_policy_name(ctx->policy));
  if (why[0]) {
    size_t n = strlen(desc);
    snprintf(desc + n, len - n, " (cache not consulted: %s)", why);
  }
  return FG_BINARY_MISSING;
}

/* ------------------------------------------------------------------------------------------ */
/* The reference kernels. */
typedef struct fg_ref_arg {
  fg_dtype dtype;
  int exact;
  char name[32];
} fg_ref_arg;

static int fg_build_reference(fg_context *ctx, fg_generator *g, const void *arg,
                              fg_kernel_image *img, char **errlog) {
  const fg_ref_arg *a = arg;
  return fg_generator_build_reference(g, a->dtype, a->exact, ctx->arch, img, errlog);
}

static fg_status fg_load_reference(fg_context *ctx, const void *arg, fg_loaded_kernel *k) {
  const fg_ref_arg *a = arg;
  fg_status st = FG_OK;
  if (fg_policy_allows_cache(ctx)) {
    int hit = fg_load_from_cache(ctx, a->name, ctx->arch, k, &st);
    if (hit == 1) return FG_OK;
  }
  return fg_load_by_compiling(ctx, a->name, fg_build_reference, a, k);
}

fg_status fg_registry_get_reference(fg_context *ctx, fg_dtype dtype, int exact,
                                    const fg_loaded_kernel **out) {
  fg_ref_arg a;
  a.dtype = dtype;
  a.exact = exact != 0;
  snprintf(a.name, sizeof a.name, "ref_%s_%s", exact ? "f64" : "lowp", fg_dtype_name(dtype));
  char key[FG_VARIANT_NAME_MAX + 8];
  snprintf(key, sizeof key, "%s_%s", a.name, fg_arch_name(ctx->arch));
  return fg_registry_acquire(ctx, key, fg_load_reference, &a, out);
}

/* ------------------------------------------------------------------------------------------ */
/* Tuned winners in the cache, for dispatch. */
typedef struct fg_nearest {
  const char *prefix;
  int64_t want;
  int found;
  int64_t best_b, best_dist;
  char winner[FG_VARIANT_NAME_MAX];
  double tflops;
} fg_nearest;

static void fg_nearest_cb(void *ud, const char *bucket, const char *winner, double tflops) {
  fg_nearest *n = ud;
  int64_t b = fg_problem_key_bucket(bucket, n->prefix);
  if (b <= 0 || !winner) return;
  int64_t dist = 0;
  for (int64_t x = b < n->want ? b : n->want, y = b < n->want ? n->want : b; x < y; x *= 2) dist++;
  if (!n->found || dist < n->best_dist || (dist == n->best_dist && b > n->best_b)) {
    n->found = 1;
    n->best_b = b;
    n->best_dist = dist;
    n->tflops = tflops;
    snprintf(n->winner, sizeof n->winner, "%s", winner);
  }
}

/* The tuned winner for prob on this device from the cache: exact bucket, then nearest. */
static int fg_jit_tuned(fg_context *ctx, const fg_problem *prob, fg_variant *out, char *rule,
                        size_t rulelen) {
  char key[FG_PROBLEM_KEY_MAX], prefix[FG_PROBLEM_KEY_MAX];
  fg_problem_format(prob, key, sizeof key);
  fg_problem_prefix(prob, prefix, sizeof prefix);
  fg_cache *cache = fg_context_cache(ctx);
  if (!cache) return 0;
  fg_device_id dev;
  fg_context_device_id(ctx, &dev);
  char name[FG_VARIANT_NAME_MAX];
  double tf = 0;
  int exact = fg_cache_get_winner(cache, &dev, key, name, sizeof name, &tf) == 1;
  fg_nearest n;
  memset(&n, 0, sizeof n);
  if (!exact) {
    n.prefix = prefix;
    n.want = prob->nk;
    fg_cache_each_winner(cache, &dev, prefix, fg_nearest_cb, &n);
    if (!n.found) return 0;
    snprintf(name, sizeof name, "%s", n.winner);
    tf = n.tflops;
  }
  char perr[256];
  if (fg_variant_parse(name, out, perr, sizeof perr) != 0 ||
      !fg_problem_served_by(prob, out)) {
    fg_warn(ctx, "kernel cache: the tuning record for %s names '%s', which is not a variant for "
            "this problem; ignoring it",
            exact ? key : "a nearby bucket", name);
    return 0;
  }
  if (exact)
    snprintf(rule, rulelen,
             "the tuned record for %s on this GPU (%s), %.1f TFLOP/s, in the kernel cache %s", key,
             ctx->limits.name, tf, fg_cache_path(cache));
  else
    snprintf(rule, rulelen,
             "the tuned record of the nearest bucket %s%" PRId64
             " on this GPU (%s), %.1f TFLOP/s, in the kernel cache %s (no record for %s)",
             prefix, n.best_b, ctx->limits.name, tf, fg_cache_path(cache), key);
  return 1;
}

static void fg_jit_preload(void) { fg_nvrtc_preload(); }

static const fg_loader fg_jit_loader = {
    .name = "jit (kernel cache and NVRTC)",
    .preload = fg_jit_preload,
    .context_destroy = fg_jit_context_destroy,
    .load = fg_jit_load,
    .probe = fg_jit_probe,
    .tuned = fg_jit_tuned,
};

const fg_loader *fg_builtin_loader(void) { return &fg_jit_loader; }
