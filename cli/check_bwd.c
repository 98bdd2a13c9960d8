/* check_bwd.c: the backward cases of `flashgen check` (names start with "bwd/"). For each case:
 * fresh random Q, K, V, dO (a seed per case, never zeros), O and LSE from flashgen's forward,
 * dQ, dK, dV poisoned with NaN, the backward call, then the gate that `flashgen tune` applies too
 * (fg_gate_backward, autotune/gate.c): every element of the gradients checked finite and
 * compared with the host's fp64 reference: max|x - ref| <= 2 * max|naive - ref| + eps(dtype) *
 * max|ref| + 1e-6 per tensor, where naive is the same-dtype computation
 * (fg_reference_backward). Also the bad-input cases that need a GPU: the call fails and the
 * gradients stay untouched. The case past 2^31 elements (bwd/big/...) runs in check_bwd_big.c. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fg_autotune.h"
#include "fg_check.h"
#include "fg_runtime_internal.h"

/* B_RUN: checked against the host's reference; B_DET: and the same bits twice; B_BIG: past 2^31
 * elements (check_bwd_big.c); B_BAD_*: bad input. */
enum { B_RUN = 0, B_DET, B_BIG, B_BAD_NULL_DO, B_BAD_NULL_LSE, B_BAD_DQ_ALIASES_Q,
       B_BAD_DK_ALIASES_DV, B_BAD_MISALIGNED_DQ, B_BAD_DO_STRIDE, B_BAD_HOST_DK };

typedef struct bwd_list {
  fg_check_bwd_case *c;
  int n, cap;
} bwd_list;

/* Appends a case: its kind, dtype, mask, head dim, (batch, query heads, KV heads, query and key
 * lengths), whether --quick runs it, and its name. One row of the table that build() spells. */
static fg_check_bwd_case *add(bwd_list *l, int kind, fg_dtype dt, int causal, int d, int64_t b,
                              int64_t hq, int64_t hkv, int64_t nq, int64_t nk, int quick,
                              const char *fmt, ...) FG_PRINTF(12, 13);
static fg_check_bwd_case *add(bwd_list *l, int kind, fg_dtype dt, int causal, int d, int64_t b,
                              int64_t hq, int64_t hkv, int64_t nq, int64_t nk, int quick,
                              const char *fmt, ...) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 256;
    fg_check_bwd_case *c = realloc(l->c, (size_t)cap * sizeof *c);
    if (!c) return NULL;
    l->c = c;
    l->cap = cap;
  }
  fg_check_bwd_case *c = &l->c[l->n++];
  memset(c, 0, sizeof *c);
  c->kind = kind;
  c->dt = dt;
  c->causal = causal;
  c->d = d;
  c->b = b, c->hq = hq, c->hkv = hkv, c->nq = nq, c->nk = nk;
  c->quick = quick;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->name, sizeof c->name, fmt, ap);
  va_end(ap);
  return c;
}

fg_problem fg_check_bwd_problem(const fg_check_bwd_case *c) {
  return fg_problem_make(FG_PASS_BWD, c->d, c->dt, c->causal, c->nk);
}

static const char *dtn(fg_dtype t) { return fg_dtype_name(t); }
static const char *cw(int causal) { return causal ? "causal" : "noncausal"; }

/* Forced variants, each on a GQA shape with ragged ends and on a short one, deterministic on one;
 * both dtypes alternate. bwd/hopper/ (sm_90a only): the Hopper kernels the tuner tries besides
 * the built-in, kv_tma at both head dims with every query-block size and stage count its rule
 * admits, on tiles padded past the head dim (d = 72 and 40: tiles of 128 and 64 columns, an odd
 * number of 16-byte chunks per row), above d = 128 (bwd_tmat.cu: d = 256; d = 200 and 136 on
 * tiles of 256 and 192 columns, where warpgroup 1's last m-tile is partly or mostly padding),
 * and kv_wgmma (the built-in before it). bwd/portable/ (sm_80 and sm_90, where 163 KB or
 * more of shared memory per block hold them): the mma.sync kernel at the shapes sm_80 and sm_90
 * run as built-ins at d = 64 and 128, and sm_80's at d = 192 and 256 (which sm_90a no longer
 * runs as built-ins), so a Hopper GPU checks what an A100 runs. */
