/* validate.c: input validation of an attention call. First everything that needs no driver
 * (fg_validate_args: sizes, dtype, head_dim, scale, strides, NULL and misaligned pointers,
 * overlapping outputs), then what does (fg_validate_pointers: device memory of the right
 * device). Every message names the argument, its value and what is accepted. Also fills the
 * kernel parameter block from validated arguments. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fg_runtime_internal.h"

#define FG_ARGS_MAX_SIZE 65536 /* a size field above this is garbage, not a newer struct */
#define FG_GRID_Y_LIMIT 65535
#define FG_LOG2E 1.4426950408889634

static fg_status fg_bad(fg_status s, char *err, size_t errlen, const char *fmt, ...)
    FG_PRINTF(4, 5);
static fg_status fg_bad(fg_status s, char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return s;
}

static int fg_mul_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static int fg_add_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_add_overflow(a, b, r); }

int64_t fg_tensor_extent(int64_t n0, int64_t n1, int64_t n2, int64_t d, const int64_t stride[3]) {
  if (n0 <= 0 || n1 <= 0 || n2 <= 0 || d <= 0) return 0;
  const int64_t n[3] = {n0, n1, n2};
  int64_t ext = d, t;
  for (int i = 0; i < 3; i++) {
    if (!fg_mul_ok(stride[i], n[i] - 1, &t) || !fg_add_ok(ext, t, &ext)) return -1;
  }
  return ext;
}

/* Sufficient condition for the elements of [n0, n1, n2, d] (strides s, 1) to be distinct: sorted
 * by stride, each stride is at least the span of the dimensions below it. */
static int fg_no_overlap(const int64_t n[3], const int64_t s[3], int64_t d) {
  int64_t dims_n[4] = {d, n[0], n[1], n[2]}, dims_s[4] = {1, s[0], s[1], s[2]};
  /* insertion sort by stride, ignoring dimensions of size 1 */
  int idx[4], m = 0;
  for (int i = 0; i < 4; i++)
    if (dims_n[i] > 1) idx[m++] = i;
  for (int i = 1; i < m; i++)
    for (int j = i; j > 0 && dims_s[idx[j]] < dims_s[idx[j - 1]]; j--) {
      int t = idx[j];
      idx[j] = idx[j - 1];
      idx[j - 1] = t;
    }
  int64_t span = 1; /* one past the largest offset of the dimensions so far */
  for (int i = 0; i < m; i++) {
    int64_t st = dims_s[idx[i]], ext;
    if (st < span) return 0;
    if (!fg_mul_ok(st, dims_n[idx[i]] - 1, &ext) || !fg_add_ok(span, ext, &span)) return 0;
  }
  return 1;
}

static const char *fg_tensor_shape(char which) {
  switch (which) {
    case 'q': return "Q [batch, heads_q, seqlen_q, head_dim]";
    case 'k': return "K [batch, heads_kv, seqlen_k, head_dim]";
    case 'v': return "V [batch, heads_kv, seqlen_k, head_dim]";
    case 'o': return "O [batch, heads_q, seqlen_q, head_dim]";
    default: return "LSE [batch, heads_q, seqlen_q] (fp32)";
  }
}

/* Byte ranges of the tensors, for the aliasing check. */
typedef struct fg_range {
  const char *name;
  uintptr_t lo, hi; /* [lo, hi) */
} fg_range;

