/* The persistent forward grid's tile order (templates/common.cuh, fwd_persistent_tile): every tile
 * taken exactly once, by blocks that stay even, the tiles of a round from few heads (so they share
 * K and V in L2). The kernel's code is transcribed below (its shape is ptxas's, see common.cuh):
 * change both together; and q_tma_d's units and tickets (fwd_tma.cu's fwd_unit_tile, dyn_ticket).
 * Then the causal backward's block order (bwd_aux.cuh, causal_kv_pos):
 * every block once, and a balanced grid where the launch order ends on a tail. */
#include <criterion/criterion.h>
#include <stdlib.h>

/* fwd_persistent_tile of templates/common.cuh, in C: the k-th tile of block x of a grid of `grid`
 * blocks, 1 with *q_tile and *bh set, 0 past the block's last. */
static int fg_tile_of(long long k, long long x, long long grid, long long tiles_q, long long pairs,
                      int causal, long long *q_tile, long long *bh) {
  if (causal) {
    const long long r = k >> 1, half = k & 1, m = (tiles_q - 1) / 2;
    const long long g =
        2 * (r * grid + (long long)(((unsigned)x + (unsigned)r) % (unsigned)grid)) + half;
    if (g >= tiles_q * pairs) return 0;
    const long long h2 = g / (2 * tiles_q), v = g - h2 * 2 * tiles_q;
    long long head, q;
    if (tiles_q % 2 == 0) {
      const long long second = v >= tiles_q, j = (v - second * tiles_q) >> 1;
      head = 2 * h2 + second;
      q = half ? tiles_q - 1 - j : j;
    } else {
      const long long u = v >> 1, j = u < m ? u : u - m - 1;
      head = 2 * h2 + (u == m ? half : u > m);
      q = u == m ? m : half ? tiles_q - 1 - j : j;
    }
    *q_tile = q;
    *bh = head;
  } else {
    const long long r = k * grid + ((k & 1) ? grid - 1 - x : x);
    if (r >= tiles_q * pairs) return 0;
    *q_tile = r % tiles_q;
    *bh = r / tiles_q;
  }
  return 1;
}

/* Key blocks a causal tile of query block q sees when Nq = Nk = n (br query rows, bc keys per
 * block): its cost, in key blocks. */
static long long causal_cost(long long q, long long n, long long br, long long bc) {
  long long last = q * br + br - 1, nkb = (n + bc - 1) / bc;
  return last / bc + 1 < nkb ? last / bc + 1 : nkb;
}

/* Walks every block's tiles; checks each tile is taken once and returns the largest and smallest
 * block total (causal: key blocks at Nq = Nk = tiles_q * br with bc = br / r; else tiles). */
static void walk(long long tiles_q, long long pairs, long long grid, int causal, long long br,
                 long long bc, long long *max_total, long long *min_total) {
  const long long n = tiles_q * pairs;
  unsigned char *seen = calloc((size_t)n, 1);
  cr_assert_not_null(seen);
  *max_total = 0;
  *min_total = -1;
  for (long long x = 0; x < grid; x++) {
    long long total = 0, k = 0, q, bh;
    for (; fg_tile_of(k, x, grid, tiles_q, pairs, causal, &q, &bh); k++) {
      cr_assert(q >= 0 && q < tiles_q && bh >= 0 && bh < pairs,
                "tiles_q %lld pairs %lld grid %lld causal %d: block %lld tile %lld is (%lld, %lld)",
                tiles_q, pairs, grid, causal, x, k, q, bh);
      cr_assert_eq(seen[bh * tiles_q + q], 0,
                   "tiles_q %lld pairs %lld grid %lld causal %d: tile (%lld, %lld) taken twice",
                   tiles_q, pairs, grid, causal, q, bh);
      seen[bh * tiles_q + q] = 1;
      total += causal ? causal_cost(q, tiles_q * br, br, bc) : 1;
    }
    /* Past its last tile a block has none later either (the kernel's loop stops at the first). */
    for (long long j = k; j < k + 4; j++)
      cr_assert_eq(fg_tile_of(j, x, grid, tiles_q, pairs, causal, &q, &bh), 0);
    if (total > *max_total) *max_total = total;
    if (*min_total < 0 || total < *min_total) *min_total = total;
  }
  for (long long i = 0; i < n; i++)
    cr_assert_eq(seen[i], 1, "tiles_q %lld pairs %lld grid %lld causal %d: tile %lld not taken",
                 tiles_q, pairs, grid, causal, i);
  free(seen);
}

