#!/usr/bin/env python3
"""bench.py: flashgen's forward, backward and forward+backward against PyTorch's SDPA backends,
timed in one process, one method.

    python3 bench/bench.py --quick                       # bf16, d 128 and 64, N 1k/4k/16k
    python3 bench/bench.py                               # the full grid of ../shared/ANCHORS.md
    python3 bench/bench.py --pass bwd                    # only the backward pass (fwd, bwd, fwdbwd)
    python3 bench/bench.py --dry-run                     # print the grid; needs no torch, no GPU
    python3 bench/bench.py --from-json DIR/results.json  # re-render results.md and plots, no GPU

Grid (ANCHORS.md): B*N = --tokens (16384) tokens, hidden --hidden (2048) so H = hidden/d,
d in {64, 128}, causal off and on, N in {512 ... 16384}, bf16 and f16; q, k, v (B, H, N, d); each
of the passes --pass selects (default all: fwd, then bwd, then fwdbwd) runs the whole grid.
Forward backends: flashgen (flashgen.attention through python/flashgen), and torch SDPA restricted
with torch.nn.attention.sdpa_kernel to FLASH_ATTENTION (flash, FlashAttention-2), CUDNN_ATTENTION
(cudnn), EFFICIENT_ATTENTION (efficient) and MATH (math, the standard attention that writes the
N*N scores to memory). Backward and forward+backward backends (--bwd-backends): flashgen through
autograd (the custom op, what a trainer sees), flashgen_direct (flashgen.attention_backward
called directly, no autograd), flash and cudnn. FLOPs: forward 4*B*H*N^2*d, backward 2.5x,
forward+backward 3.5x, halved when causal. See bench/README.md for the method and the columns.

torch, numpy and matplotlib are imported only when measuring or plotting: --help, --dry-run and
--from-json (without a plot) run on a machine with plain Python.
"""

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

ALL_BACKENDS = ("flashgen", "flash", "cudnn", "efficient", "math")
SDPA_BACKEND_NAMES = {  # ours -> torch.nn.attention.SDPBackend member
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}
REFERENCE_ORDER = ("flash", "cudnn", "efficient", "math")  # whose output the others are checked on
ALL_PASSES = ("fwd", "bwd", "fwdbwd")  # run in this order, each over the whole grid
PASS_FLOPS_HALVES = {"fwd": 2, "bwd": 5, "fwdbwd": 7}  # FLOPs = forward FLOPs * this / 2
PASS_TITLES = {"fwd": "Forward", "bwd": "Backward", "fwdbwd": "Forward + backward"}
# Backends of the backward passes. flashgen: flashgen.attention with inputs requiring grad, then
# torch.autograd.grad (the torch.library custom op's backward); flashgen_direct:
# flashgen.attention_backward called by hand (the same kernels without autograd).
ALL_GRAD_BACKENDS = ("flashgen", "flashgen_direct", "flash", "cudnn", "efficient", "math")
DEFAULT_GRAD_BACKENDS = ("flashgen", "flashgen_direct", "flash", "cudnn")
GRAD_BASE_BACKEND = {"flashgen_direct": "flashgen"}  # needs this forward backend in --backends
GRAD_LABELS = {"flashgen_direct": "flashgen direct"}
GRAD_NAMES = ("dq", "dk", "dv")
DTYPE_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "fp16": "f16", "float16": "f16",
                 "half": "f16"}
DIFF_LIMIT = {"bf16": 2e-2, "f16": 5e-3}  # max |out - ref| above this is flagged as suspicious
# (for gradients: max |g - g_ref| / max(1, max |g_ref|), per dq, dk, dv: they reach ~10 in size)
ELEM_BYTES = {"bf16": 2, "f16": 2}

DEFAULT_N = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_D_FWD = (64, 96, 128, 192, 256)  # forward head dims (issue 13's grid)
DEFAULT_D_GRAD = (64, 128)  # backward and forward+backward head dims
QUICK_N = (1024, 4096, 16384)
STANDARD_ATTENTION_N = (512, 1024, 2048, 4096)  # the seeds' claim: speed-up and memory vs math
MATH_MEMORY_FRACTION = 0.40  # skip math when its N*N buffers would need more of the free memory
INPUT_MEMORY_FRACTION = 0.25  # the rotating input sets take at most this much of the free memory
MAX_INPUT_SETS = 8
MIN_REPS_SLOW = 5  # the fewest timed calls for a configuration slower than the time budget
MAX_REPS = 100
ROUNDS = 5  # the timed calls of a configuration's backends interleave in this many rounds
MiB = 1024.0 * 1024.0


# ---------------------------------------------------------------- grid (no torch) -----------

def attention_flops(B, H, N, d, causal):
    """FlashAttention convention: forward = 4*B*H*N^2*d (two N*N*d matrix products, 2 flops per
    multiply-add), halved when causal."""
    f = 4 * B * H * N * N * d
    return f // 2 if causal else f


def pass_flops(B, H, N, d, causal, pass_="fwd"):
    """FLOPs of one call of a pass (ANCHORS.md): forward as attention_flops, backward 2.5x the
    forward (five N*N*d products against the forward's two), forward + backward 3.5x; all halved
    when causal. Exact integers: the forward count is even."""
    if pass_ not in PASS_FLOPS_HALVES:
        raise ValueError("pass must be one of %s, not %r" % (", ".join(ALL_PASSES), pass_))
    return attention_flops(B, H, N, d, causal) * PASS_FLOPS_HALVES[pass_] // 2


def flashgen_bwd_workspace_bytes(B, H, N, d):
    """The fp32 workspace flashgen's backward allocates itself (cuMemAllocAsync, so PyTorch's
    counter cannot see it): (d + 1) floats per (batch, query head, query row), as
    include/flashgen.h documents for fg_attention_backward_workspace_size (exact where N is a
    multiple of 128, as on the grid: the Hopper kernel rounds each head's rows up to its block)."""
    return B * H * N * (d + 1) * 4


def row_pass(r):
    """A row's pass; rows of results.json files written before the backward existed are forward."""
    return r.get("pass", "fwd")


def _int_list(text, what):
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError("%s: expected comma-separated integers, got %r"
                                         % (what, text))
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError("%s: expected positive integers, got %r" % (what, text))
    return vals


def _dtype_list(text):
    out = []
    for x in text.replace(" ", "").split(","):
        if not x:
            continue
        if x.lower() not in DTYPE_ALIASES:
            raise argparse.ArgumentTypeError("--dtypes: unknown dtype %r (use bf16, f16)" % x)
        if DTYPE_ALIASES[x.lower()] not in out:
            out.append(DTYPE_ALIASES[x.lower()])
    if not out:
        raise argparse.ArgumentTypeError("--dtypes: empty list")
    return out


def _backend_list(text):
    out = []
    for x in text.replace(" ", "").split(","):
        if not x:
            continue
        if x not in ALL_BACKENDS:
            raise argparse.ArgumentTypeError("--backends: unknown backend %r (choose from %s)"
                                             % (x, ",".join(ALL_BACKENDS)))
        if x not in out:
            out.append(x)
    if not out:
        raise argparse.ArgumentTypeError("--backends: empty list")
    return out


def _pass_list(text):
    out = []
    for x in text.replace(" ", "").lower().split(","):
        if not x:
            continue
        if x in ("all", "both"):
            names = list(ALL_PASSES)
        elif x in ALL_PASSES:
            names = [x]
        elif x in ("fwd+bwd", "fwd_bwd", "train"):
            names = ["fwdbwd"]
        else:
            raise argparse.ArgumentTypeError("--pass: unknown pass %r (use fwd, bwd, fwdbwd or "
                                             "all, or a comma-separated list)" % x)
        out += [n for n in names if n not in out]
    if not out:
        raise argparse.ArgumentTypeError("--pass: empty list (use fwd, bwd, fwdbwd or all)")
    return [p for p in ALL_PASSES if p in out]


def _grad_backend_list(text):
    out = []
    for x in text.replace(" ", "").split(","):
        if not x:
            continue
        x = {"flashgen-direct": "flashgen_direct", "direct": "flashgen_direct"}.get(x, x)
        if x not in ALL_GRAD_BACKENDS:
            raise argparse.ArgumentTypeError("--bwd-backends: unknown backend %r (choose from %s)"
                                             % (x, ",".join(ALL_GRAD_BACKENDS)))
        if x not in out:
            out.append(x)
    if not out:
        raise argparse.ArgumentTypeError("--bwd-backends: empty list")
    return out


