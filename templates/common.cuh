// common.cuh: device helpers shared by the kernel templates, written over PTX so the generated
// source needs no toolkit header: 16/8-bit types, fp16/bf16 conversion, cp.async, ldmatrix and
// mma.sync m16n8k16. Included by templates with {% include("common.cuh") %}.
typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;

#define FG_DEV __device__ __forceinline__

#define FG_NEG_INF (__int_as_float(0xff800000))

// pick<B, T, F>::type is T when B, else F (std::conditional, which the generated source cannot include).
template <bool B, class T, class F> struct pick { typedef T type; };
template <class T, class F> struct pick<false, T, F> { typedef F type; };

{% include("fg_params.h") %}

// The block's coordinates and the thread index, read anew on every call (volatile: the compiler
// may not keep an earlier read, or values derived from it, alive in registers across a long loop).
FG_DEV u32 ctaid_x() { u32 r; asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(r)); return r; }
FG_DEV u32 ctaid_y() { u32 r; asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(r)); return r; }
FG_DEV u32 tid_x() { u32 r; asm volatile("mov.u32 %0, %%tid.x;" : "=r"(r)); return r; }
FG_DEV u32 nctaid_x() { u32 r; asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(r)); return r; }
FG_DEV u32 nctaid_y() { u32 r; asm volatile("mov.u32 %0, %%nctaid.y;" : "=r"(r)); return r; }
FG_DEV u32 nsmid() { u32 r; asm volatile("mov.u32 %0, %%nsmid;" : "=r"(r)); return r; }

// A grid of nx x ny blocks (x fastest: the GPU starts the blocks in the order of L = y nx + x)
// where x = 0 is each row's longest block (a causal grid: query or key blocks by cost) ends on a
// tail when the rows go one after another: the last rows' longest blocks start last. Dealt
// instead in ng groups of rows (the ny rows split evenly), within a group x slow and y fast, each
// group runs longest first while its blocks still come from few rows (sharing them in L2): block
// L takes (*x, *y). 32-bit: ny (gridDim.y) is at most 65535, so (yl + 1) ng and gi ny fit.
// Host copy and tests: tests/test_tile_order.c.
FG_DEV void deal_grouped(u32 L, u32 nx, u32 ny, u32 ng, u32 &x, u32 &y) {
  const u32 yl = L / nx, gi = ((yl + 1) * ng - 1) / ny;  // the group of row yl in launch order
  const u32 y0 = gi * ny / ng, gs = (gi + 1) * ny / ng - y0, r = L - y0 * nx;
  x = r / gs;
  y = y0 + r % gs;
}
// Where rows are short (few blocks each) and their blocks must stay together to share them in L2,
// only the grid's tail is dealt so: the rows in launch order but for the last g (about one wave of
// blocks: ceil(SMs / nx)), which go as one group, x slow, so the grid ends on short blocks.
FG_DEV void deal_tail(u32 L, u32 nx, u32 ny, u32 &x, u32 &y) {
  const u32 g0 = (nsmid() + nx - 1) / nx, g = g0 < ny ? g0 : ny, y0 = ny - g;
  if (L < y0 * nx) {
    x = L % nx;
    y = L / nx;
  } else {
    const u32 r = L - y0 * nx;
    x = r / g;
    y = y0 + r % g;
  }
}
// The causal grids' order (kv_tma's backward, fwd_tma.cu's forward without the persistent grid):
// under 16 blocks a row deal_tail, else deal_grouped in groups of about HALF_WAVES / 2 waves of
// blocks (the rows split evenly). Host copy: tests/test_tile_order.c, causal_pos.
template <u32 HALF_WAVES>
FG_DEV void deal_causal(u32 L, u32 nx, u32 ny, u32 &x, u32 &y) {
  if (nx < 16) {
    deal_tail(L, nx, ny, x, y);
  } else {
    const u32 ng0 = ny * nx * 2u / (HALF_WAVES * nsmid());
    deal_grouped(L, nx, ny, ng0 < 1 ? 1 : (ng0 > ny ? ny : ng0), x, y);
  }
}

