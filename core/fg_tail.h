/* fg_tail.h: the tail of a backward main grid. Without a mask every key block of a head sums over
 * the same query rows, so the blocks of the backward's main kernel (kv_tiles: one per key block
 * and KV head) take equally long, and the grid's last wave, partial, leaves the other SMs idle
 * for a whole block: on an H100 (132 SMs) at d = 64, N = 16k, 4096 blocks are 31.03 waves, and 33
 * heads took as long as 32 (bench/NOTES.md, session 22). A main step whose plan allows it
 * (fg_plan_step.tail) runs with a tail: the last partial wave's key blocks are split into pieces
 * that every SM shares, each summing part of the key block's query blocks into the plan's tail
 * workspace (templates/fg_params.h: tail_first, tail_blocks, tail_splits, dkv_tail). */
#ifndef FG_TAIL_H
#define FG_TAIL_H
#include <stdint.h>

#include "fg_kernel.h"

typedef struct fg_plan_tail {
  uint64_t first;  /* linear block index (y * grid x + x) of the first piece: the key blocks
                      before it run whole */
  uint64_t blocks; /* key blocks split (the grid's last, in linear order); 0: no tail */
  uint64_t splits; /* pieces per split key block (each a contiguous part of its query blocks) */
} fg_plan_tail;

/* Blocks of a step that one SM holds at once by its shared memory (bytes; 1 KB of it reserved per
 * block) and threads; 0 when none fits. Registers are not counted: the workspace's size is asked
 * of a plan before its kernel is compiled (fg_attention_backward_workspace_size), and must be the
 * launch's; the backward's main kernels (255 registers x 256 threads, or 168 x 384) take one
 * block per SM by their shared memory as well, at every head dimension on sm_80 and sm_90. */
int fg_plan_step_blocks_per_sm(const fg_plan_step *s, int smem_per_sm, int threads_per_sm);

/* The tail of kv_tiles main step s for a problem on a GPU that runs `slots` of its blocks at once
 * (SMs x blocks per SM): none (blocks 0) unless s->tail, no mask, not deterministic (the pieces'
 * additions would not be ordered), one split (fg_plan_step_splits), more blocks than slots and a
 * partial last wave. Then the last wave's r key blocks are split into the number of pieces that
 * ends them soonest, counting each piece's start and partial sums as FG_TAIL_PIECE_ROWS query
 * rows of work and giving every piece at least 128 query rows of each head; and only when that
 * ends the tail in at most 3/4 of a whole block's time. */
#define FG_TAIL_PIECE_ROWS 128
fg_plan_tail fg_plan_step_tail(const fg_plan_step *s, uint64_t slots, int64_t batch, int64_t heads_q,
                               int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, int causal,
                               int deterministic);

/* The main step's grid y with tail t (blocks > 0) on a grid of x key blocks: enough rows of x
 * blocks for every piece, ceil((first + blocks * splits) / x). */
uint64_t fg_plan_tail_grid_y(const fg_plan_tail *t, uint64_t grid_x);
#endif
