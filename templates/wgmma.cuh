// wgmma.cuh: Hopper (sm_90a) helpers shared by the wgmma templates (fwd_wgmma.cu, bwd_wgmma.cu):
// the 128-byte-swizzled tile loader, shared-memory matrix descriptors, the wgmma fences, commit
// and wait, and the async-proxy fence. Included after common.cuh with {% include("wgmma.cuh") %}.

// Copies ROWS rows of 8 * CHUNKS columns (row stride in elements) from global into the swizzled
// tile at sbase (1024-byte aligned) with cp.async, by THREADS threads: 16-byte chunk c of row r
// goes to column block c / 8, row r, chunk (c % 8) ^ (r % 8). Rows at or past rows_left are
// zero-filled.
template <int ROWS, int CHUNKS, int THREADS>
FG_DEV void load_sw(u32 sbase, const u16 *g, i64 row_stride, i64 rows_left, int tid) {
  static_assert(THREADS % CHUNKS == 0, "threads cover whole rows");
  constexpr int RPI = THREADS / CHUNKS;  // rows per pass
  const int r0 = tid / CHUNKS, c = tid % CHUNKS;
  const int left = (int)(rows_left < ROWS ? rows_left : ROWS) - r0;
  const i64 lane_off = (r0 * row_stride + c * 8) * 2;
  const u32 dst = sbase + (u32)((c / 8) * ROWS * 128 + r0 * 128);
#pragma unroll
  for (int it = 0; it < (ROWS + RPI - 1) / RPI; ++it) {
    if (ROWS % RPI == 0 || r0 + it * RPI < ROWS) {
      const u32 sw = (u32)(((c % 8) ^ ((r0 + it * RPI) % 8)) * 16);
      cp_async16_row(dst + (u32)(it * RPI * 128) + sw, g + it * RPI * row_stride, lane_off, it * RPI < left);
    }
  }
}

// A shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (PTX ISA, "Matrix Descriptor Format").
FG_DEV u64 sw128_desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) | (1ull << 62);
}

FG_DEV void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
FG_DEV void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> FG_DEV void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Shared memory written by cp.async (the generic proxy) becomes visible to wgmma (the async
// proxy) after this fence in the writing thread, then a barrier.
FG_DEV void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of an accumulator across wgmma's asynchronous window.
template <int N> FG_DEV void fence_regs(float *d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

