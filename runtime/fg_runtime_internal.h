/* fg_runtime_internal.h: the runtime's internal API, shared by the files of runtime/ and used by
 * autotune/, cli/ (`flashgen check`, `flashgen explain`) and the tests. Not installed, not stable.
 *
 * Owns: the context struct, the loader interface (struct fg_loader: the cache and NVRTC behind it,
 * filled by jit/loader.c in the full library), per-thread errors, input validation, the device
 * helpers (allocate, copy, fill, time with events), loading and launching an fg_kernel_image, the
 * module registry, exported tables, dispatch, and forcing a variant for a call.
 *
 * Conventions: functions taking an fg_context make its CUDA context current themselves (push/pop)
 * unless they say otherwise, and on failure leave the detailed message in the calling thread's
 * last error on that context (fg_context_last_error). */
#ifndef FG_RUNTIME_INTERNAL_H
#define FG_RUNTIME_INTERNAL_H
#include <pthread.h>
#include <stdint.h>

#include "fg_cuda.h"
#include "fg_kernel.h"
#include "fg_params.h"
#include "fg_problem.h"
#include "fg_tail.h"
#include "fg_variant.h"
#include "flashgen.h"

#if defined(__GNUC__)
#define FG_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define FG_PRINTF(f, a)
#endif

/* ------------------------------------------------------------------------------------------ */
/* Device limits, read off the device when the context is created. */
typedef struct fg_rt_limits {
  char name[256];            /* e.g. "NVIDIA H100 80GB HBM3" */
  int cc_major, cc_minor;
  int smem_optin_per_block;  /* bytes a block may opt into */
  int smem_per_sm;           /* bytes */
  int regs_per_sm;           /* 32-bit registers */
  int max_threads_per_block;
  int max_threads_per_sm;    /* resident threads per SM (2048 on sm_80 / sm_90) */
  int sm_count;
  int max_grid_y;            /* 65535 on every GPU so far */
  int l2_bytes;
  int memory_pools;          /* cuMemAllocAsync usable */
  int driver_version;        /* major*1000 + minor*10 */
  size_t total_mem;
} fg_rt_limits;

typedef struct fg_registry fg_registry;       /* registry.c */
typedef struct fg_dispatch_memo fg_dispatch_memo; /* dispatch.c */
typedef struct fg_err_table fg_err_table;     /* context.c */
typedef struct fg_loader fg_loader;           /* below */

struct fg_context {
  uint64_t id;               /* unique in the process, never reused */
  int device;                /* ordinal */
  CUdevice dev;
  CUcontext cu;              /* the device's primary context, retained */
  fg_rt_limits limits;
  fg_arch arch;              /* what the generator targets on this device */
  fg_policy policy;          /* resolved: never FG_POLICY_DEFAULT */
  int quiet;
  int no_disk_cache;
  char *cache_dir;           /* NULL: the cache's default */
  fg_err_table *errors;
  fg_registry *registry;
  fg_dispatch_memo *memo;
  pthread_mutex_t lock;      /* guards the lazily created members below */
  CUmemoryPool ws_pool;      /* the workspaces' pool (workspace.c); NULL: none (yet) */
  int ws_pool_tried;
  int poison_workspaces;     /* fill every workspace with 0xFF bytes (NaN) first: flashgen check */
  const fg_loader *loader;   /* fg_builtin_loader(): NULL in flashgen_runtime */
  void *jit;                 /* the loader's per-context state (jit/loader.c), created lazily */
};

/* ---- context (context.c) ---- */
const fg_rt_limits *fg_context_limits(const fg_context *ctx);
fg_arch fg_context_arch(const fg_context *ctx);
fg_policy fg_context_policy(const fg_context *ctx); /* resolved */
const char *fg_policy_name(fg_policy p);
/* Whether the policy lets the dispatcher read the disk cache / compile. */
int fg_policy_allows_cache(const fg_context *ctx);
int fg_policy_allows_jit(const fg_context *ctx);

