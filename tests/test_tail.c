/* The backward main grid's tail (core/fg_tail.h): blocks per SM, which key blocks the last partial
 * wave splits into how many pieces (the figures of an H100's 132 SMs at the benchmark's shapes),
 * when there is none, and that the pieces the kernel takes cover every key block's query blocks
 * exactly once: bwd_place_of and bwd_span_of (templates/bwd_aux.cuh) are transcribed below in C
 * (change both together). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "fg_tail.h"

/* The main step of a backward plan with a tail: Bc 128, 256 threads, one block per SM by its
 * shared memory (bwd.cu d = 64 Br 128 on sm_90a). */
static fg_plan_step main_step(void) {
  fg_plan_step s = {"fg_main", FG_GRID_KV_TILES, 128, 256, 215088, 65536, 1};
  return s;
}

#define H100_SMEM 233472 /* bytes of shared memory per SM */

Test(tail, blocks_per_sm_by_shared_memory_and_threads) {
  fg_plan_step s = main_step();
  cr_assert_eq(fg_plan_step_blocks_per_sm(&s, H100_SMEM, 2048), 1);
  s.threads = 384, s.smem_bytes = 232448; /* kv_tma: exactly the SM's 228 KB with the 1 KB */
  cr_assert_eq(fg_plan_step_blocks_per_sm(&s, H100_SMEM, 2048), 1);
  s.smem_bytes = 232449;
  cr_assert_eq(fg_plan_step_blocks_per_sm(&s, H100_SMEM, 2048), 0, "one byte more does not fit");
  s.threads = 256, s.smem_bytes = 50000;
  cr_assert_eq(fg_plan_step_blocks_per_sm(&s, H100_SMEM, 2048), 4, "233472 / 51024");
  cr_assert_eq(fg_plan_step_blocks_per_sm(&s, H100_SMEM, 768), 3, "768 / 256 threads");
  s.smem_bytes = 0, s.threads = 32;
  cr_assert_eq(fg_plan_step_blocks_per_sm(&s, H100_SMEM, 2048), 32, "at most 32 blocks");
}

/* The benchmark's grid (B N = 16k, H d = 2048) on 132 SMs: d = 64 (Bc 128, 32 heads) has 4096
 * blocks at every N, 31 waves and 4; d = 128 (16 heads) 2048, 15 waves and 68. */
Test(tail, benchmark_shapes_on_132_sms) {
  const fg_plan_step s = main_step();
  static const struct {
    int64_t heads, n;
    uint64_t first, blocks, splits;
  } want[] = {{32, 512, 4092, 4, 4},      {32, 1024, 4092, 4, 8},   {32, 4096, 4092, 4, 32},
              {32, 16384, 4092, 4, 33},   {16, 512, 0, 0, 0},       {16, 1024, 0, 0, 0},
              {16, 2048, 1980, 68, 5},    {16, 4096, 1980, 68, 5},  {16, 16384, 1980, 68, 11}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const int64_t n = want[i].n, b = 16384 / n;
    const fg_plan_tail t = fg_plan_step_tail(&s, 132, b, want[i].heads, want[i].heads, n, n, 0, 0);
    cr_expect_eq(t.first, want[i].first, "H %lld N %lld: first %llu", (long long)want[i].heads,
                 (long long)n, (unsigned long long)t.first);
    cr_expect_eq(t.blocks, want[i].blocks, "H %lld N %lld: blocks %llu", (long long)want[i].heads,
                 (long long)n, (unsigned long long)t.blocks);
    cr_expect_eq(t.splits, want[i].splits, "H %lld N %lld: splits %llu", (long long)want[i].heads,
                 (long long)n, (unsigned long long)t.splits);
  }
  const fg_plan_tail t = fg_plan_step_tail(&s, 132, 1, 32, 32, 16384, 16384, 0, 0);
  cr_assert_eq(fg_plan_tail_grid_y(&t, 128), 33, "4092 + 4 x 33 = 4224 blocks: 33 rows of 128");
}

