// bwd_consumer.cuh: what the Hopper backward templates (bwd_wgmma.cu, bwd_tma.cu) compute alike
// for one warpgroup of 64 keys, rendered inside their kernels by Lua functions (included after
// wgmma.cuh with {% include("bwd_consumer.cuh") %}, called after the template's constants). They
// use the kernel's names: k_wg, v_wg (the warpgroup's K and V rows), s_q, s_do, s_l (this query
// block's Q, dO, LSE/D), q0, p, wg, wr, g, t, sl2, Nk, diag, dk, dv (the accumulators), b, hk (for
// the stores); and the constants D, DP (the tiles' width: D rounded up to 64-column blocks, whose
// columns past D hold zeros; bwd_tma.cu), BR, BC, KSTEPS, NT_S, NT_D (DP / 8), CAUSAL, BF16; and
// the template parameter dp (DP, from bwd.lua's layout).
//   {% bwd_wgmma_decls() %}      the wgmma instructions of the four products (wgmma.cuh) and the
//                                shared-memory helpers both kernels use
//   {% bwd_sdp(after, split) %}  S^T = K Q^T and dP^T = V dO^T into s, dp, issued and waited for
//                                (after: code run between the commit and the wait, "" for none;
//                                split: two commit groups, only S^T waited for, bwd_pds waits
//                                for dP^T between P^T and dS^T)
//   {% bwd_pds("ds", split) %}   P^T packed into pa, dS^T stored at shared address ds (swizzled);
//                                split as bwd_sdp's (then P^T in place of S^T, under dP^T)
//   {% bwd_dv() %}               dV += P^T dO issued (committed, not waited for)
//   {% bwd_dk("ds") %}           dK += dS^T Q issued, this warpgroup's rows of the dS^T at ds
//   {% bwd_dkdv_split("tid") %}  a split's dK, dV added into dkv_accum, then return (tid: the
//                                thread's index among the working threads)
//   {% bwd_dkdv_store() %}       dK = scale * dK and dV stored in the element type
// Text, not functions: the verified kernels' cubins stay byte for byte what they were.
{% function bwd_wgmma_decls() %}
// d (64 x BR, f32) = A B^T over one k-step (16 columns of D), A (64 keys) and B (BR query rows)
// from shared memory, both K-major: S^T = K Q^T and dP^T = V dO^T. scale_d = 0 starts from zero.
{% wgmma_ss("wgmma_sdp", br, 0, 0) %}
// dV (64 x DP, f32) += P^T dO over 16 query rows: A = P^T from registers (the mma.sync m16k16
// fragment, per warp), B = dO (16 x DP) from shared memory, D-major (transposed).
{% wgmma_rs("wgmma_dv", dp) %}
// dK (64 x DP, f32) += dS^T Q over 16 query rows (called with scale_d = 1): A = dS^T from shared
// memory (key rows, K-major), B = Q (16 x DP) from shared memory, D-major (transposed).
{% wgmma_ss("wgmma_dk", dp, 0, 1) %}
// d (64 x DQ_N, f32) (+)= dS K over 16 keys: A = dS from dS^T in shared memory (query-major:
// transposed), B = K (16 x DQ_N) from shared memory, D-major (transposed).
{% wgmma_ss("wgmma_dq", (br // 64 == warps // 4) and dp or dp // (warps // 4), 1, 1) %}
FG_DEV void ld_shared_f2(u32 a, float &x, float &y) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(x), "=f"(y) : "r"(a));
}
FG_DEV void st_shared_f2(u32 a, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(x), "f"(y) : "memory");
}
FG_DEV void st_shared_u32(u32 a, u32 x) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(x) : "memory"); }
// Four 8 x 8 matrices of 16-bit elements from a warp's mma fragments (x[j]: matrix j, this lane's
// row lane / 4, columns 2 (lane % 4) ...) into shared memory, lane l giving the address of row l % 8
// of matrix l / 8 (sm_90+).
FG_DEV void stsm_x4(u32 a, u32 x0, u32 x1, u32 x2, u32 x3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(x0), "r"(x1), "r"(x2), "r"(x3)
               : "memory");
}
{% end %}
{% function bwd_sdp(after, split) %}
    float s[BR / 2], dp[BR / 2];
    const u64 dk_a = fresh(sw128_desc(k_wg, 16, 1024)), dv_a = fresh(sw128_desc(v_wg, 16, 1024));
    const u64 dq_b = fresh(sw128_desc(s_q, 16, 1024)), ddo_b = fresh(sw128_desc(s_do, 16, 1024));
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks)
      wgmma_sdp(s, dk_a + ((ks / 4) * BC * 128 + (ks % 4) * 32) / 16, dq_b + ((ks / 4) * BR * 128 + (ks % 4) * 32) / 16, ks > 0);
{% if split then %}
    wg_commit();
{% end %}
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks)
      wgmma_sdp(dp, dv_a + ((ks / 4) * BC * 128 + (ks % 4) * 32) / 16, ddo_b + ((ks / 4) * BR * 128 + (ks % 4) * 32) / 16, ks > 0);
    wg_commit();
{% if split then %}
{{ after }}    wg_wait<1>();
    fence_regs<BR / 2>(s);
{% else %}
{{ after }}    wg_wait<0>();
    fence_regs<BR / 2>(s);
    fence_regs<BR / 2>(dp);
{% end %}
{% end %}
// dS^T of n8 tiles nt - 1 and nt (dsx) to the buffer at ds after every odd tile (bwd_pds).
{% function bwd_ds_pair(ds) %}
      if (nt % 2 == 1)
        stsm_x4({{ ds }} + (u32)(((nt - 1) / 8) * BC * 128 + ds_r * 128 + ((((nt - 1) % 8) ^ ds_sw) * 16)), dsx[0], dsx[1],
                dsx[2], dsx[3]);
{% end %}
// bwd_pds's loop over the n8 tiles of S^T / dP^T; masked: true (the mask applied), false (none),
// or "uniform" (applied where need_mask holds).
{% function bwd_pds_tiles(ds, masked) %}
#pragma unroll
    for (int nt = 0; nt < NT_S; ++nt) {
      float l2[2], dd[2];
      ld_shared_f2(s_l + (u32)(8 * nt + 2 * t) * 4, l2[0], l2[1]);
      ld_shared_f2(s_l + (u32)(BR + 8 * nt + 2 * t) * 4, dd[0], dd[1]);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = wg * 64 + wr + g + 8 * hh;
        float pv[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * nt + 2 * hh + e;
          pv[e] = fast_exp2(fmaf(s[i], sl2, -l2[e]));
{% if masked == "uniform" then %}
          if (need_mask && !(r < kv_left && (!CAUSAL || r <= 8 * nt + 2 * t + e + dlim))) pv[e] = 0.f;
{% elseif masked then %}
          if (!(r < kv_left && (!CAUSAL || r <= 8 * nt + 2 * t + e + dlim))) pv[e] = 0.f;
{% end %}
          ds[e] = pv[e] * (dp[i] - dd[e]);
        }
        pa[nt / 2][(nt % 2) * 2 + hh] = pack2<BF16>(pv[0], pv[1]);
        dsx[(nt % 2) * 2 + hh] = pack2<BF16>(ds[0], ds[1]);
      }
{% bwd_ds_pair(ds) %}
    }
{% end %}
// bwd_pds's tiles with S^T and dP^T waited for apart (bwd_sdp's split): P^T = exp2(...) in place
// of S^T and packed for dV while dP^T's products run, then dS^T. kv_tma at Br 64 with its turns,
// where the element-wise phase decides how long the tensor pipe waits: fg_ab, H100, d = 128 4k
// +2-3%, 16k +3-5%, causal 2k +4%, 8k +7% (bench/NOTES.md, session 19; without the turns, in
// session 7, the same split gained nothing).
{% function bwd_pds_split(ds, masked) %}
#pragma unroll
    for (int nt = 0; nt < NT_S; ++nt) {
      float l2[2];
      ld_shared_f2(s_l + (u32)(8 * nt + 2 * t) * 4, l2[0], l2[1]);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = wg * 64 + wr + g + 8 * hh;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * nt + 2 * hh + e;
          s[i] = fast_exp2(fmaf(s[i], sl2, -l2[e]));
{% if masked then %}
          if (!(r < kv_left && (!CAUSAL || r <= 8 * nt + 2 * t + e + dlim))) s[i] = 0.f;
{% end %}
        }
        pa[nt / 2][(nt % 2) * 2 + hh] = pack2<BF16>(s[4 * nt + 2 * hh], s[4 * nt + 2 * hh + 1]);
      }
    }
    wg_wait<0>();  // dP^T
    fence_regs<BR / 2>(dp);
