/* context.c: fg_context: the device, its retained primary CUDA context and limits, the policy,
 * per-thread last errors and warnings, the lazily created generator and disk cache (full library
 * only), and the device helpers (allocate, copy, fill, streams, events) that autotune and
 * `flashgen check` use. */
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_runtime_internal.h"

static _Atomic uint64_t fg_next_ctx_id = 1;
static _Atomic uint64_t fg_next_thread_token = 1;

/* ------------------------------------------------------------------------------------------ */
/* Per-thread last errors. Each context keeps one slot per thread that called it, keyed by a
 * token unique to the thread for the life of the process; a small thread-local cache maps
 * (context id, thread) to the slot so the common path takes no lock. A slot is written and read
 * only by its own thread, and freed with the context; context ids are never reused, so a cache
 * entry of a destroyed context can never match again. */
typedef struct fg_err_slot {
  uint64_t thread;
  char *msg;
  size_t cap;
  struct fg_err_slot *next;
} fg_err_slot;

struct fg_err_table {
  pthread_mutex_t lock;
  fg_err_slot *head;
};

#define FG_TLS_SLOTS 4
static _Thread_local uint64_t fg_thread_token;
static _Thread_local struct {
  uint64_t ctx_id;
  fg_err_slot *slot;
} fg_tls_slots[FG_TLS_SLOTS];
static _Thread_local unsigned fg_tls_next;
static _Thread_local char fg_create_error[2048];

static uint64_t fg_my_token(void) {
  if (!fg_thread_token) fg_thread_token = atomic_fetch_add(&fg_next_thread_token, 1);
  return fg_thread_token;
}

/* The calling thread's slot on ctx; created when create is set, else NULL when it has none. */
static fg_err_slot *fg_slot(const fg_context *ctx, int create) {
  for (int i = 0; i < FG_TLS_SLOTS; i++)
    if (fg_tls_slots[i].ctx_id == ctx->id) return fg_tls_slots[i].slot;
  uint64_t me = fg_my_token();
  fg_err_table *t = ctx->errors;
  pthread_mutex_lock(&t->lock);
  fg_err_slot *s = t->head;
  while (s && s->thread != me) s = s->next;
  if (!s && create) {
    s = calloc(1, sizeof *s);
    if (s) {
      s->thread = me;
      s->next = t->head;
      t->head = s;
    }
  }
  pthread_mutex_unlock(&t->lock);
  if (s) {
    unsigned i = fg_tls_next++ % FG_TLS_SLOTS;
    fg_tls_slots[i].ctx_id = ctx->id;
    fg_tls_slots[i].slot = s;
  }
  return s;
}

static void fg_slot_vset(fg_err_slot *s, const char *prefix, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  size_t pl = strlen(prefix);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) n = 0;
  size_t need = pl + (size_t)n + 1;
  if (need > s->cap) {
    char *m = realloc(s->msg, need);
    if (!m) return; /* keep the old message rather than none */
    s->msg = m;
    s->cap = need;
  }
  memcpy(s->msg, prefix, pl);
  vsnprintf(s->msg + pl, s->cap - pl, fmt, ap);
}

static void fg_vset_error(fg_context *ctx, const char *prefix, const char *fmt, va_list ap) {
  if (!ctx) return;
  fg_err_slot *s = fg_slot(ctx, 1);
  if (s) fg_slot_vset(s, prefix, fmt, ap);
}

void fg_set_error(fg_context *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fg_vset_error(ctx, "", fmt, ap);
  va_end(ap);
}

fg_status fg_fail(fg_context *ctx, fg_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fg_vset_error(ctx, "", fmt, ap);
  va_end(ap);
  return s;
}

fg_status fg_fail_cuda(fg_context *ctx, const char *call, CUresult r) {
  char buf[512];
  fg_cuda_describe(buf, sizeof buf, call, r);
  return fg_fail(ctx, fg_cuda_status(r), "%s", buf);
}

void fg_clear_error(fg_context *ctx) {
  if (!ctx) return;
  fg_err_slot *s = fg_slot(ctx, 1);
  if (s && s->msg) s->msg[0] = 0;
}