/* ---- per-thread last error (context.c) ---- */
/* Sets the calling thread's last error on ctx. */
void fg_set_error(fg_context *ctx, const char *fmt, ...) FG_PRINTF(2, 3);
/* Sets the last error and returns s: `return fg_fail(ctx, FG_ERROR_..., "...", ...);` */
fg_status fg_fail(fg_context *ctx, fg_status s, const char *fmt, ...) FG_PRINTF(3, 4);
/* Sets the last error to the description of a failed driver call and returns its status. */
fg_status fg_fail_cuda(fg_context *ctx, const char *call, CUresult r);
/* Clears the last error (a call succeeded). */
void fg_clear_error(fg_context *ctx);
/* A warning: on stderr ("flashgen: warning: ...") unless the context is quiet, and kept as the
 * calling thread's last error text (prefixed "warning: ") until its next call. */
void fg_warn(fg_context *ctx, const char *fmt, ...) FG_PRINTF(2, 3);

/* ---- device helpers (context.c) ---- */
fg_status fg_ctx_push(fg_context *ctx);
void fg_ctx_pop(fg_context *ctx);
fg_status fg_dev_alloc(fg_context *ctx, CUdeviceptr *p, size_t bytes);
void fg_dev_free(fg_context *ctx, CUdeviceptr p); /* 0 is a no-op */
/* Upload and fills are complete on return (they wait for the legacy default stream, which a
 * kernel on a non-blocking stream would not wait for); a download reads what the GPU has
 * finished: synchronise the stream of the kernels that wrote it first. */
fg_status fg_dev_upload(fg_context *ctx, CUdeviceptr dst, const void *src, size_t bytes);
fg_status fg_dev_download(fg_context *ctx, void *dst, CUdeviceptr src, size_t bytes);
fg_status fg_dev_fill16(fg_context *ctx, CUdeviceptr dst, unsigned short value, size_t count);
fg_status fg_dev_fill32(fg_context *ctx, CUdeviceptr dst, unsigned int value, size_t count);
fg_status fg_dev_synchronize(fg_context *ctx);
/* Page-locked host memory (FG_ERROR_UNSUPPORTED when the driver lacks cuMemAllocHost). */
fg_status fg_host_alloc_pinned(fg_context *ctx, void **p, size_t bytes);
void fg_host_free_pinned(fg_context *ctx, void *p);
fg_status fg_stream_create(fg_context *ctx, CUstream *s);
void fg_stream_destroy(fg_context *ctx, CUstream s);
fg_status fg_stream_synchronize(fg_context *ctx, CUstream s);
fg_status fg_event_create(fg_context *ctx, CUevent *ev);
void fg_event_destroy(fg_context *ctx, CUevent ev);
fg_status fg_event_record(fg_context *ctx, CUevent ev, CUstream s);
/* Waits for end and returns the time between the two events in milliseconds. */
fg_status fg_event_elapsed_ms(fg_context *ctx, CUevent start, CUevent end, float *ms);

/* ---- validation (validate.c) ---- */
typedef enum fg_validate_mode {
  FG_VALIDATE_CALL = 0,    /* a real call: pointers required (unless the problem is empty) */
  FG_VALIDATE_SHAPES = 1   /* fg_explain: pointers may be NULL; non-NULL ones are still checked */
} fg_validate_mode;

/* The checks that need no driver: the size field, dtype, sizes, head_dim, GQA ratio, scale,
 * NULL pointers, 16-byte alignment of pointers and strides, strides that make O overlap, and
 * sizes whose element offsets overflow 64 bits. On success copies *in into *out normalised:
 * size = sizeof, default strides filled in, scale resolved (1/sqrt(d) for 0). On failure
 * returns FG_ERROR_INVALID_ARGUMENT (FG_ERROR_UNSUPPORTED for sizes past the launch limits)
 * with a message in err that names the argument and its value and says what is accepted. */
fg_status fg_validate_args(const fg_attention_args *in, fg_validate_mode mode,
                           fg_attention_args *out, char *err, size_t errlen);

