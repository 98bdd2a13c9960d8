// bwd_aux.cuh: what the backward templates (bwd.cu: mma.sync; bwd_wgmma.cu: wgmma) share: the
// plan's first and last kernels ({{ entry }}_pre: D = rowsum(dO * O) and the fp32 dQ accumulator
// zeroed; {{ entry }}_post: dQ converted; for long query ranges dkv_accum zeroed and converted
// into dK, dV too), the fp32 reductions of dQ tiles, the query blocks a key block (and its split)
// visits, the LSE/D loads of a query block, deterministic mode's semaphores, the splits'
// additions of their dK/dV partial sums, and (DQ_TILED) the tiled dQ accumulator of bwd_tma.cu.
// Included after the template's constants (D, CHUNKS, BF16, BR, CAUSAL, THREADS) with
// {% include("bwd_aux.cuh") %}. The helpers that every working thread of the main kernel calls
// count MAIN_THREADS and meet at main_sync(): by default every thread of the block and
// __syncthreads(); a warp-specialised template defines both (its consumers, a named barrier)
// before the include. Macros, not declarations: a declaration perturbs ptxas's output, and the
// verified kernels' cubins are compared byte for byte.
#ifndef MAIN_THREADS
#define MAIN_THREADS THREADS
#define main_sync() __syncthreads()
#endif
// The plan's parameter block as every kernel declares it, and the name p of its fg_bwd_params
// (a template whose plan takes tensor maps defines both, its block holding p).
#ifndef BWD_PARAMS
#define BWD_PARAMS const __grid_constant__ fg_bwd_params p
#define BWD_PARAMS_BIND
#endif
namespace {
// From the plan (bwd.lua, launch(v).constants): query rows and threads per block of the _pre
// and _post kernels, and query rows per semaphore of deterministic mode.
constexpr int PRE_ROWS = {{ pre_rows }}, PRE_THREADS = {{ pre_threads }}, SEM_ROWS = {{ sem_rows }};
// Long query ranges (bwd.lua, SPLIT_ROWS): per key block of each (batch, KV head), dkv_accum
// holds dK, then dV (BC x D fp32 each, row-major), then DKV_SEM_FLOATS floats whose first is the
// block's semaphore of deterministic mode.
constexpr int DKV_SEM_FLOATS = {{ dkv_sem_floats }};
constexpr i64 DKV_FLOATS = 2 * (i64)BC * D + DKV_SEM_FLOATS;
static_assert(DKV_FLOATS % 4 == 0, "dkv_accum's key blocks stay 16-byte aligned (vector adds)");
static_assert(BR % SEM_ROWS == 0 && PRE_ROWS % SEM_ROWS == 0 && PRE_ROWS / SEM_ROWS <= PRE_THREADS,
              "a semaphore covers whole query blocks, and _pre zeroes its rows' semaphores");
constexpr float LOG2E = 1.4426950408889634f;

FG_DEV void ld_global_v4(const void *g, u32 &a, u32 &b, u32 &c, u32 &d) {
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(g));
}
FG_DEV void st_global_v4(void *g, u32 a, u32 b, u32 c, u32 d) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"l"(g), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
FG_DEV void red_add_f32(float *g, float x) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(g), "f"(x) : "memory");
}
// Reductions that happen only where `on` (a predicate on the instruction: no branch around it).
FG_DEV void red_add_f32_if(float *g, bool on, float x) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p red.global.add.f32 [%0], %1;\n}\n" ::"l"(g), "f"(x),
               "r"((int)on) : "memory");
}
FG_DEV void red_add_v4_if(float *g, bool on, float x0, float x1, float x2, float x3) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n}\n"
               ::"l"(g), "f"(x0), "f"(x1), "f"(x2), "f"(x3), "r"((int)on) : "memory");
}
// Stores a float4 where `store`, else adds it (one predicated instruction each, no branch).
FG_DEV void put_v4(float *g, bool store, float x0, float x1, float x2, float x3) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p st.global.v4.f32 [%0], {%1, %2, %3, %4};\n"
               " @!p red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n}\n" ::"l"(g), "f"(x0), "f"(x1), "f"(x2), "f"(x3),
               "r"((int)store) : "memory");
}
FG_DEV void red_add_v2_if(float *g, bool on, float x0, float x1) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p red.global.add.v2.f32 [%0], {%1, %2};\n}\n"
               ::"l"(g), "f"(x0), "f"(x1), "r"((int)on) : "memory");
}
// Adds the dQ fragment of one m16n8 tile (row g: x0, x1 at columns c, c + 1; row g + 8: x2, x3)
// to the fp32 accumulator at row0 (row stride D floats, c = 2t + tile column). On sm_90 the lane
// pairs (t, t ^ 1) swap halves so that each adds four adjacent floats with one vector reduction
// (+17-24% over two scalar ones on an H100 at d = 64 and 128); before, four scalar reductions.
// Branch-free (selects and predicated reductions): callers that pass row0 + tile column and the
// same c for every tile of a row get one address computation for all of them.
FG_DEV void add_dq_tile(float *row0, int g, int t, int c, int nrows, float x0, float x1, float x2,
                        float x3) {
{% if arch == "sm_90" or arch == "sm_90a" then %}
  const bool even = (t & 1) == 0;
  const float y0 = __shfl_xor_sync(0xffffffffu, even ? x2 : x0, 1);
  const float y1 = __shfl_xor_sync(0xffffffffu, even ? x3 : x1, 1);
  const int r = even ? g : g + 8;
  red_add_v4_if(row0 + (r * D + (even ? c : c - 2)), r < nrows, even ? x0 : y0, even ? x1 : y1, even ? y0 : x2,
                even ? y1 : x3);
{% else %}
  float *a = row0 + (g * D + c);
  red_add_f32_if(a, g < nrows, x0);
  red_add_f32_if(a + 1, g < nrows, x1);
  red_add_f32_if(a + 8 * D, g + 8 < nrows, x2);
  red_add_f32_if(a + 8 * D + 1, g + 8 < nrows, x3);
{% end %}
}
FG_DEV float lo_f(u32 x) { return to_float<BF16>((u16)(x & 0xffffu)); }
FG_DEV float hi_f(u32 x) { return to_float<BF16>((u16)(x >> 16)); }
FG_DEV float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
// Whether the kernels run deterministic mode's fixed order: asked for (p.deterministic), or where
// the template's plan takes it for speed (DET_ORDER_MAX_KEYS, bwd.lua: bwd_tmat.cu with a causal
// mask up to 1024 keys, where the order's first key block stores each dQ tile and so saves
// _pre's zeroing of the accumulator: 1.08-1.13x at 512-1k, H100, bench/NOTES.md session 29). The
// plan then has the semaphores in either mode. Every test of the mode in the kernels is this one.
#ifndef DET_ORDER_MAX_KEYS
#define DET_ORDER_MAX_KEYS 0
#endif
FG_DEV bool det_order(const fg_bwd_params &p) {
  return p.deterministic || (DET_ORDER_MAX_KEYS > 0 && CAUSAL && p.seqlen_k <= DET_ORDER_MAX_KEYS);
}
// The fp32 workspace: the dQ accumulator, then D.
FG_DEV float *dq_acc(const fg_bwd_params &p) { return (float *)p.workspace; }
FG_DEV float *d_sum(const fg_bwd_params &p) { return (float *)p.dsum; }
// Deterministic mode: one semaphore per SEM_ROWS query rows of each (batch, query head); the one
// of the tile's first row counts the key blocks that have added their part of that dQ tile.
FG_DEV i64 sems_per_head(const fg_bwd_params &p) { return (p.seqlen_q + SEM_ROWS - 1) / SEM_ROWS; }
FG_DEV u32 ld_acquire(const u32 *a) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(a) : "memory");
  return v;
}

