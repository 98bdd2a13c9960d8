/* flashgen.h: the public runtime API of flashgen.
 *
 * flashgen computes exact attention, O = softmax(scale * Q K^T) V, on NVIDIA GPUs with kernels it
 * generates, compiles at run time (NVRTC), tunes and caches, or with kernels exported ahead of
 * time. An application creates one fg_context per device, fills an fg_attention_args and calls
 * fg_attention_forward; flashgen picks the kernel.
 *
 *     fg_context *ctx;
 *     if (fg_context_create(&ctx, NULL) != FG_OK) { ... }
 *     fg_attention_args a = {0};
 *     a.dtype = FG_DTYPE_BF16; a.batch = B; a.heads_q = H; a.heads_kv = H;
 *     a.seqlen_q = N; a.seqlen_k = N; a.head_dim = 128;
 *     a.q = dq; a.k = dk; a.v = dv; a.o = dout;            // device pointers, (B, H, N, d)
 *     fg_status s = fg_attention_forward(ctx, &a, stream);
 *     if (s != FG_OK) fprintf(stderr, "%s\n", fg_context_last_error(ctx));
 *     fg_context_destroy(ctx);
 *
 * Threads: one context may be used from several host threads at once. fg_context_last_error is
 * per thread (it reports the last failure of the calling thread on that context).
 *
 * CUDA: flashgen loads the driver (libcuda.so.1) itself; nothing here needs cuda.h. The context
 * uses the device's primary context, so memory from cudaMalloc (runtime API) or PyTorch works.
 * FLASHGEN_CUDA_LIBRARY=/path/to/libcuda.so.1 names the driver explicitly (then it is the only
 * place looked at).
 */
#ifndef FLASHGEN_H
#define FLASHGEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FG_API __attribute__((visibility("default")))
#else
#define FG_API
#endif

/* The same typedef as cuda.h; repeating a typedef of the same type is valid C11 and C++. */
typedef struct CUstream_st *CUstream;

/* Status codes. fg_status_string(code) gives static text; fg_context_last_error(ctx) the
 * detailed message of the last failure (argument names, variant names, NVRTC logs). */
typedef enum fg_status {
  FG_OK = 0,
  FG_ERROR_INVALID_ARGUMENT = 1, /* bad input: nothing was launched and no output was touched */
  FG_ERROR_UNSUPPORTED = 2,      /* valid input that no kernel of this build can serve */
  FG_ERROR_NO_DRIVER = 3,        /* libcuda.so.1 missing, or no CUDA device */
  FG_ERROR_NO_COMPILER = 4,      /* a kernel must be compiled but NVRTC could not be loaded */
  FG_ERROR_COMPILE = 5,          /* NVRTC rejected generated source (the log is in the message) */
  FG_ERROR_KERNEL_MISSING = 6,   /* the policy forbids compiling and no kernel was found */
  FG_ERROR_CUDA = 7,             /* a CUDA driver call failed (its name and code are in the message) */
  FG_ERROR_OUT_OF_MEMORY = 8,
  FG_ERROR_CACHE = 9,            /* the on-disk cache failed in a way that could not be degraded */
  FG_ERROR_INTERNAL = 10
} fg_status;

/* Static English text for a status code; never NULL, valid forever. */
FG_API const char *fg_status_string(fg_status code);

/* The version of the library, "MAJOR.MINOR.PATCH"; valid forever. */
FG_API const char *fg_version(void);

/* Element types of Q, K, V and O. Arithmetic accumulates in fp32. 0 is "not set" (an error). */
typedef enum fg_dtype { FG_DTYPE_F16 = 1, FG_DTYPE_BF16 = 2 } fg_dtype;

/* What the dispatcher may do to find a kernel (see DESIGN.md, "Dispatch order and policies").
 * FG_POLICY_DEFAULT is FG_POLICY_JIT for the full library and FG_POLICY_EXPORTED_ONLY for
 * flashgen_runtime, which cannot compile. */
