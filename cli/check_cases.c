/* check_cases.c: the forward cases of `flashgen check`, as tables and loops over them (the names
 * are what `flashgen check --list` prints and --filter matches: keep them stable). Each section
 * says what it covers; kv_outer cases exist only where the default set has a kv_outer variant of
 * their (d, dtype, causal). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_check.h"

/* Appends a case: kind, dtype, causal, head dim, batch, query heads, KV heads, Nq, Nk, whether
 * --quick runs it, and its name; layout (B, H, N, d), with LSE, the default scale. */
static fg_check_case *add(fg_check_list *l, int kind, fg_dtype dt, int causal, int64_t d,
                          int64_t B, int64_t Hq, int64_t Hkv, int64_t Nq, int64_t Nk, int quick,
                          const char *fmt, ...) FG_PRINTF(12, 13);
static fg_check_case *add(fg_check_list *l, int kind, fg_dtype dt, int causal, int64_t d,
                          int64_t B, int64_t Hq, int64_t Hkv, int64_t Nq, int64_t Nk, int quick,
                          const char *fmt, ...) {
  if (l->n == l->cap) {
    int cap = l->cap ? l->cap * 2 : 256;
    fg_check_case *c = realloc(l->c, (size_t)cap * sizeof *c);
    if (!c) {
      fprintf(stderr, "flashgen check: out of memory\n");
      exit(1);
    }
    l->c = c;
    l->cap = cap;
  }
  fg_check_case *c = &l->c[l->n++];
  memset(c, 0, sizeof *c);
  c->kind = kind;
  c->dtype = dt;
  c->causal = causal;
  c->d = d;
  c->B = B, c->Hq = Hq, c->Hkv = Hkv, c->Nq = Nq, c->Nk = Nk;
  c->quick = quick;
  c->lse = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->name, sizeof c->name, fmt, ap);
  va_end(ap);
  return c;
}

static const char *cw(int causal) { return causal ? "causal" : "noncausal"; }
static const char *dtn(fg_dtype t) { return fg_dtype_name(t); }
/* bf16 for even x, f16 for odd (the sections alternate dtypes over their loops). */
static fg_dtype alt(int64_t x) { return x % 2 ? FG_DTYPE_F16 : FG_DTYPE_BF16; }

/* Forces the last case to the default set's kv_outer variant of its (d, dtype, causal), or
 * drops it when the set has none. */
static void kv_outer(fg_check_list *l, const fg_variant *defs, int n) {
  fg_check_case *c = &l->c[l->n - 1];
  for (int i = 0; i < n; i++)
    if (defs[i].d == c->d && defs[i].dtype == c->dtype && (defs[i].causal != 0) == (c->causal != 0) &&
        defs[i].loop == FG_LOOP_KV_OUTER) {
      c->forced = 1;
      c->v = defs[i];
      return;
    }
  l->n--;
}

/* A wgmma variant (fwd_wgmma.cu; loop q_wgmma, or q_wgmma_ov when ov). */
static fg_variant wgmma(int d, fg_dtype dt, int causal, fg_arch arch, int ov, int warps, int bc,
                        int stages) {
  fg_variant v = {FG_PASS_FWD, d, 16 * warps, bc, dt, causal,
                  ov ? FG_LOOP_Q_WGMMA_OV : FG_LOOP_Q_WGMMA, warps, stages, arch};
  return v;
}

static void force(fg_check_case *c, fg_variant v) {
  c->forced = 1;
  c->v = v;
}

/* The sequence-length pairs and the layouts every Hopper path runs (add_wgmma_cases,
 * add_tma_cases): partial Q and K/V blocks, one key, rows without keys; GQA and MQA, (B, N, H, d)
 * strides, padded rows, mixed layouts, no LSE, more than 2^16 (batch, head) pairs. */
static const int64_t pairs[][2] = {{1, 1},     {17, 129},  {129, 17},   {127, 1000}, {1000, 127},
                                   {1000, 1000}, {4097, 4097}, {300, 100}, {300, 0}};
