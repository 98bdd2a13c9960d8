-- fwd.lua: the forward templates' launch contracts and resource formulas. The fit rule
-- (generator/fit.c) and the renderer read only this file, so a change to a template's shared
-- memory layout is made here, next to the template, and nowhere else.
local M = {}

local function round_up(x, m) return (x + m - 1) // m * m end

-- Shared-memory layout common to both forward templates: rows of d_pad = d rounded up to 16
-- (the mma k-step), plus 8 elements (16 B) of padding so that the 8 row addresses of one
-- ldmatrix fall into different bank groups.
function M.layout(v)
  local d_pad = round_up(v.d, 16)
  local row = d_pad + 8
  local mt = v.br // (16 * v.warps)
  return { d_pad = d_pad, row = row, mt = mt }
end

-- Registers per thread the kernels need: the O accumulator, the S accumulator twice (ptxas keeps
-- the exponentiated S live while packing P), Q fragments when kept in registers, and 52 for
-- addresses, softmax state and loop control. Fitted to ptxas (NVRTC 13.0, sm_80 and sm_90a)
-- after addresses went 32-bit and the epilogue re-reads the block's coordinates: d=128 with 32
-- rows per warp and Bc=32 uses 246-254 causal or not (estimated 252); Bc=64 spills (316); 16 rows
-- per warp, 8 warps, Bc=64 uses 212-221 (212). tests/test_compile.c compiles every candidate and
-- fails on any spill; flashgen tune rejects a candidate that spills.
function M.q_in_regs(v)
  local L = M.layout(v)
  -- 160 spilled 16 B at d = 184 (Q 48 + O 96 + S 16 registers); 128 keeps d = 128, Bc = 64.
  return L.mt * (L.d_pad // 16) * 4 + L.mt * (L.d_pad // 8) * 4 + L.mt * (v.bc // 8) * 4 <= 128
end

function M.resources(v)
  local L = M.layout(v)
  local elem = 2
  local smem, regs
  local o_acc = L.mt * (L.d_pad // 8) * 4
  local s_acc = L.mt * (v.bc // 8) * 4
  local p_frag = L.mt * (v.bc // 16) * 4
  if v.loop == "q_outer" then
    smem = (v.br + 2 * v.stages * v.bc) * L.row * elem
    local q_frag = M.q_in_regs(v) and L.mt * (L.d_pad // 16) * 4 or 4 * L.mt
    regs = o_acc + 2 * s_acc + q_frag + 52
  else
    smem = (v.br + 2 * v.bc) * L.row * elem
    regs = math.min(o_acc, 64 * L.mt) + s_acc + p_frag + 4 * L.mt + 96  -- P~V in 128-column chunks
  end
  return { threads = 32 * v.warps, smem = smem, regs = regs }
end

-- Rules a template adds to the shared structural ones (runtime/variant.c).
-- kv_outer holds an S block, its P fragments, the fp32 P~V chunk and the HBM update in
-- registers at once; ptxas spills beyond one 16-row tile per warp, 4 warps, and Bc = 32 (Bc = 16
-- above d = 128): Bc = 64 spilled 4 to 28 B at d = 40..120 (NVRTC 13.0, sm_80 and sm_90a).
-- tests/test_compile.c keeps it true.
function M.check(v)
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

-- The launch contract (runtime/fg_kernel.h).
function M.launch(v)
  local r = M.resources(v)
  if v.loop == "q_outer" then
    return { template = "fwd_q_outer.cu", entry = M.entry(v), threads = r.threads,
             smem = r.smem, grid = "q_tiles", br = v.br, workspace = 0 }
  else
    return { template = "fwd_kv_outer.cu", entry = M.entry(v), threads = r.threads,
             smem = r.smem, grid = "heads", br = v.br, workspace = v.d + 2 }
  end
end

function M.reference(dtype, exact)
  local name = "ref_" .. (exact and "f64" or "lowp") .. "_" .. dtype
  return { template = "reference.cu", entry = "fg_" .. name, name = name, threads = 256,
           smem = 0, grid = "rows", br = 1, workspace = 0 }
end

return M