static void add_forced_cases(bwd_list *l, fg_arch arch) {
  const int hopper = arch == FG_ARCH_SM90A, big_smem = arch == FG_ARCH_SM80 || arch >= FG_ARCH_SM90;
  static const struct {
    int d, br, bc, stages;
    fg_loop_order loop;
  } shapes[] = {{64, 128, 128, 2, FG_LOOP_KV_TMA},   {64, 64, 128, 2, FG_LOOP_KV_TMA},
                {64, 64, 128, 3, FG_LOOP_KV_TMA},    {128, 64, 128, 2, FG_LOOP_KV_TMA},
                {72, 64, 128, 2, FG_LOOP_KV_TMA},    {40, 128, 128, 2, FG_LOOP_KV_TMA},
                {256, 64, 64, 2, FG_LOOP_KV_TMA},    {200, 64, 64, 2, FG_LOOP_KV_TMA},
                {136, 64, 64, 2, FG_LOOP_KV_TMA},
                {64, 128, 128, 2, FG_LOOP_KV_WGMMA}, {128, 64, 128, 2, FG_LOOP_KV_WGMMA},
                {64, 128, 128, 1, FG_LOOP_KV_OUTER}, {128, 64, 128, 1, FG_LOOP_KV_OUTER},
                {64, 128, 128, 2, FG_LOOP_KV_OUTER}, {128, 64, 128, 2, FG_LOOP_KV_OUTER},
                {192, 64, 64, 1, FG_LOOP_KV_OUTER},  {256, 32, 64, 1, FG_LOOP_KV_OUTER}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int portable = shapes[i].loop == FG_LOOP_KV_OUTER;
    if (portable ? !big_smem || (shapes[i].stages == 2 && arch < FG_ARCH_SM90) : !hopper) continue;
    const char *group = portable ? "portable" : "hopper";
    for (int m = 0; m < 2; m++) {
      const fg_dtype dt = (i + (size_t)m) % 2 ? FG_DTYPE_F16 : FG_DTYPE_BF16;
      const fg_variant v = {FG_PASS_BWD, shapes[i].d, shapes[i].br, shapes[i].bc, dt, m, shapes[i].loop,
                            8, shapes[i].stages, arch};
      char vn[FG_VARIANT_NAME_MAX];
      fg_variant_name(&v, vn, sizeof vn);
      const int quick = shapes[i].loop == FG_LOOP_KV_TMA && (shapes[i].d == 64 || shapes[i].d == 128) &&
                        shapes[i].br == (shapes[i].d == 64 ? 128 : 64);
      /* ... and (no mask) with a tail: 70 heads of 2 key blocks (the second of one key), 140
       * blocks, on 132 SMs the last 8 split into 4 pieces (108 SMs: 32 into 3; core/fg_tail.h) */
      const int first = l->n; /* (add may move the list: the cases are marked by index after) */
      add(l, B_RUN, dt, m, shapes[i].d, 2, 4, 2, 300, 257, quick, "bwd/%s/%s_gqa_nq300_nk257", group,
          vn);
      add(l, B_RUN, dt, m, shapes[i].d, 1, 2, 2, 17, 129, 0, "bwd/%s/%s_nq17_nk129", group, vn);
      add(l, B_DET, dt, m, shapes[i].d, 1, 2, 1, 700, 700, 0, "bwd/%s/%s_deterministic", group, vn);
      if (!m)
        add(l, B_RUN, dt, m, shapes[i].d, 1, 70, 70, 512, 129, 0, "bwd/%s/%s_tail_h70_nq512_nk129",
            group, vn);
      for (int k = first; k < l->n; k++) l->c[k].forced = 1, l->c[k].v = v;
    }
  }
}