/* The grid the runtime launches: min(tiles, SMs). */
static long long grid_of(long long tiles, long long sms) { return tiles < sms ? tiles : sms; }

Test(tile_order, every_tile_once_at_every_shape) {
  static const long long tq[] = {1, 2, 3, 4, 5, 7, 8, 16, 33, 128};
  static const long long pr[] = {1, 2, 3, 16, 31, 512};
  static const long long sms[] = {1, 7, 132};
  for (int c = 0; c < 2; c++)
    for (size_t i = 0; i < sizeof tq / sizeof tq[0]; i++)
      for (size_t j = 0; j < sizeof pr / sizeof pr[0]; j++)
        for (size_t s = 0; s < sizeof sms / sizeof sms[0]; s++) {
          long long mx, mn;
          walk(tq[i], pr[j], grid_of(tq[i] * pr[j], sms[s]), c, 128, 128, &mx, &mn);
        }
}

/* Causal, Nq = Nk, the bench grid's shapes on 132 SMs: the pairs keep the blocks' totals within one
 * pair (tiles_q + 1 key blocks at Br = Bc) plus one tile, where a block per pair would be exact. */
Test(tile_order, causal_pairs_keep_the_blocks_even) {
  static const struct {
    long long n, heads, br, bc;
  } g[] = {{512, 16, 128, 128},  {1024, 16, 128, 128}, {4096, 16, 128, 128},
           {16384, 16, 128, 128}, {512, 32, 192, 128}, {2048, 32, 192, 128},
           {16384, 32, 192, 128}, {1000, 7, 128, 128}};
  for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
    const long long tiles_q = (g[i].n + g[i].br - 1) / g[i].br, pairs = 16384 / g[i].n * g[i].heads;
    const long long grid = grid_of(tiles_q * pairs, 132);
    long long mx, mn;
    walk(tiles_q, pairs, grid, 1, g[i].br, g[i].bc, &mx, &mn);
    const long long pair_cost = causal_cost(0, tiles_q * g[i].br, g[i].br, g[i].bc) +
                                causal_cost(tiles_q - 1, tiles_q * g[i].br, g[i].br, g[i].bc);
    const long long tile_max = causal_cost(tiles_q - 1, tiles_q * g[i].br, g[i].br, g[i].bc);
    cr_assert(mx - mn <= pair_cost + tile_max,
              "N %lld Br %lld: block totals %lld..%lld key blocks, more apart than one pair (%lld) "
              "and one tile (%lld)",
              g[i].n, g[i].br, mn, mx, pair_cost, tile_max);
  }
}

/* q_tma_d's scheduler (templates/fwd_tma.cu, fwd_unit_tile), in C: tile g of the causal order's
 * sequence of units in 32 bits; q_tile stays ~0u past the total. */
static void fg_unit_tile(unsigned tq, unsigned g, unsigned total, unsigned *q_tile, unsigned *bh) {
  if (g >= total) return;
  const unsigned half = g & 1u, m = (tq - 1u) / 2u, h2 = g / (2u * tq), v = g - h2 * 2u * tq;
  if (tq % 2u == 0) {
    const unsigned second = v >= tq ? 1u : 0u, j = (v - second * tq) >> 1;
    *bh = 2u * h2 + second;
    *q_tile = half ? tq - 1u - j : j;
  } else {
    const unsigned u = v >> 1, j = u < m ? u : u - m - 1u;
    *bh = 2u * h2 + (u == m ? half : (u > m ? 1u : 0u));
    *q_tile = u == m ? m : half ? tq - 1u - j : j;
  }
}

/* The dynamic order hands out the static order's units: position g of the sequence is the same
 * tile in both (the static order's block x takes g = 2 (r grid + (x + r) % grid) + k % 2 in round
 * r = k / 2), so every tile once, in pairs of equal cost. */
Test(tile_order, dynamic_units_are_the_static_orders) {
  static const long long tq[] = {1, 2, 3, 4, 5, 8, 33};
  static const long long pr[] = {1, 2, 3, 16, 31};
  for (size_t i = 0; i < sizeof tq / sizeof tq[0]; i++)
    for (size_t j = 0; j < sizeof pr / sizeof pr[0]; j++) {
      const long long total = tq[i] * pr[j], grid = grid_of(total, 7);
      for (long long x = 0; x < grid; x++) {
        long long q, bh;
        for (long long k = 0; fg_tile_of(k, x, grid, tq[i], pr[j], 1, &q, &bh); k++) {
          const long long r = k >> 1;
          const long long g = 2 * (r * grid + (x + r) % grid) + (k & 1);
          unsigned dq = ~0u, dbh = 0;
          fg_unit_tile((unsigned)tq[i], (unsigned)g, (unsigned)total, &dq, &dbh);
          cr_assert(dq == q && dbh == bh, "tiles_q %lld heads %lld: position %lld is (%lld, %lld) "
                    "in the static order, (%u, %u) in the dynamic one", tq[i], pr[j], g, q, bh, dq, dbh);
        }
      }
      unsigned dq = ~0u, dbh = 0;
      fg_unit_tile((unsigned)tq[i], (unsigned)total, (unsigned)total, &dq, &dbh);
      cr_assert_eq(dq, ~0u, "past the total: the end");
    }
}