static const struct {
  const char *name;
  int d, layout, lse, causal;
  int64_t B, Hq, Hkv, Nq, Nk;
} ps[] = {{"gqa8", 128, FG_CHECK_BHND, 1, 1, 2, 16, 2, 300, 345},
          {"mqa", 64, FG_CHECK_BHND, 1, 0, 2, 8, 1, 300, 300},
          {"bnhd", 128, FG_CHECK_BNHD, 1, 1, 2, 4, 4, 333, 333},
          {"padded_rows", 64, FG_CHECK_PADDED, 1, 0, 2, 4, 4, 257, 300},
          {"mixed_layouts", 128, FG_CHECK_MIXED, 1, 0, 2, 4, 2, 257, 300},
          {"nolse", 128, FG_CHECK_BHND, 0, 1, 2, 2, 2, 300, 300},
          {"b8300_h16_n1", 128, FG_CHECK_BHND, 1, 0, 8300, 16, 16, 1, 1}};

/* The wgmma path (sm_90a only), both schedules (in order, overlapped): every tile shape on the
 * head dims it takes, both dtypes, causal or not; then sequence-length pairs (partial Q and K/V
 * blocks, one key, rows without keys), GQA and MQA, layouts, no LSE, and more than 2^16 (batch,
 * head) pairs. */
static void add_wgmma_cases(fg_check_list *l, fg_arch arch) {
  if (arch != FG_ARCH_SM90A) return;
  static const struct { int d, warps, bc, stages, ov; } shapes[] = {
      {64, 4, 64, 2, 1},  {64, 4, 128, 2, 0}, {64, 8, 64, 2, 1},  {128, 4, 64, 2, 1},
      {128, 4, 64, 2, 0}, {128, 4, 128, 2, 0}, {128, 8, 64, 2, 1}, {128, 8, 32, 2, 0},
      {256, 4, 32, 2, 0}, {256, 8, 32, 2, 1}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int dt = 0; dt < 2; dt++)
      for (int causal = 0; causal <= 1; causal++) {
        const fg_variant v = wgmma(shapes[i].d, alt(dt), causal, arch, shapes[i].ov,
                                   shapes[i].warps, shapes[i].bc, shapes[i].stages);
        char vn[FG_VARIANT_NAME_MAX];
        fg_variant_name(&v, vn, sizeof vn);
        const int quick = (shapes[i].d == 128 || shapes[i].d == 64) && shapes[i].warps == 4 &&
                          dt == causal;
        force(add(l, FG_CHECK_RUN, alt(dt), causal, shapes[i].d, 2, 2, 1, causal ? 160 : 200,
                  causal ? 224 : 200, quick, "wgmma/%s", vn),
              v);
      }
  for (int dd = 0; dd < 2; dd++)
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
      for (int causal = 0; causal <= 1; causal++) {
        if (pairs[i][1] == 0 && causal) continue;
        const int ov = (int)(i + (size_t)dd) % 2; /* both schedules over the pairs */
        const int d = dd ? 64 : 128;
        const fg_dtype dt = alt((int64_t)i + causal);
        const int64_t nq = pairs[i][0], nk = pairs[i][1];
        force(add(l, FG_CHECK_RUN, dt, causal, d, nq * nk >= 1000 * 1000 ? 1 : 2, 2, dd ? 2 : 1,
                  nq, nk, i == 1 || i == 2 || i == 7,
                  "wgmma_seqlen/d%d_nq%" PRId64 "_nk%" PRId64 "_%s_%s_%s", d, nq, nk, dtn(dt),
                  cw(causal), ov ? "ov" : "inorder"),
              wgmma(d, dt, causal, arch, ov, 4, 64, 2));
      }
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    const int ov = i % 2 == 0;
    fg_check_case *c = add(l, FG_CHECK_RUN, FG_DTYPE_BF16, ps[i].causal, ps[i].d, ps[i].B,
                           ps[i].Hq, ps[i].Hkv, ps[i].Nq, ps[i].Nk, 1, "wgmma/%s_%s_%s",
                           ps[i].name, cw(ps[i].causal), ov ? "ov" : "inorder");
    c->layout = ps[i].layout;
    c->lse = ps[i].lse;
    force(c, wgmma(ps[i].d, FG_DTYPE_BF16, ps[i].causal, arch, ov, 4, 64, 2));
  }
}

