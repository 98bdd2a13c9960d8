/* Deterministic mode's staggered order (templates/det_order.cuh, bwd_tmat.cu's dQ hand-off),
 * compiled here from the template's own text: for every count of key blocks (1-70) and of query
 * tiles (1-40), every tile's ranks are a permutation of the key blocks; a block waits on a tile
 * only for blocks of its own group that reach it at an earlier step of their own walk, or for
 * blocks of earlier groups; and a simulation in which each group runs alone (all its blocks at
 * once: the residency the order needs), after the groups before it, finishes every group, in
 * exactly P steps where the group is staggered (nobody waits in lockstep). A mistake here hangs
 * the GPU or makes dQ differ between runs, neither of which CI can see without one. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint32_t u32;
#define FG_DEV static inline
#include "../templates/det_order.cuh"

#define MAX_KB 70u
#define MAX_P 40u

/* The step of key block kb's walk at which it reaches tile i (its walk: rot, rot + 1, ... mod P). */
static u32 step_of(u32 kb, u32 nkb, u32 i, u32 P) { return (i + P - det_stagger_rot(kb, nkb, P)) % P; }

Test(det_order, every_tile_ranks_each_key_block_once) {
  unsigned char seen[MAX_KB];
  for (u32 nkb = 1; nkb <= MAX_KB; nkb++)
    for (u32 P = 1; P <= MAX_P; P++)
      for (u32 i = 0; i < P; i++) {
        memset(seen, 0, sizeof seen);
        for (u32 kb = 0; kb < nkb; kb++) {
          const u32 r = det_stagger_rank(kb, nkb, i, P);
          cr_assert_lt(r, nkb, "nkb %u P %u tile %u: key block %u has rank %u", nkb, P, i, kb, r);
          cr_assert_not(seen[r], "nkb %u P %u tile %u: rank %u given twice", nkb, P, i, r);
          seen[r] = 1;
        }
        cr_assert_lt(det_stagger_rot(nkb - 1, nkb, P), P, "nkb %u P %u: a first tile past the span", nkb, P);
      }
}

Test(det_order, a_block_waits_only_for_blocks_ahead_of_it) {
  u32 by_rank[MAX_KB];
  for (u32 nkb = 1; nkb <= MAX_KB; nkb++)
    for (u32 P = 1; P <= MAX_P; P++)
      for (u32 i = 0; i < P; i++) {
        for (u32 kb = 0; kb < nkb; kb++) by_rank[det_stagger_rank(kb, nkb, i, P)] = kb;
        for (u32 r = 0; r + 1 < nkb; r++) {
          const u32 a = by_rank[r], b = by_rank[r + 1];
          u32 ga, gb;
          const u32 n = det_stagger_group(b, nkb, &gb);
          det_stagger_group(a, nkb, &ga);
          cr_assert_leq(ga, gb, "nkb %u P %u tile %u: group of %u after group of %u", nkb, P, i, a, b);
          if (ga == gb && n <= P)  /* staggered: the block before reached the tile at an earlier step */
            cr_assert_lt(step_of(a, nkb, i, P), step_of(b, nkb, i, P),
                         "nkb %u P %u tile %u: block %u (rank %u) waits for %u, a later step", nkb, P, i, b,
                         r + 1, a);
        }
      }
}

/* Each group alone, after the groups before it, all its blocks at once, in rounds: in a round
 * every block whose next tile's semaphore equals its rank there adds (the semaphores as they
 * were at the round's start: a turn passed on is seen a round later). */
Test(det_order, every_group_finishes_alone_and_staggered_ones_never_wait) {
  u32 sem[MAX_P], done[MAX_KB], ready[MAX_KB];
  for (u32 nkb = 1; nkb <= MAX_KB; nkb++)
    for (u32 P = 1; P <= MAX_P; P++) {
      memset(sem, 0, sizeof sem);
      for (u32 g0 = 0; g0 < nkb;) {
        u32 first;
        const u32 n = det_stagger_group(g0, nkb, &first);
        cr_assert_eq(first, g0, "nkb %u: group at %u starts at %u", nkb, g0, first);
        memset(done, 0, sizeof done);
        u32 rounds = 0, left = n * P;
        while (left > 0) {
          cr_assert_lt(rounds, n * P + 1, "nkb %u P %u: the group at %u is stuck (a deadlock on the GPU)", nkb, P,
                       g0);
          for (u32 j = 0; j < n; j++) {
            const u32 kb = g0 + j, t = (det_stagger_rot(kb, nkb, P) + done[j]) % P;
            ready[j] = done[j] < P && sem[t] == det_stagger_rank(kb, nkb, t, P);
          }
          for (u32 j = 0; j < n; j++)
            if (ready[j]) {
              sem[(det_stagger_rot(g0 + j, nkb, P) + done[j]) % P]++;
              done[j]++;
              left--;
            }
          rounds++;
        }
        if (n <= P) cr_assert_eq(rounds, P, "nkb %u P %u: the staggered group at %u took %u rounds", nkb, P, g0, rounds);
        g0 += n;
      }
      for (u32 i = 0; i < P; i++) cr_assert_eq(sem[i], nkb, "nkb %u P %u: tile %u added %u times", nkb, P, i, sem[i]);
    }
}