/* The tile counter's tickets (fwd_tma.cu, dyn_ticket and the scheduler's end), each atomic step
 * of each block interleaved at random over a word that starts with whatever memory held (zero,
 * flashgen check's poison, another launch's count, float bits, random): every ticket 0 ..
 * units + blocks - 1 is taken exactly once, each block's last one its end (>= units), and the word
 * is 0 afterwards. */
typedef struct dyn_block {
  int state; /* 0 add, 1 cas, 2 add again, 3 done */
  unsigned long long expected;
  unsigned last;
} dyn_block;
static unsigned long long dyn_rand(unsigned long long *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}
Test(tile_order, dynamic_tickets_once_each_from_any_word) {
  unsigned long long seed = 0x9E3779B97F4A7C15ull;
  const unsigned long long starts[] = {0ull, ~0ull, (0x7F800005ull << 32) | 77u, 0x3F8000003F800000ull,
                                       0x12345678FFFFFFFFull, 0xDEADBEEFCAFEF00Dull};
  const unsigned epoch = 0x7F800009u;
  for (int trial = 0; trial < 600; trial++) {
    const unsigned blocks = 1 + (unsigned)(dyn_rand(&seed) % 9), units = (unsigned)(dyn_rand(&seed) % 40);
    unsigned long long word = trial < 6 ? starts[trial] : dyn_rand(&seed);
    if ((unsigned)(word >> 32) == epoch) word ^= 1ull << 40;
    dyn_block b[9];
    unsigned char taken[64] = {0};
    for (unsigned i = 0; i < blocks; i++) b[i] = (dyn_block){0, 0, 0};
    unsigned done = 0;
    while (done < blocks) {
      dyn_block *k = &b[dyn_rand(&seed) % blocks];
      unsigned t = 0;
      int got = 0;
      if (k->state == 0 || k->state == 2) { /* atomicAdd */
        const unsigned long long v = word++;
        if (k->state == 2 || (unsigned)(v >> 32) == epoch)
          t = (unsigned)v, got = 1;
        else
          k->expected = v + 1, k->state = 1;
      } else if (k->state == 1) { /* atomicCAS(expected -> epoch, 1) */
        const unsigned long long prev = word;
        if (prev == k->expected)
          word = ((unsigned long long)epoch << 32) | 1ull, t = 0, got = 1;
        else if ((unsigned)(prev >> 32) == epoch)
          k->state = 2;
        else
          k->expected = prev;
      } else {
        continue;
      }
      if (!got) continue;
      cr_assert(t < units + blocks && !taken[t], "trial %d: ticket %u out of range or taken twice",
                trial, t);
      taken[t] = 1;
      k->last = t;
      k->state = t >= units ? 3 : 0;
      if (t >= units) {
        done++;
        if (t == units + blocks - 1) word = 0; /* the launch's last ticket */
      }
    }
    for (unsigned t = 0; t < units + blocks; t++) cr_assert(taken[t], "trial %d: ticket %u never taken", trial, t);
    cr_assert_eq(word, 0ull, "trial %d: the word after the launch", trial);
  }
}

/* The tiles of one round (the k-th tile of every block, which run at about the same time) come
 * from few heads: at most ceil(2 grid / tiles_q) + 1 with a mask (a round is 2 grid consecutive
 * positions of the head-major sequence, over two k), ceil(grid / tiles_q) + 1 without. */