/* 1 when the (normalised) problem launches nothing: batch, heads_q or seqlen_q is 0. */
int fg_args_empty(const fg_attention_args *a);

/* The checks that need the driver: q, k, v, o and lse (when set) are device (or managed)
 * memory of ctx's device. k and v are not checked when seqlen_k = 0. Returns
 * FG_ERROR_INVALID_ARGUMENT with the message in err. The caller has made ctx current. */
fg_status fg_validate_pointers(fg_context *ctx, const fg_attention_args *a, char *err,
                               size_t errlen);

/* The element count of a strided tensor [n0, n1, n2, d] (largest offset + 1), 0 if empty. */
int64_t fg_tensor_extent(int64_t n0, int64_t n1, int64_t n2, int64_t d, const int64_t stride[3]);

/* Fills the kernel parameter block from normalised args (workspace 0). */
void fg_params_from_args(const fg_attention_args *a, fg_fwd_params *p);

/* ---- kernel images: load and launch (registry.c, forward.c) ---- */
typedef struct fg_loaded_kernel {
  char name[FG_VARIANT_NAME_MAX]; /* variant or reference name */
  fg_arch arch;                    /* arch of the image */
  CUmodule module;
  CUfunction fn[FG_PLAN_MAX_STEPS]; /* the plan's steps (meta.steps), resolved in module */
  fg_kernel_meta meta;
  int from_ptx;                    /* the driver JIT-compiled the PTX (no cubin for this GPU) */
  fg_dtype dtype;                  /* of its variant; 0 for references (the tensor maps' type) */
  char source[256];                /* where the binary came from, for fg_explain */
} fg_loaded_kernel;

/* Loads img into ctx's CUDA context: the cubin, or the PTX when the cubin does not run on this
 * GPU; resolves the entry of every step of its plan; opts each into its dynamic shared memory
 * when above 48 KB. Fails with FG_ERROR_UNSUPPORTED when a step exceeds the device (threads,
 * shared memory) or its plan takes tensor maps the driver cannot encode (no
 * cuTensorMapEncodeTiled); FG_ERROR_INTERNAL when such a plan's block is not its variant's pass's
 * (fwd_tma for a forward variant, bwd_tma for a backward one).
 * out->source is left empty for the caller. */
fg_status fg_kernel_load(fg_context *ctx, const fg_kernel_image *img, fg_loaded_kernel *out);
void fg_kernel_unload(fg_context *ctx, fg_loaded_kernel *k);

/* Element sizes of a launch: inputs (Q, K, V), output O and LSE, in bytes. Forward kernels take
 * {2, 2, 4}; the reference kernels {2, 8, 8} (they write fp64). */
typedef struct fg_launch_elems {
  int in, out, lse;
} fg_launch_elems;
#define FG_ELEMS_FORWARD ((fg_launch_elems){2, 2, 4})
#define FG_ELEMS_REFERENCE ((fg_launch_elems){2, 8, 8})

/* The grid of a plan's step for a problem (before splitting along y; z > 1 only for a kv_tiles
 * main step that splits long query ranges, fg_plan_step_splits) on a device of sm_count SMs
 * (a persistent grid's blocks; 0: one block per tile). */
void fg_plan_grid(const fg_plan_step *s, int sm_count, int64_t batch, int64_t heads_q,
                  int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, uint64_t grid[3]);
/* The hang watchdog of the command-line tools (watchdog.c): fg_watchdog_arm starts it with a
 * limit of FLASHGEN_HANG_TIMEOUT seconds (default_s when unset; 0: off), after which a single
 * wait for the GPU ends the process with FG_WATCHDOG_EXIT and a message naming the last kernel
 * launched; -1 (after a message) when the variable is not a number. The runtime marks its
 * blocking waits and notes each launch's kernel; unarmed, the marks cost an atomic load. */