static void build(bwd_list *l) {
  const fg_dtype dts[2] = {FG_DTYPE_BF16, FG_DTYPE_F16};
  /* Every head dimension, both dtypes, both masks: the built-in variant of each (--quick: bf16 at
   * d = 64 and 128, and d = 96, which sm_90a runs on kv_tma's tiles padded to 128 columns). */
  for (int d = 32; d <= 256; d += 8)
    for (int t = 0; t < 2; t++)
      for (int c = 0; c < 2; c++)
        add(l, B_RUN, dts[t], c, d, 2, 4, 2, 129, 129, (d == 64 || d == 96 || d == 128) && t == 0,
            "bwd/head_dim/d%d_%s_%s", d, dtn(dts[t]), cw(c));
  /* Odd shapes at d = 64 and 128. */
  static const int64_t nn[][2] = {{1, 1},     {1, 17},    {17, 1},     {17, 129},
                                  {127, 128}, {128, 128}, {129, 127},  {129, 17},
                                  {17, 1000}, {1000, 1000}, {1000, 17}};
  for (int d = 64; d <= 128; d += 64)
    for (size_t i = 0; i < sizeof nn / sizeof nn[0]; i++)
      for (int c = 0; c < 2; c++)
        add(l, B_RUN, FG_DTYPE_BF16, c, d, 1, 2, 2, nn[i][0], nn[i][1], i == 7 && c,
            "bwd/seqlen/d%d_nq%" PRId64 "_nk%" PRId64 "_%s", d, nn[i][0], nn[i][1], cw(c));
  add(l, B_RUN, FG_DTYPE_BF16, 1, 64, 1, 1, 1, 4097, 4097, 0,
      "bwd/seqlen/d64_nq4097_nk4097_causal");
  /* 64 (batch, KV head)s of 17 key blocks, causal: on sm_90a the blocks go in two groups of 32
   * heads, longest key blocks first (bwd_aux.cuh, causal_kv_pos; 16 key blocks or more),
   * every (key block, head) once; most key blocks see no query row (dK = dV = 0). */
  add(l, B_RUN, FG_DTYPE_BF16, 1, 128, 4, 16, 16, 300, 2100, 0,
      "bwd/seqlen/d128_b4_h16_nq300_nk2100_causal");
  /* The same order with key blocks of 64 (d = 160: bwd_tmat.cu on sm_90a, the mma.sync kernel
   * elsewhere): 16 (batch, KV head)s of 33 key blocks, one group of 16 heads on 132 SMs. */
  add(l, B_RUN, FG_DTYPE_BF16, 1, 160, 2, 8, 8, 300, 2100, 0,
      "bwd/seqlen/d160_b2_h8_nq300_nk2100_causal");
  /* 128 (batch, KV head)s of 2 key blocks, causal: on sm_90a the first 62 heads in launch order,
   * the last 66 (a wave of blocks) as one group, longest key blocks first (common.cuh, deal_tail;
   * under 16 key blocks). */
  add(l, B_RUN, FG_DTYPE_BF16, 1, 128, 8, 16, 16, 200, 200, 0,
      "bwd/seqlen/d128_b8_h16_nq200_nk200_causal");
  /* The grid's tail (core/fg_tail.h; no mask, not deterministic): 140 blocks (35 KV heads of 2
   * key blocks, the second of one key) of GQA groups of 2, on 132 SMs the last 8 each split into
   * 4 pieces (108 SMs: 32 into 3); at d = 96 kv_tma's padded tiles on sm_90a, the mma.sync
   * kernel elsewhere. */
  for (int d = 64; d <= 128; d += 32)
    add(l, B_RUN, FG_DTYPE_BF16, 0, d, 2, 70, 35, 600, 129, d != 96,
        "bwd/tail/d%d_b2_hq70_hkv35_nq600_nk129", d);
  /* GQA and MQA: dK, dV sum over the query heads of a KV head. */
  add(l, B_RUN, FG_DTYPE_BF16, 0, 128, 2, 8, 2, 257, 257, 1, "bwd/gqa/hq8_hkv2_d128");
  add(l, B_RUN, FG_DTYPE_F16, 1, 64, 2, 8, 1, 200, 300, 0, "bwd/gqa/mqa_hq8_d64_causal");
  /* Past the main kernel's split threshold (templates/bwd.lua, SPLIT_ROWS = 65536 query rows per
   * KV head): 8 * (16384 + 17) = 131208 rows, so each key block's query blocks are split over 3
   * blocks (the grid's z), whose dK/dV sums meet in the fp32 dkv_accum; 129 keys: a last key
   * block of one row. Deterministic mode below: the splits add in order. */
  for (int m = 0; m < 2; m++)
    add(l, B_RUN, FG_DTYPE_BF16, m, 64, 1, 8, 1, 16384 + 17, 129, 0,
        "bwd/gqa/long_hq8_hkv1_d64_nq16401_nk129_%s", cw(m));
  /* The same with 8 * 8209 = 65672 rows (2 splits): at d = 192 and 256, where sm_90a runs
   * bwd_tmat.cu (its dK/dV sums staged in shared memory on rows of d + 4 floats) and the other
   * archs the mma.sync kernel (on sm_90 its sums staged over the swizzled K and V tiles, bwd.lua:
   * swz); at d = 96, which sm_90a runs on kv_tma's tiles padded to 128 columns (bwd_tma.cu DP),
   * whose splits add only the columns below d. */
  static const struct {
    int d, causal;
    fg_dtype dt;
  } longs[] = {{192, 0, FG_DTYPE_F16}, {256, 1, FG_DTYPE_BF16}, {96, 0, FG_DTYPE_F16}};
  for (size_t i = 0; i < sizeof longs / sizeof longs[0]; i++)
    add(l, B_RUN, longs[i].dt, longs[i].causal, longs[i].d, 1, 8, 1, 8209, 65, 0,
        "bwd/gqa/long_hq8_hkv1_d%d_nq8209_nk65_%s", longs[i].d, cw(longs[i].causal));
  /* (B, N, H, d) strides for every tensor. */
  fg_check_bwd_case *c =
      add(l, B_RUN, FG_DTYPE_BF16, 1, 64, 2, 4, 2, 200, 200, 1, "bwd/layout/bnhd_d64");
  if (c) c->bnhd = 1;
  c = add(l, B_RUN, FG_DTYPE_F16, 0, 128, 1, 3, 3, 129, 65, 0, "bwd/layout/bnhd_d128_nq129_nk65");
  if (c) c->bnhd = 1;
  /* seqlen_k = 0: dQ = 0. B * H past the grid's 65535. */
  add(l, B_RUN, FG_DTYPE_BF16, 0, 64, 2, 2, 2, 33, 0, 1, "bwd/empty/nk0");
  add(l, B_DET, FG_DTYPE_F16, 1, 128, 1, 2, 2, 70, 0, 0, "bwd/empty/nk0_causal_deterministic");
  add(l, B_RUN, FG_DTYPE_BF16, 1, 32, 66000, 1, 1, 16, 16, 0, "bwd/grid/batch66000");
  add(l, B_RUN, FG_DTYPE_BF16, 1, 32, 66000, 1, 1, 17, 17, 0, "bwd/grid/batch66000_nq17");
  /* ... with the semaphores in every launch's part of the workspace: Hopper's claim-first (d = 128,
   * Br 64) and deterministic store-first (each about 80 s of host reference on 16 cores). */
  add(l, B_RUN, FG_DTYPE_F16, 0, 128, 66000, 1, 1, 17, 33, 0, "bwd/grid/batch66000_d128_nq17_nk33");
  add(l, B_DET, FG_DTYPE_BF16, 1, 128, 66000, 1, 1, 40, 20, 0, "bwd/grid/batch66000_d128_nq40_nk20_causal_deterministic");
  /* Deterministic mode: correct, and the same bits on a second run (many key blocks per dQ
   * tile, GQA, causal and not). */
  for (int m = 0; m < 2; m++) {
    add(l, B_DET, FG_DTYPE_BF16, m, 128, 2, 8, 2, 1000, 1000, m, "bwd/deterministic/d128_%s",
        cw(m));
    add(l, B_DET, FG_DTYPE_F16, m, 64, 1, 4, 4, 777, 2049, 0, "bwd/deterministic/d64_nk2049_%s",
        cw(m));
    add(l, B_DET, FG_DTYPE_BF16, m, 64, 1, 8, 1, 16384 + 17, 129, 0,
        "bwd/deterministic/gqa_long_hq8_hkv1_d64_nq16401_nk129_%s", cw(m));
  }
  /* Causal with more query rows than keys: dQ tiles that no key block adds (rows before the first
   * key), and tiles of one, two and three (sm_90a: the first in a tile's order stores, the rest
   * add; bwd_aux.cuh, dq_store_first). */
  add(l, B_DET, FG_DTYPE_F16, 1, 128, 2, 4, 2, 1000, 300, 0, "bwd/deterministic/d128_nq1000_nk300_causal");
  /* 65 key blocks of 128 per head: on sm_90a, deterministic without a mask deals the key blocks
   * out in groups of 16 per (batch, head) and the 65th in a remainder (bwd_aux.cuh, det_kv_pos). */
  add(l, B_DET, FG_DTYPE_BF16, 0, 64, 1, 2, 2, 300, 8300, 0,
      "bwd/deterministic/d64_nq300_nk8300_noncausal");
  /* 34 (batch, KV head)s of 17 key blocks (two groups of 8 and a remainder), 2 query blocks of
   * 128 per query head: on sm_90a with up to 136 SMs the groups are rotated (each block from its
   * own first dQ tile; bwd_aux.cuh, det_rotate: 34 x 8 >= 2 x SMs), fewer tiles than blocks. */
  add(l, B_DET, FG_DTYPE_BF16, 0, 64, 2, 34, 17, 200, 2049, 0,
      "bwd/deterministic/gqa_b2_hq34_hkv17_d64_nq200_nk2049_noncausal");
  /* Past d = 128 (sm_90a: bwd_tmat.cu and its turn warp; elsewhere the mma.sync kernel): without
   * a mask two groups of 8 key blocks a head, each staggered (a block from its own tile), GQA;
   * one head of 66 key blocks over 18 tiles (8 staggered groups and a remainder of 2, all resident
   * at once, each group behind the one before it); fewer tiles than a group's blocks (4 of 64 rows,
   * 33 key blocks): the ascending order; query rows past the main kernel's split (4 x 16401: 2
   * splits, their dK/dV added in order), causal and not. */
  for (int m = 0; m < 2; m++) {
    add(l, B_DET, m ? FG_DTYPE_F16 : FG_DTYPE_BF16, m, 192, 1, 2, 1, 1000, 1000, 0,
        "bwd/deterministic/gqa_d192_%s", cw(m));
    add(l, B_DET, FG_DTYPE_BF16, m, 256, 1, 4, 1, 16384 + 17, 129, 0,
        "bwd/deterministic/gqa_long_hq4_hkv1_d256_nq16401_nk129_%s", cw(m));
  }
  add(l, B_DET, FG_DTYPE_F16, 0, 136, 1, 1, 1, 1100, 4200, 0, "bwd/deterministic/d136_nq1100_nk4200_noncausal");
  add(l, B_DET, FG_DTYPE_BF16, 0, 256, 1, 1, 1, 200, 2049, 0, "bwd/deterministic/d256_nq200_nk2049_noncausal");
  /* 64-bit offsets in the three kernels: Q, O, dO and dQ of more than 2^31 elements (2^31 +
   * 4097 * 128), dQ's fp32 accumulator of more than 2^32 bytes, K and V of 64 rows. Device memory:
   * Q, O, dO, dQ 4.0 GiB each, the workspace (fp32 dQ and D: (d + 1) floats a row) 8.1 GiB, LSE
   * 64 MiB, dkv_accum 257 KiB: about 24.2 GiB. Time: the main kernel's one key block is split
   * over 257 blocks (65536 query rows each; before the split one SM ran all 16.8M rows, ~35 s
   * non-causal), and 10-30 s on the host (uploading the periodic Q and dO, comparing all 2^31
   * elements of dQ). Causal is cheap: all but the last 64 rows see no key
   * (dQ exactly 0), and the pre and post kernels still cross 2^31 elements. */
  const int64_t big_nq = (INT64_C(1) << 31) / 128 + 4097;
  for (int m = 0; m < 2; m++)
    add(l, B_BIG, FG_DTYPE_BF16, m, 128, 1, 1, 1, big_nq, 64, 0,
        "bwd/big/q_over_2^31_elements_d128_bf16_nq%" PRId64 "_nk64_%s", big_nq, cw(m));
  /* Bad input: an error, and the gradients untouched. */
  static const struct {
    int kind;
    const char *name;
  } bad[] = {{B_BAD_NULL_DO, "d_o_null"},         {B_BAD_NULL_LSE, "lse_null"},
             {B_BAD_DQ_ALIASES_Q, "dq_aliases_q"}, {B_BAD_DK_ALIASES_DV, "dk_aliases_dv"},
             {B_BAD_MISALIGNED_DQ, "dq_misaligned"},
             {B_BAD_DO_STRIDE, "do_stride_odd"},  {B_BAD_HOST_DK, "dk_host_memory"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    add(l, bad[i].kind, FG_DTYPE_BF16, 0, 64, 1, 2, 2, 64, 64, 1, "bwd/bad/%s", bad[i].name);
}

/* ------------------------------------------------------------------------------------------ */
static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One strided device tensor with its logical host copy [n0][n1][n2][d]. */
typedef struct dtensor {
  int64_t n[3], d, s[3], ext; /* ext: elements from the base */
  CUdeviceptr p;
} dtensor;

static void tensor_init(dtensor *t, int64_t n0, int64_t n1, int64_t n2, int64_t d, int bnhd) {
  memset(t, 0, sizeof *t);
  t->n[0] = n0, t->n[1] = n1, t->n[2] = n2, t->d = d;
  if (bnhd) {
    t->s[0] = n2 * n1 * d, t->s[1] = d, t->s[2] = n1 * d;
  } else {
    t->s[0] = n1 * n2 * d, t->s[1] = n2 * d, t->s[2] = d;
  }
  t->ext = fg_tensor_extent(n0, n1, n2, d, t->s);
}

/* Logical index -> offset. */
static int64_t toff(const dtensor *t, int64_t i) {
  const int64_t x = i % t->d, r = i / t->d, n = r % t->n[2], h = (r / t->n[2]) % t->n[1],
                b = r / (t->n[2] * t->n[1]);
  return b * t->s[0] + h * t->s[1] + n * t->s[2] + x;
}

static fg_status tensor_alloc(fg_context *ctx, dtensor *t, uint16_t poison) {
  const size_t bytes = (size_t)(t->ext > 0 ? t->ext : 1) * 2;
  fg_status st = fg_dev_alloc(ctx, &t->p, bytes);
  if (st == FG_OK) st = fg_dev_fill16(ctx, t->p, poison, bytes / 2);
  return st;
}

static fg_status tensor_upload(fg_context *ctx, dtensor *t, const uint16_t *h, uint16_t fillv) {
  const int64_t n = t->n[0] * t->n[1] * t->n[2] * t->d;
  uint16_t *buf = malloc((size_t)(t->ext > 0 ? t->ext : 1) * 2);
  if (!buf) return FG_ERROR_OUT_OF_MEMORY;
  for (int64_t i = 0; i < t->ext; i++) buf[i] = fillv;
  for (int64_t i = 0; i < n; i++) buf[toff(t, i)] = h[i];
  fg_status st = fg_dev_upload(ctx, t->p, buf, (size_t)t->ext * 2);
  free(buf);
  return st;
}

static fg_status tensor_download(fg_context *ctx, const dtensor *t, uint16_t *h) {
  const int64_t n = t->n[0] * t->n[1] * t->n[2] * t->d;
  uint16_t *buf = malloc((size_t)(t->ext > 0 ? t->ext : 1) * 2);
  if (!buf) return FG_ERROR_OUT_OF_MEMORY;
  fg_status st = t->ext > 0 ? fg_dev_download(ctx, buf, t->p, (size_t)t->ext * 2) : FG_OK;
  for (int64_t i = 0; st == FG_OK && i < n; i++) h[i] = buf[toff(t, i)];
  free(buf);
  return st;
}

void fg_check_bwd_fail(fg_check_bwd_result *r, const char *fmt, ...) {
  if (!r->pass && r->reason[0]) return;
  r->pass = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->reason, sizeof r->reason, fmt, ap);
  va_end(ap);
}

int fg_check_bwd_call(const fg_check_bwd_env *env, const fg_attention_backward_args *a,
                      const fg_variant *v, fg_check_bwd_result *r) {
  fg_status st = fg_attention_backward_variant(env->ctx, a, env->stream, v);
  if (st == FG_OK) st = fg_stream_synchronize(env->ctx, env->stream);
  if (st == FG_OK) return 0;
  fg_check_bwd_fail(r, "the backward call failed: %s: %s", fg_status_string(st),
                    fg_context_last_error(env->ctx));
  return -1;
}

/* "i" when err is infinite (the gate's first non-finite index), else "-"; into buf[24]. */
static const char *idx_or_none(double err, int64_t i, char *buf) {
  if (isinf(err)) snprintf(buf, 24, "%" PRId64, i);
  else snprintf(buf, 24, "-");
  return buf;
}

/* "n/m (p poison)": of the n elements of g, how many are not finite and how many still hold the
 * poison bit pattern the gradient was filled with before the call (all of them: never written);
 * into buf[64]. */
static const char *nonfinite_count(const uint16_t *g, int64_t n, uint16_t poison, fg_dtype dt,
                                   char *buf) {
  int64_t bad = 0, left = 0;
  for (int64_t i = 0; i < n; i++) {
    bad += !isfinite(fg_half_to_f32(g[i], dt));
    left += g[i] == poison;
  }
  snprintf(buf, 64, "%" PRId64 " of %" PRId64 " (%" PRId64 " poison)", bad, n, left);
  return buf;
}

/* The backward call a (variant v) again on env's stream, waited for, with its gradients outs
 * (dQ, dK, dV) poisoned anew first; with sync_first after a device synchronisation too. */
static fg_status call_again(const fg_check_bwd_env *env, const fg_attention_backward_args *a,
                            const fg_variant *v, const dtensor *const outs[3], uint16_t poison,
                            int sync_first) {
  fg_status st = FG_OK;
  for (int i = 0; i < 3 && st == FG_OK; i++)
    st = fg_dev_fill16(env->ctx, outs[i]->p, poison, (size_t)(outs[i]->ext > 0 ? outs[i]->ext : 1));
  if (st == FG_OK && sync_first) st = fg_dev_synchronize(env->ctx);
  if (st == FG_OK) st = fg_attention_backward_variant(env->ctx, a, env->stream, v);
  if (st == FG_OK) st = fg_stream_synchronize(env->ctx, env->stream);
  return st;
}

/* After a non-finite result: the same backward call again on the same inputs (Q, K, V, dO and the
 * forward's O and LSE as they are now) after a device synchronisation, described into out[384]:
 * a failure the call repeats, or one that depends on what ran before it (work still in flight,
 * the state an earlier call left). */
static void rerun_after_sync(const fg_check_bwd_env *env, const fg_attention_backward_args *a,
                             const fg_variant *v, const dtensor *const outs[3], const int64_t n[3],
                             uint16_t poison, fg_dtype dt, char *out) {
  uint16_t *buf = malloc((size_t)(n[0] > n[1] ? n[0] : n[1]) * 2 + 2);
  char c[3][64];
  fg_status st = buf ? call_again(env, a, v, outs, poison, 1) : FG_ERROR_OUT_OF_MEMORY;
  for (int i = 0; i < 3 && st == FG_OK; i++)
    if ((st = tensor_download(env->ctx, outs[i], buf)) == FG_OK)
      nonfinite_count(buf, n[i], poison, dt, c[i]);
  if (st != FG_OK)
    snprintf(out, 384, "the same call again after a device synchronisation failed: %s",
             fg_context_last_error(env->ctx));
  else
    snprintf(out, 384,
             "the same call again after a device synchronisation: non-finite dQ %s, dK %s, dV %s",
             c[0], c[1], c[2]);
  free(buf);
}

/* Describes into out[192] whether the inputs Q, K, V and dO (ts[i], n[i] logical elements) read
 * back from the device bit for bit as they were uploaded (hs[i]): a kernel that wrote where it
 * should not, or an upload not done when the call read it, shows here. */
static void inputs_as_uploaded(fg_context *ctx, const dtensor *const ts[4],
                               const uint16_t *const hs[4], const int64_t n[4], char *out) {
  static const char *names[4] = {"Q", "K", "V", "dO"};
  uint16_t *buf = malloc((size_t)(n[0] > n[1] ? n[0] : n[1]) * 2 + 2);
  int len = snprintf(out, 192, "Q, K, V, dO read back");
  int same = 1;
  for (int t = 0; t < 4 && len < 192; t++) {
    if (!buf || tensor_download(ctx, ts[t], buf) != FG_OK) {
      snprintf(out, 192, "Q, K, V, dO could not be read back");
      free(buf);
      return;
    }
    int64_t diff = 0, first = -1;
    for (int64_t i = 0; i < n[t]; i++)
      if (buf[i] != hs[t][i] && diff++ == 0) first = i;
    if (diff) {
      len += snprintf(out + len, (size_t)(192 - len),
                      "%s %s: %" PRId64 " of %" PRId64 " elements differ from the upload (%s[%" PRId64
                      "] = 0x%04x, uploaded 0x%04x)",
                      same ? ":" : ";", names[t], diff, n[t], names[t], first, buf[first],
                      hs[t][first]);
      same = 0;
    }
  }
  if (same) snprintf(out, 192, "Q, K, V, dO read back as uploaded");
  free(buf);
}

/* Describes into out whether the forward's O (nq_el elements, through its strides) and LSE
 * (nrows floats) hold NaN or infinities (LSE = -inf is a row without keys, not counted). */
static void forward_outputs_finite(fg_context *ctx, const dtensor *o, CUdeviceptr lse,
                                   int64_t nq_el, int64_t nrows, fg_dtype dt, char *out,
                                   size_t outlen) {
  uint16_t *ho = malloc((size_t)(nq_el + 1) * 2);
  float *hl = malloc((size_t)(nrows + 1) * 4);
  if (!ho || !hl || tensor_download(ctx, o, ho) != FG_OK ||
      (nrows > 0 && fg_dev_download(ctx, hl, lse, (size_t)nrows * 4) != FG_OK)) {
    snprintf(out, outlen, "the forward's O and LSE could not be read back");
  } else {
    int64_t bad_o = 0, bad_l = 0, first_o = -1, first_l = -1;
    for (int64_t i = 0; i < nq_el; i++)
      if (!isfinite(fg_half_to_f32(ho[i], dt)) && bad_o++ == 0) first_o = i;
    for (int64_t i = 0; i < nrows; i++)
      if ((isnan(hl[i]) || hl[i] == INFINITY) && bad_l++ == 0) first_l = i;
    char so[96], sl[96];
    if (bad_o)
      snprintf(so, sizeof so, "%" PRId64 " of %" PRId64 " not finite, first O[%" PRId64 "]", bad_o,
               nq_el, first_o);
    else snprintf(so, sizeof so, "all %" PRId64 " finite", nq_el);
    if (bad_l) snprintf(sl, sizeof sl, "%" PRId64 " of %" PRId64 " NaN or +inf, first row %" PRId64,
                        bad_l, nrows, first_l);
    else snprintf(sl, sizeof sl, "all %" PRId64 " finite or -inf", nrows);
    snprintf(out, outlen, "the forward's O: %s; its LSE: %s", so, sl);
  }
  free(ho);
  free(hl);
}

static void run_case(fg_check_bwd_env *env, const fg_check_bwd_case *c, fg_check_bwd_result *r) {
  fg_context *ctx = env->ctx;
  r->pass = 1;
  const fg_problem p = fg_check_bwd_problem(c);
  const fg_variant v = c->forced ? c->v : fg_problem_builtin(&p, fg_context_arch(ctx));
  fg_variant_name(&v, r->variant, sizeof r->variant);
  dtensor q, k, vv, o, dout, dq, dk, dv;
  tensor_init(&q, c->b, c->hq, c->nq, c->d, c->bnhd);
  tensor_init(&o, c->b, c->hq, c->nq, c->d, c->bnhd);
  tensor_init(&dout, c->b, c->hq, c->nq, c->d, c->bnhd);
  tensor_init(&dq, c->b, c->hq, c->nq, c->d, c->bnhd);
  tensor_init(&k, c->b, c->hkv, c->nk, c->d, c->bnhd);
  tensor_init(&vv, c->b, c->hkv, c->nk, c->d, c->bnhd);
  tensor_init(&dk, c->b, c->hkv, c->nk, c->d, c->bnhd);
  tensor_init(&dv, c->b, c->hkv, c->nk, c->d, c->bnhd);
  const int64_t nq_el = c->b * c->hq * c->nq * c->d, nk_el = c->b * c->hkv * c->nk * c->d;
  const int64_t nrows = c->b * c->hq * c->nq;
  const uint16_t nan16 = c->dt == FG_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
  uint16_t *hq = malloc((size_t)(nq_el + 1) * 2), *hdo = malloc((size_t)(nq_el + 1) * 2);
  uint16_t *hk = malloc((size_t)(nk_el + 1) * 2), *hv = malloc((size_t)(nk_el + 1) * 2);
  uint16_t *gq = malloc((size_t)(nq_el + 1) * 2), *gk = malloc((size_t)(nk_el + 1) * 2),
           *gv = malloc((size_t)(nk_el + 1) * 2);
  double *ex = malloc((size_t)(nq_el + 2 * nk_el + 1) * sizeof(double));
  double *nv = malloc((size_t)(nq_el + 2 * nk_el + 1) * sizeof(double));
  CUdeviceptr lse = 0;
  dtensor *all[8] = {&q, &k, &vv, &o, &dout, &dq, &dk, &dv};
  if (!hq || !hdo || !hk || !hv || !gq || !gk || !gv || !ex || !nv) {
    fg_check_bwd_fail(r, "out of host memory");
    goto done;
  }
  fg_rng g = {env->seed ^ fg_seed_of_name(c->name)};
  fg_fill_random(hq, nq_el, &g, c->dt, 1);
  fg_fill_random(hk, nk_el, &g, c->dt, 1);
  fg_fill_random(hv, nk_el, &g, c->dt, 0);
  fg_fill_random(hdo, nq_el, &g, c->dt, 0);
  fg_status st = FG_OK;
  for (int i = 0; i < 8 && st == FG_OK; i++) st = tensor_alloc(ctx, all[i], nan16);
  if (st == FG_OK) st = fg_dev_alloc(ctx, &lse, (size_t)(nrows > 0 ? nrows : 1) * 4);
  if (st == FG_OK) st = tensor_upload(ctx, &q, hq, nan16);
  if (st == FG_OK) st = tensor_upload(ctx, &k, hk, nan16);
  if (st == FG_OK) st = tensor_upload(ctx, &vv, hv, nan16);
  if (st == FG_OK) st = tensor_upload(ctx, &dout, hdo, nan16);
  if (st != FG_OK) {
    fg_check_bwd_fail(r, "setting up device memory: %s", fg_context_last_error(ctx));
    goto done;
  }
  fg_attention_backward_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = c->dt;
  a.causal = c->causal;
  a.batch = c->b, a.heads_q = c->hq, a.heads_kv = c->hkv, a.seqlen_q = c->nq,
  a.seqlen_k = c->nk, a.head_dim = c->d;
  a.q = (const void *)(uintptr_t)q.p, a.k = (const void *)(uintptr_t)k.p;
  a.v = (const void *)(uintptr_t)vv.p, a.o = (const void *)(uintptr_t)o.p;
  a.d_o = (const void *)(uintptr_t)dout.p, a.lse = (const float *)(uintptr_t)lse;
  a.dq = (void *)(uintptr_t)dq.p, a.dk = (void *)(uintptr_t)dk.p, a.dv = (void *)(uintptr_t)dv.p;
  memcpy(a.q_stride, q.s, sizeof q.s), memcpy(a.k_stride, k.s, sizeof k.s);
  memcpy(a.v_stride, vv.s, sizeof vv.s), memcpy(a.o_stride, o.s, sizeof o.s);
  memcpy(a.do_stride, dout.s, sizeof dout.s), memcpy(a.dq_stride, dq.s, sizeof dq.s);
  memcpy(a.dk_stride, dk.s, sizeof dk.s), memcpy(a.dv_stride, dv.s, sizeof dv.s);
  fg_attention_args f;
  fg_backward_forward_args(&a, &f);
  if (fg_attention_forward(ctx, &f, env->stream) != FG_OK ||
      (env->sync && fg_dev_synchronize(ctx) != FG_OK)) {
    fg_check_bwd_fail(r, "the forward call failed: %s", fg_context_last_error(ctx));
    goto done;
  }
  if (c->kind != B_RUN && c->kind != B_DET) {
    /* Bad input: make it bad, call, expect an error and the gradients untouched. */
    fg_status want = FG_ERROR_INVALID_ARGUMENT;
    void *host = NULL;
    switch (c->kind) {
      case B_BAD_NULL_DO: a.d_o = NULL; break;
      case B_BAD_NULL_LSE: a.lse = NULL; break;
      case B_BAD_DQ_ALIASES_Q: a.dq = (void *)(uintptr_t)q.p; break;
      case B_BAD_DK_ALIASES_DV: a.dk = a.dv; break;
      case B_BAD_MISALIGNED_DQ: a.dq = (void *)(uintptr_t)(dq.p + 8); break;
      case B_BAD_DO_STRIDE: a.do_stride[2] = c->d + 4; break;
      case B_BAD_HOST_DK:
        host = malloc((size_t)dk.ext * 2 + 16);
        a.dk = host ? (void *)(((uintptr_t)host + 15) & ~(uintptr_t)15) : NULL;
        break;
    }
    fg_status got = fg_attention_backward_variant(ctx, &a, env->stream, &v);
    free(host);
    if (got != want)
      fg_check_bwd_fail(r, "expected %s, got %s (%s)", fg_status_string(want),
                        fg_status_string(got), fg_context_last_error(ctx));
    else if (!strstr(fg_context_last_error(ctx), "args->"))
      fg_check_bwd_fail(r, "the message does not name the argument: %s",
                        fg_context_last_error(ctx));
    fg_stream_synchronize(ctx, env->stream);
    if (tensor_download(ctx, &dq, gq) == FG_OK)
      for (int64_t i = 0; i < nq_el; i++)
        if (gq[i] != nan16) {
          fg_check_bwd_fail(r, "dQ was written by a call that failed");
          break;
        }
    goto done;
  }
  a.deterministic = c->kind == B_DET;
  if (fg_check_bwd_call(env, &a, &v, r)) goto done;
  if (tensor_download(ctx, &dq, gq) != FG_OK || tensor_download(ctx, &dk, gk) != FG_OK ||
      tensor_download(ctx, &dv, gv) != FG_OK) {
    fg_check_bwd_fail(r, "downloading the gradients: %s", fg_context_last_error(ctx));
    goto done;
  }
  if (c->kind == B_DET) {
    /* Again, on poisoned gradients: the same bits. */
    uint16_t *again = malloc((size_t)(nq_el > nk_el ? nq_el : nk_el) * 2 + 2);
    const dtensor *const outs[3] = {&dq, &dk, &dv};
    const uint16_t *first[3] = {gq, gk, gv};
    const char *names[3] = {"dQ", "dK", "dV"};
    st = again ? call_again(env, &a, &v, outs, nan16, 0) : FG_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < 3 && st == FG_OK; i++) {
      st = tensor_download(ctx, outs[i], again);
      const int64_t n = i ? nk_el : nq_el;
      if (st == FG_OK && memcmp(again, first[i], (size_t)n * 2) != 0)
        fg_check_bwd_fail(r, "deterministic mode: %s differs between two runs", names[i]);
    }
    free(again);
    if (st != FG_OK) {
      fg_check_bwd_fail(r, "the second deterministic call failed: %s", fg_context_last_error(ctx));
      goto done;
    }
  }
  fg_bwd_host_problem hp = {c->dt, c->causal, c->b, c->hq, c->hkv, c->nq, c->nk, c->d,
                            1.0 / sqrt((double)c->d), hq, hk, hv, hdo};
  if (fg_reference_backward(&hp, 1, ex, ex + nq_el, ex + nq_el + nk_el, NULL, env->threads) ||
      fg_reference_backward(&hp, 0, nv, nv + nq_el, nv + nq_el + nk_el, NULL, env->threads)) {
    fg_check_bwd_fail(r, "the host reference failed (out of memory?)");
    goto done;
  }
  fg_gate_result gr;
  fg_gate_backward(c->dt, gq, gk, gv, ex, nv, nq_el, nk_el, &gr);
  memcpy(r->err, gr.err, sizeof r->err);
  memcpy(r->tol, gr.tol, sizeof r->tol);
  if (!gr.pass) {
    if (isinf(gr.err[0]) || isinf(gr.err[1]) || isinf(gr.err[2])) {
      /* Non-finite gradients: say where the first of each is, whether the forward's O and LSE
       * (the backward's inputs besides Q, K, V, dO) were finite, so one failure tells the
       * forward from the backward, whether Q, K, V and dO still hold what was uploaded, and
       * whether the same call fails again after a device synchronisation (a failure that
       * depends on what ran before, or one of the call). */
      char inputs[256], intact[192], again[384], i0[24], i1[24], i2[24], n0[64], n1[64], n2[64];
      forward_outputs_finite(ctx, &o, lse, nq_el, nrows, c->dt, inputs, sizeof inputs);
      const dtensor *const ins[4] = {&q, &k, &vv, &dout};
      const uint16_t *const hins[4] = {hq, hk, hv, hdo};
      const int64_t nins[4] = {nq_el, nk_el, nk_el, nq_el};
      inputs_as_uploaded(ctx, ins, hins, nins, intact);
      const dtensor *const outs[3] = {&dq, &dk, &dv};
      const int64_t ns[3] = {nq_el, nk_el, nk_el};
      rerun_after_sync(env, &a, &v, outs, ns, nan16, c->dt, again);
      fg_check_bwd_fail(r,
                        "%s; first non-finite dQ/dK/dV index %s/%s/%s; non-finite dQ %s, dK %s, "
                        "dV %s; %s; %s; %s",
                        gr.reason, idx_or_none(gr.err[0], gr.worst[0], i0),
                        idx_or_none(gr.err[1], gr.worst[1], i1),
                        idx_or_none(gr.err[2], gr.worst[2], i2),
                        nonfinite_count(gq, nq_el, nan16, c->dt, n0),
                        nonfinite_count(gk, nk_el, nan16, c->dt, n1),
                        nonfinite_count(gv, nk_el, nan16, c->dt, n2), inputs, intact, again);
    } else {
      fg_check_bwd_fail(r, "%s", gr.reason);
    }
  }
done:
  for (int i = 0; i < 8; i++) fg_dev_free(ctx, all[i]->p);
  fg_dev_free(ctx, lse);
  free(hq), free(hdo), free(hk), free(hv), free(gq), free(gk), free(gv), free(ex), free(nv);
}