Test(tile_order, a_round_spans_few_heads) {
  static const long long tq[] = {3, 4, 8, 128};
  for (int c = 0; c < 2; c++)
    for (size_t i = 0; i < sizeof tq / sizeof tq[0]; i++) {
      const long long pairs = 512, grid = 132, tiles_q = tq[i];
      for (long long k = 0; k < 8; k += 1 + c) {
        long long lo = -1, hi = -1, q, bh;
        for (long long x = 0; x < grid; x++)
          for (long long kk = k; kk <= k + c; kk++)
            if (fg_tile_of(kk, x, grid, tiles_q, pairs, c, &q, &bh)) {
              if (lo < 0 || bh < lo) lo = bh;
              if (bh > hi) hi = bh;
            }
        const long long bound = ((1 + c) * grid + tiles_q - 1) / tiles_q + 1;
        cr_assert(hi - lo + 1 <= bound, "causal %d tiles_q %lld round %lld: heads %lld..%lld (> %lld)",
                  c, tiles_q, k, lo, hi, bound);
      }
    }
}

/* deal_grouped of templates/common.cuh: block L = y nx + x of an nx x ny grid takes (*x, *y), the
 * rows in ng groups, x slow within a group. Transcribed: change both together. */
static void deal_grouped(unsigned L, unsigned nx, unsigned ny, unsigned ng, unsigned *x,
                         unsigned *y) {
  const unsigned yl = L / nx, gi = ((yl + 1) * ng - 1) / ny;
  const unsigned y0 = gi * ny / ng, gs = (gi + 1) * ny / ng - y0, r = L - y0 * nx;
  *x = r / gs;
  *y = y0 + r % gs;
}

/* deal_tail of templates/common.cuh: the rows in launch order but for the last
 * ceil(nsm / nx), dealt as one group, x slow. Transcribed: change both together. */
static void deal_tail(unsigned L, unsigned nx, unsigned ny, unsigned nsm, unsigned *x,
                      unsigned *y) {
  const unsigned g0 = (nsm + nx - 1) / nx, g = g0 < ny ? g0 : ny, y0 = ny - g;
  if (L < y0 * nx) {
    *x = L % nx;
    *y = L / nx;
  } else {
    const unsigned r = L - y0 * nx;
    *x = r / g;
    *y = y0 + r % g;
  }
}

/* deal_causal of templates/common.cuh, the causal grids' order (x: the row's blocks, longest
 * first): under 16 blocks a row deal_tail, else deal_grouped over rows / (waves2 / 2 waves of nsm
 * blocks) groups; the causal backward's (bwd_aux.cuh, causal_kv_pos: waves2 = 6) and the
 * non-persistent causal forward's (fwd_tma.cu next_tile: GROUP_HALF_WAVES = 3). */
static void causal_pos(unsigned L, unsigned nx, unsigned ny, unsigned nsm, unsigned waves2,
                       unsigned *x, unsigned *y) {
  if (nx < 16) {
    deal_tail(L, nx, ny, nsm, x, y);
    return;
  }
  const unsigned ng0 = ny * nx * 2u / (waves2 * nsm);
  deal_grouped(L, nx, ny, ng0 < 1 ? 1 : (ng0 > ny ? ny : ng0), x, y);
}

/* The causal backward's block order (kv_tma): block L = y nkb + x of the grid (nkb key blocks,
 * nbh (batch, KV head)s) computes key block *kb of *bhk. */
static void bwd_causal_pos(unsigned L, unsigned nkb, unsigned nbh, unsigned nsm, unsigned *kb,
                           unsigned *bhk) {
  causal_pos(L, nkb, nbh, nsm, 6, kb, bhk);
}

/* The GPU's block scheduler as a list schedule: blocks in linear order, each to the SM that frees
 * first; key block kb costs its nkb - kb key blocks' worth of query rows plus a fixed part.
 * Returns the ideal time over the makespan. */
static double bwd_causal_balance(unsigned nkb, unsigned nbh, unsigned nsm, int reordered) {
  double *busy = calloc(nsm, sizeof *busy), total = 0, end = 0;
  cr_assert_not_null(busy);
  for (unsigned L = 0; L < nkb * nbh; L++) {
    unsigned kb = L % nkb, bhk = L / nkb;
    if (reordered) bwd_causal_pos(L, nkb, nbh, nsm, &kb, &bhk);
    unsigned s = 0;
    for (unsigned i = 1; i < nsm; i++)
      if (busy[i] < busy[s]) s = i;
    const double c = (double)(nkb - kb) + 0.3;
    busy[s] += c;
    total += c;
  }
  for (unsigned i = 0; i < nsm; i++)
    if (busy[i] > end) end = busy[i];
  free(busy);
  return total / nsm / end;
}

