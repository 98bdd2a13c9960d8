-- bwd.lua: the backward template's plan, launch contracts and resource formulas (bwd.cu). The
-- fit rule and the renderer read only this file for backward variants, so a change to the
-- template's shared-memory layout is made here, next to the template, and nowhere else.
--
-- The plan is launch(v) below; runtime/backward.c launches its steps in order on the caller's
-- stream, and sizes the workspaces from it.
local M = {}

local function round_up(x, m) return (x + m - 1) // m * m end

-- Warp tiles: WM warps along the Bc keys of S^T, dK and dV, the rest (WN) along the queries of
-- S^T and the columns of dK and dV; WQ warps along the Br rows of dQ, WD along its columns. Each
-- warp takes 32 rows (two m16 tiles) where the block allows, so every B fragment read from
-- shared memory feeds two MMAs (FlashAttention-2's 2 x 4 / 4 x 2 layouts): d = 128, Br 64,
-- Bc 128, 8 warps went from 204 to 231 TFLOP/s (H100, bf16, N = 4k) against one m16 tile per
-- warp. The head dimension is padded (with zeros, in shared memory) to 16 columns per warp
-- along it: d_pad = d rounded up to 16 * max(WN, WD).
function M.layout(v)
  local wm = math.min(v.warps, math.max(1, v.bc // 32))
  if v.br % (16 * (v.warps // wm)) ~= 0 then wm = math.min(v.warps, v.bc // 16) end
  local wq = math.min(v.warps, math.max(1, v.br // 32))
  local split = math.max(v.warps // wm, v.warps // wq)
  local d_pad = round_up(v.d, 16 * split)
  return { d_pad = d_pad, row = d_pad + 8, wm = wm, wq = wq }
end

-- Registers per thread: the dK and dV accumulators (kept across the whole loop), S^T and dP^T
-- (one query block), the dQ block (after S^T and dP^T die), and about 56 for addresses, loop
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

function M.resources(v)
  local L = M.layout(v)
  local tile = v.bc * L.row * 2
  local stage = 2 * v.br * L.row * 2 + 2 * v.br * 4
  local pds = 2 * v.bc * (v.br + 8) * 2
  return { threads = 32 * v.warps, smem = 2 * tile + v.stages * stage + pds,
           regs = regs_estimate(v, L) }
end

-- Rules the template adds to the shared structural ones (core/variant.c).
function M.check(v)
  if v.loop ~= "kv_outer" then
    return "the backward pass has one loop order, kv_outer (K/V blocks outer, seed 003)"
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
           v.br .. " queries of S^T over " .. wn .. " warps: Br must be a multiple of " .. 16 * wn
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

-- The plan (core/fg_kernel.h), run in order with one fg_bwd_params:
--   <entry>_pre   grid q_tiles (ceil(Nq / 64), B * Hq), 128 threads: D = rowsum(dO * O), the dQ
--                 accumulator := 0 (and the semaphores, deterministic)
--   <entry>       grid kv_tiles (ceil(Nk / Bc), B * Hkv): the main kernel (br holds Bc)
--   <entry>_post  grid q_tiles, 128 threads: dQ = scale * accumulator
-- Workspaces, per (batch, query head), one after the other: the fp32 dQ accumulator (d floats per
-- query row, at p.workspace), D (1 float per row, p.dsum) and in deterministic mode a 4-byte
-- semaphore per 16 query rows (p.sem).
--
-- The plan of a backward template whose main kernel takes `threads` and `smem` (another
-- backward template returns its own through this, with its own main kernel).
local function plan(v, template, threads, smem)
  local e = M.entry(v)
  return {
    template = template, main = 2,
    steps = {
      { entry = e .. "_pre", grid = "q_tiles", br = AUX_ROWS, threads = AUX_THREADS, smem = 0 },
      { entry = e, grid = "kv_tiles", br = v.bc, threads = threads, smem = smem },
      { entry = e .. "_post", grid = "q_tiles", br = AUX_ROWS, threads = AUX_THREADS, smem = 0 },
    },
    workspaces = {
      { name = "dq_accum", param = "workspace", bytes = 4 * v.d, rows = 1 },
      { name = "dsum", param = "dsum", bytes = 4, rows = 1 },
      { name = "semaphores", param = "sem", bytes = 4, rows = SEM_ROWS, deterministic = true },
    },
    constants = { pre_rows = AUX_ROWS, pre_threads = AUX_THREADS, sem_rows = SEM_ROWS },
  }
end

function M.launch(v)
  local r = M.resources(v)
  return plan(v, "bwd.cu", r.threads, r.smem)
end

function M.q_in_regs(v) return false end

return M
