/* candidates.c: the candidate variants of a problem on a device, pruned by the fit rule before
 * anything is compiled, and the seed's block-size rule. */
#include <string.h>

#include "fg_autotune.h"

static int round_down(int x, int m) { return x / m * m; }

fg_variant fg_seed_rule_variant(fg_generator *g, int d, fg_dtype dtype, int causal, fg_arch arch,
                                const fg_device_limits *lim) {
  const int M = lim->smem_optin_per_block / 2; /* elements of 2 bytes */
  const int b = (M + 4 * d - 1) / (4 * d);     /* ceil(M / 4d) */
  fg_variant v = {FG_PASS_FWD, d, 0, 0, dtype, causal, FG_LOOP_Q_OUTER, 4, 2, arch};
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

int fg_candidates(fg_generator *g, int d, fg_dtype dtype, int causal, fg_arch arch,
                  const fg_device_limits *lim, fg_variant *out, int cap, fg_prune_counts *pruned) {
  static const int brs[] = {64, 128}, bcs[] = {16, 32, 64, 128}, warps[] = {4, 8};
  fg_prune_counts pc = {0, 0, 0, 0};
  int n = 0;
  fg_variant seed = fg_seed_rule_variant(g, d, dtype, causal, arch, lim);
  char why[256];
  if (fg_variant_fits(g, &seed, lim, why, sizeof why) == 1 && n < cap) out[n++] = seed;
  /* q_outer: 2 or 3 stages; q_wgmma and q_wgmma_ov: 2 (3 is pruned by their rule); kv_outer: 1
   * (Algorithm 1). The wgmma loops are pruned on every arch but sm_90a by their rule (fwd.lua),
   * so there they count among "rules". */
  for (int loop = 0; loop < FG_LOOP_COUNT; loop++)
    for (size_t bi = 0; bi < sizeof brs / sizeof brs[0]; bi++)
      for (size_t ci = 0; ci < sizeof bcs / sizeof bcs[0]; ci++)
        for (size_t wi = 0; wi < sizeof warps / sizeof warps[0]; wi++)
          for (int st = loop == FG_LOOP_KV_OUTER ? 1 : 2; st <= (loop == FG_LOOP_KV_OUTER ? 1 : 3); st++) {
            fg_variant v = {FG_PASS_FWD, d, brs[bi], bcs[ci], dtype, causal, (fg_loop_order)loop,
                            warps[wi], st, arch};
            /* too little work per barrier */
            if (loop != FG_LOOP_KV_OUTER && v.bc < 32) continue;
            if (memcmp(&v, &seed, sizeof v) == 0) continue;
            int fits = fg_variant_fits(g, &v, lim, why, sizeof why);
            if (fits == 1) {
              if (n < cap) out[n++] = v;
              continue;
            }
            if (strstr(why, "shared memory")) pc.smem++;
            else if (strstr(why, "registers")) pc.regs++;
            else if (strstr(why, "threads")) pc.threads++;
            else pc.rules++;
          }
  if (pruned) *pruned = pc;
  return n;
}