Test(tile_order, bwd_causal_order_takes_every_block_once) {
  static const unsigned nkbs[] = {1, 2, 7, 8, 15, 16, 17, 32, 64, 128, 200};
  static const unsigned nbhs[] = {1, 2, 3, 5, 16, 21, 32, 64, 100, 256, 1000};
  static const unsigned sms[] = {1, 7, 132};
  for (size_t i = 0; i < sizeof nkbs / sizeof nkbs[0]; i++)
    for (size_t j = 0; j < sizeof nbhs / sizeof nbhs[0]; j++)
      for (size_t s = 0; s < sizeof sms / sizeof sms[0]; s++) {
        const unsigned nkb = nkbs[i], nbh = nbhs[j], n = nkb * nbh;
        unsigned char *seen = calloc(n, 1);
        cr_assert_not_null(seen);
        for (unsigned L = 0; L < n; L++) {
          unsigned kb, bhk;
          bwd_causal_pos(L, nkb, nbh, sms[s], &kb, &bhk);
          cr_assert(kb < nkb && bhk < nbh, "nkb %u nbh %u: block %u -> (%u, %u)", nkb, nbh, L, kb, bhk);
          cr_assert_eq(seen[bhk * nkb + kb], 0, "nkb %u nbh %u: (%u, %u) twice", nkb, nbh, kb, bhk);
          seen[bhk * nkb + kb] = 1;
          /* under 16 key blocks: the launch order but for the last wave's heads */
          const unsigned g = (sms[s] + nkb - 1) / nkb;
          if (nkb < 16 && L / nkb + g < nbh)
            cr_assert(kb == L % nkb && bhk == L / nkb, "nkb %u: block %u moved", nkb, L);
        }
        free(seen);
      }
}

/* The bench grid's causal backward shapes (B N = 16k, H d = 2048, Bc 128) on 132 SMs: the launch
 * order ends on a tail (0.93-0.95 of the ideal at d = 128 N = 512-8k); the groups' longest-first
 * order (from 2k) and the last wave's (512, 1k) stay within 2% of it (measured: 1.03-1.06x at
 * d = 128 causal 2k-8k, 1.02x and 1.04x at 512 and 1k, fg_ab H100). */
Test(tile_order, bwd_causal_order_balances_the_grid) {
  static const struct {
    unsigned n, heads;
  } g[] = {{512, 16},  {1024, 16}, {2048, 16}, {4096, 16}, {8192, 16}, {16384, 16}, {512, 32},
           {1024, 32}, {2048, 32}, {4096, 32}, {8192, 32}, {16384, 32}, {4096, 21}};
  for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
    const unsigned nkb = g[i].n / 128, nbh = 16384 / g[i].n * g[i].heads;
    const double before = bwd_causal_balance(nkb, nbh, 132, 0);
    const double after = bwd_causal_balance(nkb, nbh, 132, 1);
    cr_assert(after >= 0.98 && after >= before,
              "N %u heads %u: balance %.3f in the launch order, %.3f reordered", g[i].n,
              g[i].heads, before, after);
  }
}

/* The non-persistent causal forward (fwd_tma.cu at two consumers: d = 256 and d = 72-128 past the
 * persistent grid's lengths): query block nq - 1 - x of row y, x from causal_pos, costs its nq - x
 * key blocks' worth (Br = 128, Bc = 64: two each). The bench's d = 256 shapes (0.87-0.90 of the
 * ideal in launch order at 512-8k): 0.95 or better (measured +3-9%, fg_ab H100). */
Test(tile_order, fwd_causal_groups_balance_the_grid) {
  static const unsigned ns[] = {512, 1024, 2048, 4096, 8192};
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
    const unsigned nq = ns[i] / 128, nbh = 16384 / ns[i] * 8;
    double busy[132] = {0}, total = 0, end = 0, before = 0;
    for (int pass = 0; pass < 2; pass++) {
      for (unsigned s = 0; s < 132; s++) busy[s] = 0;
      total = end = 0;
      for (unsigned L = 0; L < nq * nbh; L++) {
        unsigned x = L % nq, y = L / nq;
        if (pass) causal_pos(L, nq, nbh, 132, 3, &x, &y);
        unsigned s = 0;
        for (unsigned k = 1; k < 132; k++)
          if (busy[k] < busy[s]) s = k;
        const double c = 2.0 * (nq - x) + 0.5;
        busy[s] += c;
        total += c;
      }
      for (unsigned s = 0; s < 132; s++)
        if (busy[s] > end) end = busy[s];
      if (!pass) before = total / 132 / end;
    }
    const double after = total / 132 / end;
    cr_assert(after >= 0.95 && after > before,
              "d = 256 N = %u: balance %.3f in launch order, %.3f reordered", ns[i], before, after);
  }
}