fg_status fg_validate_args(const fg_attention_args *in, fg_validate_mode mode,
                           fg_attention_args *out, char *err, size_t errlen) {
  const fg_status INV = FG_ERROR_INVALID_ARGUMENT;
  if (err && errlen) err[0] = 0;
  if (!in)
    return fg_bad(INV, err, errlen,
                  "args is NULL; pass a pointer to a zero-initialised fg_attention_args");
  if (!out) return fg_bad(FG_ERROR_INTERNAL, err, errlen, "fg_validate_args: out is NULL");

  /* The size field: 0 or this version's size; a newer caller's larger struct is accepted when
   * every field this version does not know is zero ("off"). */
  size_t size = in->size ? in->size : sizeof(fg_attention_args);
  if (size < sizeof(fg_attention_args))
    return fg_bad(INV, err, errlen,
                  "args->size = %zu is smaller than fg_attention_args of flashgen %s (%zu bytes); "
                  "set it to sizeof(fg_attention_args), or 0",
                  in->size, FG_VERSION_STRING, sizeof(fg_attention_args));
  if (size > FG_ARGS_MAX_SIZE)
    return fg_bad(INV, err, errlen,
                  "args->size = %zu is not the size of an fg_attention_args; set it to "
                  "sizeof(fg_attention_args), or 0",
                  in->size);
  if (size > sizeof(fg_attention_args)) {
    const unsigned char *tail = (const unsigned char *)in + sizeof(fg_attention_args);
    for (size_t i = 0; i < size - sizeof(fg_attention_args); i++)
      if (tail[i])
        return fg_bad(INV, err, errlen,
                      "args->size = %zu: the caller's fg_attention_args has fields after byte "
                      "%zu that flashgen %s does not know, and byte %zu of them is set; "
                      "upgrade flashgen, or leave those fields zero",
                      in->size, sizeof(fg_attention_args), FG_VERSION_STRING,
                      sizeof(fg_attention_args) + i);
  }
  fg_attention_args a;
  memcpy(&a, in, sizeof a);
  a.size = sizeof a;
  a.causal = a.causal != 0;

  if (a.dtype == 0)
    return fg_bad(INV, err, errlen,
                  "args->dtype is not set (0); set it to FG_DTYPE_F16 or FG_DTYPE_BF16");
  if (a.dtype != FG_DTYPE_F16 && a.dtype != FG_DTYPE_BF16)
    return fg_bad(INV, err, errlen,
                  "args->dtype = %d is not a known element type; use FG_DTYPE_F16 (%d) or "
                  "FG_DTYPE_BF16 (%d)",
                  (int)a.dtype, (int)FG_DTYPE_F16, (int)FG_DTYPE_BF16);

  const struct {
    const char *name;
    int64_t v;
  } sizes[] = {{"batch", a.batch},       {"heads_q", a.heads_q},   {"heads_kv", a.heads_kv},
               {"seqlen_q", a.seqlen_q}, {"seqlen_k", a.seqlen_k}, {"head_dim", a.head_dim}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].v < 0)
      return fg_bad(INV, err, errlen, "args->%s = %" PRId64 " is negative; sizes must be >= 0",
                    sizes[i].name, sizes[i].v);

  if (a.head_dim % 8 != 0)
    return fg_bad(INV, err, errlen,
                  "args->head_dim = %" PRId64
                  " is not a multiple of 8; flashgen supports 32..256 in steps of 8",
                  a.head_dim);
  if (a.head_dim < 32 || a.head_dim > 256)
    return fg_bad(INV, err, errlen,
                  "args->head_dim = %" PRId64
                  " is outside 32..256; flashgen supports 32..256 in steps of 8",
                  a.head_dim);

  if (a.heads_q > 0 && a.heads_kv == 0)
    return fg_bad(INV, err, errlen,
                  "args->heads_kv = 0 with heads_q = %" PRId64
                  "; heads_kv must be at least 1 and divide heads_q (heads_kv = heads_q for "
                  "plain attention, 1 for MQA)",
                  a.heads_q);
  if (a.heads_kv > 0 && a.heads_q % a.heads_kv != 0)
    return fg_bad(INV, err, errlen,
                  "args->heads_q = %" PRId64 " is not a multiple of args->heads_kv = %" PRId64
                  "; every K/V head must serve the same number of query heads (GQA)",
                  a.heads_q, a.heads_kv);

  if (!isfinite(a.scale))
    return fg_bad(INV, err, errlen,
                  "args->scale = %g is not finite; pass 0 for the default 1/sqrt(head_dim), or "
                  "a finite positive scale",
                  (double)a.scale);
  if (a.scale < 0)
    return fg_bad(INV, err, errlen,
                  "args->scale = %g is negative; pass 0 for the default 1/sqrt(head_dim), or a "
                  "finite positive scale",
                  (double)a.scale);
  if (a.scale == 0) a.scale = (float)(1.0 / sqrt((double)a.head_dim));

  /* Strides: all zero means the contiguous (B, H, N, d) layout of that tensor. */
  struct {
    char which;
    const char *name;
    int64_t *s;
    int64_t h, n;
  } ts[4] = {{'q', "q_stride", a.q_stride, a.heads_q, a.seqlen_q},
             {'k', "k_stride", a.k_stride, a.heads_kv, a.seqlen_k},
             {'v', "v_stride", a.v_stride, a.heads_kv, a.seqlen_k},
             {'o', "o_stride", a.o_stride, a.heads_q, a.seqlen_q}};
  for (int t = 0; t < 4; t++) {
    int64_t *s = ts[t].s;
    if (s[0] == 0 && s[1] == 0 && s[2] == 0) {
      int64_t nd, hnd;
      if (!fg_mul_ok(ts[t].n, a.head_dim, &nd) || !fg_mul_ok(ts[t].h, nd, &hnd))
        return fg_bad(FG_ERROR_UNSUPPORTED, err, errlen,
                      "%s: the tensor has more than 2^63 elements", fg_tensor_shape(ts[t].which));
      s[0] = hnd;
      s[1] = nd;
      s[2] = a.head_dim;
      continue;
    }
    for (int i = 0; i < 3; i++) {
      if (s[i] < 0)
        return fg_bad(INV, err, errlen,
                      "args->%s[%d] = %" PRId64 " is negative; strides are element counts >= 0",
                      ts[t].name, i, s[i]);
      if (s[i] % 8 != 0)
        return fg_bad(INV, err, errlen,
                      "args->%s[%d] = %" PRId64 " elements (%" PRId64
                      " bytes) is not a multiple of 16 bytes; strides must be multiples of 8 "
                      "elements for f16/bf16",
                      ts[t].name, i, s[i], s[i] * 2);
    }
  }

  if (a.heads_q > FG_GRID_Y_LIMIT)
    return fg_bad(FG_ERROR_UNSUPPORTED, err, errlen,
                  "args->heads_q = %" PRId64 " is more than %d (the CUDA grid's y limit)",
                  a.heads_q, FG_GRID_Y_LIMIT);
  if (a.seqlen_k > INT32_MAX)
    return fg_bad(FG_ERROR_UNSUPPORTED, err, errlen,
                  "args->seqlen_k = %" PRId64 " is more than %d (the kernels count key blocks in "
                  "32 bits)",
                  a.seqlen_k, INT32_MAX);
  if (a.seqlen_q > INT32_MAX)
    return fg_bad(FG_ERROR_UNSUPPORTED, err, errlen,
                  "args->seqlen_q = %" PRId64 " is more than %d (the CUDA grid's x limit)",
                  a.seqlen_q, INT32_MAX);

  /* Element extents, checked for overflow (a byte offset must fit in 63 bits too). */
  int64_t ext[5];
  ext[0] = fg_tensor_extent(a.batch, a.heads_q, a.seqlen_q, a.head_dim, a.q_stride);
  ext[1] = fg_tensor_extent(a.batch, a.heads_kv, a.seqlen_k, a.head_dim, a.k_stride);
  ext[2] = fg_tensor_extent(a.batch, a.heads_kv, a.seqlen_k, a.head_dim, a.v_stride);
  ext[3] = fg_tensor_extent(a.batch, a.heads_q, a.seqlen_q, a.head_dim, a.o_stride);
  {
    int64_t bh, bhn = 0;
    if (!fg_mul_ok(a.batch, a.heads_q, &bh) || !fg_mul_ok(bh, a.seqlen_q, &bhn)) bhn = -1;
    ext[4] = bhn;
  }
  static const char tnames[5] = {'q', 'k', 'v', 'o', 'l'};
  for (int t = 0; t < 5; t++)
    if (ext[t] < 0 || ext[t] > INT64_MAX / 8)
      return fg_bad(FG_ERROR_UNSUPPORTED, err, errlen,
                    "%s: with these sizes and strides its offsets do not fit in 64 bits",
                    fg_tensor_shape(tnames[t]));

  /* Distinct elements of O: two threads must never write the same element. */
  if (!fg_args_empty(&a)) {
    const int64_t on[3] = {a.batch, a.heads_q, a.seqlen_q};
    if (!fg_no_overlap(on, a.o_stride, a.head_dim))
      return fg_bad(INV, err, errlen,
                    "args->o_stride = {%" PRId64 ", %" PRId64 ", %" PRId64
                    "} makes elements of O overlap (batch %" PRId64 ", heads_q %" PRId64
                    ", seqlen_q %" PRId64 ", head_dim %" PRId64
                    "): every row of O needs its own head_dim elements",
                    a.o_stride[0], a.o_stride[1], a.o_stride[2], a.batch, a.heads_q,
                    a.seqlen_q, a.head_dim);
  }

  /* Pointers. An empty problem reads and writes nothing, so its pointers may be anything
   * (PyTorch gives empty tensors a NULL data pointer); seqlen_k = 0 reads no K or V. */
  if (!fg_args_empty(&a)) {
    const int kv_used = a.seqlen_k > 0;
    struct {
      const char *name;
      char which;
      const void *p;
      int required;
    } ps[5] = {{"q", 'q', a.q, 1},
               {"k", 'k', a.k, kv_used},
               {"v", 'v', a.v, kv_used},
               {"o", 'o', a.o, 1},
               {"lse", 'l', a.lse, 0}};
    for (int i = 0; i < 5; i++) {
      if (!ps[i].p) {
        if (ps[i].required && mode == FG_VALIDATE_CALL)
          return fg_bad(INV, err, errlen, "args->%s is NULL; pass the device address of %s",
                        ps[i].name, fg_tensor_shape(ps[i].which));
        continue;
      }
      if (!ps[i].required && i != 4) continue; /* K, V unused when seqlen_k = 0 */
      if ((uintptr_t)ps[i].p % 16 != 0)
        return fg_bad(INV, err, errlen,
                      "args->%s = %p is not 16-byte aligned; flashgen loads and stores 16 bytes "
                      "at a time, so every tensor must start on a 16-byte boundary",
                      ps[i].name, ps[i].p);
    }
    /* The outputs must not alias anything else. */
    fg_range r[5];
    int nr = 0;
    const int64_t elem[5] = {2, 2, 2, 2, 4};
    for (int i = 0; i < 5; i++) {
      if (!ps[i].p || (!ps[i].required && i != 4)) continue;
      r[nr].name = ps[i].name;
      r[nr].lo = (uintptr_t)ps[i].p;
      r[nr].hi = r[nr].lo + (uintptr_t)(ext[i] * elem[i]);
      nr++;
    }
    for (int i = 0; i < nr; i++)
      for (int j = i + 1; j < nr; j++) {
        int out_i = !strcmp(r[i].name, "o") || !strcmp(r[i].name, "lse");
        int out_j = !strcmp(r[j].name, "o") || !strcmp(r[j].name, "lse");
        if (!out_i && !out_j) continue; /* inputs may share memory (K and V in one buffer) */
        if (r[i].lo < r[j].hi && r[j].lo < r[i].hi)
          return fg_bad(INV, err, errlen,
                        "args->%s and args->%s overlap in memory ([%p, %p) and [%p, %p)); an "
                        "output must not share memory with another tensor",
                        r[i].name, r[j].name, (void *)r[i].lo, (void *)r[i].hi, (void *)r[j].lo,
                        (void *)r[j].hi);
      }
  }
  *out = a;
  return FG_OK;
}

