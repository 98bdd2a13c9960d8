// bwd_producer.cuh: what the warp-specialised backward templates (bwd_tma.cu, bwd_tmat.cu) do
// alike in their producer warpgroup, rendered inside their kernels by Lua functions (included
// with {% include("bwd_producer.cuh") %}; text, not functions: the verified cubins stay byte for
// byte). They use the kernel's names: p, P (the tensor maps), tid, bars, sbase, sgen and the
// constants BAR_KV, KV_BYTES, K_OFF, V_OFF, Q_OFF, QT_BYTES, DP, BC, BR, STAGES, L_OFF,
// PRODUCER_REGS, bar_full, bar_empty.
//   {% bwd_producer_enter() %}  past the block's last barrier: the tail's empty pieces leave, and
//                               the producer warpgroup (tid < 128) opens its branch with its
//                               registers given up and the block's place (warp, lane, b, hk, G, sp)
//   {% bwd_producer_kv() %}     (one thread) the tensor maps prefetched, K and V loaded once
//   {% bwd_producer_qdo(q0) %}  (that thread, then) Q and dO of every item into its stage (Q_OFF:
//                               STAGES x (Q, dO), QT_BYTES each) once the consumers freed it (q0:
//                               the item's first query row, an expression of it)
//   {% bwd_producer_lse(q0) %}  (one warp) LSE * log2(e) and D of every item into its stage, then
//                               one arrival per lane on the stage's full barrier (q0: the item's
//                               first query row, an expression of it)
{% function bwd_producer_enter() %}
  __syncthreads();  // the last block-wide barrier: the producer warps leave early
  if (place_splits() == 0) return;  // past the tail's last piece (bwd_place_of)

  if (tid < 128) {
    // The producer warpgroup. Items (query head of the group, query block) as bwd_span_of.
    regs_dec<PRODUCER_REGS>();
    const int warp = tid / 32, lane = tid % 32;
    const u32 bhk = KV_HEAD_BLOCK(p), b = bhk / (u32)p.heads_kv, hk = bhk % (u32)p.heads_kv;
    const int G = (int)p.hq_per_hkv;
    const bwd_span sp = bwd_span_now(p);
{% end %}
{% function bwd_producer_kv() %}
#pragma unroll
      for (int m = 0; m < 4; ++m) tma_prefetch_map(&P.tmap[m]);
      mbar_expect_tx(bars + BAR_KV, 2 * KV_BYTES);
      const int k0 = (int)k0_of(p);
#pragma unroll
      for (int c = 0; c < DP / 64; ++c) {
        tma_load_4d(sbase + K_OFF + (u32)c * BC * 128, &P.tmap[2], 64 * c, k0, (int)hk, (int)b, bars + BAR_KV);
        tma_load_4d(sbase + V_OFF + (u32)c * BC * 128, &P.tmap[3], 64 * c, k0, (int)hk, (int)b, bars + BAR_KV);
      }
{% end %}
{% function bwd_producer_qdo(q0) %}
      for (int it = 0; it < sp.n_items; ++it) {
        const int st = it % STAGES;
        if (it >= STAGES) mbar_wait(bars + bar_empty(st), (u32)(it / STAGES + 1) & 1);
        const int h = (int)hk * G + it / sp.per_head, q0 = {{ q0 }};
        const u32 s_q = sbase + Q_OFF + (u32)st * 2 * QT_BYTES;
        mbar_expect_tx(bars + bar_full(st), 2 * QT_BYTES);
#pragma unroll
        for (int c = 0; c < DP / 64; ++c) {
          tma_load_4d(s_q + (u32)c * BR * 128, &P.tmap[0], 64 * c, q0, h, (int)b, bars + bar_full(st));
          tma_load_4d(s_q + QT_BYTES + (u32)c * BR * 128, &P.tmap[1], 64 * c, q0, h, (int)b, bars + bar_full(st));
        }
      }
{% end %}
{% function bwd_producer_lse(q0) %}
      for (int it = 0; it < sp.n_items; ++it) {
        const int st = it % STAGES;
        if (it >= STAGES) mbar_wait(bars + bar_empty(st), (u32)(it / STAGES + 1) & 1);
        const i64 h = (i64)hk * G + it / sp.per_head, q0 = {{ q0 }};
        load_lse_d((float *)(sgen + L_OFF + st * 2 * BR * 4), p, b, h, q0, lane, 32);
        mbar_arrive(bars + bar_full(st));
      }
{% end %}