// The query blocks that see key block k0: all of them, or (causal) from the block of the first
// query i with k0 <= i + (Nk - Nq). Items are (query head of the group, query block) pairs:
// item it is head hk * G + it / per_head, query block i0 + it % per_head.
// Past the plan's SPLIT_ROWS the grid's z splits them: of the P query blocks the key block sees
// in every head of the group, split z of S takes blocks floor(z P / S) ... floor((z + 1) P / S) - 1
// (in every head; below the threshold z = 0 of 1: all of them). So the split is again a span of
// that form, and the main loop is the same code with or without splits.
// In deterministic mode a block waits for the key block before it in a dQ tile's order (dq_rank:
// kb - 1 without a mask, kb + 1 causal); there the tile sits at the same (no mask) or a smaller
// (causal: a shorter span, the tile nearer its start) fraction of the span, so in the same or a
// lower split. Every block thus waits only for blocks of lower z, or of the same z and lower x
// (key_block; det_kv_pos: of lower linear index), which the GPU starts before it.
struct bwd_span {
  int i0, per_head, n_items;
};
#ifdef BWD_DET_GROUPS
// Deterministic mode without a mask (bwd_tma.cu and bwd_tmat.cu define BWD_DET_GROUPS): the key blocks of a
// (batch, head) in groups of KBG (det_kv_pos, below; the last group the remainder). Within a group
// of n, block j walks the span's P query blocks from the (j P / n)-th on, wrapping, and the tile of
// query block i is added by the group's blocks in the order they reach it: j_i (the last whose
// start is at or before i), j_i - 1, ..., 0, n - 1, ..., j_i + 1; the groups in ascending order. So
// a block's first tile waits for nobody and every later one for a block that started a tile or more
// ahead (all starting at the first tile, the k-th block waited k hand-offs before its first: 1.32x
// the non-deterministic time at d = 64 1k, H100). A block waits only for blocks of its own group or
// of an earlier one, which the GPU starts no later than its group's last (det_kv_pos deals each
// group out contiguously in the linear block index), so a group must be resident at once, where the
// ascending order needs nothing resident beside a block: only groups of 8 (fewer than 64 key
// blocks) are rotated, since a GPU or a share of one (MPS, green contexts) with fewer SMs free to
// this kernel than a group's blocks would hang. And two limits: a group's tiles are all done only
// near its end, so the next group of the head, if it ran beside it, would wait that long for its
// first; and a group reads all of its head's Q, dO and dQ sums at once where the ascending order
// reads a tile (measured, H100: d = 128 4k 0.58x and d = 64 16k 0.78x with every group rotated, 4-8
// MB a head, 8-16 heads resident; 1.04-1.13x at 1-2 MB). So the rotation is taken where a head's G
// Nq D is at most 2^18 (2 MB of those sums and tiles: 132 SMs hold 16 groups of 8, 32 MB, in the
// H100's 50 MB L2) and either the head has one group or a round of the deal (8 blocks of every
// head) is at least twice the SMs (the GPU finishes a group before the next of its head starts);
// else the ascending order, each group close behind the last.
FG_DEV u32 det_kbg(u32 nkb) { return !DET_STAGGER && nkb >= 64 ? 16 : 8; }
FG_DEV bool det_rotate(const fg_bwd_params &p, u32 nkb) {
  const u32 kbg = det_kbg(nkb);
  return DET_ROTATE && kbg == 8 && p.hq_per_hkv * p.seqlen_q * D <= ((i64)1 << 18) &&
         (nkb <= kbg || nctaid_y() * kbg >= 2 * nsmid());
}
// Key block kb's group of the nkb: its first key block g0 and size n.
FG_DEV void det_group(u32 kb, u32 nkb, u32 &g0, u32 &n) {
  const u32 kbg = det_kbg(nkb), full = nkb / kbg * kbg;
  g0 = kb < full ? kb / kbg * kbg : full;
  n = kb < full ? kbg : nkb - full;
}
// The staggered order (DET_STAGGER: bwd_tmat.cu, whose consumers add dQ from registers and so
// wait for each tile's turn themselves): det_order.cuh. Its blocks one tile apart, where the spread
// above puts them P / n apart and a group reads all of its head's Q, dO and dQ at once: here n
// tiles of them, as in the ascending order, at every N. Groups of 8 at every length (det_kbg), for
// the reason above: a staggered group must be resident at once.
{% include("det_order.cuh") %}
static_assert(DET_STAGGER_KBG == 8, "det_order.cuh's groups are det_kbg's and det_kv_pos's");
FG_DEV int det_rot(const fg_bwd_params &p, u32 kb, u32 nkb, int P) {
  if constexpr (DET_STAGGER) return (int)det_stagger_rot(kb, nkb, (u32)P);
  if (!det_rotate(p, nkb)) return 0;
  u32 g0, n;
  det_group(kb, nkb, g0, n);
  return (int)((u64)(kb - g0) * (u32)P / n);
}
// How many key blocks add query block i (of the span's P) before key block kb.
FG_DEV u32 det_rank(const fg_bwd_params &p, u32 kb, u32 nkb, int i, int P) {
  if constexpr (DET_STAGGER) return det_stagger_rank(kb, nkb, (u32)i, (u32)P);
  if (!det_rotate(p, nkb)) return kb;
  u32 g0, n;
  det_group(kb, nkb, g0, n);
  u32 ji = (u32)(((u64)(i + 1) * n + (u32)P - 1) / (u32)P) - 1;  // the largest j with j P / n <= i
  if (ji > n - 1) ji = n - 1;
  return g0 + (ji + n - (kb - g0)) % n;
}
#endif
FG_DEV bwd_span bwd_span_of(const fg_bwd_params &p, i64 k0, u32 z, u32 splits) {
  const i64 Nq = p.seqlen_q, diag = p.seqlen_k - Nq;
  const int nqb = (int)((Nq + BR - 1) / BR);
  int i0 = 0;
  if constexpr (CAUSAL) {
    const i64 first_q = k0 - diag;
    i0 = first_q <= 0 ? 0 : (first_q / BR < nqb ? (int)(first_q / BR) : nqb);
  }
  // 32-bit operands, 64-bit products (this form kept ptxas's registers at d = 128 as before).
  const u32 P = (u32)(nqb - i0);
  const int a = (int)((u64)z * P / splits), e = (int)((u64)(z + 1) * P / splits);
  return {i0 + a, e - a, (int)p.hq_per_hkv * (e - a)};
}