/* A TMA variant (fwd_tma.cu, loop q_tma): warps / 4 consumer warpgroups of 64 rows. */
static fg_variant tma(int d, fg_dtype dt, int causal, fg_arch arch, int warps, int bc, int stages) {
  fg_variant v = {FG_PASS_FWD, d, 16 * warps, bc, dt, causal, FG_LOOP_Q_TMA, warps, stages, arch};
  return v;
}

/* The TMA path (sm_90a only): one, two and three consumer warpgroups, the key-block sizes the
 * built-in rule and the tuner take (spill-free ones: causal kernels hold a smaller Bc), 2 and 3
 * stages, both dtypes; then the sequence-length pairs (rows past the end arrive as zeros from the
 * TMA), GQA and MQA, layouts whose strides the tensor maps carry, no LSE, and more than 2^16
 * (batch, head) pairs (maps encoded per batch chunk). */
static void add_tma_cases(fg_check_list *l, fg_arch arch) {
  if (arch != FG_ARCH_SM90A) return;
  static const struct { int d, warps, bc, bc_causal, stages; } shapes[] = {
      {64, 12, 128, 64, 2}, {64, 8, 128, 128, 2}, {64, 4, 64, 64, 2},   {128, 8, 128, 112, 2},
      {128, 8, 64, 64, 3},  {128, 12, 64, 32, 2}, {128, 4, 64, 64, 2},  {192, 8, 96, 64, 2},
      {256, 8, 80, 64, 2},  {256, 8, 32, 32, 2},
      /* head dims off the 64-column blocks: tiles rounded up, the TMA's zeros past d */
      {40, 12, 128, 64, 2}, {72, 8, 128, 112, 2}, {96, 8, 128, 112, 2}, {160, 8, 96, 64, 2},
      {200, 8, 64, 64, 2},  {248, 8, 64, 64, 2}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int dt = 0; dt < 2; dt++)
      for (int causal = 0; causal <= 1; causal++) {
        const fg_variant v = tma(shapes[i].d, alt(dt), causal, arch, shapes[i].warps,
                                 causal ? shapes[i].bc_causal : shapes[i].bc, shapes[i].stages);
        char vn[FG_VARIANT_NAME_MAX];
        fg_variant_name(&v, vn, sizeof vn);
        const int quick = (shapes[i].d == 128 || shapes[i].d == 96) && shapes[i].warps == 8 &&
                          shapes[i].stages == 2;
        force(add(l, FG_CHECK_RUN, alt(dt), causal, shapes[i].d, 2, 2, 1, causal ? 160 : 300,
                  causal ? 224 : 300, quick, "tma/%s", vn),
              v);
      }
  for (int dd = 0; dd < 2; dd++)
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
      for (int causal = 0; causal <= 1; causal++) {
        if (pairs[i][1] == 0 && causal) continue;
        const int d = dd ? 64 : 128, warps = dd ? 12 : 8;
        const int bc = dd ? (causal ? 64 : 128) : (causal ? 112 : 128);
        const fg_dtype dt = alt((int64_t)i + causal);
        const int64_t nq = pairs[i][0], nk = pairs[i][1];
        force(add(l, FG_CHECK_RUN, dt, causal, d, nq * nk >= 1000 * 1000 ? 1 : 2, 2, dd ? 2 : 1,
                  nq, nk, i == 1 || i == 2 || i == 7,
                  "tma_seqlen/d%d_nq%" PRId64 "_nk%" PRId64 "_%s_%s", d, nq, nk, dtn(dt),
                  cw(causal)),
              tma(d, dt, causal, arch, warps, bc, 2));
      }
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    fg_check_case *c = add(l, FG_CHECK_RUN, FG_DTYPE_BF16, ps[i].causal, ps[i].d, ps[i].B,
                           ps[i].Hq, ps[i].Hkv, ps[i].Nq, ps[i].Nk, 1, "tma/%s_%s", ps[i].name,
                           cw(ps[i].causal));
    c->layout = ps[i].layout;
    c->lse = ps[i].lse;
    const int d64 = ps[i].d == 64;
    force(c, tma(ps[i].d, FG_DTYPE_BF16, ps[i].causal, arch, d64 ? 12 : 8,
                 d64 ? (ps[i].causal ? 64 : 128) : (ps[i].causal ? 112 : 128), 2));
  }
  /* Causal, 17 query blocks of 128 and 32 (batch, head)s: the blocks go in two groups of 16 heads,
   * longest query blocks first (fwd_tma.cu next_tile, common.cuh deal_grouped), GQA. */
  force(add(l, FG_CHECK_RUN, FG_DTYPE_BF16, 1, 256, 2, 16, 4, 2100, 2100, 0,
            "tma/grouped_d256_b2_hq16_hkv4_nq2100_causal"),
        tma(256, FG_DTYPE_BF16, 1, arch, 8, 64, 2));
  /* ... and 3 query blocks of 128 a head, 128 (batch, head)s: the first 84 heads in launch order,
   * the last 44 (a wave of blocks) as one group (common.cuh, deal_tail). */
  force(add(l, FG_CHECK_RUN, FG_DTYPE_BF16, 1, 256, 8, 16, 16, 300, 300, 0,
            "tma/tail_grouped_d256_b8_h16_nq300_causal"),
        tma(256, FG_DTYPE_BF16, 1, arch, 8, 64, 2));
}

