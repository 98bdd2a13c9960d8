/* candidates.c: the candidate variants of a problem (forward or backward) on a device, pruned by
 * the fit rule before anything is compiled; the seed's block-size rule (forward) and the baseline
 * of each pass. */
#include <string.h>

#include "fg_autotune.h"

static int round_down(int x, int m) { return x / m * m; }

fg_variant fg_seed_rule_variant(fg_generator *g, const fg_problem *p, fg_arch arch,
                                const fg_device_limits *lim) {
  const int d = p->d;
  const int M = lim->smem_optin_per_block / 2; /* elements of 2 bytes */
  const int b = (M + 4 * d - 1) / (4 * d);     /* ceil(M / 4d) */
  fg_variant v = {FG_PASS_FWD, d, 0, 0, p->dtype, p->causal, FG_LOOP_Q_OUTER, 4, 2, arch};
  v.bc = round_down(b, 16);
  v.br = round_down(b < d ? b : d, 64);
  if (v.bc > 256) v.bc = 256;
  if (v.br > 256) v.br = 256;
  if (v.bc < 16) v.bc = 16;
  if (v.br < 64) v.br = 64;
  /* The rule ignores the padding and the pipeline stage of our layout: shrink until it fits. */
  char why[256];
  while (fg_variant_fits(g, &v, lim, why, sizeof why) != 1) {
    if (v.bc > 16) v.bc -= 16;
    else if (v.stages > 1) v.stages--;
    else if (v.br > 64) v.br -= 64;
    else break;
  }
  return v;
}

/* Counts a variant the fit rule rejected under the cause its reason names. */
static void count_pruned(fg_prune_counts *pc, const char *why) {
  if (strstr(why, "shared memory")) pc->smem++;
  else if (strstr(why, "registers")) pc->regs++;
  else if (strstr(why, "threads")) pc->threads++;
  else pc->rules++;
}

fg_variant fg_baseline_variant(fg_generator *g, const fg_problem *p, fg_arch arch,
                               const fg_device_limits *lim) {
  if (p->pass == FG_PASS_BWD) return fg_problem_builtin(p, arch);
  return fg_seed_rule_variant(g, p, arch, lim);
}