void fg_warn(fg_context *ctx, const char *fmt, ...) {
  va_list ap;
  if (!ctx->quiet) {
    va_start(ap, fmt);
    fputs("flashgen: warning: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
  }
  va_start(ap, fmt);
  fg_vset_error(ctx, "warning: ", fmt, ap);
  va_end(ap);
}

FG_API const char *fg_context_last_error(const fg_context *ctx) {
  if (!ctx) return "fg_context_last_error: ctx is NULL";
  fg_err_slot *s = fg_slot(ctx, 0);
  return s && s->msg ? s->msg : "";
}

FG_API const char *fg_last_create_error(void) { return fg_create_error; }

static fg_status fg_create_fail(fg_status s, const char *fmt, ...) FG_PRINTF(2, 3);
static fg_status fg_create_fail(fg_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(fg_create_error, sizeof fg_create_error, fmt, ap);
  va_end(ap);
  return s;
}

/* ------------------------------------------------------------------------------------------ */
/* Policies. */
const char *fg_policy_name(fg_policy p) {
  switch (p) {
    case FG_POLICY_DEFAULT: return "default";
    case FG_POLICY_EXPORTED_ONLY: return "exported-only";
    case FG_POLICY_EXPORTED_AND_CACHE: return "exported-and-cache";
    case FG_POLICY_JIT: return "jit";
  }
  return "unknown";
}

int fg_policy_allows_cache(const fg_context *ctx) {
  return ctx->loader && !ctx->no_disk_cache &&
         (ctx->policy == FG_POLICY_EXPORTED_AND_CACHE || ctx->policy == FG_POLICY_JIT);
}

int fg_policy_allows_jit(const fg_context *ctx) {
  return ctx->loader && ctx->policy == FG_POLICY_JIT;
}

const fg_rt_limits *fg_context_limits(const fg_context *ctx) { return &ctx->limits; }
fg_arch fg_context_arch(const fg_context *ctx) { return ctx->arch; }
fg_policy fg_context_policy(const fg_context *ctx) { return ctx->policy; }

/* ------------------------------------------------------------------------------------------ */
/* Creation and destruction. */
static fg_status fg_read_limits(CUdevice dev, fg_rt_limits *l, char *err, size_t errlen) {
  static const struct {
    int attr;
    size_t off;
    const char *name;
  } attrs[] = {
      {FG_CU_DEV_COMPUTE_CAPABILITY_MAJOR, offsetof(fg_rt_limits, cc_major), "compute capability"},
      {FG_CU_DEV_COMPUTE_CAPABILITY_MINOR, offsetof(fg_rt_limits, cc_minor), "compute capability"},
      {FG_CU_DEV_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, offsetof(fg_rt_limits, smem_optin_per_block),
       "opt-in shared memory per block"},
      {FG_CU_DEV_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, offsetof(fg_rt_limits, smem_per_sm),
       "shared memory per SM"},
      {FG_CU_DEV_MAX_REGISTERS_PER_MULTIPROCESSOR, offsetof(fg_rt_limits, regs_per_sm),
       "registers per SM"},
      {FG_CU_DEV_MAX_THREADS_PER_BLOCK, offsetof(fg_rt_limits, max_threads_per_block),
       "threads per block"},
      {FG_CU_DEV_MAX_THREADS_PER_MULTIPROCESSOR, offsetof(fg_rt_limits, max_threads_per_sm),
       "threads per SM"},
      {FG_CU_DEV_MULTIPROCESSOR_COUNT, offsetof(fg_rt_limits, sm_count), "SM count"},
      {FG_CU_DEV_MAX_GRID_DIM_Y, offsetof(fg_rt_limits, max_grid_y), "grid y limit"},
      {FG_CU_DEV_L2_CACHE_SIZE, offsetof(fg_rt_limits, l2_bytes), "L2 size"},
  };
  memset(l, 0, sizeof *l);
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
    int v = 0;
    CUresult r = fg_cu.cuDeviceGetAttribute(&v, attrs[i].attr, dev);
    if (r != FG_CUDA_SUCCESS) {
      char d[512];
      snprintf(err, errlen, "reading the %s of the device: %s", attrs[i].name,
               fg_cuda_describe(d, sizeof d, "cuDeviceGetAttribute", r));
      return fg_cuda_status(r);
    }
    memcpy((char *)l + attrs[i].off, &v, sizeof v);
  }
  int pools = 0;
  if (fg_cu.cuMemAllocAsync && fg_cu.cuMemFreeAsync &&
      fg_cu.cuDeviceGetAttribute(&pools, FG_CU_DEV_MEMORY_POOLS_SUPPORTED, dev) == FG_CUDA_SUCCESS)
    l->memory_pools = pools != 0;
  if (fg_cu.cuDeviceGetName(l->name, (int)sizeof l->name, dev) != FG_CUDA_SUCCESS)
    snprintf(l->name, sizeof l->name, "CUDA device");
  fg_cu.cuDriverGetVersion(&l->driver_version);
  fg_cu.cuDeviceTotalMem(&l->total_mem, dev);
  if (l->max_grid_y <= 0) l->max_grid_y = 65535;
  return FG_OK;
}

