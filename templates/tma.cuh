// tma.cuh: Hopper (sm_90a) helpers of the warp-specialised templates (fwd_tma.cu): mbarriers,
// TMA tile loads from a tensor map (cp.async.bulk.tensor) and the warpgroup register moves
// (setmaxnreg), and two consumer warpgroups' turns (ping-pong). Included after common.cuh and
// wgmma.cuh with {% include("tma.cuh") %}. The tensor maps are encoded on the host
// (runtime/forward.c) and reach the kernel inside its __grid_constant__ parameter
// (fg_fwd_tma_params.tmap), whose generic address the TMA takes.

// An mbarrier (8 bytes of shared memory) expecting `count` arrivals per phase.
FG_DEV void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised mbarriers visible to the other threads and to the TMA unit; a
// __syncthreads() follows.
FG_DEV void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// One arrival that also announces `bytes` more to be written by the TMA in this phase.
FG_DEV void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
FG_DEV void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` (0 for the first, 1 for the second, ...) completes.
FG_DEV void mbar_wait(u32 bar, u32 parity) {
  asm volatile("{\n.reg .pred p;\nFG_MBAR_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               "@!p bra FG_MBAR_WAIT;\n}\n" ::"r"(bar), "r"(parity)
               : "memory");
}

// Clusters (a kernel compiled with __cluster_dims__): this block's rank in its cluster; the
// address, in the cluster's shared window, of the location at a of the block of rank `rank`; one
// arrival on an mbarrier of another block (its cluster_map address; the default semantics,
// release at CTA scope, as CUTLASS's cluster barriers: with .release.cluster, a fence at cluster
// scope on every arrival, q_tma_c ran 0.63x); a barrier of every thread of the cluster's blocks
// (release / acquire at cluster scope).
FG_DEV u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
FG_DEV u32 cluster_map(u32 a, u32 rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
FG_DEV void mbar_arrive_remote(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
FG_DEV void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Loads the box at coordinates (c0 column, c1 row, c2 head, c3 batch) of the 4-d tensor map at
// tmap (a generic address) into shared memory at dst, completing `bytes` on the mbarrier bar.
FG_DEV void tma_load_4d(u32 dst, const void *tmap, int c0, int c1, int c2, int c3, u32 bar) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
               "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
               "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
               : "memory");
}
// tma_load_4d into every block of the cluster whose bit is set in mask (bit i: rank i), at dst's
// offset in each, completing the box's bytes on the mbarrier at bar's offset in each.
FG_DEV void tma_load_4d_mc(u32 dst, const void *tmap, int c0, int c1, int c2, int c3, u32 bar, u16 mask) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
               "[%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
               "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(mask)
               : "memory");
}
// Stores the box at coordinates (c0 .. c3) of the tensor map at tmap from shared memory at src
// (a bulk group: commit it, then wait for its reads before src is reused or the block exits).
FG_DEV void tma_store_4d(const void *tmap, u32 src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
               ::"l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}
FG_DEV void st_shared_b32(u32 a, u32 x) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(x) : "memory"); }
FG_DEV void st_shared_f4(u32 a, float x, float y, float z, float w) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}
FG_DEV void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
FG_DEV void bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Adds `bytes` (a multiple of 16) of fp32 values from shared memory at src to global memory at dst,
// element by element atomically, as one bulk operation of the current bulk group.
FG_DEV void bulk_reduce_add_f32(void *dst, u32 src, u32 bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "r"(bytes) : "memory");
}
// Copies `bytes` (a multiple of 16) from shared memory at src to global memory at dst, as one bulk
// operation of the current bulk group.
FG_DEV void bulk_store(void *dst, u32 src, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
// Waits until this thread's bulk groups are complete (their writes done, not only their reads).
FG_DEV void bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Orders this thread's global accesses of the generic proxy and of the async proxy (bulk
// operations) on either side of it.
FG_DEV void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
FG_DEV void tma_prefetch_map(const void *tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tmap) : "memory");
}

// Registers of the calling warpgroup (every thread of it executes these): the producer gives
// registers back, the consumers take them (a multiple of 8 from 24 to 256).
template <int N> FG_DEV void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> FG_DEV void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

// Ping-pong of two consumer warpgroups (256 threads; bwd_tma.cu's turns, fwd_tma.cu's PP):
// warpgroup wg waits for its turn on named barrier 4 + wg (pingpong_wait) and hands the next to
// the other with an arrival on 5 - wg (pingpong_pass). Every turn a warpgroup waits for must be
// handed to it once: whichever goes first is handed its first turn by the other before any wait,
// and an arrival on a warpgroup's own barrier (pingpong_close) takes up a turn handed to it that
// it will not wait for.
FG_DEV void pingpong_wait(int wg) { asm volatile("bar.sync %0, 256;\n" ::"r"(4 + wg) : "memory"); }
FG_DEV void pingpong_pass(int wg) { asm volatile("bar.arrive %0, 256;\n" ::"r"(5 - wg) : "memory"); }
FG_DEV void pingpong_close(int wg) { asm volatile("bar.arrive %0, 256;\n" ::"r"(4 + wg) : "memory"); }