/* Compiles the variants of the selected cases on `jobs` threads (fg_pool_run, at most 32)
 * before the cases run; a failure shows in its case. */
typedef struct preload_job {
  fg_context *ctx;
  fg_variant *v;
} preload_job;

static void preload_one(void *arg, int i) {
  preload_job *j = arg;
  const fg_loaded_kernel *k;
  (void)fg_registry_get(j->ctx, &j->v[i], &k);
}

static void preload(fg_context *ctx, const bwd_list *l, const char *sel, int jobs) {
  fg_variant *v = calloc((size_t)l->n + 1, sizeof *v);
  if (!v) return;
  int n = 0;
  for (int i = 0; i < l->n; i++) {
    if (!sel[i]) continue;
    const fg_check_bwd_case *c = &l->c[i];
    const fg_problem p = fg_check_bwd_problem(c);
    fg_variant x = c->forced ? c->v : fg_problem_builtin(&p, fg_context_arch(ctx));
    int dup = 0;
    for (int k = 0; k < n && !dup; k++) dup = !memcmp(&v[k], &x, sizeof x);
    if (!dup) v[n++] = x;
  }
  preload_job j = {ctx, v};
  fg_pool_run(n, jobs < 1 ? 1 : jobs > 32 ? 32 : jobs, preload_one, NULL, &j);
  free(v);
}