FG_API fg_status fg_context_create(fg_context **out, const fg_context_options *options) {
  fg_create_error[0] = 0;
  if (!out)
    return fg_create_fail(FG_ERROR_INVALID_ARGUMENT,
                          "out is NULL; pass the address of an fg_context pointer");
  *out = NULL;

  fg_context_options o;
  memset(&o, 0, sizeof o);
  if (options) {
    size_t size = options->size ? options->size : sizeof o;
    if (size > 65536)
      return fg_create_fail(FG_ERROR_INVALID_ARGUMENT,
                            "options->size = %zu is not the size of an fg_context_options; set "
                            "it to sizeof(fg_context_options), or 0",
                            options->size);
    if (size > sizeof o) {
      const unsigned char *tail = (const unsigned char *)options + sizeof o;
      for (size_t i = 0; i < size - sizeof o; i++)
        if (tail[i])
          return fg_create_fail(FG_ERROR_INVALID_ARGUMENT,
                                "options->size = %zu: the caller's fg_context_options has fields "
                                "that flashgen %s does not know, and some are set; upgrade "
                                "flashgen, or leave them zero",
                                options->size, FG_VERSION_STRING);
    }
    memcpy(&o, options, size < sizeof o ? size : sizeof o);
  }
  if ((int)o.policy < (int)FG_POLICY_DEFAULT || (int)o.policy > (int)FG_POLICY_JIT)
    return fg_create_fail(FG_ERROR_INVALID_ARGUMENT,
                          "options->policy = %d is not a policy; use FG_POLICY_DEFAULT (0), "
                          "FG_POLICY_EXPORTED_ONLY (1), FG_POLICY_EXPORTED_AND_CACHE (2) or "
                          "FG_POLICY_JIT (3)",
                          (int)o.policy);
  if (o.device < 0)
    return fg_create_fail(FG_ERROR_INVALID_ARGUMENT,
                          "options->device = %d is negative; pass a CUDA device ordinal (0 is "
                          "the first visible device)",
                          o.device);
  fg_policy policy = o.policy;
  const fg_loader *loader = fg_builtin_loader();
  if (policy == FG_POLICY_DEFAULT) policy = loader ? FG_POLICY_JIT : FG_POLICY_EXPORTED_ONLY;
  if (!loader && policy != FG_POLICY_EXPORTED_ONLY)
    return fg_create_fail(
        FG_ERROR_UNSUPPORTED,
        "options->policy = %s needs the full flashgen library, but this program is linked with "
        "flashgen_runtime, which can neither compile kernels nor read the kernel cache; use "
        "FG_POLICY_EXPORTED_ONLY (or FG_POLICY_DEFAULT) with exported kernels, or link flashgen",
        fg_policy_name(policy));

  char err[2048];
  if (fg_cuda_load(err, sizeof err) != 0) return fg_create_fail(FG_ERROR_NO_DRIVER, "%s", err);
  /* The loader may start slow work (the full library loads NVRTC, ~7 ms, whose version is a
   * cache-key input) while cuInit and the primary context below take far longer. */
  if (loader && policy != FG_POLICY_EXPORTED_ONLY && loader->preload) loader->preload();
  CUresult r = fg_cu.cuInit(0);
  if (r != FG_CUDA_SUCCESS) {
    char d[512];
    fg_cuda_describe(d, sizeof d, "cuInit", r);
    if (r == FG_CUDA_ERROR_NO_DEVICE)
      return fg_create_fail(FG_ERROR_NO_DRIVER,
                            "%s: no CUDA device is visible to this process (check nvidia-smi "
                            "and CUDA_VISIBLE_DEVICES)",
                            d);
    return fg_create_fail(
        fg_cuda_status(r) == FG_ERROR_CUDA ? FG_ERROR_NO_DRIVER : fg_cuda_status(r),
        "%s (driver %s)", d, fg_cuda_library_path());
  }
  int count = 0;
  r = fg_cu.cuDeviceGetCount(&count);
  if (r != FG_CUDA_SUCCESS) {
    char d[512];
    return fg_create_fail(FG_ERROR_NO_DRIVER, "%s",
                          fg_cuda_describe(d, sizeof d, "cuDeviceGetCount", r));
  }
  if (count == 0)
    return fg_create_fail(FG_ERROR_NO_DRIVER,
                          "no CUDA device is visible to this process (check nvidia-smi and "
                          "CUDA_VISIBLE_DEVICES)");
  if (o.device >= count)
    return fg_create_fail(FG_ERROR_INVALID_ARGUMENT,
                          "options->device = %d, but only %d CUDA device%s visible (ordinals "
                          "0..%d)",
                          o.device, count, count == 1 ? " is" : "s are", count - 1);
  CUdevice dev;
  r = fg_cu.cuDeviceGet(&dev, o.device);
  if (r != FG_CUDA_SUCCESS) {
    char d[512];
    return fg_create_fail(fg_cuda_status(r), "%s", fg_cuda_describe(d, sizeof d, "cuDeviceGet", r));
  }
  fg_rt_limits lim;
  fg_status st = fg_read_limits(dev, &lim, err, sizeof err);
  if (st != FG_OK) return fg_create_fail(st, "%s", err);
  if (lim.cc_major < 8)
    return fg_create_fail(FG_ERROR_UNSUPPORTED,
                          "device %d (%s) has compute capability %d.%d; flashgen's kernels need "
                          "8.0 (Ampere) or newer",
                          o.device, lim.name, lim.cc_major, lim.cc_minor);

  fg_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return fg_create_fail(FG_ERROR_OUT_OF_MEMORY, "out of host memory creating a context");
  ctx->id = atomic_fetch_add(&fg_next_ctx_id, 1);
  ctx->device = o.device;
  ctx->dev = dev;
  ctx->limits = lim;
  ctx->arch = fg_arch_for_cc(lim.cc_major, lim.cc_minor);
  ctx->policy = policy;
  ctx->loader = loader;
  ctx->quiet = o.quiet != 0;
  ctx->no_disk_cache = o.no_disk_cache != 0;
  if (o.cache_dir && !(ctx->cache_dir = strdup(o.cache_dir))) {
    free(ctx);
    return fg_create_fail(FG_ERROR_OUT_OF_MEMORY, "out of host memory creating a context");
  }
  pthread_mutex_init(&ctx->lock, NULL);
  ctx->errors = calloc(1, sizeof *ctx->errors);
  if (!ctx->errors) {
    free(ctx->cache_dir);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
    return fg_create_fail(FG_ERROR_OUT_OF_MEMORY, "out of host memory creating a context");
  }
  pthread_mutex_init(&ctx->errors->lock, NULL);

  r = fg_cu.cuDevicePrimaryCtxRetain(&ctx->cu, dev);
  if (r != FG_CUDA_SUCCESS) {
    char d[512];
    fg_cuda_describe(d, sizeof d, "cuDevicePrimaryCtxRetain", r);
    ctx->cu = NULL;
    fg_context_destroy(ctx);
    return fg_create_fail(fg_cuda_status(r), "device %d (%s): %s", o.device, lim.name, d);
  }
  if ((st = fg_registry_create(ctx)) != FG_OK || (st = fg_dispatch_memo_create(ctx)) != FG_OK) {
    fg_context_destroy(ctx);
    return fg_create_fail(st, "out of host memory creating a context");
  }
  *out = ctx;
  return FG_OK;
}