// LSE * log2(e) and D of query rows q0 ... q0 + BR - 1 of head (b, h) into sl[0, BR) and
// sl[BR, 2 BR) with plain loads, by `threads` threads (tid one of them). Rows past Nq, and rows
// that saw no key (LSE = -inf), get +inf, so their P is 0.
FG_DEV void load_lse_d(float *sl, const fg_bwd_params &p, u32 b, i64 h, i64 q0, int tid,
                       int threads = MAIN_THREADS) {
  const i64 Nq = p.seqlen_q, row0 = ((i64)b * p.heads_q + h) * Nq + q0;
  for (int c = tid; c < BR; c += threads) {
    const bool in = q0 + c < Nq;
    const float l = in ? ((const float *)p.lse)[row0 + c] : FG_NEG_INF;
    sl[c] = l == FG_NEG_INF ? __int_as_float(0x7f800000) : l * LOG2E;
    sl[BR + c] = in ? d_sum(p)[row0 + c] : 0.f;
  }
}

// (BWD_DET_GROUPS, which bwd_tma.cu and bwd_tmat.cu define.) Deterministic mode without a mask: the key blocks add
// each dQ tile in ascending order, every one from the span's first tile, so the blocks of one
// (batch, head) that start together fill a pipeline (the k-th waits k hand-offs before its first
// tile), and in the grid's order (x, the key block, fastest) all the key blocks of a head start
// together. There the linear block index y * nkb + x is dealt out KBG key blocks of each (batch,
// head) in turn: fewer blocks of one head start together, and a later group finds its first tiles
// long done. A block still waits only on the key block before it, which has a lower linear index
// (the same group, one earlier; or the group before), so the GPU started it first. 32-bit: nkb *
// nbh is at most the keys of all heads over 64, far below 2^32 for any K that fits in memory. The
// mma.sync kernel (255 registers) spilled with it (sm_80, d = 128: 0 -> 132 B), so only kv_tma.
#ifdef BWD_DET_GROUPS
struct kv_pos {
  u32 kb, bhk;
};
FG_DEV kv_pos det_kv_pos() {
  const u32 nkb = nctaid_x(), nbh = nctaid_y(), L = ctaid_y() * nkb + ctaid_x();
  // key blocks in whole groups; det_kbg's rule written out, not called: with the call ptxas
  // compiles d = 64 and 128's kv_tma main kernels differently (their .text changes), and d = 128's
  // is kept as it was measured (ff7c2d2, bench/NOTES.md session 16)
  const u32 kbg = !DET_STAGGER && nkb >= 64 ? 16 : 8, full = nkb / kbg * kbg;
  if (L < full * nbh) {
    const u32 r = L % (kbg * nbh);
    return {L / (kbg * nbh) * kbg + r % kbg, r / kbg};
  }
  const u32 r = L - full * nbh, n = nkb - full;
  return {full + r % n, r / n};
}
#endif
FG_DEV u32 ctaid_z() { u32 r; asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(r)); return r; }
FG_DEV u32 nctaid_z() { u32 r; asm volatile("mov.u32 %0, %%nctaid.z;" : "=r"(r)); return r; }
// The block's place: the key block (of BC keys) it computes, its (batch, KV head), and which of
// how many splits of the key block's query blocks it takes (bwd_span_of).
struct bwd_place {
  u32 kb, bhk, z, splits;
};
// From the grid: (x, y, z) of (nkb, B * Hkv, splits); or, where the runtime gave the launch a tail
// (fg_params.h: tail_splits > 1; only without a mask, without deterministic mode and with one
// split: runtime/backward.c, fg_plan_step_tail), the linear blocks L = y nkb + x from tail_first
// on are the tail's pieces: piece i = L - tail_first is split i / tail_blocks of key block
// tail_first + i % tail_blocks (in linear order), so the GPU starts every tail key block's first
// piece before any second one; splits 0 past the last piece (the block does nothing). The tail is
// taken only where its fields match the grid (tail_first + tail_blocks = nkb B Hkv): a runtime
// from before it passes a shorter parameter block, whose bytes past its end are not a tail.
FG_DEV bwd_place bwd_place_of(const fg_bwd_params &p) {
  const u32 nkb = nctaid_x();
  if (!CAUSAL && p.tail_splits > 1 && p.tail_first + p.tail_blocks == (i64)nkb * p.batch * p.heads_kv) {
    const u32 L = ctaid_y() * nkb + ctaid_x(), f = (u32)p.tail_first;
    if (L >= f) {
      const u32 i = L - f, z = i / (u32)p.tail_blocks, lin = f + (i - z * (u32)p.tail_blocks);
      return {lin % nkb, lin / nkb, z, z < (u32)p.tail_splits ? (u32)p.tail_splits : 0u};
    }
  }
  return {ctaid_x(), ctaid_y(), ctaid_z(), nctaid_z()};
}
#ifdef BWD_CAUSAL_ORDER
// (BWD_CAUSAL_ORDER, which bwd.cu and bwd_tma.cu define.) Causal, not deterministic: key block kb
// of a head sees the query rows from its diagonal on, so the first key blocks are the longest, and
// in launch order (x, the key block, fastest: one head after another) the last heads' longest
// blocks start late and the grid ends on a tail (a host simulation of the list schedule: 0.93-0.95
// of the ideal at d = 128 N = 1k-8k). Here the heads go in groups of about three waves of blocks
// (the heads split evenly), and within a group the key blocks slow and the heads fast, so each
// group runs longest first (0.985-0.998) while its blocks still share their heads' Q, dO and dQ in
// L2. Under 16 key blocks only the last wave's heads are dealt so (deal_tail), the rest in launch
// order: at d = 128 N = 1k (8) the groups lost 6-7% (fg_ab, H100; short blocks, and a head's few
// key blocks, dealt far apart, read its Q and dO from DRAM again) where the tail alone gained 4%
// (512: 1.8%); the groups gained 2-6% from 2k (bench/NOTES.md session 18).
FG_DEV void causal_kv_pos(u32 &kb, u32 &bhk) {
  const u32 nkb = nctaid_x(), nbh = nctaid_y(), L = ctaid_y() * nkb + ctaid_x();
  deal_causal<6>(L, nkb, nbh, kb, bhk);  // common.cuh: groups of about three waves
}
#endif
// The templates that keep the place in 16 bytes of shared memory (bwd.cu, bwd_tma.cu: bwd_slot(),
// BWD_PLACE_SLOT) work it out once, thread 0 before the block's first barrier (bwd_place_store),
// and read it there anew at every call (volatile: nothing held across the query-block loop; the
// tail's division, or deterministic mode's deal, is not redone in the loop). bwd_wgmma.cu reads
// the grid. Besides bwd_place_of's: deterministic causal calls take the key blocks in reverse (the
// last key block first), because there the dQ tiles are passed from the last key block down
// (dq_rank), so a block waits only for blocks before it in x, which the GPU starts first;
// deterministic without a mask, det_kv_pos's deal; causal otherwise (BWD_CAUSAL_ORDER),
// causal_kv_pos's.
#ifdef BWD_PLACE_SLOT
FG_DEV void bwd_place_store(const fg_bwd_params &p) {
  bwd_place pl = bwd_place_of(p);
  if (CAUSAL && det_order(p)) pl.kb = nctaid_x() - 1 - ctaid_x();
#ifdef BWD_CAUSAL_ORDER
  if (CAUSAL && !det_order(p)) causal_kv_pos(pl.kb, pl.bhk);
#endif
#ifdef BWD_DET_GROUPS
  if (!CAUSAL && det_order(p)) {
    const kv_pos d = det_kv_pos();
    pl.kb = d.kb, pl.bhk = d.bhk;
  }
#endif
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(bwd_slot()), "r"(pl.kb), "r"(pl.bhk) : "memory");
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(bwd_slot() + 8u), "r"(pl.z), "r"(pl.splits) : "memory");
}
FG_DEV u32 place_slot(int i) {
  u32 r;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(r) : "r"(bwd_slot() + 4u * (u32)i));
  return r;
}
#define KV_HEAD_BLOCK(p) place_slot(1)
FG_DEV int key_block(const fg_bwd_params &) { return (int)place_slot(0); }
FG_DEV u32 place_z() { return place_slot(2); }
FG_DEV u32 place_splits() { return place_slot(3); }
#else
#define KV_HEAD_BLOCK(p) blockIdx.y
FG_DEV int key_block(const fg_bwd_params &p) {
  if (CAUSAL && det_order(p)) return (int)(nctaid_x() - 1 - ctaid_x());
  return (int)ctaid_x();
}
FG_DEV u32 place_z() { return ctaid_z(); }
FG_DEV u32 place_splits() { return nctaid_z(); }
#endif
FG_DEV i64 k0_of(const fg_bwd_params &p) { return (i64)key_block(p) * BC; }
// Whether this block sums part of its key block's query blocks (long query ranges past the plan's
// SPLIT_ROWS, or a tail piece): then it adds its dK/dV into dkv_block, which _post converts.
FG_DEV bool bwd_split() { return place_splits() > 1; }
// This block's span (bwd_span_of) with its key block and split read anew (volatile) at every
// call: a kernel that calls it where it needs the span keeps none of it live across the
// query-block loop (bwd.cu, single-buffered).
FG_DEV bwd_span bwd_span_now(const fg_bwd_params &p) {
  return bwd_span_of(p, k0_of(p), place_z(), place_splits());
}
#ifdef BWD_DET_GROUPS
// The span's query block that this block takes first (det_rot: deterministic without a mask;
// else 0), and the first query row of item it (query head it / per_head of the group): the
// span's query blocks in order from the rot-th, wrapping. (Only the producer warps of
// bwd_tma.cu need it: the consumers use a block's first row only for the causal mask.)
FG_DEV int item_rot(const fg_bwd_params &p, const bwd_span &sp) {
  if constexpr (CAUSAL || !DET_ROTATE) return 0;
  return det_order(p) ? det_rot(p, (u32)key_block(p), nctaid_x(), sp.per_head) : 0;
}
FG_DEV i64 item_q0(const bwd_span &sp, int rot, int it) {
  int i = it % sp.per_head;
  if (rot) {
    i += rot;
    if (i >= sp.per_head) i -= sp.per_head;
  }
  return (i64)(sp.i0 + i) * BR;
}
#endif
// Deterministic mode: the key blocks add their parts of each dQ tile (the rows q0 ... of head
// (b, h)) in a fixed order, each after the ones before it: rank is how many come before key
// block kb = key_block(p). Without a mask every key block sees every tile: ascending, rank kb
// (BWD_DET_GROUPS: det_rank's order, each group's blocks from their own first tile). Causal (bottom-
// right), the blocks that see tile i are 0 ... jmax(i) (key block j's first query block is the
// one of query j * BC - diag, bwd_span_of): descending from jmax(i), rank jmax(i) - kb. In that
// order a block's first tile waits for nobody (it is the last key block that sees it) and every
// later one for blocks that started one tile earlier, so the additions overlap instead of
// filling a pipeline of all key blocks (ascending cost 2.2-2.4x the non-deterministic time at
// N = 4k-16k, H100). Every block of the order does add to the tile: they walk the same tiles in
// the same order, each from its own first one.
FG_DEV u32 dq_rank(const fg_bwd_params &p, i64 q0) {
  const int kb = key_block(p);  // from the block's index again: nothing held across the loop
  if constexpr (CAUSAL) {
    const i64 last = (q0 + BR - 1 + p.seqlen_k - p.seqlen_q) / BC;  // jmax: j * BC <= that row + diag
    return (u32)((last < (i64)gridDim.x - 1 ? last : (i64)gridDim.x - 1) - kb);
  }
#ifdef BWD_DET_GROUPS
  if constexpr (DET_ROTATE) {
    const bwd_span sp = bwd_span_now(p);
    return det_rank(p, (u32)kb, nctaid_x(), (int)(q0 / BR) - sp.i0, sp.per_head);
  }
#endif
  return (u32)kb;
}
FG_DEV u32 *dq_sem(const fg_bwd_params &p, u32 b, i64 h, i64 q0) {
  return (u32 *)p.sem + ((i64)b * p.heads_q + h) * sems_per_head(p) + q0 / SEM_ROWS;
}
// Both are called by every thread of the block, for the tile of rows q0 ...
FG_DEV void dq_sem_wait(const fg_bwd_params &p, u32 *sem, i64 q0, int tid) {
  if (det_order(p)) {
    if (tid == 0) {
      const u32 rank = dq_rank(p, q0);
      while (ld_acquire(sem) != rank) {
      }
    }
    main_sync();
  }
}
FG_DEV void dq_sem_release(const fg_bwd_params &p, u32 *sem, int tid) {
  if (det_order(p)) {
    __threadfence();
    main_sync();
    // sem held this block's rank (dq_sem_wait): one more passes the tile on. An add, so that
    // nothing of the rank's computation stays live across the tile's reductions (that spilled).
    if (tid == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(sem) : "memory");
  }
}

