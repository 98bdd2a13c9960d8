/* support_plan.h: launch plans for tests that make kernel images by hand (no generator): the
 * backward's three steps and four workspaces as templates/bwd.lua declares them (test_generator
 * checks the manifest against the same numbers), the tail that bwd.lua adds to kv_outer's and
 * kv_tma's, and a forward's one step. */
#ifndef FG_TEST_SUPPORT_PLAN_H
#define FG_TEST_SUPPORT_PLAN_H
#include <stdio.h>
#include <string.h>

#include "fg_kernel.h"

/* The backward plan of kernel `name` (its main entry is "fg_" + name): _pre and _post on
 * (ceil(Nq / 64), B * Hq) with 128 threads, the main kernel on (ceil(Nk / bc), B * Hkv); the dQ
 * accumulator (4 d B per row), the dK/dV partial sums ((2 bc d + 4) * 4 B per key block of each
 * (batch, KV head), only when Nq * Hq / Hkv > 65536, when the main kernel's grid splits the query
 * range too), D (4 B per row), semaphores (4 B per 16 rows, deterministic). */
static inline void test_backward_plan(fg_kernel_meta *m, const char *name, int d, int bc,
                                      int threads, int smem) {
  char e[64];
  snprintf(e, sizeof e, "fg_%.60s", name); /* entries hold 63 characters */
  fg_kernel_meta_single(m, e, FG_GRID_KV_TILES, bc, threads, smem);
  m->steps[0].split_rows = 65536;
  m->n_steps = 3;
  m->main_step = 1;
  m->steps[1] = m->steps[0];
  m->steps[0] = m->steps[2] = (fg_plan_step){.grid = FG_GRID_Q_TILES, .br = 64, .threads = 128};
  snprintf(m->steps[0].entry, sizeof m->steps[0].entry, "%.58s_pre", e);
  snprintf(m->steps[2].entry, sizeof m->steps[2].entry, "%.58s_post", e);
  m->n_workspaces = 4;
  m->workspaces[0] = (fg_plan_workspace){"dq_accum", "workspace", 4 * d, 1, 0, 0, 0, 0};
  m->workspaces[1] = (fg_plan_workspace){"dkv_accum", "dkv", 4 * (2 * bc * d + 4), bc, 0, 1, 65536, 0};
  m->workspaces[2] = (fg_plan_workspace){"dsum", "dsum", 4, 1, 0, 0, 0, 0};
  m->workspaces[3] = (fg_plan_workspace){"semaphores", "sem", 4, 16, 1, 0, 0, 0};
  /* A kv_tma variant's plan takes the tensor-map block (bwd.lua): maps of Q and dO (Br rows), K
   * and V (Bc rows); the fake driver reads every step of a kvtma entry's block that way. */
  int dd, br;
  if (strstr(name, "_kvtma_") && sscanf(name, "bwd_d%d_br%d_", &dd, &br) == 2) {
    m->params = FG_PARAMS_BWD_TMA;
    m->n_tmaps = 4;
    m->tmaps[0] = (fg_plan_tmap){FG_TMAP_Q, br};
    m->tmaps[1] = (fg_plan_tmap){FG_TMAP_DO, br};
    m->tmaps[2] = (fg_plan_tmap){FG_TMAP_K, bc};
    m->tmaps[3] = (fg_plan_tmap){FG_TMAP_V, bc};
  }
}

/* What templates/bwd.lua adds to the plan of a template that runs with a tail (bwd.cu,
 * bwd_tma.cu): tail on the main step, and the workspace dkv_tail ((2 bc d + 4) * 4 B per key
 * block of the launch's tail, in total) third, after dkv_accum. m is test_backward_plan's. */
static inline void test_backward_plan_add_tail(fg_kernel_meta *m, int d, int bc) {
  m->steps[m->main_step].tail = 1;
  for (int i = m->n_workspaces; i > 2; i--) m->workspaces[i] = m->workspaces[i - 1];
  m->workspaces[2] = (fg_plan_workspace){"dkv_tail", "dkv_tail", 4 * (2 * bc * d + 4), bc, 0, 1, 0, 1};
  m->n_workspaces++;
}
#endif