def _causal_list(text):
    t = text.strip().lower()
    if t in ("both", "all"):
        return [False, True]
    if t in ("0", "no", "false", "off"):
        return [False]
    if t in ("1", "yes", "true", "on"):
        return [True]
    raise argparse.ArgumentTypeError("--causal: expected both, 0 or 1, got %r" % text)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="bench.py",
        description="Time flashgen.attention's forward, backward and forward+backward against "
                    "PyTorch SDPA backends (flash, cudnn, efficient, math) on the ANCHORS.md grid; "
                    "write results.json, results.md and the plots. Build libflashgen.so first "
                    "(./scripts/run or cmake).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="bf16, d=128 and 64, N in {1024, 4096, 16384}, causal both "
                        "(explicit --dtypes/--d/--n/--causal still override)")
    p.add_argument("--dtypes", type=_dtype_list, default=None, help="bf16,f16 (default both)")
    p.add_argument("--d", type=lambda s: _int_list(s, "--d"), default=None,
                   help="head dims (default: the forward 64,96,128,192,256, the backward passes "
                        "64,128)")
    p.add_argument("--causal", type=_causal_list, default=None, help="both, 0 or 1 (default both)")
    p.add_argument("--n", type=lambda s: _int_list(s, "--n"), default=None,
                   help="sequence lengths (default 512,1024,2048,4096,8192,16384)")
    p.add_argument("--pass", dest="passes", type=_pass_list, default="all",
                   metavar="PASS",
                   help="fwd, bwd, fwdbwd or all, or a comma-separated list; each pass runs the "
                        "whole grid, in the order fwd, bwd, fwdbwd")
    p.add_argument("--backends", type=_backend_list, default=list(ALL_BACKENDS),
                   help="forward pass: comma-separated subset of " + ",".join(ALL_BACKENDS))
    p.add_argument("--bwd-backends", type=_grad_backend_list,
                   default=",".join(DEFAULT_GRAD_BACKENDS),
                   help="bwd and fwdbwd passes: comma-separated subset of %s (flashgen: through "
                        "autograd; flashgen_direct: flashgen.attention_backward called directly); "
                        "a backend whose forward backend is not in --backends is left out"
                        % ",".join(ALL_GRAD_BACKENDS))
    p.add_argument("--out", default=None,
                   help="output directory (default bench/results/<date>)")
    p.add_argument("--tokens", type=int, default=16384, help="B*N: B = tokens / N")
    p.add_argument("--hidden", type=int, default=2048, help="H*d: H = hidden / d")
    p.add_argument("--reps", type=int, default=20,
                   help="timed calls per backend and configuration (at least; more for fast "
                        "calls, fewer (never under %d) when they would exceed --budget)"
                        % MIN_REPS_SLOW)
    p.add_argument("--warmup", type=int, default=3, help="untimed calls after the first (min 3)")
    p.add_argument("--budget", type=float, default=1.5,
                   help="seconds of timed calls per backend and configuration")
    p.add_argument("--lib", default=None,
                   help="path of libflashgen.so (default $FLASHGEN_LIBRARY, else "
                        "<repo>/build/libflashgen.so)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed for the inputs")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    p.add_argument("--write-benchmarks-md", metavar="PATH", default=None,
                   help="also write a BENCHMARKS.md (table, plot path, versions, date, command)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    p.add_argument("--dry-run", action="store_true",
                   help="print the grid (configs, B, H, N, FLOPs per call) and exit; no torch")
    p.add_argument("--from-json", metavar="RESULTS_JSON", nargs="+", default=None,
                   help="re-render results.md / plots (and --write-benchmarks-md) from one or "
                        "more results.json (merged in order: a later file's row replaces an "
                        "earlier one's for the same pass, configuration and backend), without "
                        "measuring; outputs go next to the first unless --out")
    a = p.parse_args(argv)
    if a.quick:
        a.dtypes = a.dtypes or ["bf16"]
        a.d = a.d or [128, 64]
        a.n = a.n or list(QUICK_N)
        a.causal = a.causal or [False, True]
    a.dtypes = a.dtypes or ["bf16", "f16"]
    # The head dims: one list for every pass when given; by default issue 13's forward grid
    # (64, 96, 128, 192, 256) and the backward's (64, 128).
    a.d_grad = a.d or list(DEFAULT_D_GRAD)
    a.d = a.d or list(DEFAULT_D_FWD)
    a.n = a.n or list(DEFAULT_N)
    a.causal = a.causal if a.causal is not None else [False, True]
    for name in ("tokens", "hidden", "reps", "budget"):
        if getattr(a, name) <= 0:
            p.error("--%s must be positive" % name)
    a.warmup = max(3, a.warmup)
    a.grad_backends = grad_backends(a.bwd_backends, a.backends)
    if any(x != "fwd" for x in a.passes) and not a.grad_backends and not a.from_json:
        p.error("--bwd-backends %s: none of them has its forward backend in --backends %s; "
                "add one to --backends, or pass --pass fwd"
                % (",".join(a.bwd_backends), ",".join(a.backends)))
    return a


def grad_backends(bwd_backends, backends):
    """The backends of the bwd and fwdbwd passes: --bwd-backends whose forward backend (flashgen
    for flashgen_direct) is among --backends."""
    return [b for b in bwd_backends if GRAD_BASE_BACKEND.get(b, b) in backends]


def build_grid(args):
    """The configurations in run order, pass by pass (fwd, bwd, fwdbwd, as --pass selects): dicts
    with pass, dtype, d, causal, B, H, N, flops (of one call of that pass), notes."""
    grid = []
    for pass_ in getattr(args, "passes", ["fwd"]):
        ds = args.d if pass_ == "fwd" else getattr(args, "d_grad", args.d)
        for dtype in args.dtypes:
            for d in ds:
                for causal in args.causal:
                    for N in args.n:
                        notes = []
                        B = args.tokens // N
                        if B < 1:
                            B = 1
                            notes.append("N > tokens: B = 1 (B*N = %d)" % N)
                        elif args.tokens % N:
                            notes.append("tokens %% N != 0: B*N = %d" % (B * N))
                        H = args.hidden // d
                        if H < 1:
                            H = 1
                            notes.append("d > hidden: H = 1")
                        elif args.hidden % d:
                            notes.append("hidden %% d != 0: H*d = %d" % (H * d))
                        grid.append(dict(dtype=dtype, d=d, causal=causal, B=B, H=H, N=N,
                                         flops=pass_flops(B, H, N, d, causal, pass_),
                                         notes=notes, **{"pass": pass_}))
    return grid


def print_grid(grid, args):
    passes = [p for p in ALL_PASSES if any(c["pass"] == p for c in grid)]
    print("bench.py --dry-run: %d configs; passes %s; forward backends %s; backward backends %s"
          % (len(grid), ",".join(passes), ",".join(args.backends),
             ",".join(args.grad_backends) or "none"))
    print("%-4s %-6s %-5s %4s %6s %4s %4s %6s %12s %14s"
          % ("#", "pass", "dtype", "d", "causal", "B", "H", "N", "GFLOP/call", "math scores"))
    total = 0
    for i, c in enumerate(grid):
        scores = c["B"] * c["H"] * c["N"] * c["N"] * 4  # fp32 N*N scores of the math backend
        total += c["flops"]
        print("%-4d %-6s %-5s %4d %6s %4d %4d %6d %12.3f %10.2f GiB%s"
              % (i, c["pass"], c["dtype"], c["d"], "yes" if c["causal"] else "no", c["B"], c["H"],
                 c["N"], c["flops"] / 1e9, scores / MiB / 1024,
                 ("  (" + "; ".join(c["notes"]) + ")") if c["notes"] else ""))
    for p in passes:
        print("configs %s: %d" % (p, sum(1 for c in grid if c["pass"] == p)))
    print("configs: %d" % len(grid))
    print("total GFLOP per call over the grid: %.3f" % (total / 1e9))


# ---------------------------------------------------------------- reports (no torch) --------