int fg_check_backward(const fg_check_options *o, int *passed, int *failed) {
  bwd_list l = {0};
  build(&l);
  /* Without a GPU (--list) the cases of an sm_90a device, as the forward's (cmd_check.c). */
  add_forced_cases(&l, o->ctx ? fg_context_arch(o->ctx) : FG_ARCH_SM90A);
  char *sel = calloc((size_t)l.n + 1, 1);
  int nsel = 0;
  for (int i = 0; sel && i < l.n; i++) {
    sel[i] = fg_check_selected(l.c[i].name, l.c[i].quick, o->filter, o->quick);
    nsel += sel[i];
  }
  if (o->list || !nsel) {
    for (int i = 0; o->list && i < l.n; i++)
      if (sel[i]) printf("%s\n", l.c[i].name);
    free(sel);
    free(l.c);
    return nsel;
  }
  preload(o->ctx, &l, sel, o->jobs);
  fg_check_bwd_env env = {o->ctx, o->stream, o->seed, o->jobs > 0 ? o->jobs : 1, o->sync};
  for (int i = 0; i < l.n; i++) {
    if (!sel[i]) continue;
    const fg_check_bwd_case *c = &l.c[i];
    fg_check_bwd_result r;
    memset(&r, 0, sizeof r);
    const double t0 = now_ms();
    if (c->kind == B_BIG) fg_check_bwd_big(&env, c, &r);
    else run_case(&env, c, &r);
    const double ms = now_ms() - t0;
    if (c->kind == B_RUN || c->kind == B_DET || c->kind == B_BIG)
      printf("%-64s err dQ %.2e/%.2e dK %.2e/%.2e dV %.2e/%.2e %7.1f ms  %s\n", c->name, r.err[0],
             r.tol[0], r.err[1], r.tol[1], r.err[2], r.tol[2], ms, r.pass ? "PASS" : "FAIL");
    else
      printf("%-64s %-42s %7.1f ms  %s\n", c->name, "expected error, output untouched", ms,
             r.pass ? "PASS" : "FAIL");
    if (!r.pass || o->verbose) printf("    variant %s\n", r.variant[0] ? r.variant : "?");
    if (!r.pass) printf("    %s\n", r.reason);
    fflush(stdout);
    if (r.pass) (*passed)++;
    else (*failed)++;
  }
  free(sel);
  free(l.c);
  return nsel;
}