/* Causal TMA kernels whose blocks are too large for a masked copy of S (fwd.lua,
 * tma_mask_in_place): the blocks on the diagonal and the last, partial one are masked in place
 * after the previous block's product. Square, bottom-right (Nq < Nk), rows without keys (Nq > Nk),
 * partial blocks both ways, a single key. */
static void add_tma_in_place_cases(fg_check_list *l, fg_arch arch) {
  if (arch != FG_ARCH_SM90A) return;
  static const struct { int d, warps, bc; } shapes[] = {
      {64, 12, 128}, {128, 8, 128}, {128, 12, 64}, {96, 8, 128}, {256, 8, 80}};
  static const int64_t runs[][2] = {{300, 300}, {160, 224}, {400, 150}, {129, 1000}, {1, 1}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
      const int d = shapes[i].d;
      const fg_dtype dt = alt((int64_t)(i + r));
      const fg_variant v = tma(d, dt, 1, arch, shapes[i].warps, shapes[i].bc, 2);
      char vn[FG_VARIANT_NAME_MAX];
      fg_variant_name(&v, vn, sizeof vn);
      force(add(l, FG_CHECK_RUN, dt, 1, d, 2, 4, 2, runs[r][0], runs[r][1],
                (d == 64 || d == 128) && r < 2, "tma_mask_in_place/%s_nq%" PRId64 "_nk%" PRId64,
                vn, runs[r][0], runs[r][1]),
            v);
    }
}

/* The persistent TMA kernel (loop q_tma_p, sm_90a only: one block per SM looping over tiles, the
 * next tile's Q in a second buffer where it fits; and q_tma_d, the same taking its tiles from a
 * counter in its workspace, as its blocks come free; and q_tma_dp, q_tma_d's two consumers in
 * ping-pong): head dims on and off the 64-column blocks,
 * both dtypes, causal or not, at one tile per block (fewer tiles than SMs), a few per block (GQA,
 * causal bottom-right) and up to five per block (each Q buffer reused, and causal at d = 96 and
 * 128 the O buffer, fwd.lua's o_buf; without a mask at d = 192 and 256 the one Q buffer released
 * after a tile's last S and the consumers' O areas, q_early; the K/V stages' phases carried
 * across tiles); rows that see no key (tiles without key blocks inside a
 * block's run), a key block cut short, no LSE, (B, N, H, d) strides. */