def _fmt_tflops(row, limit):
    if row is None:
        return "—"
    if row.get("status") != "ok":
        return {"skipped": "skip", "unsupported": "n/a", "oom": "OOM"}.get(row.get("status"), "err")
    t = row["tflops"]
    s = "%.0f" % t if t >= 10 else ("%.1f" % t if t >= 1 else "%.2g" % t)
    if _flagged(row, limit):
        s += " ⚠"
    return s


def _flagged(row, limit):
    """NaN/Inf, or a difference from the reference above the limit: for the forward max |Δ| of
    O; for gradients the largest of max |Δ| / max(1, max |ref|) over dq, dk, dv."""
    if row.get("nonfinite"):
        return True
    diff = row.get("max_diff_scaled", row.get("max_diff"))
    return diff is not None and diff > limit


def _ratio(a, b):
    if a is None or b is None or a.get("status") != "ok" or b.get("status") != "ok":
        return "—"
    return "%.2f×" % (a["tflops"] / b["tflops"])


def _config_key(r):
    return (r["dtype"], r["d"], r["causal"], r["N"])


def _group(rows):
    """{config key: {backend: row}} and the keys in run order."""
    groups, order = {}, []
    for r in rows:
        k = _config_key(r)
        if k not in groups:
            groups[k] = {}
            order.append(k)
        groups[k][r["backend"]] = r
    return groups, order


def _mib(x):
    if x is None:
        return "—"
    return "%.0f" % x if abs(x) >= 10 else "%.1f" % x


def render_markdown(rows, meta):
    """results.md: the forward sections (TFLOP/s, standard attention, memory) when the rows have
    forward ones, then the backward and forward + backward sections, the notes, the run."""
    L, notes = [], []
    fwd_rows = [r for r in rows if row_pass(r) == "fwd"]
    if fwd_rows:
        _render_forward(L, notes, fwd_rows, meta)
    _render_grad(L, notes, rows, meta)
    _render_tail(L, notes, meta)
    return "\n".join(L)


def _render_forward(L, notes, rows, meta):
    backends = [b for b in meta.get("backends", ALL_BACKENDS)]
    groups, order = _group(rows)
    L.append("## Forward TFLOP/s (%s)" % meta.get("gpu", "unknown GPU"))
    L.append("")
    L.append("TFLOP/s = 4·B·H·N²·d / median time (halved when causal). B·N = %s tokens, H·d = %s."
             " ⚠: output differs from the reference backend by more than %s (bf16) / %s (f16), "
             "or is not finite. skip / n/a / OOM / err: see the notes below."
             % (meta.get("tokens", "?"), meta.get("hidden", "?"), DIFF_LIMIT["bf16"],
                DIFF_LIMIT["f16"]))
    L.append("")
    head = ["dtype", "d", "causal", "B", "H", "N"] + backends
    ratio_cols = []
    if "flashgen" in backends:
        for peer in ("flash", "cudnn"):
            if peer in backends:
                ratio_cols.append(peer)
    head += ["flashgen/%s" % p for p in ratio_cols]
    if "flashgen" in backends:
        head += ["flashgen max\\|Δ\\|"]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))
    for k in order:
        g = groups[k]
        any_row = next(iter(g.values()))
        limit = DIFF_LIMIT.get(k[0], 2e-2)
        cells = [k[0], str(k[1]), "yes" if k[2] else "no", str(any_row["B"]), str(any_row["H"]),
                 str(k[3])]
        cells += [_fmt_tflops(g.get(b), limit) for b in backends]
        cells += [_ratio(g.get("flashgen"), g.get(p)) for p in ratio_cols]
        if "flashgen" in backends:
            fg = g.get("flashgen")
            if fg is not None and fg.get("nonfinite"):
                cells.append("NaN/Inf")
            elif fg is not None and fg.get("max_diff") is not None:
                cells.append("%.1e vs %s" % (fg["max_diff"], fg.get("reference", "?")))
            else:
                cells.append("—")
        L.append("| " + " | ".join(cells) + " |")
        for b in backends:
            r = g.get(b)
            if r is None:
                continue
            tag = "%s d=%d %s N=%d %s" % (k[0], k[1], "causal" if k[2] else "non-causal", k[3], b)
            if r.get("status") != "ok":
                notes.append("%s: %s: %s" % (tag, r.get("status"), r.get("reason", "")))
            elif r.get("nonfinite"):
                notes.append("%s: output has NaN/Inf" % tag)
            elif r.get("max_diff") is not None and r["max_diff"] > limit:
                notes.append("%s: max |Δ| %.3g vs %s (limit %g) — suspicious"
                             % (tag, r["max_diff"], r.get("reference"), limit))
    L.append("")

    # The seeds' claim: standard attention (math) against flashgen at N = 512..4096.
    if "flashgen" in backends and "math" in backends:
        L.append("## flashgen against standard attention (SDPA math), N = 512…4096")
        L.append("")
        L.append("Speed-up = math time / flashgen time. Extra = peak device memory of one call "
                 "beyond its inputs and output (flashgen: PyTorch counter + its own workspace). "
                 "Peak ratio = (inputs + output + math extra) / (inputs + output + flashgen "
                 "extra), the total footprint the FlashAttention paper compares (2–4× faster, "
                 "10–20× less memory).")
        L.append("")
        L.append("| dtype | d | causal | N | math ms | flashgen ms | speed-up | math extra MiB | "
                 "flashgen extra MiB | extra ratio | peak ratio |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|")
        n_rows = 0
        for k in order:
            if k[3] not in STANDARD_ATTENTION_N:
                continue
            g = groups[k]
            m, f = g.get("math"), g.get("flashgen")
            if m is None or f is None:
                continue
            ok = m.get("status") == "ok" and f.get("status") == "ok"
            cells = [k[0], str(k[1]), "yes" if k[2] else "no", str(k[3])]
            cells.append("%.3f" % m["median_ms"] if m.get("status") == "ok" else m.get("status"))
            cells.append("%.3f" % f["median_ms"] if f.get("status") == "ok" else f.get("status"))
            cells.append("%.1f×" % (m["median_ms"] / f["median_ms"]) if ok else "—")
            me, fe = m.get("extra_mib"), f.get("extra_mib")
            cells.append(_mib(me))
            cells.append(_mib(fe))
            if me is not None and fe is not None:
                cells.append(("%.0f×" if me / max(fe, 1e-9) >= 10 else "%.1f×") % (me / fe)
                             if fe > 0.05 else "∞ (flashgen extra ≈ 0)")
                io = f.get("io_mib") or 0.0
                cells.append("%.1f×" % ((io + me) / (io + max(fe, 0.0))) if io + fe > 0 else "—")
            else:
                cells += ["—", "—"]
            L.append("| " + " | ".join(cells) + " |")
            n_rows += 1
        if n_rows == 0:
            L.append("| (no configuration with N in 512…4096 and both backends) |||||||||||")
        L.append("")

    # Memory of every backend, every configuration.
    L.append("## Peak extra device memory of one call (MiB)")
    L.append("")
    L.append("Per backend: extra (PyTorch counter, + workspace for flashgen) / device Δ "
             "(device-wide used memory from cudaMemGetInfo after the synchronised call minus "
             "before, minus the output). io = q, k, v and o of one call.")
    L.append("")
    head = ["dtype", "d", "causal", "N", "io MiB"] + backends
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))
    for k in order:
        g = groups[k]
        any_row = next(iter(g.values()))
        cells = [k[0], str(k[1]), "yes" if k[2] else "no", str(k[3]), _mib(any_row.get("io_mib"))]
        for b in backends:
            r = g.get(b)
            if r is None or r.get("status") != "ok" or r.get("extra_mib") is None:
                cells.append("—")
            else:
                cells.append("%s / %s" % (_mib(r.get("extra_mib")), _mib(r.get("device_delta_mib"))))
        L.append("| " + " | ".join(cells) + " |")
    L.append("")


def _grad_label(b):
    return GRAD_LABELS.get(b, b)


def _grad_backends_of(rows, meta):
    """The backward backends to show: those of the rows, in --bwd-backends order."""
    order = list(meta.get("grad_backends") or []) + [b for b in ALL_GRAD_BACKENDS]
    present = {r["backend"] for r in rows}
    out = []
    for b in order + [r["backend"] for r in rows]:
        if b in present and b not in out:
            out.append(b)
    return out