FG_API void fg_context_destroy(fg_context *ctx) {
  if (!ctx) return;
  if (ctx->registry) fg_registry_destroy(ctx);
  if (ctx->memo) fg_dispatch_memo_destroy(ctx);
  if (ctx->ws_pool && fg_ctx_push(ctx) == FG_OK) {
    fg_workspace_pool_destroy(ctx);
    fg_ctx_pop(ctx);
  }
  if (ctx->loader && ctx->loader->context_destroy) ctx->loader->context_destroy(ctx);
  if (ctx->cu) fg_cu.cuDevicePrimaryCtxRelease(ctx->dev);
  if (ctx->errors) {
    fg_err_slot *s = ctx->errors->head;
    while (s) {
      fg_err_slot *n = s->next;
      free(s->msg);
      free(s);
      s = n;
    }
    pthread_mutex_destroy(&ctx->errors->lock);
    free(ctx->errors);
  }
  /* Forget this thread's cached slot pointers (other threads' entries can never match again). */
  for (int i = 0; i < FG_TLS_SLOTS; i++)
    if (fg_tls_slots[i].ctx_id == ctx->id) fg_tls_slots[i].ctx_id = 0;
  free(ctx->cache_dir);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* Device helpers. Each makes the context current for its driver call. */
/* Whether each level of this thread's fg_ctx_push nesting really pushed: when the context is
 * already current (the usual case under PyTorch or the runtime API) nothing is pushed, which
 * saves two driver calls per fg_attention_forward. */
#define FG_PUSH_DEPTH 32
static _Thread_local unsigned char push_did[FG_PUSH_DEPTH];
static _Thread_local int push_depth;

fg_status fg_ctx_push(fg_context *ctx) {
  CUcontext cur = NULL;
  int did = 1;
  if (fg_cu.cuCtxGetCurrent(&cur) == FG_CUDA_SUCCESS && cur == ctx->cu) did = 0;
  if (did) {
    CUresult r = fg_cu.cuCtxPushCurrent(ctx->cu);
    if (r != FG_CUDA_SUCCESS) return fg_fail_cuda(ctx, "cuCtxPushCurrent", r);
  }
  if (push_depth < FG_PUSH_DEPTH) push_did[push_depth] = (unsigned char)did;
  push_depth++;
  return FG_OK;
}

void fg_ctx_pop(fg_context *ctx) {
  (void)ctx;
  if (push_depth <= 0) return;
  push_depth--;
  if (push_depth >= FG_PUSH_DEPTH || push_did[push_depth]) {
    CUcontext prev;
    fg_cu.cuCtxPopCurrent(&prev);
  }
}

/* Runs one driver call with the context pushed: `FG_DRIVER(ctx, "name", call)`. */
#define FG_DRIVER(ctx, name, call)                                \
  do {                                                            \
    fg_status st_ = fg_ctx_push(ctx);                             \
    if (st_ != FG_OK) return st_;                                 \
    CUresult r_ = (call);                                         \
    fg_ctx_pop(ctx);                                              \
    if (r_ != FG_CUDA_SUCCESS) return fg_fail_cuda(ctx, name, r_); \
    return FG_OK;                                                 \
  } while (0)

fg_status fg_dev_alloc(fg_context *ctx, CUdeviceptr *p, size_t bytes) {
  *p = 0;
  if (bytes == 0) return FG_OK;
  FG_DRIVER(ctx, "cuMemAlloc", fg_cu.cuMemAlloc(p, bytes));
}

void fg_dev_free(fg_context *ctx, CUdeviceptr p) {
  if (!p || fg_ctx_push(ctx) != FG_OK) return;
  fg_cu.cuMemFree(p);
  fg_ctx_pop(ctx);
}

/* A driver call that waits for the GPU, marked for the hang watchdog (watchdog.c): the comma
 * operator begins the mark before the call, fg_waited ends it after. FG_DRIVER_WAIT is FG_DRIVER
 * of such a call. */
static CUresult fg_waited(CUresult r) {
  fg_watchdog_wait_end();
  return r;
}
#define FG_WAITED(call) (fg_watchdog_wait_begin(), fg_waited(call))
#define FG_DRIVER_WAIT(ctx, name, call) FG_DRIVER(ctx, name, FG_WAITED(call))

/* The upload and the fills run on the legacy default stream, which work queued on a
 * non-blocking stream (flashgen check's, the tuner's: fg_stream_create) does not wait for, and
 * return before the GPU is done (a fill always; an upload from pageable memory once its bytes
 * are staged). So each waits for that stream before returning: a kernel launched after it reads
 * what was written (flashgen check, the tuner and fg_ab upload inputs and poison outputs this
 * way, then run kernels on their own stream). */
static CUresult fg_legacy_done(CUresult r) {
  return r == FG_CUDA_SUCCESS ? FG_WAITED(fg_cu.cuStreamSynchronize(FG_CU_STREAM_LEGACY)) : r;
}

fg_status fg_dev_upload(fg_context *ctx, CUdeviceptr dst, const void *src, size_t bytes) {
  if (bytes == 0) return FG_OK;
  FG_DRIVER(ctx, "cuMemcpyHtoD", fg_legacy_done(fg_cu.cuMemcpyHtoD(dst, src, bytes)));
}

fg_status fg_dev_download(fg_context *ctx, void *dst, CUdeviceptr src, size_t bytes) {
  if (bytes == 0) return FG_OK;
  FG_DRIVER_WAIT(ctx, "cuMemcpyDtoH", fg_cu.cuMemcpyDtoH(dst, src, bytes));
}

fg_status fg_dev_fill16(fg_context *ctx, CUdeviceptr dst, unsigned short value, size_t count) {
  if (count == 0) return FG_OK;
  FG_DRIVER(ctx, "cuMemsetD16", fg_legacy_done(fg_cu.cuMemsetD16(dst, value, count)));
}

fg_status fg_dev_fill32(fg_context *ctx, CUdeviceptr dst, unsigned int value, size_t count) {
  if (count == 0) return FG_OK;
  FG_DRIVER(ctx, "cuMemsetD32", fg_legacy_done(fg_cu.cuMemsetD32(dst, value, count)));
}

fg_status fg_dev_synchronize(fg_context *ctx) {
  FG_DRIVER_WAIT(ctx, "cuCtxSynchronize", fg_cu.cuCtxSynchronize());
}

fg_status fg_host_alloc_pinned(fg_context *ctx, void **p, size_t bytes) {
  *p = NULL;
  if (!fg_cu.cuMemAllocHost)
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED, "the CUDA driver lacks cuMemAllocHost_v2");
  FG_DRIVER(ctx, "cuMemAllocHost", fg_cu.cuMemAllocHost(p, bytes));
}

