/* fg_variant.h: the variant type (every parameter that changes generated code), its canonical
 * name, and parsing names back. Pure C, in core/ (the ground floor: includes nothing of ours but
 * core/ and the public flashgen.h) so the generator, the cache, exported tables and the
 * dispatcher all name variants the same way. */
#ifndef FG_VARIANT_H
#define FG_VARIANT_H
#include <stddef.h>
#include "flashgen.h"

/* The op a variant computes: the forward pass, or the backward pass (dQ, dK, dV; a plan of three
 * kernels, templates/bwd.lua). */
typedef enum fg_pass { FG_PASS_FWD = 0, FG_PASS_BWD = 1, FG_PASS_COUNT } fg_pass;
/* "fwd", "bwd"; "?" when out of range. */
const char *fg_pass_name(fg_pass p);
/* Loop orders: q_outer is FlashAttention-2 (one block per Q tile, looping over K/V, mma.sync,
 * sm_80 and newer); kv_outer is FlashAttention-1's Algorithm 1; q_wgmma is q_outer's loop on
 * Hopper's warpgroup matrix instructions (wgmma, sm_90a only: fwd_wgmma.cu), each block's S,
 * softmax and O += P V in order; q_wgmma_ov the same with the softmax of block j+1 overlapping
 * O += P_j V_j on the tensor cores. kv_wgmma is the backward's K/V-outer loop on wgmma (sm_90a only:
 * bwd_wgmma.cu), one warpgroup per 64 keys. q_tma is q_wgmma with a producer warpgroup (sm_90a only:
 * fwd_tma.cu): TMA loads of Q, K and V completing on mbarriers, the warps of the variant (4 or 8)
 * consuming them, one warpgroup per 64 query rows; the block has 128 threads more than 32 * warps.
 * kv_tma is kv_wgmma with a producer warpgroup (sm_90a only: bwd_tma.cu): TMA loads of K, V, Q and
 * dO, LSE/D by a producer warp, dQ added by bulk reductions from shared memory; the variant's warps
 * (8) are the consumers, the block has 128 threads more; past d = 128 (bwd_tmat.cu) the same
 * producer with dK and dV computed transposed, split over the consumers by d, and dQ added from
 * registers. q_tma_p is q_tma on a persistent grid
 * (one block per SM looping over the tiles, the next tile's loads under this one's epilogue; grid
 * kind "persistent"). q_tma_c is q_tma on clusters of two blocks, two query tiles of one head that
 * share every K/V block: each block loads half of it and the TMA multicasts it to both (grid kind
 * "q_tile_pairs"; with a causal mask the pair loads the blocks its later tile sees). q_tma_d is
 * q_tma_p taking its tiles as its blocks come free, from a counter in the call's workspace (8 bytes
 * per (batch, head), one word used), in the persistent order's units. q_tma_dp is q_tma_d on two
 * consumer warpgroups that run each block's S, softmax and O += P V in order and take turns at the
 * softmax's exponentials (ping-pong: one's under the other's products), where q_tma_d's consumers
 * each overlap a block's softmax with their own next products. */
typedef enum fg_loop_order {
  FG_LOOP_Q_OUTER = 0,
  FG_LOOP_KV_OUTER = 1,
  FG_LOOP_Q_WGMMA = 2,
  FG_LOOP_Q_WGMMA_OV = 3,
  FG_LOOP_KV_WGMMA = 4,
  FG_LOOP_Q_TMA = 5,
  FG_LOOP_KV_TMA = 6,
  FG_LOOP_Q_TMA_P = 7,
  FG_LOOP_Q_TMA_C = 8,
  FG_LOOP_Q_TMA_D = 9,
  FG_LOOP_Q_TMA_DP = 10,
  FG_LOOP_COUNT
} fg_loop_order;
typedef enum fg_arch {
  FG_ARCH_SM80 = 0, FG_ARCH_SM86, FG_ARCH_SM89, FG_ARCH_SM90, FG_ARCH_SM90A, FG_ARCH_COUNT
} fg_arch;

typedef struct fg_variant {
  fg_pass pass;
  int d;          /* head dimension: multiple of 8, 32..256 */
  int br, bc;     /* rows of a Q block, rows of a K/V block */
  fg_dtype dtype;
  int causal;
  fg_loop_order loop;
  int warps;      /* warps per thread block */
  int stages;     /* K/V shared-memory stages (cp.async pipeline depth) */
  fg_arch arch;
} fg_variant;

#define FG_VARIANT_NAME_MAX 96

/* Writes the canonical name, e.g. fwd_d128_br128_bc64_bf16_causal_qouter_w4_s2_sm80 (backward:
 * bwd_d128_br64_bc64_bf16_causal_kvouter_w8_s2_sm80).
 * Returns the length, or -1 if the variant has a field out of its enum range. */