def _grad_diff_cell(fg):
    if fg is None:
        return "—"
    if fg.get("nonfinite"):
        return "NaN/Inf"
    diffs = fg.get("grad_max_diff")
    if not diffs:
        return "—"
    return "%s vs %s" % (" / ".join("%.1e" % diffs[n] if diffs.get(n) is not None else "?"
                                    for n in GRAD_NAMES), fg.get("reference", "?"))


def _ok(r):
    return r is not None and r.get("status") == "ok"


def _ratio_summary(pairs, peer):
    """One line on flashgen / peer over the rows where both ran."""
    vals = sorted(a["tflops"] / b["tflops"] for a, b in pairs if _ok(a) and _ok(b))
    if not vals:
        return None
    med = statistics.median(vals)
    return ("flashgen/%s: %d of %d rows at 1.00× or above; min %.2f×, median %.2f×, max %.2f×"
            % (peer, sum(1 for v in vals if v >= 1.0 - 5e-3), len(vals), vals[0], med, vals[-1]))


def _render_grad(L, notes, rows, meta):
    """The bwd and fwdbwd TFLOP/s tables and the backward memory table."""
    for pass_ in ("bwd", "fwdbwd"):
        prows = [r for r in rows if row_pass(r) == pass_]
        if not prows:
            continue
        backends = _grad_backends_of(prows, meta)
        groups, order = _group(prows)
        L.append("## %s TFLOP/s (%s)" % (PASS_TITLES[pass_], meta.get("gpu", "unknown GPU")))
        L.append("")
        if pass_ == "bwd":
            what = ("TFLOP/s = 2.5 × 4·B·H·N²·d / median time of one backward call (halved when "
                    "causal): inputs requiring grad, one forward, then "
                    "`torch.autograd.grad(o, (q, k, v), do, retain_graph=True)` timed")
        else:
            what = ("TFLOP/s = 3.5 × 4·B·H·N²·d / median time of one forward + backward call "
                    "(halved when causal): the forward of inputs requiring grad, then "
                    "`torch.autograd.grad(o, (q, k, v), do)`, both timed")
        L.append("%s. flashgen: `flashgen.attention` (its torch.library custom op's backward); "
                 "flashgen direct: `flashgen.attention_backward` called directly (%s; no "
                 "autograd), so flashgen − direct is the autograd overhead; flash = SDPA "
                 "FlashAttention-2, cudnn = SDPA cuDNN. B·N = %s tokens, H·d = %s. ⚠: a "
                 "gradient differs from the reference backend's by more than %s (bf16) / %s "
                 "(f16) × max(1, max |reference|), or is not finite."
                 % (what, "with `flashgen.attention(..., return_lse=True)` before it, timed"
                    if pass_ == "fwdbwd" else "o and lse from a forward outside the timing",
                    meta.get("tokens", "?"), meta.get("hidden", "?"), DIFF_LIMIT["bf16"],
                    DIFF_LIMIT["f16"]))
        L.append("")
        head = ["dtype", "d", "causal", "B", "H", "N"] + [_grad_label(b) for b in backends]
        peers = [p for p in ("flash", "cudnn") if p in backends] if "flashgen" in backends else []
        head += ["flashgen/%s" % p for p in peers]
        has_direct = "flashgen" in backends and "flashgen_direct" in backends
        if has_direct:
            head.append("autograd µs")
        if "flashgen" in backends or "flashgen_direct" in backends:
            head.append("flashgen max\\|Δ\\| dq / dk / dv")
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "---|" * len(head))
        pairs = {p: [] for p in peers}
        for k in order:
            g = groups[k]
            any_row = next(iter(g.values()))
            limit = DIFF_LIMIT.get(k[0], 2e-2)
            cells = [k[0], str(k[1]), "yes" if k[2] else "no", str(any_row["B"]),
                     str(any_row["H"]), str(k[3])]
            cells += [_fmt_tflops(g.get(b), limit) for b in backends]
            cells += [_ratio(g.get("flashgen"), g.get(p)) for p in peers]
            for p in peers:
                pairs[p].append((g.get("flashgen"), g.get(p)))
            if has_direct:
                a, b = g.get("flashgen"), g.get("flashgen_direct")
                cells.append("%+.0f" % ((a["median_ms"] - b["median_ms"]) * 1e3)
                             if _ok(a) and _ok(b) else "—")
            if "flashgen" in backends or "flashgen_direct" in backends:
                cells.append(_grad_diff_cell(g.get("flashgen") or g.get("flashgen_direct")))
            L.append("| " + " | ".join(cells) + " |")
            for b in backends:
                r = g.get(b)
                if r is None:
                    continue
                tag = "%s %s d=%d %s N=%d %s" % (pass_, k[0], k[1],
                                                 "causal" if k[2] else "non-causal", k[3],
                                                 _grad_label(b))
                if r.get("status") != "ok":
                    notes.append("%s: %s: %s" % (tag, r.get("status"), r.get("reason", "")))
                elif r.get("nonfinite"):
                    notes.append("%s: a gradient has NaN/Inf" % tag)
                elif _flagged(r, limit):
                    diffs = r.get("grad_max_diff") or {}
                    notes.append("%s: max |Δ| %s vs %s (largest / max(1, max |ref|) = %.3g, "
                                 "limit %g) — suspicious"
                                 % (tag, ", ".join("%s %.3g" % (n, diffs[n]) for n in GRAD_NAMES
                                                   if diffs.get(n) is not None),
                                    r.get("reference"), r.get("max_diff_scaled"), limit))
        L.append("")
        for p in peers:
            line = _ratio_summary(pairs[p], p)
            if line:
                L.append("- " + line)
        if peers:
            L.append("")
        if pass_ == "bwd":
            _render_grad_memory(L, groups, order, backends)


def _render_grad_memory(L, groups, order, backends):
    L.append("## Peak extra device memory of one backward call (MiB)")
    L.append("")
    L.append("Per backend: extra / device Δ of one backward call (the timed call: "
             "`torch.autograd.grad` after the forward, or flashgen.attention_backward), "
             "measured as for the forward, minus the gradients dq, dk, dv themselves. extra = "
             "PyTorch's max_memory_allocated delta, plus for flashgen the fp32 workspace it "
             "allocates itself ((d + 1) × 4 bytes per query row, include/flashgen.h), which "
             "PyTorch cannot see. N×N = one fp32 B·H·N² matrix, for scale. flashgen B/row = "
             "flashgen's extra / (B·H·N): constant in N when the extra memory is O(N), with no "
             "N×N buffer.")
    L.append("")
    head = (["dtype", "d", "causal", "N", "grads MiB", "N×N MiB"]
            + [_grad_label(b) for b in backends])
    fg = next((b for b in ("flashgen", "flashgen_direct") if b in backends), None)
    if fg:
        head.append("flashgen B/row")
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))
    largest = {}
    for k in order:
        g = groups[k]
        any_row = next(iter(g.values()))
        B, H, N = any_row["B"], any_row["H"], k[3]
        nxn = B * H * N * N * 4 / MiB
        cells = [k[0], str(k[1]), "yes" if k[2] else "no", str(N), _mib(any_row.get("grads_mib")),
                 _mib(nxn)]
        for b in backends:
            r = g.get(b)
            if not _ok(r) or r.get("extra_mib") is None:
                cells.append("—")
            else:
                cells.append("%s / %s" % (_mib(r.get("extra_mib")),
                                          _mib(r.get("device_delta_mib"))))
        if fg:
            r = g.get(fg)
            if _ok(r) and r.get("extra_mib") is not None:
                cells.append("%.0f" % (r["extra_mib"] * MiB / (B * H * N)))
                key = k[:3]
                if key not in largest or largest[key][0] < N:
                    largest[key] = (N, r["extra_mib"], nxn)
            else:
                cells.append("—")
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    if largest:
        parts = ["%s d=%d %s: %s MiB (%.2g%% of N×N)"
                 % (k[0], k[1], "causal" if k[2] else "non-causal", _mib(v[1]),
                    100.0 * v[1] / v[2] if v[2] else 0.0)
                 for k, v in largest.items()]
        Ns = sorted({v[0] for v in largest.values()})
        L.append("flashgen's extra memory of one backward call at the largest N measured (N = %s):"
                 " %s." % ("/".join(str(n) for n in Ns), "; ".join(parts)))
        L.append("")