/* The forward grid: Br, Bc, warps, stages, every loop order. */
static int fwd_candidates(fg_generator *g, int d, fg_dtype dtype, int causal, fg_arch arch,
                          const fg_device_limits *lim, const fg_variant *seed, fg_variant *out,
                          int n, int cap, fg_prune_counts *pc) {
  static const int brs[] = {64, 128}, bcs[] = {16, 32, 64, 128}, warps[] = {4, 8};
  char why[256];
  /* q_outer: 2 or 3 stages; q_wgmma and q_wgmma_ov: 2 (3 is pruned by their rule); kv_outer: 1
   * (Algorithm 1). The wgmma loops are pruned on every arch but sm_90a by their rule (fwd.lua),
   * so there they count among "rules". */
  /* q_tma has its own, smaller grid (below). */
  static const fg_loop_order loops[] = {FG_LOOP_Q_OUTER, FG_LOOP_KV_OUTER, FG_LOOP_Q_WGMMA,
                                        FG_LOOP_Q_WGMMA_OV};
  for (size_t li = 0; li < sizeof loops / sizeof loops[0]; li++)
    for (size_t bi = 0; bi < sizeof brs / sizeof brs[0]; bi++)
      for (size_t ci = 0; ci < sizeof bcs / sizeof bcs[0]; ci++)
        for (size_t wi = 0; wi < sizeof warps / sizeof warps[0]; wi++)
          for (int st = loops[li] == FG_LOOP_KV_OUTER ? 1 : 2;
               st <= (loops[li] == FG_LOOP_KV_OUTER ? 1 : 3); st++) {
            const fg_loop_order loop = loops[li];
            fg_variant v = {FG_PASS_FWD, d, brs[bi], bcs[ci], dtype, causal, loop,
                            warps[wi], st, arch};
            /* too little work per barrier */
            if (loop != FG_LOOP_KV_OUTER && v.bc < 32) continue;
            if (memcmp(&v, seed, sizeof v) == 0) continue;
            if (fg_variant_fits(g, &v, lim, why, sizeof why) == 1) {
              if (n < cap) out[n++] = v;
            } else {
              count_pruned(pc, why);
            }
          }
  /* q_tma (fwd_tma.cu; its rule prunes it on every arch but sm_90a): two or three consumer
   * warpgroups (Br 128 / 192), key blocks of 64 or 128, 2 stages; a candidate that spills is
   * dropped after compiling (the forward's spill limit is 0). Without a mask, the same shapes on
   * the persistent grid too (q_tma_p: 1.01-1.25x q_tma on an H100, most at short sequences; with a
   * causal mask, its tiles paired short with long within a head, 1.09-1.19x up to N = 4k at d =
   * 128 and 0.94-0.98x at 16k: bench/NOTES.md, session 12). Where rows end inside a 32-byte
   * sector (fg_rows_mid_sector) the same shapes on clusters of two blocks too (q_tma_c: 1.03-1.3x
   * there on an H100, 0.6-0.95x on sectors; bench/NOTES.md, session 32). */
  static const int tma_shapes[][2] = {{8, 64}, {8, 128}, {12, 64}, {12, 128}};
  static const fg_loop_order tma_loops[] = {FG_LOOP_Q_TMA, FG_LOOP_Q_TMA_P, FG_LOOP_Q_TMA_C};
  for (int li = 0; li < (fg_rows_mid_sector(d) ? 3 : 2); li++)
    for (size_t i = 0; i < sizeof tma_shapes / sizeof tma_shapes[0]; i++) {
      const int w = tma_shapes[i][0];
      fg_variant v = {FG_PASS_FWD, d, 16 * w, tma_shapes[i][1], dtype, causal, tma_loops[li], w, 2,
                      arch};
      if (memcmp(&v, seed, sizeof v) == 0) continue;
      if (fg_variant_fits(g, &v, lim, why, sizeof why) == 1) {
        if (n < cap) out[n++] = v;
      } else {
        count_pruned(pc, why);
      }
    }
  /* The built-in choices of every key length too (where they are off this grid: the length rules'
   * key blocks of 48-112, 12 warps off the 64-column blocks, clusters), so that a tuned problem is
   * never slower than the untuned dispatcher's choice for its bucket; the same list for every
   * bucket (tune keeps one per op, d, dtype and mask). */
  fg_variant b[FG_BUILTIN_MAX];
  const int nb = fg_builtin_variants(d, dtype, causal, arch, b);
  for (int k = 0; k < nb; k++) {
    int dup = memcmp(&b[k], seed, sizeof b[k]) == 0;
    for (int i = 0; i < n && !dup; i++) dup = memcmp(&b[k], &out[i], sizeof b[k]) == 0;
    if (!dup && fg_variant_fits(g, &b[k], lim, why, sizeof why) == 1 && n < cap) out[n++] = b[k];
  }
  return n;
}

/* The register estimate (bwd.lua) above which a backward variant is not tried. The fastest
 * backward kernels sit at ptxas's 255-register cap with small spills (Bc = 128: 8-88 B, and
 * 1.3-1.5x the spill-free Bc = 64 on an H100), so only the fit rule's bound applies; a kernel
 * spilling more than fg_variant_spill_limit is rejected after compiling. */
#define BWD_REGS_MAX 255

