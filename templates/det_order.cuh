// det_order.cuh: deterministic mode's staggered order (DET_STAGGER, bwd_tmat.cu; bwd_aux.cuh
// includes it): which query tile each key block starts at and how many key blocks add a dQ tile
// before a given one, as pure integer functions, so that tests/test_det_order.c compiles this very
// text on the host and checks the order (every tile's ranks a permutation, each block waiting
// only for one a step ahead, every group finishing with only the groups before it done). Plain
// C as well as CUDA: FG_DEV and u32 come from the includer.
//
// The key blocks of a (batch, head) go in groups of DET_STAGGER_KBG (the last group the
// remainder), dealt out contiguously (bwd_aux.cuh: det_kv_pos); key block kb starts at query tile
// kb mod P (P: the span's tiles), so a group's n blocks start on n consecutive tiles (wrapping),
// one tile apart, and the next group on the n after. The tile of query block i is added by a
// group's blocks in the order they reach it, each one step after the block before it: from the
// last block that starts at or before i (counted from the group's first tile, g0 mod P) down,
// wrapping; the groups in ascending order. Only where a group has no more blocks than the span has
// tiles (else the ascending order, rank kb).
#define DET_STAGGER_KBG 8u
// Key block kb's group of the nkb: its first key block (*g0) and size (returned).
FG_DEV u32 det_stagger_group(u32 kb, u32 nkb, u32 *g0) {
  const u32 full = nkb / DET_STAGGER_KBG * DET_STAGGER_KBG;
  *g0 = kb < full ? kb / DET_STAGGER_KBG * DET_STAGGER_KBG : full;
  return kb < full ? DET_STAGGER_KBG : nkb - full;
}
// The span's query tile (of P) that key block kb takes first.
FG_DEV u32 det_stagger_rot(u32 kb, u32 nkb, u32 P) {
  u32 g0;
  const u32 n = det_stagger_group(kb, nkb, &g0);
  return n <= P ? kb % P : 0u;
}
// How many key blocks add query tile i (of the span's P) before key block kb.
FG_DEV u32 det_stagger_rank(u32 kb, u32 nkb, u32 i, u32 P) {
  u32 g0;
  const u32 n = det_stagger_group(kb, nkb, &g0);
  if (n > P) return kb;
  const u32 a = (i + P - g0 % P) % P;  // i's tile counted from the group's first
  return g0 + ((a < n - 1 ? a : n - 1) + n - (kb - g0)) % n;
}