typedef enum fg_policy {
  FG_POLICY_DEFAULT = 0,
  FG_POLICY_EXPORTED_ONLY = 1,      /* never compile, never touch the disk */
  FG_POLICY_EXPORTED_AND_CACHE = 2, /* exported kernels, then the on-disk cache; never compile */
  FG_POLICY_JIT = 3                 /* exported, then cache, then compile with NVRTC */
} fg_policy;

/* Options for fg_context_create. Zero-initialise, then set what you need; NULL means all
 * defaults. The struct only grows by appending fields: set `size` to sizeof(fg_context_options)
 * (0 is taken as the size of this version). */
typedef struct fg_context_options {
  size_t size;
  int device;          /* CUDA device ordinal; default 0 */
  fg_policy policy;    /* default FG_POLICY_DEFAULT */
  const char *cache_dir; /* NULL: $FLASHGEN_CACHE_DIR, else $XDG_CACHE_HOME/flashgen, else
                            ~/.cache/flashgen. Copied; the caller keeps ownership. */
  int no_disk_cache;   /* nonzero: keep compiled kernels in memory only */
  int quiet;           /* nonzero: no warnings on stderr (they still reach last_error) */
} fg_context_options;

typedef struct fg_context fg_context;

/* Creates a context bound to one device. On success *out owns the context (release it with
 * fg_context_destroy). On failure *out is NULL and the returned code says why; the detailed
 * message is available from fg_last_create_error() on the calling thread. */
FG_API fg_status fg_context_create(fg_context **out, const fg_context_options *options);

/* The detailed message of the last failed fg_context_create on the calling thread, or "". Valid
 * until the next fg_context_create on that thread. */
FG_API const char *fg_last_create_error(void);

/* Releases the context, its loaded modules and its handles. NULL is a harmless no-op. Kernels
 * still running on a stream are not waited for; synchronise first if they use the context. */
FG_API void fg_context_destroy(fg_context *ctx);

/* The detailed message of the last failure of a call on ctx made by the calling thread, or ""
 * if the last call succeeded. A call that succeeded with a warning (e.g. a kernel cache that
 * cannot be used) leaves the warning here, starting with "warning: ". Valid until the calling
 * thread's next call on ctx. NULL ctx gives a static string. */
FG_API const char *fg_context_last_error(const fg_context *ctx);

/* Arguments of one attention call. Zero-initialise, then set the fields; the struct only grows
 * by appending fields whose zero value means "off", so an older caller keeps working.
 *
 * Shapes: Q and O are [batch, heads_q, seqlen_q, head_dim]; K and V are
 * [batch, heads_kv, seqlen_k, head_dim]; lse, when not NULL, is fp32 [batch, heads_q, seqlen_q],
 * contiguous, and receives log(sum_j exp(scale * q·k_j)) per row (natural log).
 *
 * Strides are in elements, for the batch, head and sequence dimensions in that order; the last
 * dimension is always contiguous. All three zero means the contiguous (B, H, N, d) layout. For
 * the (B, N, H, d) layout use {N*H*d, d, H*d}. Each pointer and each stride in bytes must be a
 * multiple of 16. q, k, v, o and lse must be memory of the context's device (device or managed
 * memory; not host memory, not another device's). The outputs (o, lse) must not overlap each
 * other or an input, and the strides of O must give every element its own address; the inputs
 * may share memory (K and V in one buffer).
 *
 * head_dim: a multiple of 8 from 32 to 256. heads_q a multiple of heads_kv (GQA; heads_kv = 1 is
 * MQA). seqlen_q and seqlen_k may differ.
 *
 * Causal masking, when seqlen_q != seqlen_k, is aligned to the bottom-right corner (the
 * FlashAttention-2 convention): query i sees keys j <= i + seqlen_k - seqlen_q. A query row
 * that sees no key (causal with seqlen_q > seqlen_k) gets O = 0 and lse = -inf.
 *
 * Empty problems: batch = 0, heads_q = 0 or seqlen_q = 0 launch nothing and touch nothing; their
 * pointers may be NULL (PyTorch gives empty tensors a NULL data pointer). seqlen_k = 0 sets O to
 * zero and lse to -inf (the limit of an empty softmax sum); k and v may then be NULL.
 *
 * Sizes: all index arithmetic is 64-bit; batch * heads_q may exceed the grid's 65535 (the call
 * is split into several launches), a tensor may have more than 2^31 elements. Kernels that load
 * through TMA tensor maps (Hopper, loop order qtma; their plan says so) take strides below 2^40
 * bytes (a dimension of size 1 may have any stride) and a driver with cuTensorMapEncodeTiled
 * (CUDA 12.0 or newer); otherwise the call fails with FG_ERROR_UNSUPPORTED naming the tensor and
 * launches nothing.
 *
 * scale: the softmax scale; 0 means 1/sqrt(head_dim). Must be finite and positive otherwise. */
