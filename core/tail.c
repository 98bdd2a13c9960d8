/* tail.c: the tail of a backward main grid (core/fg_tail.h): how many blocks an SM holds, and
 * which key blocks the last partial wave splits into how many pieces. */
#include "fg_tail.h"

int fg_plan_step_blocks_per_sm(const fg_plan_step *s, int smem_per_sm, int threads_per_sm) {
  if (s->threads <= 0 || threads_per_sm <= 0) return 0;
  int n = threads_per_sm / s->threads;
  if (smem_per_sm > 0) {
    const int per = s->smem_bytes + 1024; /* the 1 KB the driver reserves per block (sm_80 on) */
    if (smem_per_sm / per < n) n = smem_per_sm / per;
  }
  return n < 32 ? n : 32;
}

fg_plan_tail fg_plan_step_tail(const fg_plan_step *s, uint64_t slots, int64_t batch, int64_t heads_q,
                               int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, int causal,
                               int deterministic) {
  fg_plan_tail t = {0, 0, 0};
  if (!s->tail || s->grid != FG_GRID_KV_TILES || s->br <= 0 || causal || deterministic || slots == 0 ||
      batch <= 0 || heads_kv <= 0 || seqlen_q <= 0 || seqlen_k <= 0 ||
      fg_plan_step_splits(s, heads_q, heads_kv, seqlen_q) != 1)
    return t;
  const uint64_t nkb = ((uint64_t)seqlen_k + (uint64_t)s->br - 1) / (uint64_t)s->br;
  const uint64_t n = nkb * (uint64_t)batch * (uint64_t)heads_kv, r = n % slots;
  if (n <= slots || r == 0) return t;
  /* A key block's work in query rows (every head of its group), and the most pieces (128 rows of
   * each head at least, 64 at most: past that a piece's start outweighs its share). */
  const uint64_t rows = fg_plan_group_rows(heads_q, heads_kv, seqlen_q), o = FG_TAIL_PIECE_ROWS;
  uint64_t smax = (uint64_t)seqlen_q / 128;
  if (smax > 64) smax = 64;
  uint64_t best = 0, best_cost = rows + o; /* a whole block: what the tail costs unsplit */
  for (uint64_t sp = 2; sp <= smax; sp++) {
    const uint64_t rounds = (r * sp + slots - 1) / slots, cost = rounds * ((rows + sp - 1) / sp + o);
    if (cost < best_cost) best = sp, best_cost = cost;
  }
  if (!best || best_cost * 4 > (rows + o) * 3) return t;
  t.first = n - r;
  t.blocks = r;
  t.splits = best;
  return t;
}

uint64_t fg_plan_tail_grid_y(const fg_plan_tail *t, uint64_t grid_x) {
  if (!grid_x) return 0;
  return (t->first + t->blocks * t->splits + grid_x - 1) / grid_x;
}