// Where a split block (bwd_split) adds its partial sums: long query ranges (p.dkv != 0, the grid's
// z splits each key block's query blocks), key block kb of (batch, KV head) bhk in dkv_accum; a
// tail piece, its key block's in dkv_tail (the tail's key blocks in linear order, from
// tail_first). dK at 0, dV at BC * D, the semaphore at 2 BC D.
FG_DEV float *dkv_block(const fg_bwd_params &p, u32 bhk, i64 kb) {
  const i64 at = (i64)bhk * ((p.seqlen_k + BC - 1) / BC) + kb;
  return p.dkv_tail ? (float *)p.dkv_tail + (at - p.tail_first) * DKV_FLOATS : (float *)p.dkv + at * DKV_FLOATS;
}
FG_DEV u32 *dkv_sem(float *blk) { return (u32 *)(blk + 2 * BC * D); }
// Deterministic mode: the splits of a key block add in z order; split z waits until the z before
// it have added (the semaphore counts them). Called by every thread of the block.
FG_DEV void dkv_wait(const fg_bwd_params &p, float *blk, int tid) {
  if (det_order(p)) {
    if (tid == 0) {
      while (ld_acquire(dkv_sem(blk)) != blockIdx.z) {
      }
    }
    main_sync();
  }
}
// Adds rows [0, rows) of a split's dK or dV, staged in shared memory (sacc: BC x D fp32,
// row-major, rows srow floats apart: D, or bwd_tmat.cu's padded rows), to dkv_accum's block at
// dst: 16 bytes per thread and step, coalesced; vector reductions (sm_90; four scalar ones
// before), or in deterministic mode (behind dkv_wait) a plain load, add and store, L2-coherent
// (.cg), so the bits are those of the z order every run. Called by every thread of the block.
FG_DEV void dkv_add_rows(const fg_bwd_params &p, float *dst, const float *sacc, int rows, int tid, int srow = D) {
  const int n4 = rows * (D / 4);
  for (int i = tid; i < n4; i += MAIN_THREADS) {
    const float4 x = srow == D ? ((const float4 *)sacc)[i] : *(const float4 *)(sacc + i / (D / 4) * srow + i % (D / 4) * 4);
    float *a = dst + 4 * i;
    if (det_order(p)) {
      float y0, y1, y2, y3;
      asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(y0), "=f"(y1), "=f"(y2), "=f"(y3) : "l"(a) : "memory");
      asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(a), "f"(y0 + x.x),
                   "f"(y1 + x.y), "f"(y2 + x.z), "f"(y3 + x.w) : "memory");
    } else {
{% if arch == "sm_90" or arch == "sm_90a" then %}
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(a), "f"(x.x), "f"(x.y),
                   "f"(x.z), "f"(x.w) : "memory");
{% else %}
      red_add_f32(a, x.x);
      red_add_f32(a + 1, x.y);
      red_add_f32(a + 2, x.z);
      red_add_f32(a + 3, x.w);
{% end %}
    }
  }
}
// Adds the m16n8 fragment of a split's dK or dV (rows g, g + 8 of row0 on, columns c, c + 1;
// row stride D) to dkv_accum: vector reductions (add_dq_tile), or in deterministic mode (behind
// dkv_wait) a plain load, add and store, L2-coherent (.cg), so the bits are those of the z
// order every run. Called by every lane of the warp.
FG_DEV void dkv_add(const fg_bwd_params &p, float *row0, int g, int t, int c, int nrows, float x0,
                    float x1, float x2, float x3) {
  if (!det_order(p)) {
    add_dq_tile(row0, g, t, c, nrows, x0, x1, x2, x3);
    return;
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (g + 8 * hh < nrows) {
      float *a = row0 + (g + 8 * hh) * D + c, y0, y1;
      asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];\n" : "=f"(y0), "=f"(y1) : "l"(a) : "memory");
      y0 += hh ? x2 : x0;
      y1 += hh ? x3 : x1;
      asm volatile("st.global.cg.v2.f32 [%0], {%1, %2};\n" ::"l"(a), "f"(y0), "f"(y1) : "memory");
    }
  }
}