typedef struct fg_attention_args {
  size_t size; /* sizeof(fg_attention_args), or 0 for this version's size */
  fg_dtype dtype;
  int causal;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  const void *q, *k, *v;
  void *o;
  float *lse;
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
  float scale;
} fg_attention_args;

/* Computes the attention forward pass on `stream` (NULL: the legacy default stream). Returns
 * once the kernel is enqueued; the first call for a new kernel may compile it (milliseconds to
 * seconds) unless it is in the cache or an exported table. On FG_ERROR_INVALID_ARGUMENT nothing
 * was launched and no output was written. */
FG_API fg_status fg_attention_forward(fg_context *ctx, const fg_attention_args *args,
                                      CUstream stream);

/* Arguments of one backward call: the gradients dQ, dK, dV of a loss whose gradient with respect
 * to the forward's output O is dO. Zero-initialise, then set the fields; the struct only grows
 * by appending fields whose zero value means "off".
 *
 * Everything the forward took is here again with the same meaning and the same rules (dtype,
 * causal, the sizes, q, k, v, their strides, scale): pass exactly what the forward call got.
 * o and lse are the forward's outputs (now read): O [batch, heads_q, seqlen_q, head_dim] at
 * o_stride, and the fp32 log-sum-exp [batch, heads_q, seqlen_q], contiguous, which the forward
 * writes when its lse is set; the backward recomputes P = exp(scale * Q K^T - lse) from it, so it
 * is required. d_o is dO, the shape of O, at do_stride. dq (the shape of Q), dk and dv (the shape
 * of K and V) receive the gradients at their strides; with GQA/MQA, dK and dV of a KV head are
 * the sums over the query heads it serves. All strides follow the forward's rules (elements,
 * batch/head/row, all zero = contiguous, multiples of 16 bytes); a plan that loads through TMA
 * tensor maps (Hopper, loop order kvtma) maps q, d_o, k and v as the forward's TMA kernels map
 * their inputs, with the same limits (strides below 2^40 bytes, a driver with
 * cuTensorMapEncodeTiled; otherwise FG_ERROR_UNSUPPORTED naming the tensor, "do" for d_o, and
 * nothing launched).
 *
 * Checked before anything is launched (FG_ERROR_INVALID_ARGUMENT, naming the argument): every
 * tensor's pointer and strides as for the forward; lse present; dq, dk, dv not overlapping each
 * other or any input, and each giving every element its own address. Not checked (it cannot be
 * without redoing the forward): that o and lse really come from a forward of these q, k, v with
 * this scale and causal flag; a mismatch gives wrong gradients, not an error.
 *
 * seqlen_k = 0: dQ is set to zero (dK and dV are empty). Rows that saw no key (lse = -inf)
 * get dQ = 0 and add nothing to dK, dV.
 *
 * Workspace: the backward needs fp32 scratch of (head_dim + 1) * 4 bytes per (batch, query head,
 * query row) (the Hopper kernel's dQ accumulator rounds each head's query rows up to its query
 * block, 64 or 128 rows), plus 4 bytes per 16 query rows of semaphores (deterministic mode; on
 * Hopper in either mode up to d = 128 with 64-row query blocks, and past d = 128 with a causal
 * mask), plus for long query ranges (when
 * seqlen_q * heads_q / heads_kv exceeds the plan's threshold, 65536 today: the main kernel then
 * splits each key block's query rows over several blocks) fp32 partial sums of dK and dV: per
 * K/V block of the kernel (Bc key rows, seqlen_k rounded up) of each (batch, KV head), 8 * Bc *
 * head_dim + 16 bytes; and without a mask, not deterministic, where the main kernel's last wave
 * of blocks on this GPU is partial and the runtime splits it into pieces (the tail: `flashgen
 * explain --backward` shows it), the same partial sums for the tail's K/V blocks only, fewer
 * than the GPU's SMs times the blocks each holds. The kernel's plan declares them all
 * (templates/bwd.lua), so the numbers are its data: fg_attention_backward_workspace_size says
 * how much (for this GPU: a buffer sized on one GPU may be short on another). With workspace = NULL
 * flashgen takes it, stream-ordered, from a memory pool of the context that keeps its memory
 * between calls (the pool is destroyed with the context; without driver memory pools,
 * cuMemAlloc and a synchronisation of the stream); or pass a device buffer of at least that many
 * bytes (16-byte aligned) that nothing else uses until the call's kernels finish.
 *
 * deterministic: nonzero gives bitwise-identical dQ, dK, dV from run to run (same inputs, same
 * GPU, same kernel): the key blocks add their parts of each dQ tile in a fixed order, waiting for
 * one another through 4 more workspace bytes per 16 query rows of each (batch, query head). It
 * costs speed, most without a mask: on the H100's built-in kernels (bench/NOTES.md session 29,
 * B N = 16k, bf16) 1.09-1.11x the time without it at d = 64 512-1k keys, 1.04x from 2k; 1.02-1.11x
 * at d = 128; past d = 128 1.07-1.11x (d = 192 and 256, 1k-16k keys); causal 1.00-1.08x (past
 * d = 128 up to 1024 keys a causal call runs in this mode's order anyway, as it is faster there).
 * dK and dV are deterministic either way.
 * Without it, dQ's fp32 additions land in a varying order and its last bits may differ. */