#define FG_WATCHDOG_EXIT 3
int fg_watchdog_arm(const char *tool, double default_s);
void fg_watchdog_launched(const char *entry); /* entry must outlive the waits after it */
void fg_watchdog_wait_begin(void);
void fg_watchdog_wait_end(void);
/* fg_plan_grid for a forward parameter block. */
void fg_launch_grid(const fg_plan_step *s, int sm_count, const fg_fwd_params *p, uint64_t grid[3]);

/* Launches k on stream s with p (which it copies). Splits the launch along the batch when
 * batch * heads_q exceeds the device's grid.y limit (adjusting the base addresses of every
 * chunk); allocates the workspace the kernel declares (stream-ordered, freed after the launch)
 * unless p->workspace is already set. Does not synchronise. Makes ctx current itself. */
fg_status fg_kernel_launch(fg_context *ctx, const fg_loaded_kernel *k, const fg_fwd_params *p,
                           fg_launch_elems elems, CUstream s);

/* One tensor of a call as a tensor map sees it: {head_dim, rows, heads, batch} elements of
 * elem_size bytes at addr, with element strides sn (row), sh (head), sb (batch). */
typedef struct fg_tmap_view {
  fg_tmap_tensor tensor; /* which one, for messages ("do" for dO) */
  unsigned long long addr;
  long long sb, sh, sn;
  long long heads, rows, batch, head_dim;
  int elem_size;
} fg_tmap_view;

/* Encodes the map of t for kernel k (cuTensorMapEncodeTiled) into out: t's dims in k->dtype, box
 * {64, box_rows, 1, 1}, 128-byte swizzle, out-of-bounds elements read as zeros; the stride of a
 * dimension of size 1 is taken as the contiguous one; t->rows == 0 (a tensor the kernel never
 * reads: no keys) leaves out zero. FG_ERROR_UNSUPPORTED, nothing written to the context's state
 * but the last error, for a dimension past 2^32, a stride the TMA cannot take (not a multiple of
 * 16 bytes, 2^40 bytes or more) or an encode the driver refuses, naming the kernel, the tensor and
 * what to do (k's loop order: qtma for a fwd_tma plan, kvtma for bwd_tma). No allocation. The
 * caller has made ctx current. The forward's and the backward's maps alike (tmap.c). */
fg_status fg_tmap_encode(fg_context *ctx, const fg_loaded_kernel *k, const fg_tmap_view *t,
                         int box_rows, fg_tmap *out);
/* The plan's maps of kernel k into out (views[i]: the view of its i-th map, tensor 0 for a tensor
 * the pass does not have: FG_ERROR_INTERNAL), each with its plan's box rows; the unused ones zero.
 * Fails as fg_tmap_encode. (tmap.c; the forward's and the backward's fill alike) */
fg_status fg_tmaps_encode(fg_context *ctx, const fg_loaded_kernel *k,
                          const fg_tmap_view views[FG_PLAN_MAX_TMAPS],
                          fg_tmap out[FG_PLAN_MAX_TMAPS]);

/* The parameter block of a forward plan that takes tensor maps (k->meta.params ==
 * FG_PARAMS_FWD_TMA): out->p = *p, and out->tmap[i] encoded (fg_tmap_encode) from the plan's i-th
 * map and p's pointers, sizes and strides (elems: their element sizes; p->batch: one launch's
 * batches), the unused ones zero. Fails as fg_tmap_encode. (forward.c) */
fg_status fg_fwd_tma_params_fill(fg_context *ctx, const fg_loaded_kernel *k, const fg_fwd_params *p,
                                 fg_launch_elems elems, fg_fwd_tma_params *out);
/* The same for every step of a backward plan that takes them (FG_PARAMS_BWD_TMA): out->p = *p
 * (one launch's batches, its workspaces already in place), out->tmap[i] the plan's i-th map of q,
 * do (dO: d_o, do_sb/do_sh/do_sn, heads_q, seqlen_q), k or v, elements of 2 bytes. (backward.c) */
