// wgmma.cuh: Hopper (sm_90a) helpers shared by the wgmma templates (fwd_wgmma.cu, bwd_wgmma.cu):
// the 128-byte-swizzled tile loader, shared-memory matrix descriptors (and fresh, which keeps derived
// descriptors from being hoisted), the wgmma fences, commit and wait, and the async-proxy fence.
// Included after common.cuh with {% include("wgmma.cuh") %}.

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

// A descriptor the compiler must form anew where it is used (volatile): descriptors derived from
// it by adding offsets (desc + (bytes >> 4)) are then not hoisted out of the loop over blocks
// and kept live (16 64-bit K and V descriptors at d = 128: registers the accumulators need).
FG_DEV u64 fresh(u64 x) {
  u64 r;
  asm volatile("mov.b64 %0, %1;\n" : "=l"(r) : "l"(x));
  return r;
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


// The wgmma instructions a template uses, rendered for its shapes by the Lua functions below
// (defined here, called from the including template, which passes the names and shapes):
//   {% wgmma_ss("name", n, ta, tb) %}  FG_DEV void name(float *d, u64 da, u64 db, int scale_d):
//       d (64 x n, f32) = (scale_d ? d : 0) + A B over one k-step of 16, A and B from shared
//       memory through descriptors; ta / tb = 1: A / B stored MN-major (transposed).
//   {% wgmma_rs("name", n) %}  FG_DEV void name(float *d, const u32 *a, u64 db): d (64 x n) += A B
//       over 16, A from registers (the mma.sync m16k16 fragment, per warp), B MN-major.
{% function wgmma_list(n, f) local t = {} for i = 0, n - 1 do t[#t + 1] = f(i) end return table.concat(t, ", ") end %}
{% function wgmma_regs(n, from) return wgmma_list(n, function(i) return "%" .. (from + i) end) end %}
{% function wgmma_outs(n) return wgmma_list(n, function(i) return '"+f"(d[' .. i .. '])' end) end %}
{% function wgmma_ss(fname, n, ta, tb) %}
FG_DEV void {{ fname }}(float *d, u64 da, u64 db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %{{ n // 2 + 2 }}, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n{{ n }}k16.f32.{{ dtype }}.{{ dtype }} "
               "{ {{ wgmma_regs(n // 2, 0) }} }, %{{ n // 2 }}, %{{ n // 2 + 1 }}, p, 1, 1, {{ ta }}, {{ tb }};\n}\n"
               : {{ wgmma_outs(n // 2) }}
               : "l"(da), "l"(db), "r"(scale_d));
}
{% end %}
{% function wgmma_rs(fname, n) %}
FG_DEV void {{ fname }}(float *d, const u32 *a, u64 db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %{{ n // 2 + 5 }}, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n{{ n }}k16.f32.{{ dtype }}.{{ dtype }} "
               "{ {{ wgmma_regs(n // 2, 0) }} }, { {{ wgmma_regs(4, n // 2) }} }, %{{ n // 2 + 4 }}, p, 1, 1, 1;\n}\n"
               : {{ wgmma_outs(n // 2) }}
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
{% end %}