typedef struct fg_attention_backward_args {
  size_t size; /* sizeof(fg_attention_backward_args), or 0 for this version's size */
  fg_dtype dtype;
  int causal;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  const void *q, *k, *v, *o, *d_o;
  const float *lse;
  void *dq, *dk, *dv;
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3], do_stride[3];
  int64_t dq_stride[3], dk_stride[3], dv_stride[3];
  float scale;
  int deterministic;
  void *workspace;
  size_t workspace_size; /* bytes at workspace */
} fg_attention_backward_args;

/* Computes dQ, dK and dV on `stream` (NULL: the legacy default stream); returns once the
 * kernels are enqueued. Like fg_attention_forward, the first call for a new kernel may compile
 * it. On FG_ERROR_INVALID_ARGUMENT nothing was launched and no output was written. */
FG_API fg_status fg_attention_backward(fg_context *ctx, const fg_attention_backward_args *args,
                                       CUstream stream);

/* The workspace in bytes a backward call with these arguments needs (the pointers may be NULL;
 * only the sizes matter), from the plan of the kernel that serves the problem: like the call, it
 * chooses that kernel, and reads its plan without loading or compiling it (from an exported
 * table, the kernel cache or its template; only when none says it, the kernel is loaded). Returns
 * FG_OK; FG_ERROR_INVALID_ARGUMENT with the reason in the context's last error; or the error
 * choosing the kernel failed with (FG_ERROR_KERNEL_MISSING ...), as the call would. */