// The blocks of the _pre and _post grids (ceil(Nq / 64), B * Hq) that serve (batch, KV head)
// bhk's dkv_accum: the G query heads' blocks, numbered l = 0 ... L - 1.
struct dkv_share {
  u32 bhk;
  i64 l, L;
};
FG_DEV dkv_share dkv_share_of(const fg_bwd_params &p, u32 b, u32 h) {
  const u32 G = (u32)p.hq_per_hkv;
  return {b * (u32)p.heads_kv + h / G, (i64)(h % G) * gridDim.x + blockIdx.x, (i64)G * gridDim.x};
}
// One row of D fp32 values at acc_row, times sc, into dst in the element type (16-byte chunks
// over the lanes of a warp).
FG_DEV void row_out(const float *acc_row, u16 *dst, float sc, int lane) {
  for (int c = lane; c < CHUNKS; c += 32) {
    u32 x[8];
    ld_global_v4(acc_row + c * 8, x[0], x[1], x[2], x[3]);
    ld_global_v4(acc_row + c * 8 + 4, x[4], x[5], x[6], x[7]);
    u32 y[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) y[i] = pack2<BF16>(__int_as_float(x[2 * i]) * sc, __int_as_float(x[2 * i + 1]) * sc);
    st_global_v4(dst + c * 8, y[0], y[1], y[2], y[3]);
  }
}
#ifdef DQ_TILED
// The tiled accumulator's width: D, or (a template that defines DQ_W: bwd_tma.cu) its tiles'
// width, D rounded up to 64-column blocks (the columns past D are sums of the TMA's zeros).
#ifndef DQ_W
#define DQ_W D
#endif
// The dQ accumulator in the consumers' fragment order (a template that defines DQ_TILED, with DQ_N
// and NT_Q: bwd_tma.cu). Per (batch, query head) its query rows rounded up to BR (the plan's
// workspace rows) in chunks of 64 rows x DQ_W floats; a chunk holds DQ_W / DQ_N parts (a warpgroup's
// 64 rows x DQ_N columns of a dQ tile), each NT_Q groups of 128 float4s: group nt's float4 of
// warpgroup thread c (warp w = c / 32, g = c % 32 / 4, t = c % 4) is dq[4 nt ... 4 nt + 3] of
// the wgmma fragment: rows 16 w + g and 16 w + g + 8, columns 8 nt + 2 t and 8 nt + 2 t + 1 of the
// part. The consumers store a part with one float4 per thread and group (no bank conflicts) and
// the dQ warp adds it with one bulk reduction; _post puts the rows back in order.
static_assert(PRE_ROWS == 64 && BR % 64 == 0 && DQ_W % DQ_N == 0 && NT_Q == DQ_N / 8 && D <= DQ_W, "64-row chunks");
// Deterministic mode, the warp that adds a tile's parts with bulk reductions (every lane calls
// these): waits until the tile's semaphore (rows q0 ...) reaches PARTS times this key block's
// rank (the key blocks before it in the tile's order have added all their parts), ordering
// those additions before the warp's bulk ones, and returns the rank; then, once the warp's
// additions are complete (not only read), passes the tile on (PARTS more): each lane waits for its
// own bulk operations and orders them before its generic accesses, and lane 0's release after the
// warp's barrier is cumulative over the lanes (as CUTLASS's Barrier::arrive_inc: a barrier, then
// one thread's release), so no lane fences (a __threadfence each cost deterministic mode 1.02-1.07x
// at d = 64 / 128, N = 512-4k; bench/NOTES.md session 29).
template <u32 PARTS> FG_DEV u32 dq_bulk_acquire(const fg_bwd_params &p, const u32 *sem, i64 q0, int lane) {
  const u32 rank = dq_rank(p, q0);
  if (lane == 0) {
    while (ld_acquire(sem) < PARTS * rank) {
    }
  }
  __syncwarp();
  fence_proxy_async_global();
  return rank;
}
// Deterministic mode of a template that defines DQ_STORE_FIRST (bwd_tma.cu; bwd_tmat.cu, from
// registers), and without it one that defines DQ_CLAIM_FIRST (bwd_tma.cu: dq_claim, below):
// the first key block of a tile's order (rank 0), or the first to claim the part,
// stores its parts where the others add theirs, so _pre leaves the
// accumulator unwritten (zeroing it wrote all of it once more: 128 MiB at B N = 16k, H d = 2048)
// and _post reads zeros for a tile that no key block adds (dq_tile_added). Every key block of the
// order adds every part below Nq (dq_rank), so rank 0 writes all of the tile's chunks that _post reads.
#ifndef DQ_STORE_FIRST
#define DQ_STORE_FIRST 0
#endif
#ifndef DQ_CLAIM_FIRST
#define DQ_CLAIM_FIRST 0
#endif
FG_DEV bool dq_store_first(const fg_bwd_params &p) {
  return det_order(p) ? DQ_STORE_FIRST : DQ_CLAIM_FIRST;
}
// Whether any key block adds to the dQ tile of rows q0 ...: without a mask all of them do (dq_rank);
// causal (bottom-right) those up to jmax, none where the tile's last row comes before the first key.
FG_DEV bool dq_tile_added(const fg_bwd_params &p, i64 q0) {
  if (p.seqlen_k <= 0) return false;  // (no key block at all: _post writes dQ = 0)
  if constexpr (CAUSAL) return q0 + BR - 1 + p.seqlen_k - p.seqlen_q >= 0;
  return true;
}
// Without deterministic mode (DQ_CLAIM_FIRST) each 64-row part of a dQ tile has the semaphore
// of its first row (p.sem, zeroed by _pre): a dQ warp about to write the part counts itself in
// (lane 0, an atomic); the first stores the part and, once the store is complete, sets DQ_STORED
// (dq_bulk_release<DQ_STORED>); the others wait for that before they add theirs. No key block
// waits for more than one store that was issued when it claimed, so the order of the additions
// still varies, nobody waits for a block that has not started (no residency needed), and the
// accumulator is never zeroed: 128 MiB less written and read again at B N = 16k, H d = 2048.
constexpr u32 DQ_STORED = 0x80000000u;
// Whether this warp's key block is the part's first (sem: the part's semaphore; every lane calls
// it, and gets the same answer); the others return once the first's store is complete.
FG_DEV bool dq_claim(u32 *sem, int lane) {
  u32 old = 0;
  if (lane == 0) asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(sem) : "memory");
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old == 0) return true;
  if (lane == 0) {
    while (ld_acquire(sem) < DQ_STORED) {
    }
  }
  __syncwarp();
  fence_proxy_async_global();
  return false;
}
// One bulk operation of a part: stored (the tile's first, dq_store_first) or added.
FG_DEV void dq_bulk_put(void *dst, u32 src, u32 bytes, bool store) {
  if (store)
    bulk_store(dst, src, bytes);
  else
    bulk_reduce_add_f32(dst, src, bytes);
}
// (FENCE: each lane fences too, as before; the portable bwd.cu keeps it, as its kernel was not
// measured nor checked on a GPU without it.)
template <u32 PARTS, bool FENCE = false> FG_DEV void dq_bulk_release(u32 *sem, int lane) {
  bulk_wait0();
  fence_proxy_async_global();
  if constexpr (FENCE) __threadfence();
  __syncwarp();
  if (lane == 0) asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(sem), "n"(PARTS) : "memory");
}
FG_DEV i64 dq_chunks(const fg_bwd_params &p) { return (p.seqlen_q + BR - 1) / BR * (BR / 64); }
FG_DEV float *dq_chunk(const fg_bwd_params &p, i64 bh, i64 c) {
  return dq_acc(p) + (bh * dq_chunks(p) + c) * 64 * DQ_W;
}
// _post's block: its 64-row chunk times sc, through shared memory (dynamic: the plan's _post step
// declares 64 rows of DQ_W + 8 elements; padded by 16 bytes, the fragments' 4-byte stores hit
// every bank once), into dQ's rows below Nq, columns below D.
FG_DEV void dq_chunk_out(const fg_bwd_params &p, u32 bh, u32 b, u32 h, float sc) {
  constexpr int ROW = DQ_W + 8;  // u16 per staged row
  extern __shared__ __align__(16) u16 st[];
  const int c = threadIdx.x, g = c % 32 / 4, t = c % 4, r = 16 * (c / 32) + g;
  const float *chunk = dq_chunk(p, bh, blockIdx.x);
  // (unwritten where no key block added the chunk's tile: dq_store_first)
  const bool zero = dq_store_first(p) && !dq_tile_added(p, (i64)blockIdx.x * 64 / BR * BR);
#pragma unroll
  for (int part = 0; part < DQ_W / DQ_N; ++part) {
#pragma unroll
    for (int nt = 0; nt < NT_Q; ++nt) {
      u32 x[4] = {0u, 0u, 0u, 0u};
      if (!zero) ld_global_v4(chunk + ((part * NT_Q + nt) * 128 + c) * 4, x[0], x[1], x[2], x[3]);
      const int col = part * DQ_N + 8 * nt + 2 * t;
      *(u32 *)&st[r * ROW + col] = pack2<BF16>(__int_as_float(x[0]) * sc, __int_as_float(x[1]) * sc);
      *(u32 *)&st[(r + 8) * ROW + col] = pack2<BF16>(__int_as_float(x[2]) * sc, __int_as_float(x[3]) * sc);
    }
  }
  __syncthreads();
  const i64 q0 = (i64)blockIdx.x * 64;
  for (int i = c; i < 64 * CHUNKS; i += PRE_THREADS) {
    const int rr = i / CHUNKS, ch = i % CHUNKS;
    if (q0 + rr >= p.seqlen_q) break;
    const uint4 y = *(const uint4 *)&st[rr * ROW + ch * 8];
    st_global_v4((u16 *)p.dq + b * p.dq_sb + h * p.dq_sh + (q0 + rr) * p.dq_sn + ch * 8, y.x, y.y, y.z, y.w);
  }
}
#endif
}  // namespace