fg_status fg_bwd_tma_params_fill(fg_context *ctx, const fg_loaded_kernel *k, const fg_bwd_params *p,
                                 fg_bwd_tma_params *out);

/* ---- exported tables (registry.c) ---- */
/* A tuned choice of an exported table: the problem key (fg_problem_format) and the variant. */
typedef struct fg_exported_choice {
  const char *bucket;  /* e.g. "fwd_d128_bf16_causal_nk4096" */
  const char *variant; /* canonical variant name; its arch says which GPUs it is for */
} fg_exported_choice;

/* What `flashgen export` writes: kernels (cubin + PTX, launch contract) and tuned choices. The
 * table and everything it points to must stay valid for the life of the process. */
typedef struct fg_exported_table {
  const char *description;           /* who produced it: version, template hash, GPU */
  const fg_kernel_image *kernels;
  size_t n_kernels;
  const fg_exported_choice *choices;
  size_t n_choices;
} fg_exported_table;

/* Registers an exported table for every context of the process (present and future); the
 * dispatcher looks there first. Registering the same table twice is a no-op. Returns
 * FG_ERROR_INVALID_ARGUMENT (message in err) for a malformed table: a kernel without a name,
 * a cubin or PTX, or an entry point; a choice naming a variant that does not parse. */
fg_status fg_register_exported(const fg_exported_table *t, char *err, size_t errlen);

/* Bumped by every registration: decisions made before it may be stale. */
uint64_t fg_exported_generation(void);

/* How an image built for arch `img` can run on a device of compute capability major.minor:
 * 3 = built for exactly that arch, 2 = its cubin runs there, 1 = only through its PTX, 0 = no. */
int fg_arch_compat(fg_arch img, int cc_major, int cc_minor);

/* The best exported kernel for v on ctx's device: same fields as v but the arch, which must be
 * compatible (exact arch first). Returns the image and its table's description, or NULL. */
const fg_kernel_image *fg_exported_find(const fg_context *ctx, const fg_variant *v,
                                        const char **table_desc);

/* The exported choice for a problem key: exact key first, then the nearest bucket of the same
 * prefix (see fg_problem_prefix). Returns 1 with *out and a sentence in why, or 0. */
int fg_exported_choice_for(const fg_context *ctx, const fg_problem *prob, fg_variant *out,
                           char *why, size_t whylen);

/* Any exported kernel with v's pass, d, dtype and causal that runs on ctx's device. */
int fg_exported_any(const fg_context *ctx, const fg_variant *v, fg_variant *out);

/* A short summary of what the exported tables hold for ctx's device, for error messages. */
void fg_exported_summary(const fg_context *ctx, char *buf, size_t len);

/* ---- the module registry (registry.c) ---- */
fg_status fg_registry_create(fg_context *ctx);
void fg_registry_destroy(fg_context *ctx); /* unloads every module; ctx must be current-able */

/* The loaded kernel of v, loading it on first use in the order of the policy: exported table,
 * disk cache, NVRTC (then stored in the cache). One load per variant per context: the first
 * thread loads, the others wait. A failure that will not change (compile error, a contract the
 * device cannot run) is remembered and returned again without retrying, with its message; a
 * missing kernel is retried after a new exported table is registered. The pointer stays valid
 * until the context is destroyed. */
fg_status fg_registry_get(fg_context *ctx, const fg_variant *v, const fg_loaded_kernel **out);


/* A load function fills *k (with k->source) or returns an error with the last error set. */
typedef fg_status (*fg_load_fn)(fg_context *ctx, const void *arg, fg_loaded_kernel *k);
/* The registry's one-load-per-key machinery, for loaders of kernels other than variants (the
 * reference kernels, jit/loader.c): the kernel under key, loaded by load(arg) on first use. */
fg_status fg_registry_acquire(fg_context *ctx, const char *key, fg_load_fn load, const void *arg,
                              const fg_loaded_kernel **out);