Test(tail, none_where_it_does_not_apply) {
  fg_plan_step s = main_step();
  const int64_t n = 16384;
  cr_assert_eq(fg_plan_step_tail(&s, 132, 1, 32, 32, n, n, 1, 0).blocks, 0, "causal: its own order");
  cr_assert_eq(fg_plan_step_tail(&s, 132, 1, 32, 32, n, n, 0, 1).blocks, 0, "deterministic");
  cr_assert_eq(fg_plan_step_tail(&s, 128, 1, 32, 32, n, n, 0, 0).blocks, 0, "4096 = 32 x 128: no partial wave");
  cr_assert_eq(fg_plan_step_tail(&s, 132, 1, 1, 1, n, n, 0, 0).blocks, 0, "128 blocks: one partial wave");
  cr_assert_eq(fg_plan_step_tail(&s, 0, 1, 32, 32, n, n, 0, 0).blocks, 0, "no slots");
  cr_assert_eq(fg_plan_step_tail(&s, 132, 1, 32, 32, 70000, n, 0, 0).blocks, 0,
               "past split_rows the grid's z splits every key block");
  cr_assert_eq(fg_plan_step_tail(&s, 132, 17, 32, 32, 200, 1024, 0, 0).blocks, 0,
               "under 256 query rows a piece would get less than 128 rows of each head");
  s.tail = 0;
  cr_assert_eq(fg_plan_step_tail(&s, 132, 1, 32, 32, n, n, 0, 0).blocks, 0, "a plan without a tail");
}

/* bwd_place_of (templates/bwd_aux.cuh) in C: block (x, y) of a grid of nkb x ny as key block
 * *kb, (batch, KV head) *bhk, split *z of *splits; *splits 0 past the tail's last piece. */
static void place_of(const fg_plan_tail *t, uint32_t nkb, uint32_t x, uint32_t y, uint32_t *kb,
                     uint32_t *bhk, uint32_t *z, uint32_t *splits) {
  const uint32_t L = y * nkb + x, f = (uint32_t)t->first;
  if (t->splits > 1 && L >= f) {
    const uint32_t i = L - f, zz = i / (uint32_t)t->blocks, lin = f + (i - zz * (uint32_t)t->blocks);
    *kb = lin % nkb, *bhk = lin / nkb, *z = zz;
    *splits = zz < (uint32_t)t->splits ? (uint32_t)t->splits : 0u;
    return;
  }
  *kb = x, *bhk = y, *z = 0, *splits = 1;
}

/* The grid of each shape: every (key block, batch x KV head) computed over each of its query
 * blocks exactly once (bwd_span_of without a mask: split z of S takes floor(z P / S) ...
 * floor((z + 1) P / S) - 1 of the P), the pieces of one key block started in turn. */
Test(tail, the_pieces_cover_every_key_block_once) {
  const fg_plan_step s = main_step();
  static const struct {
    int64_t b, hq, hkv, nq, nk;
    uint64_t slots;
  } shapes[] = {{1, 32, 32, 16384, 16384, 132}, {1, 16, 16, 16384, 16384, 132},
                {2, 20, 10, 700, 1100, 132},    {1, 17, 17, 1000, 1000, 108},
                {1, 17, 17, 1000, 1000, 132},   {3, 7, 7, 4000, 1500, 70}};
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    const fg_plan_tail t = fg_plan_step_tail(&s, shapes[k].slots, shapes[k].b, shapes[k].hq,
                                             shapes[k].hkv, shapes[k].nq, shapes[k].nk, 0, 0);
    cr_assert_gt(t.blocks, 0, "shape %zu has a tail", k);
    const uint32_t nkb = (uint32_t)((shapes[k].nk + 127) / 128), nbh = (uint32_t)(shapes[k].b * shapes[k].hkv);
    const uint32_t P = (uint32_t)((shapes[k].nq + 63) / 64), ny = (uint32_t)fg_plan_tail_grid_y(&t, nkb);
    cr_assert_geq((uint64_t)ny * nkb, t.first + t.blocks * t.splits);
    unsigned char *seen = calloc((size_t)nkb * nbh * P, 1);
    cr_assert_not_null(seen);
    for (uint32_t y = 0; y < ny; y++)
      for (uint32_t x = 0; x < nkb; x++) {
        uint32_t kb, bhk, z, splits;
        place_of(&t, nkb, x, y, &kb, &bhk, &z, &splits);
        if (!splits) continue;
        cr_assert_lt(bhk, nbh, "shape %zu block (%u, %u)", k, x, y);
        for (uint32_t i = (uint32_t)((uint64_t)z * P / splits); i < (uint64_t)(z + 1) * P / splits; i++)
          seen[((size_t)bhk * nkb + kb) * P + i]++;
      }
    for (size_t i = 0; i < (size_t)nkb * nbh * P; i++)
      cr_assert_eq(seen[i], 1, "shape %zu: query block %zu of key block %zu seen %d times", k, i % P,
                   i / P, seen[i]);
    free(seen);
  }
}