// D = rowsum(dO * O) in fp32; zeroes the row's dQ accumulator (but dq_store_first's). Grid (ceil(Nq / 64), B * Hq).
extern "C" __global__ void __launch_bounds__(PRE_THREADS) {{ entry }}_pre(BWD_PARAMS) {
  BWD_PARAMS_BIND
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const u32 bh = blockIdx.y, b = bh / (u32)p.heads_q, h = bh % (u32)p.heads_q;
  for (int rr = warp; rr < PRE_ROWS; rr += PRE_THREADS / 32) {
    const i64 q = (i64)blockIdx.x * PRE_ROWS + rr;
    if (q >= p.seqlen_q) break;
    const u16 *o = (const u16 *)p.o + b * p.o_sb + h * p.o_sh + q * p.o_sn;
    const u16 *dout = (const u16 *)p.d_o + b * p.do_sb + h * p.do_sh + q * p.do_sn;
    float acc = 0.f;
    for (int c = lane; c < CHUNKS; c += 32) {
      u32 a[4], e[4];
      ld_global_v4(o + c * 8, a[0], a[1], a[2], a[3]);
      ld_global_v4(dout + c * 8, e[0], e[1], e[2], e[3]);
#pragma unroll
      for (int i = 0; i < 4; ++i) acc += lo_f(a[i]) * lo_f(e[i]) + hi_f(a[i]) * hi_f(e[i]);
    }
    acc = warp_sum(acc);
    const i64 row = (i64)bh * p.seqlen_q + q;
    if (lane == 0) d_sum(p)[row] = acc;
#ifndef DQ_TILED
    float *acc_row = dq_acc(p) + row * D;
    for (int c = lane; c < D / 4; c += 32) st_global_v4(acc_row + c * 4, 0u, 0u, 0u, 0u);
#endif
  }
#ifdef DQ_TILED
  if (!dq_store_first(p)) {  // the accumulator's 64-row chunk of these rows (a tile's padding past Nq included)
    float *chunk = dq_chunk(p, bh, blockIdx.x);
    for (int i = threadIdx.x; i < 64 * DQ_W / 4; i += PRE_THREADS) st_global_v4(chunk + 4 * i, 0u, 0u, 0u, 0u);
  }
#endif
  if (p.sem && threadIdx.x < PRE_ROWS / SEM_ROWS) {  // this block's rows' semaphores
    const i64 s = (i64)blockIdx.x * (PRE_ROWS / SEM_ROWS) + threadIdx.x;
    if (s < sems_per_head(p)) ((u32 *)p.sem)[(i64)bh * sems_per_head(p) + s] = 0u;
  }
  if (p.dkv) {  // long query ranges: this (batch, KV head)'s dkv_accum, semaphores included
    const dkv_share sh = dkv_share_of(p, b, h);
    float *base = dkv_block(p, sh.bhk, 0);
    const i64 n4 = (p.seqlen_k + BC - 1) / BC * (DKV_FLOATS / 4);
    for (i64 i = sh.l * PRE_THREADS + threadIdx.x; i < n4; i += sh.L * PRE_THREADS)
      st_global_v4(base + 4 * i, 0u, 0u, 0u, 0u);
  }
  if (p.dkv_tail) {  // the tail's key blocks (fg_params.h), shared out over the whole grid
    const i64 n4 = p.tail_blocks * (DKV_FLOATS / 4), l = (i64)blockIdx.y * gridDim.x + blockIdx.x;
    for (i64 i = l * PRE_THREADS + threadIdx.x; i < n4; i += (i64)gridDim.x * gridDim.y * PRE_THREADS)
      st_global_v4((float *)p.dkv_tail + 4 * i, 0u, 0u, 0u, 0u);
  }
}