/* Where v's binary would come from, without compiling or loading anything. */
typedef enum fg_binary_source {
  FG_BINARY_MISSING = 0,  /* not anywhere the policy allows */
  FG_BINARY_LOADED,       /* already loaded in this context */
  FG_BINARY_EXPORTED,     /* in a registered exported table */
  FG_BINARY_CACHED,       /* in the disk cache */
  FG_BINARY_COMPILE,      /* would be compiled with NVRTC */
  FG_BINARY_FAILED        /* an earlier load failed; the failure is remembered */
} fg_binary_source;
/* Says in desc where v's binary would come from; fills *meta when it is known. */
fg_binary_source fg_registry_probe(fg_context *ctx, const fg_variant *v, char *desc, size_t len,
                                   fg_kernel_meta *meta, int *meta_known);

/* ---- problem keys and dispatch (dispatch.c) ---- */
/* ---- the loader (jit/loader.c in the full library; none in flashgen_runtime) ---- */
/* Where binaries come from after the exported tables: the full library's loader reads the disk
 * cache and compiles with NVRTC (storing into the cache); flashgen_runtime has none, so the
 * runtime is the same code in both libraries and never names the generator or the cache. Each
 * function honours the context's policy (fg_policy_allows_cache / _jit). */
struct fg_loader {
  const char *name;
  /* Starts slow work a first load will need (loading NVRTC) while the context is created. */
  void (*preload)(void);
  /* Frees the loader's per-context state (ctx->jit). */
  void (*context_destroy)(fg_context *ctx);
  /* Loads variant v (canonical name `name`) from the cache or by compiling. Sets *final = 1 when
   * the answer is final (FG_OK with *k loaded and k->source set, or a failure with the last
   * error set); *final = 0 when it found nothing and the runtime should say what is missing. */
  fg_status (*load)(fg_context *ctx, const fg_variant *v, const char *name, fg_loaded_kernel *k,
                    int *final);
  /* fg_registry_probe past the exported tables: the cache, compiling, or missing, in desc. */
  fg_binary_source (*probe)(fg_context *ctx, const fg_variant *v, const char *name, char *desc,
                            size_t len, fg_kernel_meta *meta, int *meta_known);
  /* The tuned winner for prob on this device (exact bucket, then nearest): 1 with *out and the
   * rule in words, or 0. */
  int (*tuned)(fg_context *ctx, const fg_problem *prob, fg_variant *out, char *rule,
               size_t rulelen);
};
/* The loader this library was linked with: runtime/loader_none.c (flashgen_runtime) returns
 * NULL, jit/loader.c (flashgen) the JIT. Read once per context by fg_context_create. */
const fg_loader *fg_builtin_loader(void);

/* The problem key and the shape buckets are core/fg_problem.h's (fg_problem, fg_seqlen_bucket,
 * fg_problem_format, fg_problem_builtin). */

/* What the dispatcher chose for a problem key. */
typedef struct fg_dispatch {
  char key[FG_PROBLEM_KEY_MAX];
  fg_variant variant;
  char variant_name[FG_VARIANT_NAME_MAX];
  char rule[768]; /* which record or rule, in words */
} fg_dispatch;

/* Chooses the variant for normalised args: an exported choice, else the tuned winner in the
 * cache (exact bucket, then nearest of the same prefix), else the built-in rule; under a policy
 * that forbids compiling, the first of those whose binary is available, then any exported kernel
 * of the same (pass, d, dtype, causal). Memoised per context and key. Without load_kernel only
 * decides (fg_explain: nothing is compiled or loaded; *kernel untouched); with it, also returns
 * the loaded kernel. *out stays valid until the context is destroyed. */
fg_status fg_dispatch_choose(fg_context *ctx, const fg_attention_args *a, int load_kernel,
                             const fg_dispatch **out, const fg_loaded_kernel **kernel);
/* fg_dispatch_choose for any pass: the same order (exported choice, tuned record of the key
 * "<pass>_d..." or the nearest bucket of its prefix, the pass's built-in rule), memoised per
 * (pass, key). a holds the problem's shapes (a backward call's: fg_backward_forward_args). */