int fg_args_empty(const fg_attention_args *a) {
  return a->batch == 0 || a->heads_q == 0 || a->seqlen_q == 0;
}

/* Checks that p is device (or managed) memory of ctx's device. */
static fg_status fg_check_pointer(fg_context *ctx, const char *name, const void *p, char *err,
                                  size_t errlen) {
  unsigned int memtype = 0, managed = 0;
  int ordinal = -1;
  CUdeviceptr dp = (CUdeviceptr)(uintptr_t)p;
  CUresult r = FG_CUDA_ERROR_NOT_SUPPORTED;
  if (fg_cu.cuPointerGetAttributes) {
    int attrs[3] = {FG_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, FG_CU_POINTER_ATTRIBUTE_IS_MANAGED,
                    FG_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[3] = {&memtype, &managed, &ordinal};
    r = fg_cu.cuPointerGetAttributes(3, attrs, data, dp);
  }
  if (r != FG_CUDA_SUCCESS) {
    /* One attribute at a time (older drivers; an attribute the driver lacks). An error on the
     * memory type means the pointer is not known to CUDA. */
    memtype = 0;
    managed = 0;
    ordinal = -1;
    r = fg_cu.cuPointerGetAttribute(&memtype, FG_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp);
    if (r != FG_CUDA_SUCCESS) memtype = 0;
    if (memtype != 0) {
      if (fg_cu.cuPointerGetAttribute(&managed, FG_CU_POINTER_ATTRIBUTE_IS_MANAGED, dp) !=
          FG_CUDA_SUCCESS)
        managed = 0;
      if (fg_cu.cuPointerGetAttribute(&ordinal, FG_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dp) !=
          FG_CUDA_SUCCESS)
        ordinal = -1;
    }
  }
  if (memtype == 0 && !managed)
    return fg_bad(FG_ERROR_INVALID_ARGUMENT, err, errlen,
                  "args->%s = %p is not CUDA memory (host memory from malloc or the stack, or a "
                  "freed allocation); pass memory allocated on CUDA device %d (cuMemAlloc, "
                  "cudaMalloc, a CUDA tensor)",
                  name, p, ctx->device);
  if (memtype == FG_CU_MEMORYTYPE_HOST && !managed)
    return fg_bad(FG_ERROR_INVALID_ARGUMENT, err, errlen,
                  "args->%s = %p is page-locked host memory (cudaMallocHost, cudaHostRegister); "
                  "flashgen needs device memory of CUDA device %d",
                  name, p, ctx->device);
  if (ordinal >= 0 && ordinal != ctx->device)
    return fg_bad(FG_ERROR_INVALID_ARGUMENT, err, errlen,
                  "args->%s = %p is memory of CUDA device %d, but this context is bound to "
                  "device %d; create the context for device %d, or copy the tensor",
                  name, p, ordinal, ctx->device, ordinal);
  return FG_OK;
}

fg_status fg_validate_pointers(fg_context *ctx, const fg_attention_args *a, char *err,
                               size_t errlen) {
  if (fg_args_empty(a)) return FG_OK;
  fg_status s;
  if ((s = fg_check_pointer(ctx, "q", a->q, err, errlen)) != FG_OK) return s;
  if (a->seqlen_k > 0) {
    if ((s = fg_check_pointer(ctx, "k", a->k, err, errlen)) != FG_OK) return s;
    if (a->v != a->k && (s = fg_check_pointer(ctx, "v", a->v, err, errlen)) != FG_OK) return s;
  }
  if ((s = fg_check_pointer(ctx, "o", a->o, err, errlen)) != FG_OK) return s;
  if (a->lse && (s = fg_check_pointer(ctx, "lse", a->lse, err, errlen)) != FG_OK) return s;
  return FG_OK;
}

/* The fields fg_fwd_params and fg_bwd_params share (by name) from either call's arguments: the
 * shape, the softmax scale (and scale * log2(e), the kernels' exponent base), the mask. */
#define FG_PARAMS_SHAPE(p, a)                                                \
  do {                                                                       \
    (p)->batch = (a)->batch;                                                 \
    (p)->heads_q = (a)->heads_q;                                             \
    (p)->heads_kv = (a)->heads_kv;                                           \
    (p)->seqlen_q = (a)->seqlen_q;                                           \
    (p)->seqlen_k = (a)->seqlen_k;                                           \
    (p)->head_dim = (a)->head_dim;                                           \
    (p)->hq_per_hkv = (a)->heads_kv > 0 ? (a)->heads_q / (a)->heads_kv : 1; \
    (p)->scale = (double)(a)->scale;                                         \
    (p)->scale_log2 = (double)(a)->scale * FG_LOG2E;                         \
    (p)->causal = (a)->causal != 0;                                          \
  } while (0)

void fg_params_from_args(const fg_attention_args *a, fg_fwd_params *p) {
  memset(p, 0, sizeof *p);
  p->q = (unsigned long long)(uintptr_t)a->q;
  p->k = (unsigned long long)(uintptr_t)a->k;
  p->v = (unsigned long long)(uintptr_t)a->v;
  p->o = (unsigned long long)(uintptr_t)a->o;
  p->lse = (unsigned long long)(uintptr_t)a->lse;
  p->workspace = 0;
  p->q_sb = a->q_stride[0];
  p->q_sh = a->q_stride[1];
  p->q_sn = a->q_stride[2];
  p->k_sb = a->k_stride[0];
  p->k_sh = a->k_stride[1];
  p->k_sn = a->k_stride[2];
  p->v_sb = a->v_stride[0];
  p->v_sh = a->v_stride[1];
  p->v_sn = a->v_stride[2];
  p->o_sb = a->o_stride[0];
  p->o_sh = a->o_stride[1];
  p->o_sn = a->o_stride[2];
  FG_PARAMS_SHAPE(p, a);
}

/* ------------------------------------------------------------------------------------------ */
/* The backward call. */

void fg_backward_forward_args(const fg_attention_backward_args *b, fg_attention_args *out) {
  memset(out, 0, sizeof *out);
  out->size = sizeof *out;
  out->dtype = b->dtype;
  out->causal = b->causal;
  out->batch = b->batch;
  out->heads_q = b->heads_q;
  out->heads_kv = b->heads_kv;
  out->seqlen_q = b->seqlen_q;
  out->seqlen_k = b->seqlen_k;
  out->head_dim = b->head_dim;
  out->q = b->q;
  out->k = b->k;
  out->v = b->v;
  out->o = (void *)(uintptr_t)b->o;
  out->lse = (float *)(uintptr_t)b->lse;
  memcpy(out->q_stride, b->q_stride, sizeof out->q_stride);
  memcpy(out->k_stride, b->k_stride, sizeof out->k_stride);
  memcpy(out->v_stride, b->v_stride, sizeof out->v_stride);
  memcpy(out->o_stride, b->o_stride, sizeof out->o_stride);
  out->scale = b->scale;
}

/* One more strided tensor of a backward call: default strides, 16-byte multiples, 64-bit
 * extents; its element range in r. */
static fg_status fg_bwd_tensor(const char *name, const char *sname, const char *shape,
                               const void *p, int64_t *s,
                               int64_t n0, int64_t n1, int64_t n2, int64_t d, int required,
                               fg_validate_mode mode, fg_range *r, char *err, size_t errlen) {
  const fg_status INV = FG_ERROR_INVALID_ARGUMENT;
  if (s[0] == 0 && s[1] == 0 && s[2] == 0) {
    int64_t nd, hnd;
    if (!fg_mul_ok(n2, d, &nd) || !fg_mul_ok(n1, nd, &hnd))
      return fg_bad(FG_ERROR_UNSUPPORTED, err, errlen, "%s: the tensor has more than 2^63 elements",
                    shape);
    s[0] = hnd;
    s[1] = nd;
    s[2] = d;
  }
  for (int i = 0; i < 3; i++) {
    if (s[i] < 0)
      return fg_bad(INV, err, errlen,
                    "args->%s[%d] = %" PRId64 " is negative; strides are element counts >= 0",
                    sname, i, s[i]);
    if (s[i] % 8 != 0)
      return fg_bad(INV, err, errlen,
                    "args->%s[%d] = %" PRId64 " elements is not a multiple of 16 bytes; "
                    "strides must be multiples of 8 elements for f16/bf16",
                    sname, i, s[i]);
  }
  const int64_t ext = fg_tensor_extent(n0, n1, n2, d, s);
  if (ext < 0 || ext > INT64_MAX / 8)
    return fg_bad(FG_ERROR_UNSUPPORTED, err, errlen,
                  "%s: with these sizes and strides its offsets do not fit in 64 bits", shape);
  r->name = name;
  r->lo = r->hi = 0;
  if (!required) return FG_OK;
  if (!p) {
    if (mode == FG_VALIDATE_CALL)
      return fg_bad(INV, err, errlen, "args->%s is NULL; pass the device address of %s", name,
                    shape);
    return FG_OK;
  }
  if ((uintptr_t)p % 16 != 0)
    return fg_bad(INV, err, errlen,
                  "args->%s = %p is not 16-byte aligned; every tensor must start on a 16-byte "
                  "boundary",
                  name, p);
  r->lo = (uintptr_t)p;
  r->hi = r->lo + (uintptr_t)(ext * 2);
  return FG_OK;
}

fg_status fg_validate_backward_args(const fg_attention_backward_args *in, fg_validate_mode mode,
                                    fg_attention_backward_args *out, char *err, size_t errlen) {
  const fg_status INV = FG_ERROR_INVALID_ARGUMENT;
  if (err && errlen) err[0] = 0;
  if (!in)
    return fg_bad(INV, err, errlen,
                  "args is NULL; pass a pointer to a zero-initialised fg_attention_backward_args");
  const size_t known = sizeof(fg_attention_backward_args);
  const size_t size = in->size ? in->size : known;
  if (size < known || size > FG_ARGS_MAX_SIZE)
    return fg_bad(INV, err, errlen,
                  "args->size = %zu is not the size of an fg_attention_backward_args of flashgen "
                  "%s (%zu bytes); set it to sizeof(fg_attention_backward_args), or 0",
                  in->size, FG_VERSION_STRING, known);
  for (size_t i = known; i < size; i++)
    if (((const unsigned char *)in)[i])
      return fg_bad(INV, err, errlen,
                    "args->size = %zu: the caller's fg_attention_backward_args has fields after "
                    "byte %zu that flashgen %s does not know, and byte %zu of them is set; "
                    "upgrade flashgen, or leave those fields zero",
                    in->size, known, FG_VERSION_STRING, i);
  fg_attention_backward_args b;
  memcpy(&b, in, sizeof b);
  b.size = sizeof b;
  b.causal = b.causal != 0;

  /* Everything the forward checks, on the forward's view (q, k, v, o, lse). */
  fg_attention_args f, fn;
  fg_backward_forward_args(&b, &f);
  fg_status st = fg_validate_args(&f, mode, &fn, err, errlen);
  if (st != FG_OK) return st;
  memcpy(b.q_stride, fn.q_stride, sizeof b.q_stride);
  memcpy(b.k_stride, fn.k_stride, sizeof b.k_stride);
  memcpy(b.v_stride, fn.v_stride, sizeof b.v_stride);
  memcpy(b.o_stride, fn.o_stride, sizeof b.o_stride);
  b.scale = fn.scale;
  b.deterministic = b.deterministic != 0;
  if (fg_args_empty(&fn)) {
    *out = b;
    return FG_OK;
  }
  if (!b.lse && mode == FG_VALIDATE_CALL)
    return fg_bad(INV, err, errlen,
                  "args->lse is NULL; the backward pass needs the forward's log-sum-exp: set "
                  "fg_attention_args.lse in the forward call and pass the same buffer here");

  const int kv = b.seqlen_k > 0;
  fg_range r[9];
  st = fg_bwd_tensor("d_o", "do_stride", "dO [batch, heads_q, seqlen_q, head_dim]", b.d_o, b.do_stride, b.batch,
                     b.heads_q, b.seqlen_q, b.head_dim, 1, mode, &r[0], err, errlen);
  if (st == FG_OK)
    st = fg_bwd_tensor("dq", "dq_stride", "dQ [batch, heads_q, seqlen_q, head_dim]", b.dq, b.dq_stride, b.batch,
                       b.heads_q, b.seqlen_q, b.head_dim, 1, mode, &r[1], err, errlen);
  if (st == FG_OK)
    st = fg_bwd_tensor("dk", "dk_stride", "dK [batch, heads_kv, seqlen_k, head_dim]", b.dk, b.dk_stride,
                       b.batch, b.heads_kv, b.seqlen_k, b.head_dim, kv, mode, &r[2], err, errlen);
  if (st == FG_OK)
    st = fg_bwd_tensor("dv", "dv_stride", "dV [batch, heads_kv, seqlen_k, head_dim]", b.dv, b.dv_stride,
                       b.batch, b.heads_kv, b.seqlen_k, b.head_dim, kv, mode, &r[3], err, errlen);
  if (st != FG_OK) return st;
  /* The gradients: each element its own address, and no sharing with anything else. */
  struct {
    const char *name;
    const int64_t *s;
    int64_t h, n;
  } outs[3] = {{"dq", b.dq_stride, b.heads_q, b.seqlen_q},
               {"dk", b.dk_stride, b.heads_kv, b.seqlen_k},
               {"dv", b.dv_stride, b.heads_kv, b.seqlen_k}};
  for (int i = 0; i < 3; i++) {
    const int64_t n[3] = {b.batch, outs[i].h, outs[i].n};
    if (n[2] > 0 && !fg_no_overlap(n, outs[i].s, b.head_dim))
      return fg_bad(INV, err, errlen,
                    "args->%s_stride = {%" PRId64 ", %" PRId64 ", %" PRId64
                    "} makes elements of %s overlap: every row needs its own head_dim elements",
                    outs[i].name, outs[i].s[0], outs[i].s[1], outs[i].s[2], outs[i].name);
  }
  /* Inputs' ranges (q, k, v, o, lse) for the aliasing check. */
  const int64_t lse_n = b.batch * b.heads_q * b.seqlen_q; /* no overflow: checked above */
  const struct {
    const char *name;
    const void *p;
    int64_t ext, elem;
  } ins[5] = {{"q", b.q, fg_tensor_extent(b.batch, b.heads_q, b.seqlen_q, b.head_dim, b.q_stride), 2},
              {"k", kv ? b.k : NULL, fg_tensor_extent(b.batch, b.heads_kv, b.seqlen_k, b.head_dim, b.k_stride), 2},
              {"v", kv ? b.v : NULL, fg_tensor_extent(b.batch, b.heads_kv, b.seqlen_k, b.head_dim, b.v_stride), 2},
              {"o", b.o, fg_tensor_extent(b.batch, b.heads_q, b.seqlen_q, b.head_dim, b.o_stride), 2},
              {"lse", b.lse, lse_n, 4}};
  int nr = 4;
  for (int i = 0; i < 5; i++) {
    if (!ins[i].p) continue;
    r[nr].name = ins[i].name;
    r[nr].lo = (uintptr_t)ins[i].p;
    r[nr].hi = r[nr].lo + (uintptr_t)(ins[i].ext * ins[i].elem);
    nr++;
  }
  for (int i = 1; i < 4; i++) { /* dq, dk, dv against everything after them and d_o */
    if (r[i].lo == r[i].hi) continue;
    for (int j = 0; j < nr; j++) {
      if (j == i || (j >= 1 && j < i) || r[j].lo == r[j].hi) continue;
      if (r[i].lo < r[j].hi && r[j].lo < r[i].hi)
        return fg_bad(INV, err, errlen,
                      "args->%s and args->%s overlap in memory ([%p, %p) and [%p, %p)); a "
                      "gradient must not share memory with another tensor",
                      r[i].name, r[j].name, (void *)r[i].lo, (void *)r[i].hi, (void *)r[j].lo,
                      (void *)r[j].hi);
    }
  }
  if (b.workspace && (uintptr_t)b.workspace % 16 != 0)
    return fg_bad(INV, err, errlen,
                  "args->workspace = %p is not 16-byte aligned; pass NULL to let flashgen "
                  "allocate it, or a 16-byte aligned device buffer",
                  b.workspace);
  *out = b;
  return FG_OK;
}

fg_status fg_validate_backward_pointers(fg_context *ctx, const fg_attention_backward_args *b,
                                        char *err, size_t errlen) {
  fg_attention_args f;
  fg_backward_forward_args(b, &f);
  if (fg_args_empty(&f)) return FG_OK;
  fg_status s = fg_validate_pointers(ctx, &f, err, errlen);
  if (s != FG_OK) return s;
  if ((s = fg_check_pointer(ctx, "d_o", b->d_o, err, errlen)) != FG_OK) return s;
  if ((s = fg_check_pointer(ctx, "dq", b->dq, err, errlen)) != FG_OK) return s;
  if (b->seqlen_k > 0) {
    if ((s = fg_check_pointer(ctx, "dk", b->dk, err, errlen)) != FG_OK) return s;
    if ((s = fg_check_pointer(ctx, "dv", b->dv, err, errlen)) != FG_OK) return s;
  }
  if (b->workspace && (s = fg_check_pointer(ctx, "workspace", b->workspace, err, errlen)) != FG_OK)
    return s;
  return FG_OK;
}

void fg_bwd_params_from_args(const fg_attention_backward_args *a, fg_bwd_params *p) {
  memset(p, 0, sizeof *p);
  p->q = (unsigned long long)(uintptr_t)a->q;
  p->k = (unsigned long long)(uintptr_t)a->k;
  p->v = (unsigned long long)(uintptr_t)a->v;
  p->o = (unsigned long long)(uintptr_t)a->o;
  p->d_o = (unsigned long long)(uintptr_t)a->d_o;
  p->lse = (unsigned long long)(uintptr_t)a->lse;
  p->dq = (unsigned long long)(uintptr_t)a->dq;
  p->dk = (unsigned long long)(uintptr_t)a->dk;
  p->dv = (unsigned long long)(uintptr_t)a->dv;
  p->workspace = (unsigned long long)(uintptr_t)a->workspace;
  long long *dst[8] = {&p->q_sb, &p->k_sb, &p->v_sb, &p->o_sb, &p->do_sb, &p->dq_sb, &p->dk_sb, &p->dv_sb};
  const int64_t *src[8] = {a->q_stride, a->k_stride, a->v_stride, a->o_stride,
                           a->do_stride, a->dq_stride, a->dk_stride, a->dv_stride};
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 3; j++) dst[i][j] = src[i][j];
  FG_PARAMS_SHAPE(p, a);
}