FG_API fg_status fg_attention_backward_workspace_size(fg_context *ctx,
                                                      const fg_attention_backward_args *args,
                                                      size_t *bytes);

/* Writes into buf (at most len bytes, always NUL-terminated when len > 0) which kernel
 * fg_attention_forward would run for args and why (the key, the tuning record or rule, the
 * variant, where its binary comes from, the launch shape, the tensor maps a TMA kernel is passed:
 * "TMA: q 128 rows, k 128, v 128"). Launches and compiles nothing; the
 * pointers in args may be NULL (only the shapes matter). Returns FG_OK, or the error the call
 * would fail with before launching (invalid arguments; FG_ERROR_KERNEL_MISSING when the policy
 * forbids compiling and no binary is available), with buf explaining it as well. */
FG_API fg_status fg_explain(fg_context *ctx, const fg_attention_args *args, char *buf, size_t len);

/* Writes into buf (at most len bytes, always NUL-terminated when len > 0) which backward plan
 * fg_attention_backward would run for args and why: the key ("bwd_d128_bf16_causal_nk4096"),
 * the exported choice, tuning record (exact bucket or the nearest) or built-in rule that chose
 * it, the variant, where its binary comes from, the plan's three launches (D and the dQ
 * accumulator, the main K/V-outer kernel, the dQ conversion), the tensor maps every launch of a
 * TMA plan is passed ("TMA: q 64 rows, do 64, k 128, v 128") and the workspace. Launches and
 * compiles nothing; the pointers in args may be NULL (only the shapes matter). Returns FG_OK, or
 * the error the call would fail with before launching (invalid arguments; FG_ERROR_KERNEL_MISSING
 * when the policy forbids compiling and no binary is available), with buf explaining it as
 * well. */
FG_API fg_status fg_explain_backward(fg_context *ctx, const fg_attention_backward_args *args,
                                     char *buf, size_t len);

/* An exported kernel table: what `flashgen export` writes as C (its layout is in
 * flashgen_export.h; the generated <prefix>_kernels.h declares `const fg_export
 * *<prefix>_flashgen_export(void)`, which returns it). */
typedef struct fg_export fg_export;

/* Registers an exported table for every context of the process, present and future: the
 * dispatcher looks there first (its tuned choices, then its kernels), under every policy. This
 * is how an application that links only flashgen_runtime gets kernels; call it once, from any
 * thread. The table and everything it points to must stay valid for the life of the process
 * (the generated file keeps it in static storage); flashgen copies nothing big and frees
 * nothing. Registering the same table again is a harmless no-op. Tables do not replace one
 * another: each kernel is looked for in all of them, the one built for the device's exact arch
 * first.
 *
 * When a problem needs a kernel that no registered table holds for the device, and the policy
 * forbids compiling (FG_POLICY_EXPORTED_ONLY, the default of flashgen_runtime, or
 * FG_POLICY_EXPORTED_AND_CACHE), fg_attention_forward returns FG_ERROR_KERNEL_MISSING and
 * fg_context_last_error names the problem, the GPU and its arch, and what the registered tables
 * contain for it ("none of which runs on ... : export for sm_90a").
 *
 * Returns FG_OK; FG_ERROR_INVALID_ARGUMENT for NULL, a table of an unknown ABI version, or a
 * malformed entry (a kernel without a variant name that parses, an arch, an entry point or
 * any binary; a choice naming a variant that does not parse); FG_ERROR_OUT_OF_MEMORY. On
 * failure nothing is registered and err (when not NULL, at most errlen bytes, always
 * NUL-terminated when errlen > 0) says which entry is wrong and why. */
FG_API fg_status fg_register_export(const fg_export *table, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* FLASHGEN_H */
