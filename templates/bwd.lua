-- bwd.lua: the backward templates' plan, launch contracts and resource formulas (bwd.cu: mma.sync;
-- bwd_wgmma.cu, bwd_tma.cu, bwd_tmat.cu: sm_90a). The fit rule and the renderer read only this
-- file for backward variants, so a change to a template's shared-memory layout is made here, next
-- to the template, and nowhere else.
--
-- The plan is launch(v) below; runtime/backward.c launches its steps in order on the caller's
-- stream, and sizes the workspaces from it.
local M = {}

local function round_up(x, m) return (x + m - 1) // m * m end

-- Warp tiles: S and dP (Br x Bc, queries along rows) have WS warps along the Br queries and the
-- rest along the Bc keys; dK and dV (Bc x d) WM warps along the keys, the rest (WN) along the
-- columns; dQ (Br x d) WQ warps along the rows, WD along the columns. Each warp takes 32 rows (two
-- m16 tiles) where the block allows, so every B fragment read from shared memory feeds two MMAs
-- (FlashAttention-2's 2 x 4 / 4 x 2 layouts): d = 128, Br 64, Bc 128, 8 warps went from 204 to
-- 231 TFLOP/s (H100, bf16, N = 4k) against one m16 tile per warp. S with the queries along rows
-- (not S^T) gives each thread 4 query rows, so LSE and D are 8 values per thread, not one per
-- column. Where 32 query rows per warp do not split the keys into 16-column tiles, WS = WN (S^T's
-- layout transposed, which the rules below always allow). The head dimension is padded (with
-- zeros, in shared memory) to 16 columns per warp along it: d_pad = d rounded up to
-- 16 * max(WN, WD).
--
-- swz (sm_90, sm_90a; d a multiple of 64, where no column is padded and a row is whole groups
-- of eight 16-byte chunks): Q, dO, K and V rows are stored unpadded (row = d), the 16-byte
-- chunk c of row r at chunk c ^ (r % 8) (bwd.cu SWZ; FlashAttention-2's layout), so ldmatrix stays
-- free of bank conflicts without the 8-element pad. With the pad (rows of 272 bytes at d = 128)
-- the cp.async stores of Q and dO took 10.5 shared-memory wavefronts per instruction against 4
-- (Nsight Compute, H100); swizzled, the H100 ran d = 64 +3-4%, d = 128 +2-5%, d = 192 +4% and
-- d = 256 +5-6% (bench/NOTES.md, session 23). Elsewhere (sm_80/86/89, other head dims) the
-- padded rows, as measured before.
--
-- dq_bulk (sm_90, sm_90a): each query block's dQ goes through shared memory (Br x d floats after
-- P and dS, in the accumulator's tiled fragment order: bwd_aux.cuh, DQ_TILED; then a 16-byte
-- slot for the mbarrier on which the warps say they have stored theirs) and is added with
-- bulk reductions (cp.reduce.async.bulk) where Br = 128 (two 64-row chunks of the tiled
-- accumulator) and the block's shared memory still fits; elsewhere (and on sm_80/86/89) every
-- thread adds its fragments with reductions of its own. Measured on an H100 against those
-- (bench/NOTES.md, session 21): d = 64 Br 128 +2-3%; d = 128 Br 64 -1-2%, so Br 64 keeps them.
local SM90_SMEM = 232448  -- shared memory one block may opt into on sm_90 (227 KB)
local function kv_outer_smem(v, row)
  local tile = v.bc * row * 2
  local stage = 2 * v.br * row * 2 + 2 * v.br * 4
  local pds = 2 * v.br * (v.bc + 8) * 2
  return 2 * tile + v.stages * stage + pds
end
-- The wgmma loops' tiles are 64-column blocks: d rounded up to 64 (kv_tma pads head dims off them
-- with the TMA's zeros; kv_wgmma takes only multiples of 64). Their templates render it as dp.
local function tma_dp(v) return (v.d + 63) // 64 * 64 end
function M.layout(v)
  if v.loop == "kv_wgmma" or v.loop == "kv_tma" then return { dp = tma_dp(v) } end
  local wm = math.min(v.warps, math.max(1, v.bc // 32))
  if v.br % (16 * (v.warps // wm)) ~= 0 then wm = math.min(v.warps, v.bc // 16) end
  local wq = math.min(v.warps, math.max(1, v.br // 32))
  local ws = wq
  if v.br % (16 * ws) ~= 0 or v.bc % (16 * (v.warps // ws)) ~= 0 then ws = v.warps // wm end
  local split = math.max(v.warps // wm, v.warps // wq)
  local d_pad = round_up(v.d, 16 * split)
  local dq_bulk = (v.arch == "sm_90" or v.arch == "sm_90a") and v.br == 128 and
                  kv_outer_smem(v, d_pad + 8) + v.br * v.d * 4 + 32 <= SM90_SMEM
  local swz = (v.arch == "sm_90" or v.arch == "sm_90a") and d_pad == v.d and v.d % 64 == 0
  return { d_pad = d_pad, row = swz and v.d or d_pad + 8, wm = wm, wq = wq, ws = ws, dq_bulk = dq_bulk,
           swz = swz }
end

-- Registers per thread: the dK and dV accumulators (kept across the whole loop), S and dP
-- (one query block), the dQ block (after S and dP die), and about 56 for addresses, loop
-- control and fragments in flight. A first fit (NVRTC 13.0): the built-in variants compile
-- without spills at estimates of 120-248; ptxas takes up to 255 at 8 warps whatever the
-- estimate, and spilled 8-20 B at d = 104..128 with Br 64 double-buffered (estimate 216).
local function regs_estimate(v, L)
  local wn, wd = v.warps // L.wm, v.warps // L.wq
  local mt = v.bc // (16 * L.wm)
  local dkv = 2 * mt * (L.d_pad // (8 * wn)) * 4
  local sdp = 2 * mt * (v.br // (8 * wn)) * 4
  local dq = (v.br // (16 * L.wq)) * (L.d_pad // (8 * wd)) * 4
  return dkv + math.max(sdp, dq) + 56
end

-- kv_wgmma (bwd_wgmma.cu, sm_90a): one warpgroup (4 warps) per 64 of the Bc keys. K, V, the
-- Q/dO stages and dS^T are stored unpadded in 64-column blocks, 128-byte swizzled, from a
-- 1024-byte aligned base (1 KB more for the alignment); then LSE and D per stage. Registers per
-- thread: dK and dV (d / 2 each), S^T and dP^T (Br / 2 each), P^T packed (Br / 4), the dQ tile
-- (a warpgroup's 64 x dqn, dqn / 2: after S^T and dP^T die), less 8 that ptxas overlaps. Fitted
-- to ptxas (NVRTC 13.0): d = 128 Br 64 Bc 128 uses 247 (estimated 232), d = 64 Br 128 Bc 128 254
-- (248), d = 64 Br 64 Bc 64 180 (168); d = 128 Br 64 Bc 64 (264: dQ 64 x 128 per warpgroup)
-- spilled 112 B.
local function wgmma_loop(v) return v.loop == "kv_wgmma" end

local function wgmma_resources(v)
  local dqn = (v.br // 64 == v.bc // 64) and v.d or v.d // (v.bc // 64)
  return { threads = 32 * v.warps,
           smem = 1024 + (2 * v.bc * v.d + v.stages * 2 * v.br * v.d + v.bc * v.br) * 2 +
                  v.stages * 2 * v.br * 4,
           regs = v.d + v.br + v.br // 4 + dqn // 2 - 8 }
end

local function wgmma_check(v)
  if v.arch ~= "sm_90a" then
    return "kv_wgmma needs sm_90a: wgmma is an instruction of Hopper (compute capability 9.0) only"
  end
  if v.d ~= 64 and v.d ~= 128 then
    return "kv_wgmma takes d = 64 or 128 (tiles of 64-column blocks; dK and dV of d = 256 " ..
           "would not fit in registers)"
  end
  if (v.bc ~= 64 and v.bc ~= 128) or v.warps ~= v.bc // 16 then
    return "kv_wgmma gives each warpgroup (4 warps) 64 keys: Bc must be 64 or 128 and warps Bc / 16"
  end
  if v.stages ~= 2 then return "kv_wgmma takes 2 stages (Q and dO double-buffered)" end
  if v.br ~= 64 and v.br ~= 128 then return "kv_wgmma takes Br = 64 or 128" end
  -- dQ's tiles: a 64-row block per warpgroup, or one block split by columns (d = 128).
  local mb, nwg = v.br // 64, v.bc // 64
  if not (mb == nwg or (mb == 1 and nwg == 2 and v.d == 128)) then
    return "kv_wgmma splits dQ (Br x d) into one 64-row block per warpgroup, or one block into " ..
           "64-column halves at d = 128: Br must be 64 x (Bc / 64), or Br = 64 with Bc = 128 at d = 128"
  end
  return nil
end

-- kv_tma (bwd_tma.cu, sm_90a): kv_wgmma's tiles and math with a producer warpgroup in front of the
-- 2 consumer warpgroups (8 warps, 64 keys each; 128 threads more): one thread loads K and V once
-- and Q, dO per query block into `stages` buffers with TMA, one warp LSE and D, one or two warps
-- add each dQ tile to the accumulator with bulk reductions from shared memory (two buffers where
-- each warpgroup owns whole rows of the tile: Br 128 at d = 64). Shared memory, from a 1024-byte
-- aligned base: K, V; the Q/dO stages; two dS^T buffers (each block's dQ reads them one block
-- later); the fp32 dQ tile in the consumers' fragment order (the accumulator's layout: below),
-- dq_bufs deep (2 where that fits in the 227 KB of a block, so the consumers write a tile while
-- the last one is still being added; else 1); LSE and D per stage. The mbarriers (under 256
-- bytes) sit in the 1 KB allocated for the alignment, before the base or after the layout.
-- Registers: the producer gives its own up (setmaxnreg 40), the consumers take 232; the block's
-- 64K over its 384 threads is what the fit rule counts (168 each: what ptxas reports for the
-- kernel, which launches with that many).
-- Head dims off 64-column blocks (a multiple of 8 up to 128) run on tiles dp wide (d rounded up
-- to 64): the TMA fills the columns past d with zeros (bwd_tma.cu DP), so their shapes are those
-- of d = dp.
local function tma_loop(v) return v.loop == "kv_tma" end
local TMA_BLOCK_REGS = 65536

-- Above d = 128 kv_tma is bwd_tmat.cu: dK and dV computed transposed (d along the products' rows,
-- split over the 2 consumer warpgroups by 64-row m-tiles), S and dP split over them by keys, P^T
-- and dS^T through shared memory (two buffers), dQ added from registers with vector reductions
-- into the accumulator tiled in the fragments' order (tiled_dq, parts of 64 x 64). Query and key
-- blocks of 64; shared memory, from a 1024-byte aligned base: K, V; the Q/dO stages; two buffers
-- of P^T and dS^T (Bc x Br each); LSE and D per stage (226 KB at d = 256 with 2 stages; the end's
-- fp32 dK / dV staging reuses the stages and buffers). Registers: warpgroup 0 holds dK^T and
-- dV^T of ceil(dp / 128) m-tiles (Bc / 2 floats each per m-tile) and 32 of dQ (one 64-column part
-- at a time).
local function tmat_loop(v) return v.loop == "kv_tma" and v.d > 128 end
local function tmat_smem(v)
  local dp = tma_dp(v)
  return 1024 + (2 * v.bc * dp + v.stages * 2 * v.br * dp + 4 * v.bc * v.br) * 2 +
         v.stages * 2 * v.br * 4
end
local function tmat_check(v)
  if v.br ~= 64 or v.bc ~= 64 or v.warps ~= 8 then
    return "kv_tma above d = 128 (dK and dV transposed) takes Br = 64, Bc = 64 and 8 consumer warps"
  end
  if v.stages ~= 2 then return "kv_tma above d = 128 takes 2 stages of Q and dO" end
  return nil
end

local function tma_smem(v, dq_bufs)
  local dp = tma_dp(v)
  return 1024 + (2 * v.bc * dp + v.stages * 2 * v.br * dp + 2 * v.bc * v.br) * 2 +
         dq_bufs * v.br * dp * 4 + v.stages * 2 * v.br * 4
end
local function tma_dq_bufs(v) return tma_smem(v, 2) <= SM90_SMEM and 2 or 1 end

local function tma_resources(v)
  return { threads = 32 * v.warps + 128,
           smem = tmat_loop(v) and tmat_smem(v) or tma_smem(v, tma_dq_bufs(v)),
           regs = TMA_BLOCK_REGS // (32 * v.warps + 128) // 8 * 8 }
end

local function tma_check(v)
  if v.arch ~= "sm_90a" then
    return "kv_tma needs sm_90a: TMA and wgmma are instructions of Hopper (compute capability 9.0)"
  end
  if v.d % 8 ~= 0 then return "kv_tma takes a multiple of 8 for d" end
  if v.d > 128 then return tmat_check(v) end
  if v.bc ~= 128 or v.warps ~= 8 then
    return "kv_tma has two consumer warpgroups of 64 keys: Bc = 128, warps = 8"
  end
  if v.stages ~= 2 and v.stages ~= 3 then return "kv_tma takes 2 or 3 stages of Q and dO" end
  local dp = tma_dp(v)
  if not ((v.br == 64 and dp == 128) or (v.br == 128 and dp == 64) or (v.br == 64 and dp == 64)) then
    return "kv_tma splits dQ (Br x d) into one 64-row block per warpgroup (Br = 128 at d <= 64) " ..
           "or one block into 64-column halves (Br = 64 at d = 72..128)"
  end
  return nil
end

function M.resources(v)
  if wgmma_loop(v) then return wgmma_resources(v) end
  if tma_loop(v) then return tma_resources(v) end
  local L = M.layout(v)
  -- (then 16 bytes for the block's place: bwd.cu SLOT_OFF)
  return { threads = 32 * v.warps, smem = kv_outer_smem(v, L.row) + (L.dq_bulk and v.br * v.d * 4 + 16 or 0) + 16,
           regs = regs_estimate(v, L) }
end

-- Rules the template adds to the shared structural ones (core/variant.c).
function M.check(v)
  if wgmma_loop(v) then return wgmma_check(v) end
  if tma_loop(v) then return tma_check(v) end
  if v.loop ~= "kv_outer" then
    return "the backward pass takes the loop orders kv_outer (K/V blocks outer, seed 003; " ..
           "mma.sync), kv_wgmma (the same on Hopper's wgmma) and kv_tma (kv_wgmma fed by TMA)"
  end
  if v.stages ~= 1 and v.stages ~= 2 then
    return "backward takes 1 or 2 stages (Q/dO single- or double-buffered)"
  end
  if v.warps ~= 4 and v.warps ~= 8 and v.warps ~= 16 then
    return "backward takes 4, 8 or 16 warps"
  end
  if v.br > 128 or v.bc > 128 then return "backward takes Br and Bc up to 128" end
  local L = M.layout(v)
  local wn = v.warps // L.wm
  if L.wm * wn ~= v.warps or (v.bc // 16) % L.wm ~= 0 then
    return "backward needs Bc / 16 to be a multiple or a divisor of the warp count"
  end
  if v.br % (16 * wn) ~= 0 then
    return "backward with " .. v.warps .. " warps and Bc = " .. v.bc .. " splits the Br = " ..
           v.br .. " queries of S over " .. wn .. " warps: Br must be a multiple of " .. 16 * wn
  end
  if (v.br // 16) % L.wq ~= 0 or v.warps % L.wq ~= 0 then
    return "backward needs Br / 16 to be a multiple or a divisor of the warp count"
  end
  return nil
end

function M.entry(v) return "fg_" .. v.name end

-- The plan's auxiliary kernels (bwd.cu renders PRE_ROWS, PRE_THREADS and SEM_ROWS from these,
-- through launch(v).constants): query rows and threads per block of _pre and _post, and query
-- rows per semaphore of deterministic mode.
local AUX_ROWS, AUX_THREADS, SEM_ROWS = 64, 128, 16
-- Long query ranges. Each key block sums dK and dV over every query row of its (batch, KV head)
-- group, seqlen_q * heads_q / heads_kv rows, in the tensor cores' fp32 accumulators, whose
-- additions truncate: the error grows with the rows (check bwd/big: 16.8M rows, dK 1.5x over the
-- tolerance, and one block of 1 SM doing all the work). Past SPLIT_ROWS rows the main step's grid
-- gets a z dimension of ceil(rows / SPLIT_ROWS) splits (runtime: fg_plan_step_splits), each a
-- contiguous part of every key block's query blocks summed as below the threshold, then added
-- into the fp32 workspace dkv_accum (bwd_aux.cuh: dkv_block), which _pre zeroes and _post
-- converts into dK and dV. Below it nothing changes: no workspace, one split, the same kernels.
-- Per key block of each (batch, KV head): dK then dV (Bc x d floats each), then DKV_SEM_FLOATS
-- floats, the first of them the block's semaphore of deterministic mode (the splits add in
-- order); 16 bytes, so every block stays 16-byte aligned for vector reductions.
local SPLIT_ROWS, DKV_SEM_FLOATS = 65536, 4

-- The plan (core/fg_kernel.h), run in order with one fg_bwd_params:
--   <entry>_pre   grid q_tiles (ceil(Nq / 64), B * Hq), 128 threads: D = rowsum(dO * O), the dQ
--                 accumulator := 0 (and the semaphores, deterministic)
--   <entry>       grid kv_tiles (ceil(Nk / Bc), B * Hkv[, splits past SPLIT_ROWS]): the main
--                 kernel (br holds Bc)
--   <entry>_post  grid q_tiles, 128 threads: dQ = scale * accumulator (and past SPLIT_ROWS dK =
--                 scale * dK sum, dV = dV sum from dkv_accum)
-- Workspaces, one after the other: per (batch, query head) the fp32 dQ accumulator (d floats per
-- query row, at p.workspace; kv_tma's in tiles of Br rows: launch below); past SPLIT_ROWS, per key block of each (batch, KV head), the fp32
-- dK/dV sums and a semaphore (dkv_accum at p.dkv; second, so that it starts 16-byte aligned);
-- per (batch, query head) D (1 float per row, p.dsum) and in deterministic mode (bwd_tma.cu at
-- Br 64: in either mode) a 4-byte semaphore per 16 query rows (p.sem).
--
-- The plan of a backward template whose main kernel takes `threads` and `smem` (another
-- backward template returns its own through this, with its own main kernel).
-- The tail (tail = true on the main step: bwd.cu, bwd_tma.cu and bwd_tmat.cu; runtime/backward.c chooses
-- it, fg_plan_step_tail): without a mask, every key block of a head sums over the same query
-- rows, so the grid's blocks take equally long and its last wave, partial, leaves the rest of the
-- SMs idle for a whole block (measured on an H100, 132 SMs: d = 64 N = 16k, 4096 blocks, 31.03
-- waves: 33 heads took as long as 32). There the runtime splits the last wave's key blocks'
-- query ranges into pieces that the wave's SMs share; the pieces add their dK/dV partial sums
-- into the workspace dkv_tail (one key block of it per tail key block: the launch's tail, not per
-- head), which _pre zeroes and _post converts, as dkv_accum past SPLIT_ROWS.
local function plan(v, template, threads, smem, tail)
  local e = M.entry(v)
  local t = {
    template = template, main = 2,
    steps = {
      { entry = e .. "_pre", grid = "q_tiles", br = AUX_ROWS, threads = AUX_THREADS, smem = 0 },
      { entry = e, grid = "kv_tiles", br = v.bc, threads = threads, smem = smem,
        split_rows = SPLIT_ROWS, tail = tail },
      { entry = e .. "_post", grid = "q_tiles", br = AUX_ROWS, threads = AUX_THREADS, smem = 0 },
    },
    workspaces = {
      { name = "dq_accum", param = "workspace", bytes = 4 * v.d, rows = 1 },
      { name = "dkv_accum", param = "dkv", bytes = 4 * (2 * v.bc * v.d + DKV_SEM_FLOATS),
        rows = v.bc, per = "key", min_group_rows = SPLIT_ROWS },
      { name = "dsum", param = "dsum", bytes = 4, rows = 1 },
      { name = "semaphores", param = "sem", bytes = 4, rows = SEM_ROWS, deterministic = true },
    },
    constants = { pre_rows = AUX_ROWS, pre_threads = AUX_THREADS, sem_rows = SEM_ROWS,
                  dkv_sem_floats = DKV_SEM_FLOATS },
  }
  if tail then
    table.insert(t.workspaces, 3, { name = "dkv_tail", param = "dkv_tail",
                                    bytes = 4 * (2 * v.bc * v.d + DKV_SEM_FLOATS), rows = v.bc,
                                    per = "key", tail = true })
  end
  return t
end

-- dQ's accumulator in tiles of Br rows (each head's rows rounded up to them) laid out as the
-- mma fragments (bwd_aux.cuh, DQ_TILED: kv_tma, and kv_outer's dq_bulk), so that bulk reductions
-- add whole parts of a tile; _post puts a 64-row chunk back in row order through shared memory
-- (rows of the tiles' width + 8 elements: d, or kv_tma's dp).
local function tiled_dq(t, v, width)
  t.workspaces[1].rows, t.workspaces[1].bytes = v.br, 4 * width * v.br
  t.steps[3].smem = 64 * (width + 8) * 2
end

function M.launch(v)
  local r = M.resources(v)
  if tma_loop(v) then
    local t = plan(v, tmat_loop(v) and "bwd_tmat.cu" or "bwd_tma.cu", r.threads, r.smem, true)
    t.params = "bwd_tma"
    tiled_dq(t, v, tma_dp(v))  -- (tiles dp wide: bwd_tma.cu, bwd_tmat.cu DQ_W)
    -- bwd_tmat.cu with a causal mask runs deterministic mode's order also without it up to 1024
    -- keys (bwd_aux.cuh: det_order; H100 d = 160 / 192 / 256 1.08-1.13x at 512-1k, 0.99-1.01x at
    -- 2k, 0.96x at 4k; without a mask 0.96-1.00x at 512), so it has the semaphores in either mode.
    t.constants.det_order_max_keys = tmat_loop(v) and v.causal and 1024 or 0
    if not tmat_loop(v) then
      t.constants.dq_bufs = tma_dq_bufs(v)
      -- One dQ part a tile (Br 64: NDQ 1), bwd_tma.cu claims each part through its semaphore
      -- also without deterministic mode (bwd_aux.cuh: dq_claim), so it has them in either mode.
      -- Not with two (d = 64, Br 128): there the claims' waits cost 8% at N = 512-1k, where
      -- d = 128 gained 1-17% (H100, bench/NOTES.md session 29).
      t.constants.dq_claim = v.br // 64 ~= v.bc // 64 and 1 or 0
    end
    if t.constants.det_order_max_keys > 0 or t.constants.dq_claim == 1 then
      for _, w in ipairs(t.workspaces) do
        if w.name == "semaphores" then w.deterministic = nil end
      end
    end
    t.tmaps = { { tensor = "q", rows = v.br }, { tensor = "do", rows = v.br },
                { tensor = "k", rows = v.bc }, { tensor = "v", rows = v.bc } }
    return t
  end
  local t = plan(v, wgmma_loop(v) and "bwd_wgmma.cu" or "bwd.cu", r.threads, r.smem, not wgmma_loop(v))
  if not wgmma_loop(v) and M.layout(v).dq_bulk then tiled_dq(t, v, v.d) end
  return t
end

function M.q_in_regs(v) return false end

return M
