/* fg_params.h: the argument block every generated kernel takes (by value, as its only
 * parameter). Shared word for word by the host (C, runtime/launch.c) and the generated CUDA
 * (pasted in by the template engine), so the two can never disagree on the layout. Only
 * 8-byte fields (and 64-byte aligned tensor maps at offset 0), so no padding differs between
 * compilers. Append fields; never reorder. */
#ifndef FG_PARAMS_H
#define FG_PARAMS_H
typedef struct fg_fwd_params {
  unsigned long long q, k, v, o, lse, workspace; /* device addresses; lse and workspace may be 0 */
  long long q_sb, q_sh, q_sn;                    /* element strides: batch, head, row */
  long long k_sb, k_sh, k_sn;
  long long v_sb, v_sh, v_sn;
  long long o_sb, o_sh, o_sn;
  long long batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  long long hq_per_hkv; /* heads_q / heads_kv */
  double scale;         /* softmax scale */
  double scale_log2;    /* scale * log2(e): exp(scale*s) = exp2(scale_log2*s) */
  long long causal;     /* read by the reference kernel only; generated kernels fix it */
  /* A launch's own number, never 0, where the launch has a workspace (runtime/forward.c; 0 else):
   * the epoch of the tile counter that a q_tma_d kernel keeps in it (templates/fwd_tma.cu,
   * dyn_ticket). */
  unsigned long long tile_epoch;
} fg_fwd_params;

/* A CUDA tensor map (the driver's CUtensorMap: 128 opaque bytes, 64-byte aligned), encoded on
 * the host from a call's pointer, shape and strides for the TMA loads of a Hopper kernel. */
#ifdef __cplusplus
#define FG_ALIGN64 alignas(64)
#else
#define FG_ALIGN64 _Alignas(64)
#endif
typedef struct fg_tmap {
  FG_ALIGN64 unsigned long long opaque[16];
} fg_tmap;

/* The argument block of forward kernels whose plan declares tensor maps (launch(v).tmaps in
 * fwd.lua): tmap[i] is the plan's i-th map (unused ones zero), then the usual block. */
typedef struct fg_fwd_tma_params {
  fg_tmap tmap[4];
  fg_fwd_params p;
} fg_fwd_tma_params;

/* The backward plan's argument block (templates/bwd.cu, runtime/backward.c): the forward's
 * tensors, dO, the gradients dQ, dK, dV, and the fp32 workspace: the dQ accumulator
 * [batch, heads_q, seqlen_q, head_dim] at workspace, D = rowsum(dO * O) [batch, heads_q,
 * seqlen_q] at dsum. */
typedef struct fg_bwd_params {
  unsigned long long q, k, v, o, d_o, lse, dq, dk, dv, workspace, dsum; /* device addresses */
  long long q_sb, q_sh, q_sn;                                    /* element strides */
  long long k_sb, k_sh, k_sn;
  long long v_sb, v_sh, v_sn;
  long long o_sb, o_sh, o_sn;
  long long do_sb, do_sh, do_sn;
  long long dq_sb, dq_sh, dq_sn;
  long long dk_sb, dk_sh, dk_sn;
  long long dv_sb, dv_sh, dv_sn;
  long long batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  long long hq_per_hkv;
  double scale, scale_log2;
  long long causal;
  /* Deterministic dQ: 1 orders the key blocks' additions to each dQ tile through the
   * semaphores at sem (unsigned, one per 16 query rows of every (batch, query head)). */
  long long deterministic;
  unsigned long long sem;
  /* Long query ranges (a plan's workspace "dkv_accum", present only past its min_group_rows):
   * an fp32 scratch of each key block's dK and dV partial sums, which the main kernel moves out
   * of the tensor cores' accumulators every so many query blocks; 0 when absent. */
  unsigned long long dkv;
  /* The tail (a main step whose plan has one, runtime/backward.c, fg_plan_step_tail): the key
   * blocks of the grid's last partial wave are split into pieces, so the wave's SMs share them.
   * In the grid's linear order (y * x blocks + x), blocks from tail_first on are pieces: piece i
   * is split i / tail_blocks (of tail_splits) of the query range of the key block whose linear
   * index is tail_first + i % tail_blocks; blocks past the last piece do nothing. Pieces add
   * their dK/dV partial sums into dkv_tail (the plan's workspace "dkv_tail": one key block of
   * it per tail key block, zeroed by the first step, converted by the last). tail_splits 0: no
   * tail (every block one key block, as before). */
  long long tail_first, tail_blocks, tail_splits;
  unsigned long long dkv_tail;
} fg_bwd_params;

/* The argument block of every kernel of a backward plan that declares tensor maps
 * (launch(v).params = "bwd_tma" in bwd.lua: its _pre, main and _post steps alike): tmap[i] is
 * the plan's i-th map (of q, do, k or v; unused ones zero), then the backward's block, whose
 * workspaces the runtime fills as for any backward plan. */
typedef struct fg_bwd_tma_params {
  fg_tmap tmap[4];
  fg_bwd_params p;
} fg_bwd_tma_params;
#endif