/* The backward grid (templates/bwd.lua): kv_outer (mma.sync), kv_wgmma and kv_tma (sm_90a; their
 * rules prune them elsewhere, under "rules"), Br and Bc in {32, 64, 128}, 4 or 8 warps, Q/dO single- or
 * double-buffered: 72 points, pruned by the fit rule and by three
 * tuning rules that keep a default tune within its time (each bucket times every candidate at
 * full size, and one backward run costs 5 forward ones):
 *   - Bc (the K/V block, rows kept on chip) at least 64, and 128 up to d = 128 where 160 KB of
 *     shared memory per block allow it: each halving doubles the dQ reductions and halves the
 *     reuse of each Q/dO tile (the built-in rule's 32 on 99 KB GPUs stays, as the baseline);
 *   - a register estimate of at most BWD_REGS_MAX (counted under registers);
 *   - single-buffered (1 stage) only where double-buffered does not fit: at ptxas's register
 *     counts (up to 255 at 8 warps) registers, not shared memory, bound the blocks per SM, so
 *     the double-buffered variant has the same occupancy and prefetches.
 * The rules count under "rules". On an A100: 4 candidates at d = 64, 2 at d = 128; on an H100 the
 * kv_wgmma and kv_tma ones too (kv_tma at every d, on tiles padded to 64-column blocks; past
 * d = 128 only Br = Bc = 64), the built-in variant first (kv_tma: Bc 128 up to d = 128, Br 128
 * up to d = 64, 64 above; past d = 128 Br = Bc = 64). */
static int bwd_candidates(fg_generator *g, int d, fg_dtype dtype, int causal, fg_arch arch,
                          const fg_device_limits *lim, const fg_variant *seed, fg_variant *out,
                          int n, int cap, fg_prune_counts *pc) {
  static const int brs[] = {32, 64, 128}, bcs[] = {32, 64, 128}, warps[] = {4, 8};
  char why[256];
  static const fg_loop_order loops[] = {FG_LOOP_KV_OUTER, FG_LOOP_KV_WGMMA, FG_LOOP_KV_TMA};
  for (size_t li = 0; li < sizeof loops / sizeof loops[0]; li++)
    for (size_t bi = 0; bi < sizeof brs / sizeof brs[0]; bi++)
      for (size_t ci = 0; ci < sizeof bcs / sizeof bcs[0]; ci++)
        for (size_t wi = 0; wi < sizeof warps / sizeof warps[0]; wi++)
          for (int st = 1; st <= 2; st++) {
            fg_variant v = {FG_PASS_BWD, d, brs[bi], bcs[ci], dtype, causal, loops[li],
                            warps[wi], st, arch};
            if (memcmp(&v, seed, sizeof v) == 0) continue;
            if (fg_variant_fits(g, &v, lim, why, sizeof why) != 1) {
              count_pruned(pc, why);
              continue;
            }
            fg_resources r;
            if (fg_generator_resources(g, &v, &r, why, sizeof why) == 0 &&
                r.regs_estimate > BWD_REGS_MAX) {
              pc->regs++;
              continue;
            }
            fg_variant v2 = v;
            v2.stages = 2;
            /* Up to d = 128 on GPUs with the shared memory for it, key blocks of 128 (1.3-1.5x
             * blocks of 64 on an H100 at d = 64 and 128, every shape measured). */
            const int bc128_fits = d <= 128 && lim->smem_optin_per_block >= 160 * 1024;
            if (v.bc < 64 || (bc128_fits && v.bc < 128) ||
                (v.stages == 1 && fg_variant_fits(g, &v2, lim, why, sizeof why) == 1)) {
              pc->rules++;
              continue;
            }
            if (n < cap) out[n++] = v;
          }
  return n;
}

int fg_candidates(fg_generator *g, const fg_problem *p, fg_arch arch, const fg_device_limits *lim,
                  fg_variant *out, int cap, fg_prune_counts *pruned) {
  const fg_pass pass = p->pass;
  const int d = p->d, causal = p->causal;
  const fg_dtype dtype = p->dtype;
  fg_prune_counts pc = {0, 0, 0, 0};
  int n = 0;
  const fg_variant seed = fg_baseline_variant(g, p, arch, lim);
  char why[256];
  if (fg_variant_fits(g, &seed, lim, why, sizeof why) == 1) {
    if (n < cap) out[n++] = seed;
  } else if (pass == FG_PASS_BWD) {
    count_pruned(&pc, why); /* the built-in rule is a point of the grid: count it once */
  }
  if (pass == FG_PASS_BWD)
    n = bwd_candidates(g, d, dtype, causal, arch, lim, &seed, out, n, cap, &pc);
  else
    n = fwd_candidates(g, d, dtype, causal, arch, lim, &seed, out, n, cap, &pc);
  if (pruned) *pruned = pc;
  return n;
}