#pragma unroll
    for (int nt = 0; nt < NT_S; ++nt) {
      float dd[2];
      ld_shared_f2(s_l + (u32)(BR + 8 * nt + 2 * t) * 4, dd[0], dd[1]);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * nt + 2 * hh + e;
          ds[e] = s[i] * (dp[i] - dd[e]);
        }
        dsx[(nt % 2) * 2 + hh] = pack2<BF16>(ds[0], ds[1]);
      }
{% bwd_ds_pair(ds) %}
    }
{% end %}
{% function bwd_pds(ds, split) %}
    u32 pa[BR / 16][4];
    const i64 k0i = k0_of(p);  // k0, read anew (see key_block)
    const int kv_left = (int)(Nk - k0i < BC ? Nk - k0i : BC);
    const i64 dq_off = q0 + diag - k0i;
    const int dlim = (int)(dq_off > BC ? BC : (dq_off < -BR ? -BR : dq_off));
    const bool need_mask = kv_left < BC || (CAUSAL && dlim < BC - 1);
    const int ds_r = wg * 64 + wr + lane % 8 + 8 * ((lane / 8) % 2), ds_sw = (lane / 16) ^ (lane % 8);
    // dS^T leaves by stmatrix, four 8 x 8 matrices (n8 tiles nt, nt + 1 x row halves) per
    // instruction: lane l addresses row l % 8 of matrix l / 8, i.e. key row wr + l % 8 + 8 ((l / 8) % 2)
    // of the warpgroup's and 16-byte chunk nt + l / 16, swizzled by the row (chunk ^ row % 8; nt is
    // even, so (nt + l / 16) ^ (l % 8) = nt ^ ds_sw). Before: one 4-byte store per tile and row half
    // (NT_S x 2 per thread per query block).
    u32 dsx[4];
    // At Br 64, two copies of the tiles' loop: blocks that need no mask (every key of the block
    // present and, causal, the whole block below the diagonal) skip the select per element (32 per
    // thread and query block). With kv_tma's turns the element-wise phase decides how long the
    // tensor pipe waits: d = 128 4k-16k +0.5-1%, causal 8k +3% (fg_ab, session 19). At Br 128
    // (d = 64) two copies spilled 60-64 B (session 17): one loop there, its .text unchanged.
{% if split then %}
    if (need_mask) {
{% bwd_pds_split(ds, true) %}
    } else {
{% bwd_pds_split(ds, false) %}
    }
{% elseif br == 64 then %}
    if (need_mask) {
{% bwd_pds_tiles(ds, true) %}
    } else {
{% bwd_pds_tiles(ds, false) %}
    }
{% else %}
{% bwd_pds_tiles(ds, "uniform") %}
{% end %}
{% end %}
{% function bwd_dv() %}
    fence_regs<DP / 2>(dv);
    fence_regs<DP / 2>(dk);
    wg_fence();
    const u64 dv_b = fresh(sw128_desc(s_do, BR * 128, 1024));
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) wgmma_dv(dv, pa[kk], dv_b + kk * 2048 / 16);
    wg_commit();
{% end %}
{% function bwd_dk(ds) %}
    const u64 dk_a2 = fresh(sw128_desc({{ ds }} + (u32)wg * 64 * 128, 16, 1024));
    const u64 dk_b = fresh(sw128_desc(s_q, BR * 128, 1024));
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk)
      wgmma_dk(dk, dk_a2 + ((kk / 4) * BC * 128 + (kk % 4) * 32) / 16, dk_b + kk * 2048 / 16, 1);
    wg_commit();
{% end %}
{% function bwd_dkdv_split(tid) %}
  const float sc = (float)p.scale;
  const i64 k0e = k0_of(p);  // k0, read anew (see key_block)
  if (bwd_split()) {
    float *blk = dkv_block(p, KV_HEAD_BLOCK(p), k0e / BC);
    const int r0 = wg * 64 + wr, kvl = (int)(Nk - k0e < BC ? Nk - k0e : BC) - r0;
    dkv_wait(p, blk, {{ tid }});
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {  // the columns below D (dkv_accum's rows are D wide)
      dkv_add(p, blk + r0 * D, g, t, 8 * nt + 2 * t, kvl, dk[4 * nt], dk[4 * nt + 1], dk[4 * nt + 2], dk[4 * nt + 3]);
      dkv_add(p, blk + BC * D + r0 * D, g, t, 8 * nt + 2 * t, kvl, dv[4 * nt], dv[4 * nt + 1], dv[4 * nt + 2], dv[4 * nt + 3]);
    }
    dq_sem_release(p, dkv_sem(blk), {{ tid }});  // the next split's turn (deterministic mode)
    return;
  }
{% end %}
{% function bwd_dkdv_store() %}
  u16 *gdK = (u16 *)p.dk + b * p.dk_sb + hk * p.dk_sh + k0e * p.dk_sn;
  u16 *gdV = (u16 *)p.dv + b * p.dv_sb + hk * p.dv_sh + k0e * p.dv_sn;
  const int kv_left = (int)(Nk - k0e < BC ? Nk - k0e : BC);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = wg * 64 + wr + g + 8 * hh;
    if (r < kv_left) {
#pragma unroll
      for (int nt = 0; nt < NT_D; ++nt) {
        const int c = 8 * nt + 2 * t;
        st_global_u32(gdK + r * p.dk_sn + c, pack2<BF16>(dk[4 * nt + 2 * hh] * sc, dk[4 * nt + 2 * hh + 1] * sc));
        st_global_u32(gdV + r * p.dv_sn + c, pack2<BF16>(dv[4 * nt + 2 * hh], dv[4 * nt + 2 * hh + 1]));
      }
    }
  }
{% end %}