void fg_host_free_pinned(fg_context *ctx, void *p) {
  if (!p || !fg_cu.cuMemFreeHost || fg_ctx_push(ctx) != FG_OK) return;
  fg_cu.cuMemFreeHost(p);
  fg_ctx_pop(ctx);
}

fg_status fg_stream_create(fg_context *ctx, CUstream *s) {
  *s = NULL;
  FG_DRIVER(ctx, "cuStreamCreate", fg_cu.cuStreamCreate(s, FG_CU_STREAM_NON_BLOCKING));
}

void fg_stream_destroy(fg_context *ctx, CUstream s) {
  if (!s || fg_ctx_push(ctx) != FG_OK) return;
  fg_cu.cuStreamDestroy(s);
  fg_ctx_pop(ctx);
}

fg_status fg_stream_synchronize(fg_context *ctx, CUstream s) {
  FG_DRIVER_WAIT(ctx, "cuStreamSynchronize", fg_cu.cuStreamSynchronize(s));
}

fg_status fg_event_create(fg_context *ctx, CUevent *ev) {
  *ev = NULL;
  FG_DRIVER(ctx, "cuEventCreate", fg_cu.cuEventCreate(ev, FG_CU_EVENT_DEFAULT));
}

void fg_event_destroy(fg_context *ctx, CUevent ev) {
  if (!ev || fg_ctx_push(ctx) != FG_OK) return;
  fg_cu.cuEventDestroy(ev);
  fg_ctx_pop(ctx);
}

fg_status fg_event_record(fg_context *ctx, CUevent ev, CUstream s) {
  FG_DRIVER(ctx, "cuEventRecord", fg_cu.cuEventRecord(ev, s));
}

fg_status fg_event_elapsed_ms(fg_context *ctx, CUevent start, CUevent end, float *ms) {
  *ms = NAN;
  fg_status st = fg_ctx_push(ctx);
  if (st != FG_OK) return st;
  CUresult r = FG_WAITED(fg_cu.cuEventSynchronize(end));
  if (r == FG_CUDA_SUCCESS) r = fg_cu.cuEventElapsedTime(ms, start, end);
  fg_ctx_pop(ctx);
  return r == FG_CUDA_SUCCESS ? FG_OK : fg_fail_cuda(ctx, "cuEventElapsedTime", r);
}