def _render_tail(L, notes, meta):
    if notes:
        L.append("## Notes")
        L.append("")
        for n in notes:
            L.append("- " + n.replace("\n", " "))
        L.append("")

    L.append("## Run")
    L.append("")
    L.append("```")
    runs = meta.get("runs")
    if runs:  # merged from several results.json (--from-json A B ...)
        for run in runs:
            L.append("%s    # %s, %s" % (run.get("command", "?"), run.get("date", "?"),
                                         "passes " + ",".join(run.get("passes") or ["fwd"])))
    else:
        L.append(meta.get("command", "?"))
    L.append("```")
    L.append("")
    for key, label in (("date", "date"), ("gpu", "GPU"), ("driver", "driver"),
                       ("torch", "PyTorch"), ("cuda", "CUDA (torch)"), ("cudnn", "cuDNN"),
                       ("flashgen", "flashgen"), ("flashgen_library", "libflashgen.so"),
                       ("python", "Python"), ("l2_mib", "L2 MiB"), ("method", "method")):
        if meta.get(key) is not None:
            L.append("- %s: %s" % (label, meta[key]))
    L.append("")


def render_benchmarks_md(rows, meta, md_table, plot_paths, target_path):
    base = os.path.dirname(os.path.abspath(target_path))
    passes = [p for p in ALL_PASSES if any(row_pass(r) == p for r in rows)] or ["fwd"]
    what = {("fwd",): "Forward attention"}.get(tuple(passes)) or (
        "Attention (%s)" % ", ".join(PASS_TITLES[p].lower() for p in passes))
    L = ["# flashgen benchmarks", "",
         "%s, flashgen against PyTorch's SDPA backends, measured in one process "
         "with one method by `bench/bench.py` (see bench/README.md for the method and the "
         "columns)." % what, "",
         "- date: %s" % meta.get("date"),
         "- GPU: %s" % meta.get("gpu"),
         "- driver: %s" % meta.get("driver"),
         "- PyTorch: %s (CUDA %s, cuDNN %s)" % (meta.get("torch"), meta.get("cuda"),
                                               meta.get("cudnn")),
         "- flashgen: %s" % meta.get("flashgen")]
    if meta.get("runs"):
        L.append("- commands (one run each, merged with --from-json):")
        L += ["  `%s` (%s)" % (r.get("command"), r.get("date")) for r in meta["runs"]]
    else:
        L.append("- command: `%s`" % meta.get("command"))
    L.append("")
    for p in plot_paths:
        rel = os.path.relpath(os.path.abspath(p), base)
        L.append("![%s](%s)" % (os.path.basename(p), rel))
        L.append("")
    L.append(md_table)
    return "\n".join(L)


def _row_key(r):
    return (row_pass(r), r.get("dtype"), r.get("d"), bool(r.get("causal")), r.get("N"),
            r.get("backend"))


def merge_results(loaded):
    """Merges [(meta, rows), ...] from several results.json into one (meta, rows): rows in the
    order first seen, a later file's row replacing an earlier one's of the same pass,
    configuration and backend; meta of the first file, with the lists (backends, dtypes, passes,
    grad_backends) united, passes those of the rows, and meta["runs"] listing each file's
    command, date and passes."""
    if len(loaded) == 1:
        return loaded[0]
    merged, meta = {}, dict(loaded[0][0])
    for key in ("backends", "dtypes", "grad_backends"):
        vals = []
        for m, _ in loaded:
            vals += [v for v in (m.get(key) or []) if v not in vals]
        meta[key] = vals
    meta["runs"] = []
    gpus = set()
    for m, rows in loaded:
        passes = m.get("passes") or sorted({row_pass(r) for r in rows}, key=ALL_PASSES.index)
        meta["runs"].append({"command": m.get("command"), "date": m.get("date"),
                             "passes": passes, "wall_s": m.get("wall_s")})
        gpus.add(m.get("gpu"))
        for r in rows:
            merged[_row_key(r)] = r
    meta["passes"] = [p for p in ALL_PASSES if any(row_pass(r) == p for r in merged.values())]
    if len(gpus) > 1:
        print("bench.py: warning: the merged results come from different GPUs (%s); compare "
              "backends only within one run" % ", ".join(sorted(str(g) for g in gpus)),
              file=sys.stderr)
    return meta, list(merged.values())


def load_results(paths):
    """(meta, rows) of one or more results.json files, merged (merge_results)."""
    loaded = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ValueError("%s: not a bench.py results.json (no rows list)" % path)
        loaded.append((data["meta"], data["rows"]))
    return merge_results(loaded)


def write_text(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        if not text.endswith("\n"):
            f.write("\n")
    os.replace(tmp, path)


def write_json(path, meta, rows):
    write_text(path, json.dumps({"meta": meta, "rows": rows}, indent=1, sort_keys=False))


def make_plots(rows, meta, out_dir):
    """Forward: plot.png for the first dtype, plot_<dtype>.png for every other; backward and
    forward + backward: plot_bwd.png, plot_bwd_<dtype>.png, plot_fwdbwd.png, ...; [] when
    matplotlib is missing (with a message)."""
    sys.path.insert(0, HERE)
    try:
        import plot as bench_plot
    except ImportError as e:
        print("bench.py: cannot import bench/plot.py (%s); no plots" % e, file=sys.stderr)
        return []
    finally:
        if sys.path and sys.path[0] == HERE:
            sys.path.pop(0)
    return bench_plot.make_plots(rows, meta, out_dir)


def finish(rows, meta, args, out_dir):
    """Writes results.json, results.md, the plots and BENCHMARKS.md; prints the table last."""
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "results.json"), meta, rows)
    plots = [] if args.no_plot else make_plots(rows, meta, out_dir)
    md = render_markdown(rows, meta)
    if plots:
        md += "\nPlots: " + ", ".join(os.path.basename(p) for p in plots) + "\n"
    write_text(os.path.join(out_dir, "results.md"), md)
    if args.write_benchmarks_md:
        write_text(args.write_benchmarks_md,
                   render_benchmarks_md(rows, meta, md, plots, args.write_benchmarks_md))
        print("bench.py: wrote %s" % args.write_benchmarks_md, file=sys.stderr)
    print("bench.py: wrote %s (results.json, results.md%s)"
          % (out_dir, "".join(", " + os.path.basename(p) for p in plots)), file=sys.stderr)
    print(md)


# ---------------------------------------------------------------- measuring (torch) ---------

def _stderr(msg):
    print(msg, file=sys.stderr, flush=True)