static void add_tma_persistent_cases(fg_check_list *l, fg_arch arch) {
  if (arch != FG_ARCH_SM90A) return;
  static const struct { int d, warps, bc, bc_causal; } shapes[] = {
      {128, 8, 128, 112}, {64, 12, 128, 64}, {96, 8, 128, 112}, {192, 8, 96, 64}, {256, 8, 64, 48}};
  static const struct {
    const char *name;
    int64_t B, Hq, Hkv, Nq, Nk, Nk_causal;
  } runs[] = {{"one_per_block", 1, 2, 2, 300, 300, 345},
              {"few_per_block_gqa", 4, 16, 4, 500, 500, 545},
              {"many_per_block", 8, 16, 16, 520, 520, 520},
              {"rows_without_keys", 6, 16, 8, 400, 150, 150}};
  static const fg_loop_order loops[] = {FG_LOOP_Q_TMA_P, FG_LOOP_Q_TMA_D, FG_LOOP_Q_TMA_DP};
  for (size_t li = 0; li < sizeof loops / sizeof loops[0]; li++)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
      for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
        for (int causal = 0; causal <= 1; causal++) {
          const int d = shapes[i].d, small = d == 64 || d == 128;
          if (!small && r == 2) continue; /* the deepest run at d = 64 and 128 only (host time) */
          /* q_tma_d at d = 256: its consumers' 240 registers spill beside the scheduler (Bc 64:
           * 12 B), and no rule takes it there. */
          if (loops[li] == FG_LOOP_Q_TMA_D && d == 256) continue;
          /* q_tma_dp: two consumer warpgroups in ping-pong only. */
          if (loops[li] == FG_LOOP_Q_TMA_DP && shapes[i].warps != 8) continue;
          const fg_dtype dt = alt((int64_t)(i + r + li) + causal);
          const fg_variant v = {FG_PASS_FWD, d, 16 * shapes[i].warps,
                                causal ? shapes[i].bc_causal : shapes[i].bc, dt, causal,
                                loops[li], shapes[i].warps, 2, arch};
          char vn[FG_VARIANT_NAME_MAX];
          fg_variant_name(&v, vn, sizeof vn);
          fg_check_case *c = add(l, FG_CHECK_RUN, dt, causal, d, runs[r].B, runs[r].Hq,
                                 runs[r].Hkv, runs[r].Nq, causal ? runs[r].Nk_causal : runs[r].Nk,
                                 small && r != 2, "tma_persistent/%s_%s", vn, runs[r].name);
          if (r == 1 && i == 0) c->layout = FG_CHECK_BNHD;
          if (r == 0 && i == 1) c->lse = 0;
          force(c, v);
        }
}

/* The TMA kernel on clusters of two blocks (loop q_tma_c, sm_90a only: two query tiles of a head,
 * each block loading half of every K/V block into both): head dims on and off the 64-column
 * blocks, one to three consumer warpgroups, both dtypes; three query tiles (the second block of
 * the last cluster past the rows), one tile (its partner all past them), GQA with (B, N, H, d)
 * strides, fewer keys than half a K/V block (the second block's half all past the keys), key
 * blocks cut short, no LSE. With a causal mask (the pair loads the later tile's K/V blocks, the
 * earlier tile releasing those past its own): an odd tile count (the later tile of the first pair
 * past the rows), more keys than queries, more queries than keys (rows that see no key, pairs with
 * one or both tiles without keys), GQA over many tiles (the pairs dealt in groups of heads). */