fg_status fg_dispatch_choose_pass(fg_context *ctx, fg_pass pass, const fg_attention_args *a,
                                  int load_kernel, const fg_dispatch **out,
                                  const fg_loaded_kernel **kernel);
/* The loaded kernel (plan) the dispatcher chooses for normalised backward args. */
fg_status fg_dispatch_backward(fg_context *ctx, const fg_attention_backward_args *b,
                               const fg_loaded_kernel **kernel);
/* Forgets the memoised choices (after new tuning records were written). */
void fg_dispatch_forget(fg_context *ctx);
fg_status fg_dispatch_memo_create(fg_context *ctx);
void fg_dispatch_memo_destroy(fg_context *ctx);

/* ---- workspaces (workspace.c) ---- */
typedef struct fg_workspace {
  CUdeviceptr ptr; /* 0: none */
  int async;       /* stream-ordered: freed with cuMemFreeAsync */
} fg_workspace;
/* Allocates bytes of device scratch for a call on stream s (0 bytes: none), from the context's
 * pool (kept between calls), else the device's default pool, else cuMemAlloc. On failure the
 * last error names `what` and the size. The caller has made ctx current. */
fg_status fg_workspace_alloc(fg_context *ctx, size_t bytes, CUstream s, const char *what,
                             fg_workspace *w);
/* With ctx->poison_workspaces (fg_context_poison_workspaces), the new workspace is filled with
 * 0xFF bytes (fp32 NaN) on s first, so that a plan reading scratch memory it never wrote fails
 * at once instead of depending on what the memory held before (the pool's reused blocks). */
void fg_context_poison_workspaces(fg_context *ctx, int on);
/* Frees it after the work queued on s (synchronising s when there are no pools). */
void fg_workspace_free(fg_context *ctx, fg_workspace *w, CUstream s);
/* Destroys the context's pool (context destruction; ctx current). */
void fg_workspace_pool_destroy(fg_context *ctx);

/* ---- backward (backward.c) ---- */
/* Normalised backward arguments: default strides filled in, scale resolved. The checks that
 * need no driver (validate.c). */
fg_status fg_validate_backward_args(const fg_attention_backward_args *in, fg_validate_mode mode,
                                    fg_attention_backward_args *out, char *err, size_t errlen);
/* fg_validate_pointers for a backward call: the forward's tensors, then d_o, dq, dk, dv and the
 * caller's workspace. The caller has made ctx current. */
fg_status fg_validate_backward_pointers(fg_context *ctx, const fg_attention_backward_args *b,
                                        char *err, size_t errlen);
/* Fills the backward plan's parameter block from normalised args (workspace as given). */
void fg_bwd_params_from_args(const fg_attention_backward_args *a, fg_bwd_params *p);
/* The tail a backward call a (normalised) runs with under plan m on ctx's device (backward.c;
 * core/fg_tail.h): what the launch, the workspace's size and explain use. */
fg_plan_tail fg_bwd_tail(const fg_context *ctx, const fg_kernel_meta *m,
                         const fg_attention_backward_args *a);
/* The forward problem of a backward call (shapes, q, k, v, o, lse, strides, scale), for keys and
 * the checks the two share. */
void fg_backward_forward_args(const fg_attention_backward_args *b, fg_attention_args *out);
/* fg_attention_backward with the variant forced (NULL: the built-in rule / tuned choice). */
fg_status fg_attention_backward_variant(fg_context *ctx, const fg_attention_backward_args *args,
                                        CUstream stream, const fg_variant *v);

/* ---- forward (forward.c) ---- */
/* fg_attention_forward with the variant forced (NULL: the dispatcher's choice). v must match
 * the problem's head_dim, dtype and causal flag (FG_ERROR_INVALID_ARGUMENT otherwise). Used by
 * `flashgen check` and autotune to run every variant. */
fg_status fg_attention_forward_variant(fg_context *ctx, const fg_attention_args *args,
                                       CUstream stream, const fg_variant *v);
#endif