int fg_variant_name(const fg_variant *v, char *buf, size_t len);

/* Parses a canonical name: only a name that fg_variant_name writes back unchanged is accepted
 * (no empty fields, leading zeros, dtype aliases or sm_ spellings). Returns 0 and fills *out, or
 * -1 with a message naming the field that is wrong (or the canonical spelling) in err. Values are checked for form (numbers, known words), not for whether the
 * template accepts them: see fg_variant_check. */
int fg_variant_parse(const char *name, fg_variant *out, char *err, size_t errlen);

/* Checks the structural rules every template shares (d a multiple of 8 in 32..256, br a
 * multiple of 16*warps, bc a multiple of 16, warps in {1,2,4,8}, stages in 1..4). Returns 0, or
 * -1 with the reason in err. */
int fg_variant_check(const fg_variant *v, char *err, size_t errlen);

const char *fg_arch_name(fg_arch a);  /* "sm_80", ... "sm_90a" */
/* The loop order's token in variant names ("qouter", "kvouter", "qwgmma", "qwgmmaov", "kvwgmma",
 * "qtma", "kvtma", "qtmap", "qtmac", "qtmad") and its name in the templates ("q_outer",
 * "kv_outer", "q_wgmma", "q_wgmma_ov", "kv_wgmma", "q_tma", "kv_tma", "q_tma_p", "q_tma_c",
 * "q_tma_d"); "?" when out of range. */
const char *fg_loop_token(fg_loop_order l);
const char *fg_loop_name(fg_loop_order l);
int fg_arch_parse(const char *s, fg_arch *out); /* accepts "sm_90a" and "sm90a"; 0 on success */
/* The arch the generator targets for a device of compute capability major.minor. */
fg_arch fg_arch_for_cc(int major, int minor);
const char *fg_dtype_name(fg_dtype t);  /* "f16", "bf16" */
int fg_dtype_parse(const char *s, fg_dtype *out);

/* The built-in rule's portable (mma.sync, q_outer) variant: block sizes by head dimension, chosen
 * to fit every supported arch's shared memory (99 KB per block and up). */
fg_variant fg_portable_variant(int d, fg_dtype dtype, int causal, fg_arch arch);
/* The variant the built-in rule picks when nothing was tuned and the length is not known: the
 * portable one, except on sm_90a, where it is the TMA kernel (q_tma; head dims off 64-column
 * blocks on padded tiles; on the persistent grid, q_tma_p, at d = 32..192 with or without a
 * mask; three consumer warpgroups at d <= 64 without a mask and at d = 72, 88, 104, 136, 152,
 * 168 without one, d = 136 and 152 on the plain grid)
 * at every d but d = 64 causal: q_wgmma there. fg_builtin_variant_for (fg_problem.h) refines it
 * by the key length. */
fg_variant fg_builtin_variant(int d, fg_dtype dtype, int causal, fg_arch arch);
/* The key block the built-in rule gives three consumer warpgroups (Br 192) at d = 72..184. */
int fg_builtin_w12_bc(int d);
/* Whether rows of d 2-byte elements end inside a 32-byte sector (2d = 16 mod 32: d = 72, 88, ...,
 * 248), which makes the TMA's K/V loads cost the L2 about 1.5x (bench/NOTES.md session 30). */
int fg_rows_mid_sector(int d);
/* Whether d's rows end inside a sector and the built-in rule gives it three consumer warpgroups
 * at every length without a mask: d = 72, 88, 104, 136, 152, 168. */
int fg_builtin_sector_dim(int d);
/* Bytes of register spills (stores, and loads alike) a compiled kernel of v may have and still
 * be tuned or built in: 0 for the forward; 128 for the backward, whose key blocks of 128 spill
 * 8-88 B and run 1.3-1.5x the spill-free blocks of 64 (H100, templates/bwd.lua). */
int fg_variant_spill_limit(const fg_variant *v);
/* The built-in rule's backward variant (templates/bwd.lua): kv_outer with K/V blocks of 128 up
 * to d = 128 (64 above; less on sm_86/89's 99 KB), query blocks of 128 up to d = 64, then 64 (32
 * above d = 192), 8 warps;
 * on sm_90a at every d the warp-specialised kernel (kv_tma, 8 consumer warps; up to d = 128 Bc
 * 128 and Br 128 up to d = 64, 64 above; past d = 128 bwd_tmat.cu, dK and dV transposed, Br = Bc =
 * 64). */
fg_variant fg_builtin_backward_variant(int d, fg_dtype dtype, int causal, fg_arch arch);
#endif