// Shared-memory address of a generic pointer into shared memory.
FG_DEV u32 smem_addr(const void *p) {
  u32 r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

// A 64-bit shared load the compiler may not hoist out of a loop (volatile).
FG_DEV u64 ld_shared_u64(u32 saddr) {
  u64 r;
  asm volatile("ld.shared.u64 %0, [%1];" : "=l"(r) : "r"(saddr));
  return r;
}

// 16-byte global -> shared copy; when !pred nothing is read and the destination is zeroed.
FG_DEV void cp_async16(u32 dst, const void *src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 16 : 0));
}
// 4-byte global -> shared copy (through L1: .ca, the only form of this size); when !pred nothing
// is read and the destination is zeroed.
FG_DEV void cp_async4(u32 dst, const void *src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 4 : 0));
}
FG_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> FG_DEV void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

FG_DEV void ldsm_x4(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
FG_DEV void ldsm_x4_t(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// C += A * B for one m16n8k16 tile, fp32 accumulate.
template <bool BF16> FG_DEV void mma16816(float *c, const u32 *a, u32 b0, u32 b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> packed pair (lo in the low half), round to nearest even.
template <bool BF16> FG_DEV u32 pack2(float lo, float hi) {
  u32 r;
  if constexpr (BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// One 16-bit value <-> float.
template <bool BF16> FG_DEV float to_float(u16 x) {
  if constexpr (BF16) return __int_as_float(((u32)x) << 16);
  else {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(x));
    return f;
  }
}
template <bool BF16> FG_DEV u16 from_float(float f) {
  u16 r;
  if constexpr (BF16) asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(f));
  else asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(r) : "f"(f));
  return r;
}
// Rounds a float to the nearest value representable in the 16-bit type.
template <bool BF16> FG_DEV float round_to(float f) { return to_float<BF16>(from_float<BF16>(f)); }

FG_DEV float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
FG_DEV float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
FG_DEV float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// One 32-bit global store.
FG_DEV void st_global_u32(void *gdst, u32 x) {
  asm volatile("st.global.b32 [%0], %1;\n" ::"l"(gdst), "r"(x) : "memory");
}

// 16 bytes shared -> global.
FG_DEV void copy16_s2g(void *gdst, u32 saddr) {
  u32 a, b, c, d;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(saddr));
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"l"(gdst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// 16-byte global -> shared copy from grow + lane_off (bytes) to dst; when !pred nothing
// is read (the address is then grow itself) and the destination is zeroed. The 64-bit add is
// written in PTX so the compiler cannot re-associate lane_off with a row offset and hoist one
// 64-bit pointer per row out of the caller's loop.
FG_DEV void cp_async16_row(u32 dst, const void *grow, i64 lane_off, bool pred) {
  asm volatile("{ .reg .u64 a; add.s64 a, %1, %2; cp.async.cg.shared.global [%0], [a], 16, %3; }\n"
               ::"r"(dst), "l"(grow), "l"(pred ? lane_off : 0ll), "r"(pred ? 16 : 0));
}

// Copies ROWS rows of NCHUNK 16-byte chunks from global (row stride in elements) into shared
// rows of SROW elements, with cp.async; rows at or past rows_left are zero-filled. When the
// threads cover whole rows, each thread copies chunk c of rows r0, r0 + RPI, ...: its state is
// one 64-bit global offset and one shared offset, the row addresses are uniform, and the bound
// is one 32-bit compare per row.
// SW (rows of SROW = 8 NCHUNK elements, NCHUNK a multiple of 8): chunk c of row r goes to chunk
// c ^ (r % 8) of its row (bwd.cu, SWZ); where the rows per pass are a multiple of 8, every pass
// of a thread has the same XOR.
template <int ROWS, int NCHUNK, int SROW, int THREADS, bool SW = false, class TID>
FG_DEV void load_tile(u32 sbase, const u16 *g, i64 row_stride, i64 rows_left, TID tid) {
  if constexpr (THREADS % NCHUNK == 0) {
    constexpr int RPI = THREADS / NCHUNK;  // rows per pass
    static_assert(!SW || (NCHUNK % 8 == 0 && SROW == 8 * NCHUNK), "swizzled rows");
    const int r0 = (int)(tid / NCHUNK), c = (int)(tid % NCHUNK);  // unsigned when TID is (lean)
    const int left = (int)(rows_left < ROWS ? rows_left : ROWS) - r0;
    const i64 lane_off = (r0 * row_stride + c * 8) * 2;
    const u32 dst = sbase + (SW ? (u32)(r0 * SROW * 2) : (u32)(r0 * SROW + c * 8) * 2u);
#pragma unroll
    for (int it = 0; it < (ROWS + RPI - 1) / RPI; ++it) {
      const u32 sw = SW ? (u32)((c ^ ((r0 + it * RPI) & 7)) << 4) : 0u;
      if (ROWS % RPI == 0 || r0 + it * RPI < ROWS)
        cp_async16_row(dst + (u32)(it * RPI * SROW * 2) + sw, g + it * RPI * row_stride, lane_off, it * RPI < left);
    }
  } else {
    static_assert(!SW, "swizzled rows: threads cover whole rows");
#pragma unroll
    for (int it = 0; it < (ROWS * NCHUNK + THREADS - 1) / THREADS; ++it) {
      const int idx = tid + it * THREADS;
      if ((ROWS * NCHUNK) % THREADS == 0 || idx < ROWS * NCHUNK) {
        const int r = idx / NCHUNK, c = idx % NCHUNK;
        const bool ok = r < rows_left;
        cp_async16(sbase + (u32)(r * SROW + c * 8) * 2u, ok ? g + r * row_stride + c * 8 : g, ok);
      }
    }
  }
}

// The Q block a thread block of a "q_tiles" grid works on (x: Q blocks, the causal ones longest
// first; y: batch * heads_q): its batch and heads, first query row, the Q head and the K/V heads
// (GQA); then (fwd_block_span) how many K/V blocks of BC rows it sees, and the 32-bit bounds its
// mask needs. Two calls, so a kernel can do other set-up between them (in fwd_q_outer.cu's
// order, which ptxas allocates registers for at the edge of 255).
struct fwd_block {
  u32 bh, b, h, hk;
  i64 q0, diag;  // diag = seqlen_k - seqlen_q: key j is visible to query i iff j <= i + diag
  const u16 *gQ, *gK, *gV;
  int n_blocks;
  int nk32, qdiag32;  // seqlen_k; q0 + seqlen_k - seqlen_q (key j is seen by row i iff j <= i + it)
};
// The block of query tile q_tile of (batch, head) pair bh.
template <int BR, bool CAUSAL> FG_DEV fwd_block fwd_block_at(const fg_fwd_params &p, i64 q_tile, u32 bh) {
  fwd_block f;
  f.bh = bh;
  // 32-bit division: bh (blockIdx.y, or a persistent block's tile) and heads_q are below the
  // grid's y limit per launch (runtime/forward.c).
  f.b = f.bh / (u32)p.heads_q;
  f.h = f.bh % (u32)p.heads_q;
  f.hk = f.h / (u32)p.hq_per_hkv;
  f.q0 = q_tile * BR;
  f.diag = p.seqlen_k - p.seqlen_q;
  f.gQ = (const u16 *)p.q + f.b * p.q_sb + f.h * p.q_sh + f.q0 * p.q_sn;
  f.gK = (const u16 *)p.k + f.b * p.k_sb + f.hk * p.k_sh;
  f.gV = (const u16 *)p.v + f.b * p.v_sb + f.hk * p.v_sh;
  f.n_blocks = f.nk32 = f.qdiag32 = 0;
  return f;
}
template <int BR, bool CAUSAL> FG_DEV fwd_block fwd_block_of(const fg_fwd_params &p) {
  // Causal: the last Q blocks see the most keys; launch them first so the short ones fill the tail.
  const i64 q_tile = CAUSAL ? (i64)(gridDim.x - 1 - blockIdx.x) : (i64)blockIdx.x;
  return fwd_block_at<BR, CAUSAL>(p, q_tile, blockIdx.y);
}
// A "persistent" grid (gridDim.x blocks, each looping over tiles): the k-th tile of this block,
// false past the last. Both orders are head-major, so the tiles that run together belong to few
// heads and share K and V in L2 (an order that ran every head's last query block first, then the
// ones before, read K and V twice from memory: 33% L2 hits against 53%, d = 128 causal N = 512,
// bench/NOTES.md session 11).
// - Without a mask every tile costs the same: block x takes ranks k * grid + x on even k and
//   k * grid + grid - 1 - x on odd k (a snake).
// - With one, a tile costs its query block's keys (q + 1 key blocks at Nq = Nk, Br = Bc): the tiles
//   go in units of two that cost about the same, one head's query blocks j and tiles_q - 1 - j; with
//   tiles_q odd the middle blocks of two neighbouring heads make a unit, between the two heads'
//   other units (a last head without a neighbour has its middle block alone, the last tile). In
//   round r (tiles k = 2r, 2r + 1) block x takes unit r * grid + (x + r) % grid of that unit-major
//   sequence: the rotation keeps a block from taking the same kind of unit every round where the
//   units' costs repeat with a period dividing the grid (tiles_q odd). The blocks' totals stay
//   within about one unit of each other without an atomic tile counter (a zeroed word per call).
//   (x + r) % grid is taken in 32 bits: a block takes fewer than 2^32 tiles.
// tests/test_tile_order.c checks this order (every tile once, the balance, the heads of a round)
// on a C transcription of it: change both together (and fwd_tma.cu's fwd_unit_tile, the dynamic
// order's scheduler, which hands out the same units in 32 bits). The code's shape is ptxas's: the producer
// runs it in 24 registers, and equivalent forms (a shared C function, a macro) spilled 88-124 B.
template <int BR, bool CAUSAL>
FG_DEV bool fwd_persistent_tile(const fg_fwd_params &p, i64 k, i64 &q_tile, u32 &bh) {
  const i64 tiles_q = (p.seqlen_q + BR - 1) / BR, pairs = p.batch * p.heads_q;
  const i64 grid = gridDim.x, x = blockIdx.x;
  if constexpr (CAUSAL) {
    const i64 r = k >> 1, half = k & 1, m = (tiles_q - 1) / 2;
    const i64 g = 2 * (r * grid + (i64)(((u32)x + (u32)r) % (u32)grid)) + half;
    if (g >= tiles_q * pairs) return false;
    const i64 h2 = g / (2 * tiles_q), v = g - h2 * 2 * tiles_q;
    i64 head, q;
    if (tiles_q % 2 == 0) {
      const i64 second = v >= tiles_q, j = (v - second * tiles_q) >> 1;
      head = 2 * h2 + second;
      q = half ? tiles_q - 1 - j : j;
    } else {
      const i64 u = v >> 1, j = u < m ? u : u - m - 1;
      head = 2 * h2 + (u == m ? half : u > m);
      q = u == m ? m : half ? tiles_q - 1 - j : j;
    }
    q_tile = q;
    bh = (u32)head;
  } else {
    const i64 r = k * grid + ((k & 1) ? grid - 1 - x : x);
    if (r >= tiles_q * pairs) return false;
    q_tile = r % tiles_q;
    bh = (u32)(r / tiles_q);
  }
  return true;
}
template <int BR, int BC, bool CAUSAL> FG_DEV void fwd_block_span(fwd_block &f, const fg_fwd_params &p) {
  const i64 Nk = p.seqlen_k;
  i64 nb64 = (Nk + BC - 1) / BC;
  if constexpr (CAUSAL) {
    const i64 last_key = f.q0 + BR - 1 + f.diag;  // the last key this block's last row sees
    nb64 = last_key < 0 ? 0 : (last_key / BC + 1 < nb64 ? last_key / BC + 1 : nb64);
  }
  f.n_blocks = (int)nb64;  // seqlen_k < 2^31 (validated), so the block count fits
  // 32-bit copies for the mask: Nk < 2^31 and q0 + Nk - Nq lies in (-2^31, 2^31).
  f.nk32 = (int)Nk;
  f.qdiag32 = (int)(f.q0 + f.diag);
}

// Zeroes the columns [D, DP) of NROWS shared rows (the k-padding of the mma), once per kernel.
template <int NROWS, int D, int DP, int SROW, int THREADS>
FG_DEV void zero_pad_columns(u16 *s, int tid) {
  if constexpr (DP != D) {
    constexpr int PC = (DP - D) / 8;
    for (int idx = tid; idx < NROWS * PC; idx += THREADS) {
      u32 *w = (u32 *)(s + (idx / PC) * SROW + D + (idx % PC) * 8);
      w[0] = 0u; w[1] = 0u; w[2] = 0u; w[3] = 0u;
    }
  }
}