static void add_tma_cluster_cases(fg_check_list *l, fg_arch arch) {
  if (arch != FG_ARCH_SM90A) return;
  static const struct { int d, warps, bc; } shapes[] = {
      {128, 8, 128}, {216, 8, 80}, {72, 12, 112}, {64, 4, 128}, {256, 8, 64}};
  /* Nq or Nk 0: 2 Br + 37 (three query tiles); quick: the first shape's case runs in --quick;
   * bnhd: (B, N, H, d) strides; no_lse: the shape (index) whose case writes no LSE. */
  static const struct {
    const char *name;
    int causal;
    int64_t B, Hq, Hkv, Nq, Nk;
    int quick, bnhd, no_lse;
  } runs[] = {{"odd_tiles", 0, 2, 4, 4, 0, 650, 1, 0, -1},
              {"one_tile", 0, 3, 2, 2, 40, 300, 0, 0, -1},
              {"gqa_bnhd", 0, 2, 8, 2, 520, 777, 0, 1, -1},
              {"few_keys", 0, 2, 4, 1, 300, 9, 0, 0, 1},
              {"causal_odd_tiles", 1, 2, 2, 2, 0, 0, 1, 0, -1},
              {"causal_more_keys", 1, 2, 2, 1, 300, 777, 0, 0, -1},
              {"causal_rows_without_keys", 1, 1, 4, 2, 777, 300, 0, 0, -1},
              {"causal_many_tiles", 1, 1, 4, 2, 4500, 4500, 0, 0, -1}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
      const int d = shapes[i].d, causal = runs[r].causal;
      const int64_t odd = 2 * 16 * shapes[i].warps + 37;
      const int64_t nq = runs[r].Nq ? runs[r].Nq : odd, nk = runs[r].Nk ? runs[r].Nk : odd;
      const fg_dtype dt = alt((int64_t)(i + r + (size_t)causal));
      const fg_variant v = {FG_PASS_FWD, d, 16 * shapes[i].warps, shapes[i].bc, dt, causal,
                            FG_LOOP_Q_TMA_C, shapes[i].warps, 2, arch};
      char vn[FG_VARIANT_NAME_MAX];
      fg_variant_name(&v, vn, sizeof vn);
      fg_check_case *c = add(l, FG_CHECK_RUN, dt, causal, d, runs[r].B, runs[r].Hq, runs[r].Hkv,
                             nq, nk, i == 0 && runs[r].quick, "tma_cluster/%s_%s", vn, runs[r].name);
      if (runs[r].bnhd) c->layout = FG_CHECK_BNHD;
      if (runs[r].no_lse == (int)i) c->lse = 0;
      force(c, v);
    }
}

