/* tmap.c: encoding one CUDA tensor map (cuTensorMapEncodeTiled) of a call's tensor for a kernel
 * whose plan loads through TMA: the forward's fwd_tma plans (runtime/forward.c picks q, k, v, o
 * from fg_fwd_params) and the backward's bwd_tma plans (runtime/backward.c picks q, do, k, v from
 * fg_bwd_params) share it, so the two view their tensors alike and refuse alike. */
#include <stdint.h>
#include <string.h>

#include "fg_runtime_internal.h"

static const char *fg_tmap_dim_names[4] = {"head_dim", "row", "head", "batch"};

/* The loop order of k's TMA kernels, for the advice to take a variant without it. */
static const char *fg_tmap_loop(const fg_loaded_kernel *k) {
  return k->meta.params == FG_PARAMS_BWD_TMA ? "kvtma" : "qtma";
}

fg_status fg_tmap_encode(fg_context *ctx, const fg_loaded_kernel *k, const fg_tmap_view *t,
                         int box_rows, fg_tmap *out) {
  const char *name = fg_tmap_tensor_name(t->tensor), *loop = fg_tmap_loop(k);
  /* A tensor without rows (seqlen_k = 0: no key for any query) is never read, since the kernel
   * sees no K/V block; its map stays zero (a tensor map cannot describe an empty dimension). */
  if (t->rows == 0) {
    memset(out, 0, sizeof *out);
    return FG_OK;
  }
  /* {head_dim, rows, heads, batch}, innermost first, as the TMA counts them. */
  const unsigned long long dims[4] = {(unsigned long long)t->head_dim, (unsigned long long)t->rows,
                                      (unsigned long long)t->heads, (unsigned long long)t->batch};
  const long long elem_strides[3] = {t->sn, t->sh, t->sb};
  unsigned long long strides[3], contiguous = (unsigned long long)t->elem_size;
  for (int i = 0; i < 4; i++) {
    if (dims[i] < 1 || dims[i] > FG_TMA_MAX_DIM)
      return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                     "kernel %s (TMA) cannot read %s: its %s dimension is %llu, more than a "
                     "tensor map holds (2^32); split the call, or use a variant without TMA (a "
                     "loop order other than %s)",
                     k->name, name, fg_tmap_dim_names[i], dims[i], loop);
    if (i == 3) break;
    /* A dimension of size 1 is never stepped over: its stride is the contiguous one (whatever
     * the caller's tensor library left there). The contiguous stride of the next dimension. */
    if (__builtin_mul_overflow(contiguous, dims[i], &contiguous)) contiguous = ~0ull;
    const unsigned long long b =
        (unsigned long long)elem_strides[i] * (unsigned long long)t->elem_size;
    strides[i] = dims[i + 1] == 1 ? contiguous : b;
    if (dims[i + 1] == 1) continue;
    if (elem_strides[i] < 0 || b % 16 != 0 || b >= FG_TMA_MAX_STRIDE)
      return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                     "kernel %s (TMA) cannot read %s: its %s stride is %lld elements (%llu bytes), "
                     "%s; make %s contiguous (or pass strides that are multiples of 8 elements), "
                     "or use a variant without TMA (a loop order other than %s)",
                     k->name, name, fg_tmap_dim_names[i + 1], elem_strides[i], b,
                     b % 16 ? "not a multiple of 16 bytes as a tensor map needs"
                            : "2^40 bytes or more, past what a tensor map holds",
                     name, loop);
  }
  for (int i = 0; i < 3; i++)
    if (strides[i] >= FG_TMA_MAX_STRIDE) /* the contiguous stride of a dimension of size 1 */
      return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                     "kernel %s (TMA) cannot read %s: it spans 2^40 bytes or more per %s, past "
                     "what a tensor map holds; split the call, or use a variant without TMA (a "
                     "loop order other than %s)",
                     k->name, name, fg_tmap_dim_names[i + 2], loop);
  const unsigned int box[4] = {64, (unsigned)box_rows, 1, 1}, ones[4] = {1, 1, 1, 1};
  const int type = k->dtype == FG_DTYPE_BF16 ? FG_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                              : FG_CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  if (!fg_cu.cuTensorMapEncodeTiled) /* fg_kernel_load refuses such kernels; never reached */
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                   "kernel %s loads through TMA, but the CUDA driver has no "
                   "cuTensorMapEncodeTiled: update the NVIDIA driver",
                   k->name);
  const CUresult r = fg_cu.cuTensorMapEncodeTiled(
      out, type, 4, (void *)(uintptr_t)t->addr, dims, strides, box, ones,
      FG_CU_TENSOR_MAP_INTERLEAVE_NONE, FG_CU_TENSOR_MAP_SWIZZLE_128B,
      FG_CU_TENSOR_MAP_L2_PROMOTION_L2_256B, FG_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != FG_CUDA_SUCCESS) {
    char d[512];
    fg_cuda_describe(d, sizeof d, "cuTensorMapEncodeTiled", r);
    return fg_fail(ctx, FG_ERROR_UNSUPPORTED,
                   "kernel %s (TMA): the tensor map of %s (address 0x%llx, dims {%llu, %llu, "
                   "%llu, %llu}, strides {%llu, %llu, %llu} B, box {64, %d, 1, 1}) was refused: "
                   "%s; make %s contiguous, or use a variant without TMA (a loop order other "
                   "than %s)",
                   k->name, name, t->addr, dims[0], dims[1], dims[2], dims[3], strides[0],
                   strides[1], strides[2], box_rows, d, name, loop);
  }
  return FG_OK;
}

fg_status fg_tmaps_encode(fg_context *ctx, const fg_loaded_kernel *k,
                          const fg_tmap_view views[FG_PLAN_MAX_TMAPS],
                          fg_tmap out[FG_PLAN_MAX_TMAPS]) {
  const fg_kernel_meta *m = &k->meta;
  for (int i = 0; i < FG_PLAN_MAX_TMAPS; i++) {
    if (i >= m->n_tmaps) {
      memset(&out[i], 0, sizeof out[i]);
      continue;
    }
    if (!views[i].tensor)
      return fg_fail(ctx, FG_ERROR_INTERNAL,
                     "kernel %s has a tensor map of a tensor its pass's maps do not view (%s): "
                     "rebuild or re-export it",
                     k->name, fg_tmap_tensor_name(m->tmaps[i].tensor));
    const fg_status st = fg_tmap_encode(ctx, k, &views[i], m->tmaps[i].rows, &out[i]);
    if (st != FG_OK) return st;
  }
  return FG_OK;
}
