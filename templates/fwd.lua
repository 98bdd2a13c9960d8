-- fwd.lua: the forward templates' launch contracts and resource formulas. The fit rule
-- (generator/fit.c) and the renderer read only this file, so a change to a template's shared
-- memory layout is made here, next to the template, and nowhere else.
local M = {}

local function round_up(x, m) return (x + m - 1) // m * m end

-- Shared-memory layout common to both forward templates: rows of d_pad = d rounded up to 16
-- (the mma k-step), plus 8 elements (16 B) of padding so that the 8 row addresses of one
-- ldmatrix fall into different bank groups. Also the register plan (below): whether Q stays in
-- registers, and whether the kernel runs lean.
local function base_layout(v)
  local d_pad = round_up(v.d, 16)
  return { d_pad = d_pad, row = d_pad + 8, mt = v.br // (16 * v.warps) }
end

-- Q's fragments stay in registers when Q + O + S accumulators fit under a limit: 128 (160
-- spilled 16 B at d = 184: Q 48 + O 96 + S 16 registers), but 160 at 32 rows per warp up to
-- d = 64, which keeps Q of d = 64 at Bc 64 in registers: 224-242 registers without spills, and
-- 4-9% faster than reading Q from shared memory every block (H100, d=64 bf16 non-causal 4k
-- 314 -> 339-344 TFLOP/s, causal 4k 282 -> 306).
local function q_in_regs(v, L)
  local limit = (L.mt >= 2 and L.d_pad <= 64) and 160 or 128
  return L.mt * (L.d_pad // 16) * 4 + L.mt * (L.d_pad // 8) * 4 + L.mt * (v.bc // 8) * 4 <= limit
end

-- Registers per thread the kernels need: the O and S accumulators, Q fragments when kept in
-- registers, and a fixed part for addresses, softmax state, loop control and the fragments in
-- flight, which is smaller per thread at 32 rows per warp (MT = 2) than at 16. Fitted to ptxas
-- (NVRTC 13.0, sm_80 and sm_90a) over all 414 q_outer candidates of d in {32..256}: the rule
-- admits no variant that spills and prunes 32 that fit (at 241-255). The edge is 255: d=128,
-- Br 128, 4 warps, Bc 64 (FlashAttention-2's shape) uses 254-255 (estimated 252); d=160 at Bc 32
-- spills 4-8 B (estimated 260). tests/test_compile.c compiles every candidate and fails on any
-- spill; flashgen tune rejects a candidate that spills.
local function regs_estimate(v, L)
  local o_acc = L.mt * (L.d_pad // 8) * 4
  local s_acc = L.mt * (v.bc // 8) * 4
  if v.loop == "q_outer" then
    local q_frag = q_in_regs(v, L) and L.mt * (L.d_pad // 16) * 4 or 4 * L.mt
    return o_acc + q_frag + (L.mt >= 2 and s_acc * 3 // 4 + 68 or s_acc + 96)
  end
  local p_frag = L.mt * (v.bc // 16) * 4
  return math.min(o_acc, 64 * L.mt) + s_acc + p_frag + 4 * L.mt + 96  -- P~V in 128-column chunks
end

-- A q_outer kernel near the 255-register edge runs lean (fwd_q_outer.cu, LEAN): it re-reads the
-- thread index and the K/V base pointers (from shared memory) on every block instead of keeping
-- values derived from them live across the loop, and does its lane arithmetic unsigned. That
-- frees 10-25 registers but costs a few instructions per block: d=64 at 32 rows per warp ran 5%
-- slower lean (298 against 314 TFLOP/s, H100), so kernels with registers to spare run plain.
-- Plain kernels spilled from an estimate of 212 up (d=96, Br 64, Bc 128; d=112 and 120 at
-- Br 128, Bc 32-64; 735 q_outer candidates, sm_80 and sm_90a); lean ones fit up to 255.
local LEAN_FROM = 200

-- q_wgmma and q_wgmma_ov (fwd_wgmma.cu, sm_90a): one warpgroup (4 warps) per 64 query rows, in
-- order or overlapped. Q, K and V tiles are stored unpadded in 64-column blocks, 128-byte
-- swizzled (what wgmma's descriptors read), from a 1024-byte aligned base: 1 KB more for the
-- alignment. Registers per thread: the O accumulators (d/2), S (bc/2), P packed (bc/4), about 64
-- for the rest, and overlapped, P in fp32 apart from S (bc/2; ptxas serializes the wgmma
-- pipeline if S is written while a wgmma runs). Fitted to ptxas (NVRTC 13.0): overlapped d=128
-- Bc 64 uses 202-207 (estimated 208), d=64 Bc 64 167 (176), d=128 Bc 128 (288) spilled 80 B,
-- d=256 Bc 64 (272) 8 B; in order d=128 Bc 64 158 (176), Bc 128 209 (224). At d = 256 one
-- warpgroup loads 4 rows of 512 B per pass, whose swizzle differs row to row: 16 more (in order
-- d=256 Bc 64 spilled 28 B at an estimate of 240 without them; the sweep of every candidate,
-- tests/test_compile.c, keeps this true).
local function wgmma_resources(v)
  local pf = v.loop == "q_wgmma_ov" and v.bc // 2 or 0
  local loader = (v.d > 128 and v.warps == 4) and 16 or 0
  return { threads = 32 * v.warps, smem = (v.br + 2 * v.stages * v.bc) * v.d * 2 + 1024,
           regs = v.d // 2 + v.bc // 2 + pf + v.bc // 4 + 64 + loader }
end

local function wgmma_check(v)
  if v.arch ~= "sm_90a" then
    return v.loop .. " needs sm_90a: wgmma is an instruction of Hopper (compute capability 9.0) only"
  end
  if v.d ~= 64 and v.d ~= 128 and v.d ~= 256 then
    return v.loop .. " takes d = 64, 128 or 256 (tiles of 64-column blocks, and rows the " ..
           "loader's threads cover whole)"
  end
  if v.warps % 4 ~= 0 or v.br ~= 16 * v.warps then
    return v.loop .. " gives each warpgroup (4 warps) 64 query rows: Br must be 16 * warps, " ..
           "warps 4 or 8"
  end
  if v.bc > 128 or v.stages ~= 2 then
    return v.loop .. " takes Bc <= 128 and 2 stages (K and V double-buffered)"
  end
  return nil
end
local function wgmma_loop(v) return v.loop == "q_wgmma" or v.loop == "q_wgmma_ov" end

-- q_tma (fwd_tma.cu, sm_90a): a producer warpgroup (one thread issues the TMA loads of Q, K and V
-- into 128-byte-swizzled 64-column blocks, completing on mbarriers; `stages` K/V buffers) and
-- warps / 4 consumer warpgroups of 64 query rows (Br = 16 * warps). With two or three consumers
-- the producer gives its registers up (setmaxnreg 24) and the consumers take what the block's
-- 64K registers leave them: 240 each of two (launch share 168), 160 each of three (launch share
-- 128); one consumer runs at the launch share (up to 255). A consumer holds O (d/2), S (bc/2, the
-- softmax's exp written apart from it in registers ptxas shares with S), P packed (bc/4), about 32
-- more, and when causal the masked copy of S (bc/2) unless it masks in place (below). Fitted to
-- ptxas (NVRTC 13.0), with the copy: no spills at d = 128 up to Bc 192 non-causal and 112 causal
-- (128 causal: 32-64 B), d = 256 Bc 80 non-causal and 64 causal (80 causal: 220 B), d = 64 Bc 192
-- non-causal with two consumers; with three, Bc 128 non-causal and 64 causal at d = 64 (96 causal:
-- 128 B), 64 non-causal at d = 128 (causal: 32 B).
-- The tuner drops a spilling kernel after compiling it (the forward's spill limit is 0), and
-- tests/test_compile.c compiles every candidate. Shared memory: Q, 2 * stages K/V blocks, 1 KB for
-- the alignment, 256 B of mbarriers.
-- Head dims that are not a multiple of 64 run on tiles rounded up to one (the TMA fills the
-- columns past d with zeros): d = 96 loads tiles of 128 columns, d = 72 too, d = 40 of 64; S
-- takes the k-steps below d, O = P V and O's registers the columns below d only. The fit below is estimated, not exact:
-- three consumers at d = 136 Bc 64 on the persistent grid pass it and spilled 80 B (the tuner and
-- test_compile compile them).
local function tma_dp(v) return (v.d + 63) // 64 * 64 end
-- A causal kernel masks the blocks on the diagonal in a copy of S while the previous block's
-- O += P V runs (bc / 2 registers more); where that copy does not fit the consumers' registers it
-- waits for the product and masks S in place (fwd_softmax.cuh, in_place: no spills at d = 64 Bc
-- 128 with three consumers, d = 128 Bc 128-144 and d = 256 Bc 80 with two, where the copy spilled
-- 56-784 B), giving up the overlap on those blocks only.
-- O holds the columns below d only (O = P V's wgmma has N = d, fwd_tma.cu), so the fit counts d;
-- whether the masked copy fits is still judged by the padded width (counted by d, the copy
-- spilled 12 B at d = 96 Bc 128 with two consumers).
local function tma_regs_without_copy(v, cols) return (cols or v.d) // 2 + v.bc // 2 + v.bc // 4 + 32 end
local TMA_CONSUMER_REGS = { 255, 240, 160 }
local function tma_mask_in_place(v)
  local cap = TMA_CONSUMER_REGS[v.warps // 4] or 0
  return v.causal and tma_regs_without_copy(v, tma_dp(v)) + v.bc // 2 > cap
end
-- q_tma_dp (ping-pong, fwd_tma.cu's PP) runs a block's products in order: its masked blocks wait
-- for nothing, so it always masks in place.
local function tma_consumer_regs(v)
  local copy = (v.causal and not tma_mask_in_place(v) and v.loop ~= "q_tma_dp") and v.bc // 2 or 0
  return tma_regs_without_copy(v) + copy
end
-- q_tma_p is q_tma on a persistent grid (one block per SM looping over the tiles, fwd_tma.cu):
-- its producer loads the next tile's Q while this tile is computed, so it takes two Q buffers
-- where they fit in the 227 KB a Hopper block may have (one else: the next Q then waits for this
-- tile's O, staged in its Q buffer, to be stored), and with two, for causal tiles of 128 columns
-- (d = 72-128) on two consumers, a buffer of its own for O where that fits too (o_buf: a Q
-- buffer is then free as soon as its tile's products are done, not once its O store has read
-- it). Measured (H100, fg_ab, bf16; bench/NOTES.md session 17): d = 128 causal 1.016x at N = 512,
-- 1.015x at 16k, d = 96 causal 512 1.02x; but d = 64 causal 1k 0.98x and d = 128 without a mask
-- 0.99-1.00x, so not there; with three consumers their 160 registers spilled 40 B.
local SM90_SMEM = 232448  -- shared memory one block may opt into on sm_90 (227 KB; as bwd.lua)
local function tma_smem(v, q_bufs, o_buf)
  return ((q_bufs + (o_buf and 1 or 0)) * v.br + 2 * v.stages * v.bc) * tma_dp(v) * 2 + 1024 + 256
end
local function tma_persist(v) return v.loop == "q_tma_p" or v.loop == "q_tma_d" or v.loop == "q_tma_dp" end
local function tma_q_bufs(v)
  if not tma_persist(v) then return 1 end
  return tma_smem(v, 2) <= SM90_SMEM and 2 or 1
end
local function tma_o_buf(v)
  return tma_q_bufs(v) == 2 and v.causal and tma_dp(v) == 128 and v.warps == 8 and
         tma_smem(v, 2, true) <= SM90_SMEM
end
-- One Q buffer on the persistent grid: where each consumer warpgroup's O fits beside it (64 rows
-- of tma_o_part 64-column blocks: half the tile's width, or one block where the width is odd),
-- the Q buffer is released after a tile's last S and O is stored from those areas in parts
-- (fwd_tma.cu's QEARLY), so the next tile's Q loads under this tile's end (bench/NOTES.md
-- session 36: d = 256 N = 512 without a mask 1.047-1.051x).
local function tma_o_part(v) local cb = tma_dp(v) // 64 return cb % 2 == 0 and cb // 2 or 1 end
local function tma_o_area(v) return (v.warps // 4) * 64 * tma_o_part(v) * 128 end
local function tma_q_early(v)
  return tma_persist(v) and tma_q_bufs(v) == 1 and tma_smem(v, 1, false) + tma_o_area(v) <= SM90_SMEM
end
local function tma_resources(v)
  local consumers = v.warps // 4
  local regs = tma_consumer_regs(v)
  if consumers > 1 then regs = 65536 // (128 * (consumers + 1)) // 8 * 8 end
  local smem = tma_smem(v, tma_q_bufs(v), tma_o_buf(v)) + (tma_q_early(v) and tma_o_area(v) or 0)
  return { threads = 32 * v.warps + 128, smem = smem, regs = regs }
end
local function tma_loop(v) return v.loop == "q_tma" or tma_persist(v) or v.loop == "q_tma_c" end
local function tma_check(v)
  if v.arch ~= "sm_90a" then
    return v.loop .. " needs sm_90a: TMA and wgmma are instructions of Hopper (compute " ..
           "capability 9.0)"
  end
  if (v.warps ~= 4 and v.warps ~= 8 and v.warps ~= 12) or v.br ~= 16 * v.warps then
    return v.loop .. " has one to three consumer warpgroups of 64 query rows: warps 4, 8 or " ..
           "12, Br = 16 * warps"
  end
  if v.bc > 256 or v.stages < 2 then
    return v.loop .. " takes Bc <= 256 (a TMA box has at most 256 rows) and 2 to 4 K/V stages"
  end
  if v.loop == "q_tma_dp" and v.warps ~= 8 then
    return "q_tma_dp's two consumer warpgroups take turns (ping-pong): warps 8, Br = 128"
  end
  local cap = TMA_CONSUMER_REGS[v.warps // 4]
  if tma_consumer_regs(v) > cap then
    return v.loop .. " with " .. v.warps // 4 .. " consumer warpgroup(s) needs about " ..
           tma_consumer_regs(v) .. " registers per consumer thread, more than the " .. cap ..
           " they get: take a smaller Bc"
  end
  return nil
end

function M.layout(v)
  local L = base_layout(v)
  -- At 32 rows per warp with Q in registers (d <= 64) ptxas fits plain (224-242 registers).
  L.lean = v.loop == "q_outer" and regs_estimate(v, L) >= LEAN_FROM and
           not (L.mt >= 2 and q_in_regs(v, L))
  return L
end

function M.q_in_regs(v) return q_in_regs(v, base_layout(v)) end

function M.resources(v)
  if wgmma_loop(v) then return wgmma_resources(v) end
  if tma_loop(v) then return tma_resources(v) end
  local L = base_layout(v)
  local smem
  if v.loop == "q_outer" then
    smem = (v.br + 2 * v.stages * v.bc) * L.row * 2
  else
    smem = (v.br + 2 * v.bc) * L.row * 2
  end
  return { threads = 32 * v.warps, smem = smem, regs = regs_estimate(v, L) }
end

-- Rules a template adds to the shared structural ones (core/variant.c).
-- kv_outer holds an S block, its P fragments, the fp32 P~V chunk and the HBM update in
-- registers at once; ptxas spills beyond one 16-row tile per warp, 4 warps, and Bc = 32 (Bc = 16
-- above d = 128): Bc = 64 spilled 4 to 28 B at d = 40..120 (NVRTC 13.0, sm_80 and sm_90a).
-- tests/test_compile.c keeps it true.
function M.check(v)
  if v.loop == "kv_wgmma" or v.loop == "kv_tma" then
    return v.loop .. " is a loop order of the backward pass"
  end
  if wgmma_loop(v) then return wgmma_check(v) end
  if tma_loop(v) then return tma_check(v) end
  local L = M.layout(v)
  if v.loop == "q_outer" and L.mt >= 2 and v.bc > 64 and v.d > 32 then
    return "q_outer with " .. 16 * L.mt .. " rows per warp takes Bc <= 64 above d = 32: the S tile " ..
           "leaves too few registers (d = 64, Bc = 128 spilled 8 B at 3 stages on sm_90a)"
  end
  if v.loop == "kv_outer" then
    if v.stages ~= 1 then
      return "kv_outer keeps one K/V block in shared memory (Algorithm 1): stages must be 1"
    end
    if v.warps ~= 4 or v.br ~= 64 then
      return "kv_outer takes Br = 64 with 4 warps (16 rows per warp); more spills registers"
    end
    local bc_max = v.d <= 128 and 32 or 16
    if v.bc > bc_max then
      return "kv_outer at d = " .. v.d .. " takes Bc <= " .. bc_max .. "; more spills registers"
    end
  end
  return nil
end

function M.entry(v) return "fg_" .. v.name end

-- The launch contract (core/fg_kernel.h): a plan of one step. kv_outer keeps its running O, m
-- and l in fp32 between K/V blocks: d + 2 floats per (batch, query head, query row), at
-- p.workspace.
local function one_step(template, entry, grid, br, threads, smem, workspaces)
  return { template = template, main = 1, workspaces = workspaces,
           steps = { { entry = entry, grid = grid, br = br, threads = threads, smem = smem } } }
end

function M.launch(v)
  local r = M.resources(v)
  if v.loop == "q_outer" then
    return one_step("fwd_q_outer.cu", M.entry(v), "q_tiles", v.br, r.threads, r.smem)
  elseif wgmma_loop(v) then
    return one_step("fwd_wgmma.cu", M.entry(v), "q_tiles", v.br, r.threads, r.smem)
  elseif tma_loop(v) then
    -- The runtime encodes the tensor maps (fg_fwd_tma_params.tmap, in this order) from the call:
    -- [batch, heads, rows, d] of the tensor, boxes of 64 columns x `rows` rows, 128-byte swizzle,
    -- rows past the end read as zeros. q_tma_p's grid is "persistent": one block per SM (at most
    -- one per tile), each taking tiles of br query rows in common.cuh's fwd_persistent_tile order.
    -- q_tma_c's grid is "q_tile_pairs": clusters of two blocks (two query tiles of a head) that
    -- each load half of every K/V block, rows bc / 2 apart, multicast to both (boxes of bc / 2 rows).
    -- q_tma_d is q_tma_p taking its tiles from a counter as its blocks come free (fwd_tma.cu's DYN):
    -- the counter is the first word of its workspace (8 bytes per (batch, head), the unit one query
    -- head's rows), which it leaves at 0 (the runtime numbers each launch: fg_fwd_params.tile_epoch).
    -- q_tma_dp is q_tma_d with its two consumers in ping-pong (fwd_tma.cu's PP): each block's S,
    -- softmax and O += P V in order, the exponentials in turns (named barriers 4 and 5).
    local dyn, pp = v.loop == "q_tma_d" or v.loop == "q_tma_dp", v.loop == "q_tma_dp"
    local persist, cluster = tma_persist(v), v.loop == "q_tma_c" and 2 or 1
    local t = one_step("fwd_tma.cu", M.entry(v),
                       persist and "persistent" or cluster > 1 and "q_tile_pairs" or "q_tiles", v.br,
                       r.threads, r.smem,
                       dyn and { { name = "tile_counter", param = "workspace", bytes = 8, rows = 2147483647 } } or nil)
    t.constants = { persist = persist, dyn = dyn, pp = pp, cluster = cluster, q_bufs = tma_q_bufs(v),
                    o_buf = tma_o_buf(v), mask_in_place = tma_mask_in_place(v), q_early = tma_q_early(v),
                    o_part = tma_o_part(v) }
    t.params = "fwd_tma"
    t.tmaps = { { tensor = "q", rows = v.br }, { tensor = "k", rows = v.bc // cluster },
                { tensor = "v", rows = v.bc // cluster }, { tensor = "o", rows = 64 } }
    return t
  else
    return one_step("fwd_kv_outer.cu", M.entry(v), "heads", v.br, r.threads, r.smem,
                    { { name = "o_m_l", param = "workspace", bytes = 4 * (v.d + 2), rows = 1 } })
  end
end

function M.reference(dtype, exact)
  local name = "ref_" .. (exact and "f64" or "lowp") .. "_" .. dtype
  local t = one_step("reference.cu", "fg_" .. name, "rows", 1, 256, 0)
  t.name = name
  return t
end

return M