def _driver_version():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0].strip()
    except Exception:
        pass
    try:
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return "CUDA driver API %d.%d" % (v.value // 1000, (v.value % 1000) // 10)
    except Exception:
        pass
    return None


def _cudnn_version(torch):
    try:
        v = torch.backends.cudnn.version()
    except Exception:
        return None
    if v is None:
        return None
    if v >= 90000:
        return "%d.%d.%d" % (v // 10000, (v % 10000) // 100, v % 100)
    return "%d.%d.%d" % (v // 1000, (v % 1000) // 100, v % 100)


def _parse_explain(text):
    """variant, choice and workspace MiB from flashgen.explain's text."""
    out = {"variant": None, "choice": None, "workspace_mib": 0.0}
    for line in text.splitlines():
        if line.startswith("variant:"):
            out["variant"] = line.split(":", 1)[1].strip()
        elif line.startswith("choice:"):
            out["choice"] = line.split(":", 1)[1].strip()
        elif "MiB fp32 workspace" in line:
            try:
                head = line.split("MiB fp32 workspace")[0]
                out["workspace_mib"] = float(head.rsplit(",", 1)[1].strip())
            except (ValueError, IndexError):
                pass
    return out


class Bench:
    def __init__(self, args):
        self.args = args
        import torch  # noqa: imported here so that --help and --dry-run need no torch
        self.torch = torch
        import torch.nn.functional as F
        self.F = F
        self.sdpa_kernel = None
        self.SDPBackend = None
        self.sdpa_import_error = None
        try:
            from torch.nn.attention import sdpa_kernel, SDPBackend
            self.sdpa_kernel, self.SDPBackend = sdpa_kernel, SDPBackend
        except Exception as e:  # older torch
            self.sdpa_import_error = "torch.nn.attention.sdpa_kernel unavailable: %s" % e
        self.flashgen = None
        self.flashgen_error = None
        self.dev = torch.device("cuda", args.device)

    # -- setup -----------------------------------------------------------------------------

    def setup_flashgen(self):
        args = self.args
        if args.lib:
            lib = os.path.abspath(args.lib)
            src = "--lib"
        elif os.environ.get("FLASHGEN_LIBRARY"):
            lib = os.environ["FLASHGEN_LIBRARY"]
            src = "$FLASHGEN_LIBRARY"
        else:
            lib = os.path.join(REPO, "build", "libflashgen.so")
            src = "the default <repo>/build/libflashgen.so"
        if not os.path.exists(lib):
            return ("libflashgen.so not found at %s (from %s). Build it first (./scripts/run, or "
                    "cmake -B build && cmake --build build --target flashgen_shared), or pass "
                    "--lib PATH / set FLASHGEN_LIBRARY." % (lib, src))
        os.environ["FLASHGEN_LIBRARY"] = lib
        sys.path.insert(0, os.path.join(REPO, "python"))
        try:
            import flashgen
        except Exception as e:
            return "cannot import the flashgen binding from %s: %s" % (
                os.path.join(REPO, "python"), e)
        try:
            version = flashgen.version()
            path = flashgen.library_path()
        except Exception as e:
            return "cannot load %s: %s" % (lib, e)
        self.flashgen = flashgen
        self.flashgen_version = version
        self.flashgen_path = path
        return None

    def meta(self):
        torch, args = self.torch, self.args
        props = torch.cuda.get_device_properties(self.dev)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 50 * 1024 * 1024)
        math_lowp = None
        try:
            math_lowp = bool(torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed())
        except Exception:
            pass
        self.math_score_bytes = 2 if math_lowp else 4
        return {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv),
            "gpu": torch.cuda.get_device_name(self.dev),
            "sm_count": getattr(props, "multi_processor_count", None),
            "total_mem_gib": round(props.total_memory / MiB / 1024, 2),
            "l2_mib": round(self.l2_bytes / MiB, 1),
            "driver": _driver_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": _cudnn_version(torch),
            "flashgen": getattr(self, "flashgen_version", None),
            "flashgen_library": getattr(self, "flashgen_path", None),
            "python": platform.python_version(),
            "host": platform.node(),
            "math_sdp_low_precision_reduction": math_lowp,
            "tokens": args.tokens, "hidden": args.hidden, "backends": list(args.backends),
            "passes": list(args.passes), "grad_backends": list(args.grad_backends),
            "dtypes": list(args.dtypes), "reps_min": args.reps, "warmup": args.warmup,
            "budget_s": args.budget,
            "method": "CUDA events around each call, median; inputs torch.randn (B,H,N,d) in "
                      "rotating sets > 2x L2; first call excluded + %d warm-up calls; timed "
                      "calls of all backends interleaved in %d rounds; "
                      "TFLOP/s = 4BHN^2d/t (halved when causal)" % (args.warmup, ROUNDS)
                      + ("; backward: q, k, v requiring grad, one forward per input set, then "
                         "torch.autograd.grad(o, (q, k, v), do, retain_graph=True) timed, "
                         "TFLOP/s = 2.5 x 4BHN^2d/t; forward+backward: forward and "
                         "torch.autograd.grad timed, 3.5 x 4BHN^2d/t"
                         if any(p != "fwd" for p in args.passes) else ""),
        }

    # -- one backend's callable ------------------------------------------------------------

    def make_fn(self, backend, causal):
        F = self.F
        if backend == "flashgen":
            fg = self.flashgen
            return lambda q, k, v: fg.attention(q, k, v, causal=causal)
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def make_grad_fn(self, backend, causal, pass_, sets):
        """(make_sets, fn) of a backend in the bwd or fwdbwd pass. sets: [(q, k, v, do)] with q,
        k, v requiring grad. make_sets() (called under the backend's context) returns the
        per-call argument tuples; fn(*one of them) is the timed call and returns (dq, dk, dv).
        bwd: make_sets runs one forward per input set (the autograd graph stays, and every
        timed call backpropagates through it with retain_graph=True); fwdbwd: fn runs both."""
        torch = self.torch
        grad = torch.autograd.grad
        if backend == "flashgen_direct":
            fg = self.flashgen
            if pass_ == "bwd":
                def make_sets():
                    out = []
                    with torch.no_grad():
                        for q, k, v, do in sets:
                            qd, kd, vd = q.detach(), k.detach(), v.detach()
                            o, lse = fg.attention(qd, kd, vd, causal=causal, return_lse=True)
                            out.append((do, qd, kd, vd, o, lse))
                    return out

                def fn(do, q, k, v, o, lse):
                    return fg.attention_backward(do, q, k, v, o, lse, causal=causal)
                return make_sets, fn

            def make_sets():
                return [(q.detach(), k.detach(), v.detach(), do) for q, k, v, do in sets]

            def fn(q, k, v, do):
                o, lse = fg.attention(q, k, v, causal=causal, return_lse=True)
                return fg.attention_backward(do, q, k, v, o, lse, causal=causal)
            return make_sets, fn
        fwd = self.make_fn(backend, causal)
        if pass_ == "bwd":
            def make_sets():
                return [(fwd(q, k, v), q, k, v, do) for q, k, v, do in sets]

            def fn(o, q, k, v, do):
                return grad(o, (q, k, v), do, retain_graph=True)
            return make_sets, fn

        def fn(q, k, v, do):
            return grad(fwd(q, k, v), (q, k, v), do)
        return (lambda: sets), fn

    def backend_context(self, backend):
        """A context manager restricting SDPA to `backend` (a no-op for flashgen)."""
        import contextlib
        if backend in ("flashgen", "flashgen_direct"):
            return contextlib.nullcontext()
        if self.sdpa_kernel is None:
            raise RuntimeError(self.sdpa_import_error)
        member = getattr(self.SDPBackend, SDPA_BACKEND_NAMES[backend], None)
        if member is None:
            raise RuntimeError("this PyTorch has no SDPBackend.%s" % SDPA_BACKEND_NAMES[backend])
        return self.sdpa_kernel([member])

    # -- timing ----------------------------------------------------------------------------

    def _event_times(self, fn, sets, count, start_index=0):
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        for i in range(count):
            inputs = sets[(start_index + i) % len(sets)]
            starts[i].record()
            fn(*inputs)
            ends[i].record()
        torch.cuda.synchronize(self.dev)
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def prepare_backend(self, fn, sets):
        """First call (host-timed, excluded) and warm-up (event-timed, excluded); decides how many
        calls to time. The timed calls come later, interleaved with the other backends'."""
        torch, args = self.torch, self.args
        torch.cuda.synchronize(self.dev)
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fn(*sets[0])
                torch.cuda.synchronize(self.dev)
            except Exception as e:
                why = "; ".join(sorted(set(str(w.message).strip() for w in caught)))
                try:
                    e.bench_warnings = why
                except Exception:
                    pass
                raise
        first_ms = (time.perf_counter() - t0) * 1e3
        warm = self._event_times(fn, sets, args.warmup, start_index=1)
        est = max(statistics.median(warm), 1e-4)  # ms
        budget_ms = args.budget * 1e3
        reps = args.reps
        if est * reps > budget_ms:
            reps = max(MIN_REPS_SLOW, int(budget_ms / est))
        else:
            reps = min(max(reps, int(0.25 * budget_ms / est)), max(MAX_REPS, args.reps))
        return {"reps": reps, "first_call_ms": first_ms, "warmup_median_ms": est}

    def time_interleaved(self, timed):
        """The timed calls of every backend of one configuration, in ROUNDS rounds that visit the
        backends in turn, so that each sees the same stretch of clock and temperature: an H100
        under sustained tensor load lowers its clock within a second, and timing backends one
        after another gave the first ones a cooler, faster GPU (spread of 2-15% between median and
        minimum). timed: {backend: (fn, context factory, reps, argument sets)}; returns
        {backend: [ms...]}."""
        times = {b: [] for b in timed}
        start = 1 + self.args.warmup
        order = list(timed.items())
        for r in range(ROUNDS):
            # Each round starts at the next backend: the first calls after a switch run at the
            # clock the previous backend left (an H100 lowers it within a second under cuDNN's
            # load), and a fixed order gave that penalty to the same backend in every round.
            for b, (fn, ctx, reps, sets) in order[r % len(order):] + order[:r % len(order)]:
                n = reps * (r + 1) // ROUNDS - reps * r // ROUNDS
                if n == 0:
                    continue
                with ctx():
                    times[b] += self._event_times(fn, sets, n, start_index=start + len(times[b]))
        return times

    def measure_memory(self, fn, *inputs, out_bytes):
        """One synchronised call fn(*inputs): (its result, extra bytes by PyTorch's allocator
        counter, device-wide used-memory delta). Both exclude out_bytes, the result's own size."""
        torch = self.torch
        torch.cuda.synchronize(self.dev)
        torch.cuda.empty_cache()
        free0, total = torch.cuda.mem_get_info(self.dev)
        base = torch.cuda.memory_allocated(self.dev)
        torch.cuda.reset_peak_memory_stats(self.dev)
        out = fn(*inputs)
        torch.cuda.synchronize(self.dev)
        peak = torch.cuda.max_memory_allocated(self.dev)
        free1, _ = torch.cuda.mem_get_info(self.dev)
        extra_torch = peak - base - out_bytes
        device_delta = (free0 - free1) - out_bytes
        return out, extra_torch, device_delta

    # -- one configuration -----------------------------------------------------------------

    def make_inputs(self, c, n_tensors=3):
        """Rotating input sets of n_tensors (B, H, N, d) torch.randn tensors each: (q, k, v), or
        (q, k, v, do) for the backward passes."""
        torch = self.torch
        dt = torch.bfloat16 if c["dtype"] == "bf16" else torch.float16
        shape = (c["B"], c["H"], c["N"], c["d"])
        tensor_bytes = c["B"] * c["H"] * c["N"] * c["d"] * ELEM_BYTES[c["dtype"]]
        set_bytes = n_tensors * tensor_bytes
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.dev)
        n = max(2, -(-(2 * self.l2_bytes + 1) // set_bytes))
        n = min(n, MAX_INPUT_SETS, int(INPUT_MEMORY_FRACTION * free // set_bytes))
        n = max(n, 1)
        sets = []
        for _ in range(n):
            sets.append(tuple(torch.randn(shape, dtype=dt, device=self.dev)
                              for _ in range(n_tensors)))
        return sets, tensor_bytes

    def _base_row(self, c, meta):
        row = {k: meta.get(k) for k in ("gpu", "driver", "torch", "cuda", "cudnn", "flashgen")}
        row.update({k: c[k] for k in ("dtype", "d", "causal", "B", "H", "N")})
        row["pass"] = c.get("pass", "fwd")
        row["flops"] = c["flops"]
        return row

    def _math_too_big(self, row, c, copies):
        """Marks row skipped and returns True when math's `copies` N*N score buffers would take
        more than MATH_MEMORY_FRACTION of the free memory."""
        torch = self.torch
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.dev)
        need = copies * c["B"] * c["H"] * c["N"] * c["N"] * self.math_score_bytes
        if need <= MATH_MEMORY_FRACTION * free:
            return False
        row.update(status="skipped",
                   reason="math would need ~%.1f GiB (%d x B*H*N^2 %d-byte scores), "
                          "more than %d%% of the %.1f GiB free"
                          % (need / MiB / 1024, copies, self.math_score_bytes,
                             MATH_MEMORY_FRACTION * 100, free / MiB / 1024))
        return True

    def _prepare_one(self, b, row, fn, make_sets, out_bytes, ws_mib, timed, outputs):
        """One backend of a configuration, under its context: its argument sets (make_sets()),
        first call and warm-up, one memory-measured call (its result goes to outputs[b] for the
        correctness check); then timed[b] is set for time_interleaved. A backend that raises
        (unsupported shape, OOM, library error) becomes a row with the reason, not a crash."""
        torch = self.torch
        try:
            with self.backend_context(b):
                sets = make_sets()
                t = self.prepare_backend(fn, sets)
                out, extra_torch, dev_delta = self.measure_memory(fn, *sets[0],
                                                                  out_bytes=out_bytes)
            outputs[b] = out
            del out
            row.update(t)
            timed[b] = (fn, (lambda b=b: self.backend_context(b)), t["reps"], sets)
            row["extra_torch_mib"] = extra_torch / MiB
            row["device_delta_mib"] = dev_delta / MiB
            row["extra_mib"] = extra_torch / MiB + ws_mib
        except Exception as e:
            is_oom = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)
            why = _short(e)
            extra = getattr(e, "bench_warnings", "")
            if extra:
                why += " | warnings: " + extra
            row.update(status="oom" if is_oom else "unsupported", reason=why)
            outputs.pop(b, None)
            torch.cuda.synchronize(self.dev)
            torch.cuda.empty_cache()

    def _time_all(self, c, rows, timed):
        """The interleaved timed calls of the configuration's prepared backends; fills status,
        median/min/max ms and TFLOP/s of their rows."""
        try:
            times = self.time_interleaved(timed)
        except Exception as e:  # a backend that passed its warm-up failed later: report, go on
            times = {}
            for row in rows:
                if row["backend"] in timed:
                    row.update(status="unsupported", reason="timed calls: %s" % _short(e))
        for row in rows:
            ts = times.get(row["backend"])
            if ts:
                row.update(status="ok", median_ms=statistics.median(ts), min_ms=min(ts),
                           max_ms=max(ts))
                row["tflops"] = c["flops"] / (row["median_ms"] * 1e-3) / 1e12

    def run_config(self, c, meta):
        torch, args = self.torch, self.args
        rows, outputs = [], {}
        base_row = self._base_row(c, meta)
        try:
            sets, tensor_bytes = self.make_inputs(c)
        except torch.cuda.OutOfMemoryError as e:
            torch.cuda.empty_cache()
            for b in args.backends:
                rows.append(dict(base_row, backend=b, status="oom",
                                 reason="allocating the inputs: %s" % _short(e)))
            return rows
        io_mib = 4 * tensor_bytes / MiB
        base_row["io_mib"] = io_mib
        base_row["input_sets"] = len(sets)
        explain = None
        timed = {}  # backend -> (fn, context factory, reps, sets), timed after every warm-up
        if "flashgen" in args.backends and self.flashgen is not None:
            try:
                explain = self.flashgen.explain(*sets[0], causal=c["causal"])
            except Exception as e:
                explain = "explain failed: %s" % _short(e)
        for b in args.backends:
            row = dict(base_row, backend=b)
            rows.append(row)
            if b == "flashgen" and self.flashgen is None:
                row.update(status="unsupported", reason=self.flashgen_error)
                continue
            if b == "flashgen" and explain is not None:
                row["explain"] = explain
                row.update({"fg_" + k: v for k, v in _parse_explain(explain).items()})
            if b == "math" and self._math_too_big(row, c, 3):
                continue
            ws = (row.get("fg_workspace_mib") or 0.0) if b == "flashgen" else 0.0
            self._prepare_one(b, row, self.make_fn(b, c["causal"]), lambda s=sets: s, tensor_bytes,
                              ws, timed, outputs)
        self._time_all(c, rows, timed)
        self.check_outputs(c, rows, outputs)
        del outputs, sets, timed
        torch.cuda.empty_cache()
        return rows

    def run_config_grad(self, c, meta):
        """One configuration of the bwd or fwdbwd pass (c["pass"]): the same machinery as the
        forward's (prepare, memory, interleaved timing), with q, k, v requiring grad and a dO."""
        torch, args = self.torch, self.args
        pass_ = c["pass"]
        rows, outputs, timed = [], {}, {}
        base_row = self._base_row(c, meta)
        try:
            sets, tensor_bytes = self.make_inputs(c, n_tensors=4)  # q, k, v, do
        except torch.cuda.OutOfMemoryError as e:
            torch.cuda.empty_cache()
            for b in args.grad_backends:
                rows.append(dict(base_row, backend=b, status="oom",
                                 reason="allocating the inputs: %s" % _short(e)))
            return rows
        for s in sets:
            for t in s[:3]:
                t.requires_grad_(True)
        grads_bytes = 3 * tensor_bytes
        base_row["io_mib"] = 8 * tensor_bytes / MiB  # q, k, v, o, do; dq, dk, dv
        base_row["grads_mib"] = grads_bytes / MiB
        base_row["input_sets"] = len(sets)
        ws_mib = flashgen_bwd_workspace_bytes(c["B"], c["H"], c["N"], c["d"]) / MiB
        for b in args.grad_backends:
            row = dict(base_row, backend=b)
            rows.append(row)
            if b in ("flashgen", "flashgen_direct"):
                if self.flashgen is None:
                    row.update(status="unsupported", reason=self.flashgen_error)
                    continue
                if not hasattr(self.flashgen, "attention_backward"):
                    row.update(status="unsupported",
                               reason="the flashgen binding at %s has no attention_backward; "
                                      "use a checkout whose python/flashgen has the backward"
                                      % os.path.join(REPO, "python"))
                    continue
                row["fg_workspace_mib"] = ws_mib
            # math's peak: the forward's 3 score buffers per call, plus (bwd) the attention
            # weights each input set's graph keeps
            if b == "math" and self._math_too_big(
                    row, c, 3 + (len(sets) if pass_ == "bwd" else 0) + 2):
                continue
            make_sets, fn = self.make_grad_fn(b, c["causal"], pass_, sets)
            self._prepare_one(b, row, fn, make_sets, grads_bytes,
                              ws_mib if b in ("flashgen", "flashgen_direct") else 0.0,
                              timed, outputs)
        self._time_all(c, rows, timed)
        self.check_grads(c, rows, outputs)
        del outputs, sets, timed
        torch.cuda.empty_cache()
        return rows

    def check_outputs(self, c, rows, outputs):
        ref_name = next((b for b in REFERENCE_ORDER if b in outputs), None)
        if ref_name is None:
            ref_name = next(iter(outputs), None)
        if ref_name is None:
            return
        ref = outputs[ref_name].float()
        for row in rows:
            b = row["backend"]
            if b not in outputs:
                continue
            o = outputs[b].float()
            row["nonfinite"] = not bool(self.torch.isfinite(o).all().item())
            row["reference"] = ref_name
            diff = 0.0 if b == ref_name else float((o - ref).abs().max().item())
            row["max_diff"] = diff if math.isfinite(diff) else None  # strict JSON: no NaN
            row["suspicious"] = row["nonfinite"] or diff != diff or diff > DIFF_LIMIT.get(
                c["dtype"], 2e-2)
            del o
        del ref

    def check_grads(self, c, rows, outputs):
        """dq, dk, dv of every backend (one call on the first input set) against the reference
        backend's: max |Δ| per gradient; flagged when max |Δ| / max(1, max |ref|) exceeds the
        dtype's DIFF_LIMIT, or a gradient is not finite."""
        torch = self.torch
        ref_name = next((b for b in REFERENCE_ORDER if b in outputs), None)
        if ref_name is None:
            ref_name = next(iter(outputs), None)
        if ref_name is None:
            return
        ref = [t.float() for t in outputs[ref_name]]
        ref_max = [float(t.abs().max().item()) for t in ref]
        limit = DIFF_LIMIT.get(c["dtype"], 2e-2)
        for row in rows:
            b = row["backend"]
            if b not in outputs:
                continue
            diffs, nonfinite, worst = {}, False, 0.0
            for name, g, r, rmax in zip(GRAD_NAMES, outputs[b], ref, ref_max):
                gf = g.float()
                nonfinite = nonfinite or not bool(torch.isfinite(gf).all().item())
                dd = 0.0 if b == ref_name else float((gf - r).abs().max().item())
                diffs[name] = dd if math.isfinite(dd) else None
                scaled = dd / max(1.0, rmax) if math.isfinite(rmax) else float("nan")
                worst = scaled if (scaled != scaled or worst != worst) else max(worst, scaled)
                del gf
            row["nonfinite"] = nonfinite
            row["reference"] = ref_name
            row["grad_max_diff"] = diffs
            row["grad_ref_absmax"] = {n: (m if math.isfinite(m) else None)
                                      for n, m in zip(GRAD_NAMES, ref_max)}
            finite = [v for v in diffs.values() if v is not None]
            row["max_diff"] = max(finite) if len(finite) == len(diffs) else None
            row["max_diff_scaled"] = worst if math.isfinite(worst) else None
            row["suspicious"] = nonfinite or not math.isfinite(worst) or worst > limit
        del ref

    # -- the whole run ---------------------------------------------------------------------

    def run(self, grid, out_dir):
        torch, args = self.torch, self.args
        meta = self.meta()
        _stderr("bench.py: %s, torch %s, cuDNN %s, flashgen %s (%s); %d configs (passes %s), "
                "backends %s, backward backends %s -> %s"
                % (meta["gpu"], meta["torch"], meta["cudnn"], meta["flashgen"],
                   meta["flashgen_library"], len(grid), ",".join(args.passes),
                   ",".join(args.backends), ",".join(args.grad_backends), out_dir))
        os.makedirs(out_dir, exist_ok=True)
        rows = []
        t_start = time.perf_counter()
        for i, c in enumerate(grid):
            t0 = time.perf_counter()
            try:
                if c["pass"] == "fwd":
                    with torch.inference_mode():
                        crow = self.run_config(c, meta)
                else:
                    with torch.enable_grad():
                        crow = self.run_config_grad(c, meta)
            except KeyboardInterrupt:
                _stderr("bench.py: interrupted; writing what was measured")
                break
            rows.extend(crow)
            summary = ", ".join(
                "%s %s" % (r["backend"], ("%.0f" % r["tflops"]) if r.get("status") == "ok"
                           else r.get("status")) for r in crow)
            _stderr("[%d/%d] %s %s d=%d causal=%d N=%d B=%d H=%d: %s (%.1f s)"
                    % (i + 1, len(grid), c["pass"], c["dtype"], c["d"], c["causal"], c["N"],
                       c["B"], c["H"], summary, time.perf_counter() - t0))
            meta["wall_s"] = round(time.perf_counter() - t_start, 1)
            write_json(os.path.join(out_dir, "results.json"), meta, rows)  # partial results
        meta["wall_s"] = round(time.perf_counter() - t_start, 1)
        return rows, meta


def _short(e, limit=600):
    s = ("%s: %s" % (type(e).__name__, e)).replace("\n", " ").strip()
    return s if len(s) <= limit else s[:limit] + "…"


def default_out_dir():
    return os.path.join(HERE, "results", datetime.date.today().isoformat())


def main(argv=None):
    args = parse_args(argv)
    grid = build_grid(args)
    if args.dry_run:
        print_grid(grid, args)
        return 0
    if args.from_json:
        try:
            meta, rows = load_results(args.from_json)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print("bench.py: cannot read %s: %s (pass results.json files written by bench.py)"
                  % (" ".join(args.from_json), e), file=sys.stderr)
            return 1
        out_dir = args.out or os.path.dirname(os.path.abspath(args.from_json[0]))
        finish(rows, meta, args, out_dir)
        return 0

    try:
        import torch
    except ImportError as e:
        print("bench.py: PyTorch is needed to measure (%s). Install torch with CUDA, or use "
              "--dry-run / --from-json." % e, file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("bench.py: torch %s sees no CUDA device (torch.version.cuda = %s); this benchmark "
              "needs a GPU." % (torch.__version__, torch.version.cuda), file=sys.stderr)
        return 1
    if args.device >= torch.cuda.device_count():
        print("bench.py: --device %d but torch sees %d device(s)"
              % (args.device, torch.cuda.device_count()), file=sys.stderr)
        return 1
    torch.cuda.set_device(args.device)
    torch.manual_seed(args.seed)
    bench = Bench(args)
    if "flashgen" in args.backends:
        err = bench.setup_flashgen()
        if err:
            print("bench.py: flashgen backend unavailable: %s\n(To measure only PyTorch's "
                  "backends, pass --backends %s.)" % (err, ",".join(b for b in args.backends
                                                                 if b != "flashgen") or "flash"),
                  file=sys.stderr)
            return 1
    if bench.sdpa_kernel is None and any(b != "flashgen" for b in args.backends):
        print("bench.py: %s; the SDPA backends need PyTorch >= 2.3" % bench.sdpa_import_error,
              file=sys.stderr)
        return 1
    out_dir = args.out or default_out_dir()
    rows, meta = bench.run(grid, out_dir)
    if not rows:
        print("bench.py: nothing was measured", file=sys.stderr)
        return 1
    finish(rows, meta, args, out_dir)
    bad = [r for r in rows if r.get("suspicious")]
    if bad:
        _stderr("bench.py: %d result(s) differ from the reference by more than the limit; see the "
                "notes in results.md" % len(bad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
