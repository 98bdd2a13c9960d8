// fwd_softmax.cuh: the parts the Hopper forward templates (fwd_wgmma.cu, fwd_tma.cu) share
// word for word, rendered inside their kernels by Lua functions (included after wgmma.cuh with
// {% include("fwd_softmax.cuh") %}). They use the kernel's names: o, m, l (one warpgroup's O and
// the row max and sum of rows g and g + 8 of each warp), s (S of one block), pf (P in fp32), pa
// (P as wgmma A fragments), sl2, nk32, qdiag32, wrow, g, t, and for the epilogue p, b, h, bh, q0,
// Nq; and the constants D, BC, BR, NT_S, NT_O, CAUSAL, BF16, RESCALE_LOG2.
//   {% fwd_state("DC"[, "QBUF"]) %}  a consumer warpgroup's state: o (64 x DC, DC the columns
//                         of O it holds: D, or DP padded to 64-column blocks), m, l, sl2, wrow,
//                         q_base (this warpgroup's rows of the Q tile at QBUF, default sbase), s,
//                         pf, pa (uses warp, wg, sbase, p)
//   {% fwd_issue_qk("kst"[, "FRESH_Q"]) %}  S = Q K^T issued to the tensor cores, K's stage at
//                         kst; where the C++ condition FRESH_Q holds, Q's descriptor formed
//                         anew for each block (not kept in registers over the loop)
//   {% fwd_issue_pv("vst", "DC") %}  O += P V issued, V's stage at vst
//   {% fwd_wait_pv("DC") %}  the lambda wait_pv: O += P V done (a second call waits for nothing)
//   {% fwd_overlap_step([release]) %}  block j of the overlapped loop: S_{j+1} and O += P_j V_j
//                         issued, S_{j+1}'s softmax under that product (uses j, n_blocks; the
//                         statement release, if given, once S_{j+1} is done)
//   {% fwd_softmax(in_place[, turns]) %}  the lambdas softmax_of(x, wait_pv) and softmax(jb, wait_pv);
//                         in_place: a block that needs a mask waits for O += P V first and
//                         masks S where it is (else a masked copy in pf, under that product);
//                         turns: the exponentials run in this warpgroup's turn (tma.cuh's
//                         pingpong_wait before them, pingpong_pass once P is packed)
//   {% fwd_epilogue() %}  O normalised and stored from the accumulators, and the log-sum-exp
//                         (fwd_wgmma.cu; fwd_tma.cu stores O through shared memory and the TMA)
{% function fwd_state(dc, qbuf) %}
  float o[{{ dc }} / 2];  // this thread's share of the warpgroup's 64 x {{ dc }} output (wgmma's layout)
#pragma unroll
  for (int i = 0; i < {{ dc }} / 2; ++i) o[i] = 0.f;
  float m[2] = {FG_NEG_INF, FG_NEG_INF}, l[2] = {0.f, 0.f};  // rows g and g + 8 of the warp
  const float sl2 = (float)p.scale_log2;
  const int wrow = warp * 16;  // this warp's first row in the block
  const u32 q_base = {{ qbuf or "sbase" }} + (u32)(wg * 64 * 128);
  // S of one block (wgmma's accumulators), and its P in fp32 before packing. No other instruction
  // may write wgmma accumulators while any wgmma is in flight (ptxas would serialize the wgmma
  // pipeline, warning C7515), and O += P V runs during the softmax: P goes to pf.
  float s[BC / 2], pf[BC / 2];
  u32 pa[BC / 16][4];          // P as wgmma A fragments, k-step kk = keys 16 kk ... 16 kk + 15
{% end %}
{% function fwd_issue_qk(kst, fresh_q) %}
    wg_fence();
    {
      // Where FRESH_Q holds, Q's descriptor is formed for each block (fresh) and the k-steps' offset
      // added to it: ptxas kept a tile's 16 k-step descriptors in registers over the block loop,
      // which spilled at d = 240 / 256 (bench/NOTES.md session 37).
      constexpr bool FRESH_Q = {{ fresh_q or "false" }};
      const u64 qd = FRESH_Q ? fresh(sw128_desc(q_base, 16, 1024)) : 0;
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        const u32 q_off = (u32)(ks / 4) * BR * 128 + (u32)(ks % 4) * 32;
        wgmma_qk(s, FRESH_Q ? qd + (q_off >> 4) : sw128_desc(q_base + q_off, 16, 1024),
                 sw128_desc({{ kst }} + (u32)(ks / 4) * BC * 128 + (u32)(ks % 4) * 32, 16, 1024), ks > 0);
      }
    }
    wg_commit();
{% end %}
{% function fwd_issue_pv(vst, dc) %}
    fence_regs<{{ dc }} / 2>(o);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) wgmma_pv(o, pa[kk], sw128_desc({{ vst }} + (u32)kk * 2048, BC * 128, 1024));
    wg_commit();
{% end %}
{% function fwd_wait_pv(dc) %}
  auto wait_pv = [&] {  // a second call waits for nothing
    wg_wait<0>();
    fence_regs<{{ dc }} / 2>(o);
  };
{% end %}
{% function fwd_overlap_step(release) %}
      const bool next = j + 1 < n_blocks;
      if (next) issue_s(j + 1);
      issue_pv(j);
      if (next) {
        wg_wait<1>();  // S_{j+1}; O += P_j V_j may still run
        fence_regs<BC / 2>(s);
{% if release then %}
        {{ release }}
{% end %}
        softmax(j + 1, wait_pv);  // returns with O += P_j V_j done
      } else {
        wait_pv();
      }
{% end %}
{% function fwd_softmax(in_place, turns) %}
  // Softmax of x (S_jb, or its masked copy in pf) into pf: the lazy running max and the row sums;
  // then P packed into pa once wait_pv says O += P V of the previous block is done. O is
  // rescaled when a row's max grows (wait_pv first: O may be in the tensor cores' hands).
  auto softmax_of = [&](const float *x, auto wait_pv) {
    float mx[2];
    bool grow = false;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mr = m[hh];
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt) mr = fmaxf(mr, fmaxf(x[4 * nt + 2 * hh], x[4 * nt + 2 * hh + 1]));
      mx[hh] = quad_max(mr);
      grow |= (mx[hh] - m[hh]) * sl2 > RESCALE_LOG2;  // true for m = -inf < mx
    }
    if (__any_sync(0xffffffffu, grow)) {
      wait_pv();
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float m_use = mx[hh] == FG_NEG_INF ? 0.f : mx[hh];  // no key seen yet
        const float alpha = fast_exp2((m[hh] - m_use) * sl2);
        m[hh] = mx[hh];
        l[hh] *= alpha;
#pragma unroll
        for (int nt = 0; nt < NT_O; ++nt) {
          o[4 * nt + 2 * hh] *= alpha;
          o[4 * nt + 2 * hh + 1] *= alpha;
        }
      }
    }
{% if turns then %}
    pingpong_wait(wg);
{% end %}
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float mb = (m[hh] == FG_NEG_INF ? 0.f : m[hh]) * sl2;
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt) {
        const float p0 = fast_exp2(fmaf(x[4 * nt + 2 * hh], sl2, -mb));
        const float p1 = fast_exp2(fmaf(x[4 * nt + 2 * hh + 1], sl2, -mb));
        l[hh] += p0 + p1;
        pf[4 * nt + 2 * hh] = p0;
        pf[4 * nt + 2 * hh + 1] = p1;
      }
    }
    wait_pv();  // P of the previous block is read from pa until its product is done