// dQ = scale * accumulator, in the element type, at dQ's strides; for long query ranges (p.dkv)
// dK = scale * dkv_accum's dK and dV = its dV too. Grid (ceil(Nq / 64), B * Hq).
extern "C" __global__ void __launch_bounds__(PRE_THREADS) {{ entry }}_post(BWD_PARAMS) {
  BWD_PARAMS_BIND
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const u32 bh = blockIdx.y, b = bh / (u32)p.heads_q, h = bh % (u32)p.heads_q;
  const float sc = (float)p.scale;
#ifdef DQ_TILED
  dq_chunk_out(p, bh, b, h, sc);
#else
  for (int rr = warp; rr < PRE_ROWS; rr += PRE_THREADS / 32) {
    const i64 q = (i64)blockIdx.x * PRE_ROWS + rr;
    if (q >= p.seqlen_q) break;
    row_out(dq_acc(p) + ((i64)bh * p.seqlen_q + q) * D,
            (u16 *)p.dq + b * p.dq_sb + h * p.dq_sh + q * p.dq_sn, sc, lane);
  }
#endif
  if (p.dkv) {  // long query ranges: a warp per key row of this (batch, KV head)
    const dkv_share sh = dkv_share_of(p, b, h);
    const u32 hk = sh.bhk % (u32)p.heads_kv;
    constexpr int W = PRE_THREADS / 32;
    for (i64 k = sh.l * W + warp; k < p.seqlen_k; k += sh.L * W) {
      const float *blk = dkv_block(p, sh.bhk, k / BC) + (k % BC) * D;
      row_out(blk, (u16 *)p.dk + b * p.dk_sb + hk * p.dk_sh + k * p.dk_sn, sc, lane);
      row_out(blk + BC * D, (u16 *)p.dv + b * p.dv_sb + hk * p.dv_sh + k * p.dv_sn, 1.f, lane);
    }
  }
  if (p.dkv_tail) {  // the tail's key blocks: a warp per key row, shared out over the whole grid
    constexpr int W = PRE_THREADS / 32;
    const i64 nkb = (p.seqlen_k + BC - 1) / BC, l = (i64)blockIdx.y * gridDim.x + blockIdx.x;
    for (i64 i = l * W + warp; i < p.tail_blocks * BC; i += (i64)gridDim.x * gridDim.y * W) {
      const i64 at = p.tail_first + i / BC, k = at % nkb * BC + i % BC;  // linear key block, key row
      if (k >= p.seqlen_k) continue;
      const u32 bk = (u32)(at / nkb / p.heads_kv), hk = (u32)(at / nkb % p.heads_kv);
      const float *row = (const float *)p.dkv_tail + (i / BC) * DKV_FLOATS + (i % BC) * D;
      row_out(row, (u16 *)p.dk + bk * p.dk_sb + hk * p.dk_sh + k * p.dk_sn, sc, lane);
      row_out(row + BC * D, (u16 *)p.dv + bk * p.dv_sb + hk * p.dv_sh + k * p.dv_sn, 1.f, lane);
    }
  }
}