void fg_check_build_cases(fg_check_list *l, const fg_variant *defs, int ndefs, int device_count) {
  static const int64_t lens[] = {1, 17, 127, 128, 129, 1000, 4097};
  const int nlens = (int)(sizeof lens / sizeof lens[0]);

  /* 1. Every variant of the default set, partial tiles, GQA 2:1, Nq != Nk when causal. */
  for (int i = 0; i < ndefs; i++) {
    char vn[FG_VARIANT_NAME_MAX];
    fg_variant_name(&defs[i], vn, sizeof vn);
    const int causal = defs[i].causal;
    force(add(l, FG_CHECK_RUN, defs[i].dtype, causal, defs[i].d, 2, 2, 1, causal ? 160 : 200,
              causal ? 224 : 200, defs[i].d == 64 || defs[i].d == 128, "variant/%s", vn),
          defs[i]);
  }

  if (ndefs > 0) add_wgmma_cases(l, defs[0].arch);
  if (ndefs > 0) add_tma_cases(l, defs[0].arch);
  if (ndefs > 0) add_tma_in_place_cases(l, defs[0].arch);
  if (ndefs > 0) add_tma_persistent_cases(l, defs[0].arch);
  if (ndefs > 0) add_tma_cluster_cases(l, defs[0].arch);

  /* 2. Sequence lengths: every (Nq, Nk) pair, causal on and off, through the dispatcher; the
   * KV-outer loop order on every pair once (causal alternating). */
  for (int i = 0; i < nlens; i++)
    for (int j = 0; j < nlens; j++) {
      const int64_t nq = lens[i], nk = lens[j];
      const int big = nq * nk >= 1000 * 1000;
      const int qpair = (nq == nk && (nq == 1 || nq == 128 || nq == 4097)) ||
                        (nq == 17 && nk == 129) || (nq == 129 && nk == 17) ||
                        (nq == 127 && nk == 1000) || (nq == 1000 && nk == 127);
      for (int causal = 0; causal <= 1; causal++)
        add(l, FG_CHECK_RUN, alt(i + j + causal), causal, 128, big ? 1 : 2, big ? 1 : 2,
            big ? 1 : 2, nq, nk, qpair, "seqlen/nq%" PRId64 "_nk%" PRId64 "_%s_%s", nq, nk,
            dtn(alt(i + j + causal)), cw(causal));
      const int causal = (i + j) % 2;
      const fg_dtype dt = alt(i / 2 + j);
      add(l, FG_CHECK_RUN, dt, causal, 64, 1, big ? 1 : 2, big ? 1 : 2, nq, nk,
          (nq == 17 && nk == 129) || (nq == 129 && nk == 17) || (nq == 1000 && nk == 1000),
          "seqlen_kvouter/nq%" PRId64 "_nk%" PRId64 "_%s_%s", nq, nk, dtn(dt), cw(causal));
      kv_outer(l, defs, ndefs);
    }

  /* 3. Head dimensions, both dtypes, causal on and off, through the dispatcher. */
  static const int dims[] = {32, 40, 64, 80, 96, 128, 160, 192, 256};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    for (int dt = 0; dt < 2; dt++)
      for (int causal = 0; causal <= 1; causal++)
        add(l, FG_CHECK_RUN, alt(dt), causal, dims[i], 2, 4, 2, causal ? 513 : 777, 777,
            dims[i] == 64 || dims[i] == 128, "head_dim/d%d_%s_%s", dims[i], dtn(alt(dt)),
            cw(causal));

  /* 4. GQA 8:1 and MQA, both loop orders. */
  for (int mqa = 0; mqa <= 1; mqa++)
    for (int causal = 0; causal <= 1; causal++)
      for (int kv = 0; kv <= 1; kv++) {
        const int64_t hq = mqa ? 8 : 16, hkv = mqa ? 1 : 2;
        add(l, FG_CHECK_RUN, mqa ? FG_DTYPE_F16 : FG_DTYPE_BF16, causal, mqa ? 64 : 128, 2, hq,
            hkv, 300, causal ? 345 : 300, 1, "%s/hq%" PRId64 "_hkv%" PRId64 "_%s_%s",
            mqa ? "mqa" : "gqa8", hq, hkv, cw(causal), kv ? "kvouter" : "dispatch");
        if (kv) kv_outer(l, defs, ndefs);
      }

  /* 5. Layouts: (B, N, H, d), padded rows, Q/O and K/V in different layouts. */
  for (int dt = 0; dt < 2; dt++)
    for (int causal = 0; causal <= 1; causal++)
      add(l, FG_CHECK_RUN, alt(dt), causal, 64, 2, 4, 4, 333, 333, 1, "layout/bnhd_%s_%s",
          dtn(alt(dt)), cw(causal))->layout = FG_CHECK_BNHD;
  static const struct {
    int layout;
    const char *name;
    int kv, hkv;
  } ls[] = {{FG_CHECK_BNHD, "bnhd_gqa_kvouter", 1, 2},
            {FG_CHECK_PADDED, "padded_rows", 0, 4},
            {FG_CHECK_PADDED, "padded_rows_kvouter", 1, 4},
            {FG_CHECK_MIXED, "mixed_q_bnhd_kv_bhnd", 0, 4},
            {FG_CHECK_MIXED, "mixed_q_bnhd_kv_bhnd_kvouter", 1, 2}};
  for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
    const int causal = (int)(i % 2);
    add(l, FG_CHECK_RUN, FG_DTYPE_BF16, causal, 128, 2, 4, ls[i].hkv, 257, 300, 1,
        "layout/%s_%s", ls[i].name, cw(causal))->layout = ls[i].layout;
    if (ls[i].kv) kv_outer(l, defs, ndefs);
  }

  /* 6. Without LSE. */
  for (int kv = 0; kv <= 1; kv++) {
    add(l, FG_CHECK_RUN, FG_DTYPE_BF16, 1, 128, 2, 2, 2, 300, 300, 1, "nolse/%s",
        kv ? "kvouter" : "dispatch")->lse = 0;
    if (kv) kv_outer(l, defs, ndefs);
  }

  /* 7. Rows that see no key: causal with Nq > Nk, and Nk = 0. */
  static const int64_t nokey[][2] = {{300, 100}, {129, 17}, {1000, 1}, {64, 0}, {300, 0}};
  for (size_t i = 0; i < sizeof nokey / sizeof nokey[0]; i++)
    for (int kv = 0; kv <= 1; kv++)
      for (int causal = nokey[i][1] == 0 ? 0 : 1; causal <= 1; causal++) {
        add(l, FG_CHECK_RUN, alt((int64_t)i + kv), causal, i % 2 ? 64 : 128, 2, 2, 1, nokey[i][0],
            nokey[i][1], 1, "nokey/nq%" PRId64 "_nk%" PRId64 "_%s_%s", nokey[i][0], nokey[i][1],
            cw(causal), kv ? "kvouter" : "dispatch");
        if (kv) kv_outer(l, defs, ndefs);
      }

  /* 8. Scales: a custom one, and large logits (scale 1 at d = 128: a very peaked softmax). */
  add(l, FG_CHECK_RUN, FG_DTYPE_BF16, 0, 128, 1, 2, 2, 500, 500, 1, "scale/0.5")->scale = 0.5f;
  for (int kv = 0; kv <= 1; kv++) {
    add(l, FG_CHECK_RUN, FG_DTYPE_F16, 1, 128, 1, 2, 2, 500, 500, 1, "scale/large_logits_%s",
        kv ? "kvouter" : "dispatch")->scale = 1.0f;
    if (kv) kv_outer(l, defs, ndefs);
  }

  /* 9. 64-bit indexing: batch * heads_q past the grid's y limit; more than 2^31 elements. */
  for (int kv = 0; kv <= 1; kv++)
    for (int causal = 0; causal <= 1; causal++) {
      add(l, FG_CHECK_RUN, FG_DTYPE_BF16, causal, 128, 8300, 16, 16, 1, 1, !kv && !causal,
          "big/b8300_h16_n1_%s_%s", cw(causal), kv ? "kvouter" : "dispatch");
      if (kv) kv_outer(l, defs, ndefs);
    }
  const int64_t big_nq = (INT64_C(1) << 31) / 128 + 4097; /* Q and O: 2^31 + 4097*128 elements */
  add(l, FG_CHECK_BIG, FG_DTYPE_BF16, 0, 128, 1, 1, 1, big_nq, 64, 0,
      "big/q_over_2^31_elements_nq%" PRId64, big_nq);

  /* 10. Bad input that needs a GPU: the call fails with FG_ERROR_INVALID_ARGUMENT, nothing is
   * written. Empty problems: FG_OK, nothing is written. */
  static const struct {
    int kind;
    const char *name;
  } bad[] = {{FG_CHECK_BAD_HOST_Q, "bad/host_pointer_q"},
             {FG_CHECK_BAD_PINNED_K, "bad/pinned_host_k"},
             {FG_CHECK_BAD_FREED_V, "bad/freed_pointer_v"},
             {FG_CHECK_BAD_HOST_LSE, "bad/host_pointer_lse"},
             {FG_CHECK_BAD_MISALIGNED_O, "bad/misaligned_o"},
             {FG_CHECK_BAD_OTHER_DEV_K, "bad/other_device_k"},
             {FG_CHECK_BAD_DTYPE, "bad/unknown_dtype"},
             {FG_CHECK_BAD_HEAD_DIM, "bad/head_dim_100"},
             {FG_CHECK_EMPTY_BATCH, "empty/batch_0"},
             {FG_CHECK_EMPTY_NQ, "empty/seqlen_q_0"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (bad[i].kind == FG_CHECK_BAD_OTHER_DEV_K && device_count < 2) continue;
    add(l, bad[i].kind, FG_DTYPE_BF16, 0, 64, 1, 2, 2, 64, 64, 1, "%s", bad[i].name);
  }
}

void fg_check_case_args(const fg_check_case *c, fg_attention_args *a) {
  memset(a, 0, sizeof *a);
  a->size = sizeof *a;
  a->dtype = c->dtype;
  a->causal = c->causal;
  a->batch = c->B;
  a->heads_q = c->Hq;
  a->heads_kv = c->Hkv;
  a->seqlen_q = c->Nq;
  a->seqlen_k = c->Nk;
  a->head_dim = c->d;
  a->scale = c->scale;
}