#pragma unroll
    for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) pa[nt / 2][(nt % 2) * 2 + hh] = pack2<BF16>(pf[4 * nt + 2 * hh], pf[4 * nt + 2 * hh + 1]);
{% if turns then %}
    pingpong_pass(wg);
{% end %}
  };
  // Softmax of S_jb: keys past the end and, when causal, above the diagonal masked (only in blocks
  // that need it). s[4 nt + 2 hh + e] is row wrow + g + 8 hh, key 8 nt + 2 t + e.
  auto softmax = [&](int jb, auto wait_pv) {
    const int kv_left = nk32 - jb * BC, diag_off0 = qdiag32 - jb * BC;
    const bool need_mask = kv_left < BC || (CAUSAL && diag_off0 < BC - 1);
    if (need_mask) {
{% if in_place then %}
      // In place, once O += P V of the previous block is done (no wgmma may be in flight while
      // its accumulators are written): the masked copy's BC / 2 registers saved for larger
      // blocks, the overlap given up on the blocks that need a mask.
      wait_pv();
{% end %}
      const int kv_last = (kv_left < BC ? kv_left : BC) - 1 - 2 * t;
      const int diag_off = diag_off0 - 2 * t;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        int lim = kv_last;
        if constexpr (CAUSAL) {
          const int dl = wrow + g + hh * 8 + diag_off;
          lim = dl < lim ? dl : lim;
        }
#pragma unroll
        for (int nt = 0; nt < NT_S; ++nt) {
{% if in_place then %}
          if (nt * 8 > lim) s[4 * nt + 2 * hh] = FG_NEG_INF;
          if (nt * 8 + 1 > lim) s[4 * nt + 2 * hh + 1] = FG_NEG_INF;
{% else %}
          pf[4 * nt + 2 * hh] = nt * 8 > lim ? FG_NEG_INF : s[4 * nt + 2 * hh];
          pf[4 * nt + 2 * hh + 1] = nt * 8 + 1 > lim ? FG_NEG_INF : s[4 * nt + 2 * hh + 1];
{% end %}
        }
      }
{% if in_place then %}
      softmax_of(s, [] {});
{% else %}
      softmax_of(pf, wait_pv);
{% end %}
    } else {
      softmax_of(s, wait_pv);
    }
  };

{% end %}
{% function fwd_epilogue() %}
  // Epilogue: normalise and store O from the accumulators (each quad of lanes writes 16
  // contiguous bytes of a row), and the log-sum-exp.
  const int e_rows = (int)(Nq - q0 < BR ? Nq - q0 : BR);  // rows to write
  u16 *gO = (u16 *)p.o + b * p.o_sb + h * p.o_sh + q0 * p.o_sn;
  float *lse = (float *)p.lse;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float lsum = quad_sum(l[hh]);
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    const int r = wrow + g + hh * 8;
    if (r < e_rows) {
      u16 *row = gO + r * p.o_sn + 2 * t;
#pragma unroll
      for (int nt = 0; nt < NT_O; ++nt)  // columns past D (zero padding of the tiles) not stored
        if (nt * 8 < D) st_global_u32(row + nt * 8, pack2<BF16>(o[4 * nt + 2 * hh] * inv, o[4 * nt + 2 * hh + 1] * inv));
      if (lse != nullptr && t == 0)
        lse[bh * p.seqlen_q + q0 + r] = lsum > 0.f ? m[hh] * (float)p.scale + logf(lsum) : FG_NEG_INF;
    }
  }
{% end %}
