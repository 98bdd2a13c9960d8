#!/usr/bin/env python3
"""bench.py: flashgen's forward against PyTorch's SDPA backends, timed in one process, one method.

    python3 bench/bench.py --quick                       # bf16, d 128 and 64, N 1k/4k/16k
    python3 bench/bench.py                               # the full grid of ../shared/ANCHORS.md
    python3 bench/bench.py --dry-run                     # print the grid; needs no torch, no GPU
    python3 bench/bench.py --from-json DIR/results.json  # re-render results.md and plots, no GPU

Grid (ANCHORS.md): B*N = --tokens (16384) tokens, hidden --hidden (2048) so H = hidden/d,
d in {64, 128}, causal off and on, N in {512 ... 16384}, bf16 and f16; q, k, v (B, H, N, d).
Backends: flashgen (flashgen.attention through python/flashgen), and torch SDPA restricted with
torch.nn.attention.sdpa_kernel to FLASH_ATTENTION (flash, FlashAttention-2), CUDNN_ATTENTION
(cudnn), EFFICIENT_ATTENTION (efficient) and MATH (math, the standard attention that writes the
N*N scores to memory). See bench/README.md for the method and what every column means.

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
DTYPE_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "fp16": "f16", "float16": "f16",
                 "half": "f16"}
DIFF_LIMIT = {"bf16": 2e-2, "f16": 5e-3}  # max |out - ref| above this is flagged as suspicious
ELEM_BYTES = {"bf16": 2, "f16": 2}

DEFAULT_N = (512, 1024, 2048, 4096, 8192, 16384)
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
        description="Time flashgen.attention against PyTorch SDPA backends (flash, cudnn, "
                    "efficient, math) on the ANCHORS.md grid; write results.json, results.md and "
                    "plot.png. Build libflashgen.so first (./scripts/run or cmake).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="bf16, d=128 and 64, N in {1024, 4096, 16384}, causal both "
                        "(explicit --dtypes/--d/--n/--causal still override)")
    p.add_argument("--dtypes", type=_dtype_list, default=None, help="bf16,f16 (default both)")
    p.add_argument("--d", type=lambda s: _int_list(s, "--d"), default=None,
                   help="head dims (default 64,128)")
    p.add_argument("--causal", type=_causal_list, default=None, help="both, 0 or 1 (default both)")
    p.add_argument("--n", type=lambda s: _int_list(s, "--n"), default=None,
                   help="sequence lengths (default 512,1024,2048,4096,8192,16384)")
    p.add_argument("--backends", type=_backend_list, default=list(ALL_BACKENDS),
                   help="comma-separated subset of " + ",".join(ALL_BACKENDS))
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
    p.add_argument("--from-json", metavar="RESULTS_JSON", default=None,
                   help="re-render results.md / plots (and --write-benchmarks-md) from a "
                        "results.json, without measuring; outputs go next to it unless --out")
    a = p.parse_args(argv)
    if a.quick:
        a.dtypes = a.dtypes or ["bf16"]
        a.d = a.d or [128, 64]
        a.n = a.n or list(QUICK_N)
        a.causal = a.causal or [False, True]
    a.dtypes = a.dtypes or ["bf16", "f16"]
    a.d = a.d or [64, 128]
    a.n = a.n or list(DEFAULT_N)
    a.causal = a.causal if a.causal is not None else [False, True]
    for name in ("tokens", "hidden", "reps", "budget"):
        if getattr(a, name) <= 0:
            p.error("--%s must be positive" % name)
    a.warmup = max(3, a.warmup)
    return a


def build_grid(args):
    """The configurations in run order: dicts with dtype, d, causal, B, H, N, flops, notes."""
    grid = []
    for dtype in args.dtypes:
        for d in args.d:
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
                                     flops=attention_flops(B, H, N, d, causal), notes=notes))
    return grid


def print_grid(grid, args):
    print("bench.py --dry-run: %d configs; backends %s" % (len(grid), ",".join(args.backends)))
    print("%-4s %-5s %4s %6s %4s %4s %6s %12s %14s" % ("#", "dtype", "d", "causal", "B", "H", "N",
                                                       "GFLOP/call", "math scores"))
    total = 0
    for i, c in enumerate(grid):
        scores = c["B"] * c["H"] * c["N"] * c["N"] * 4  # fp32 N*N scores of the math backend
        total += c["flops"]
        print("%-4d %-5s %4d %6s %4d %4d %6d %12.3f %10.2f GiB%s"
              % (i, c["dtype"], c["d"], "yes" if c["causal"] else "no", c["B"], c["H"], c["N"],
                 c["flops"] / 1e9, scores / MiB / 1024,
                 ("  (" + "; ".join(c["notes"]) + ")") if c["notes"] else ""))
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
    diff = row.get("max_diff")
    if row.get("nonfinite") or (diff is not None and diff > limit):
        s += " ⚠"
    return s


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
    """results.md: the TFLOP/s table, the standard-attention table, the memory table, notes."""
    backends = [b for b in meta.get("backends", ALL_BACKENDS)]
    groups, order = _group(rows)
    L = []
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
    notes = []
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

    if notes:
        L.append("## Notes")
        L.append("")
        for n in notes:
            L.append("- " + n.replace("\n", " "))
        L.append("")

    L.append("## Run")
    L.append("")
    L.append("```")
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
    return "\n".join(L)


def render_benchmarks_md(rows, meta, md_table, plot_paths, target_path):
    base = os.path.dirname(os.path.abspath(target_path))
    L = ["# flashgen benchmarks", "",
         "Forward attention, flashgen against PyTorch's SDPA backends, measured in one process "
         "with one method by `bench/bench.py` (see bench/README.md for the method and the "
         "columns).", "",
         "- date: %s" % meta.get("date"),
         "- GPU: %s" % meta.get("gpu"),
         "- driver: %s" % meta.get("driver"),
         "- PyTorch: %s (CUDA %s, cuDNN %s)" % (meta.get("torch"), meta.get("cuda"),
                                               meta.get("cudnn")),
         "- flashgen: %s" % meta.get("flashgen"),
         "- command: `%s`" % meta.get("command"), ""]
    for p in plot_paths:
        rel = os.path.relpath(os.path.abspath(p), base)
        L.append("![%s](%s)" % (os.path.basename(p), rel))
        L.append("")
    L.append(md_table)
    return "\n".join(L)


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
    """plot.png for the first dtype, plot_<dtype>.png for every other; [] when matplotlib is
    missing (with a message)."""
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
            "dtypes": list(args.dtypes), "reps_min": args.reps, "warmup": args.warmup,
            "budget_s": args.budget,
            "method": "CUDA events around each call, median; inputs torch.randn (B,H,N,d) in "
                      "rotating sets > 2x L2; first call excluded + %d warm-up calls; timed "
                      "calls of all backends interleaved in %d rounds; "
                      "TFLOP/s = 4BHN^2d/t (halved when causal)" % (args.warmup, ROUNDS),
        }

    # -- one backend's callable ------------------------------------------------------------

    def make_fn(self, backend, causal):
        F = self.F
        if backend == "flashgen":
            fg = self.flashgen
            return lambda q, k, v: fg.attention(q, k, v, causal=causal)
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def backend_context(self, backend):
        """A context manager restricting SDPA to `backend` (a no-op for flashgen)."""
        import contextlib
        if backend == "flashgen":
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
            q, k, v = sets[(start_index + i) % len(sets)]
            starts[i].record()
            fn(q, k, v)
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

    def time_interleaved(self, timed, sets):
        """The timed calls of every backend of one configuration, in ROUNDS rounds that visit the
        backends in turn, so that each sees the same stretch of clock and temperature: an H100
        under sustained tensor load lowers its clock within a second, and timing backends one
        after another gave the first ones a cooler, faster GPU (spread of 2-15% between median and
        minimum). timed: {backend: (fn, context factory, reps)}; returns {backend: [ms...]}."""
        times = {b: [] for b in timed}
        start = 1 + self.args.warmup
        for r in range(ROUNDS):
            for b, (fn, ctx, reps) in timed.items():
                n = reps * (r + 1) // ROUNDS - reps * r // ROUNDS
                if n == 0:
                    continue
                with ctx():
                    times[b] += self._event_times(fn, sets, n, start_index=start + len(times[b]))
        return times

    def measure_memory(self, fn, q, k, v, out_bytes):
        """One synchronised call: (output, extra bytes by PyTorch's allocator counter, device-wide
        used-memory delta). Both exclude the output itself."""
        torch = self.torch
        torch.cuda.synchronize(self.dev)
        torch.cuda.empty_cache()
        free0, total = torch.cuda.mem_get_info(self.dev)
        base = torch.cuda.memory_allocated(self.dev)
        torch.cuda.reset_peak_memory_stats(self.dev)
        out = fn(q, k, v)
        torch.cuda.synchronize(self.dev)
        peak = torch.cuda.max_memory_allocated(self.dev)
        free1, _ = torch.cuda.mem_get_info(self.dev)
        extra_torch = peak - base - out_bytes
        device_delta = (free0 - free1) - out_bytes
        return out, extra_torch, device_delta

    # -- one configuration -----------------------------------------------------------------

    def make_inputs(self, c):
        torch = self.torch
        dt = torch.bfloat16 if c["dtype"] == "bf16" else torch.float16
        shape = (c["B"], c["H"], c["N"], c["d"])
        tensor_bytes = c["B"] * c["H"] * c["N"] * c["d"] * ELEM_BYTES[c["dtype"]]
        set_bytes = 3 * tensor_bytes
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.dev)
        n = max(2, -(-(2 * self.l2_bytes + 1) // set_bytes))
        n = min(n, MAX_INPUT_SETS, int(INPUT_MEMORY_FRACTION * free // set_bytes))
        n = max(n, 1)
        sets = []
        for _ in range(n):
            sets.append(tuple(torch.randn(shape, dtype=dt, device=self.dev) for _ in range(3)))
        return sets, tensor_bytes

    def run_config(self, c, meta):
        torch, args = self.torch, self.args
        rows, outputs = [], {}
        base_row = {k: meta.get(k) for k in ("gpu", "driver", "torch", "cuda", "cudnn",
                                             "flashgen")}
        base_row.update({k: c[k] for k in ("dtype", "d", "causal", "B", "H", "N")})
        base_row["flops"] = c["flops"]
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
        timed = {}  # backend -> (fn, context factory, reps), timed together after every warm-up
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
            if b == "math":
                torch.cuda.empty_cache()
                free, _ = torch.cuda.mem_get_info(self.dev)
                need = 3 * c["B"] * c["H"] * c["N"] * c["N"] * self.math_score_bytes
                if need > MATH_MEMORY_FRACTION * free:
                    row.update(status="skipped",
                               reason="math would need ~%.1f GiB (3 x B*H*N^2 %d-byte scores), "
                                      "more than %d%% of the %.1f GiB free"
                                      % (need / MiB / 1024, self.math_score_bytes,
                                         MATH_MEMORY_FRACTION * 100, free / MiB / 1024))
                    continue
            fn = self.make_fn(b, c["causal"])
            try:
                with self.backend_context(b):
                    t = self.prepare_backend(fn, sets)
                    out, extra_torch, dev_delta = self.measure_memory(fn, *sets[0],
                                                                      out_bytes=tensor_bytes)
                outputs[b] = out
                del out
                row.update(t)
                timed[b] = (fn, (lambda b=b: self.backend_context(b)), t["reps"])
                row["extra_torch_mib"] = extra_torch / MiB
                row["device_delta_mib"] = dev_delta / MiB
                ws = (row.get("fg_workspace_mib") or 0.0) if b == "flashgen" else 0.0
                row["extra_mib"] = extra_torch / MiB + ws
            except Exception as e:  # unsupported shape, OOM, library error: a row, not a crash
                is_oom = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)
                why = _short(e)
                extra = getattr(e, "bench_warnings", "")
                if extra:
                    why += " | warnings: " + extra
                row.update(status="oom" if is_oom else "unsupported", reason=why)
                outputs.pop(b, None)
                torch.cuda.synchronize(self.dev)
                torch.cuda.empty_cache()
        try:
            times = self.time_interleaved(timed, sets)
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
        self.check_outputs(c, rows, outputs)
        del outputs, sets
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

    # -- the whole run ---------------------------------------------------------------------

    def run(self, grid, out_dir):
        torch, args = self.torch, self.args
        meta = self.meta()
        _stderr("bench.py: %s, torch %s, cuDNN %s, flashgen %s (%s); %d configs x %d backends -> %s"
                % (meta["gpu"], meta["torch"], meta["cudnn"], meta["flashgen"],
                   meta["flashgen_library"], len(grid), len(args.backends), out_dir))
        os.makedirs(out_dir, exist_ok=True)
        rows = []
        t_start = time.perf_counter()
        with torch.inference_mode():
            for i, c in enumerate(grid):
                t0 = time.perf_counter()
                try:
                    crow = self.run_config(c, meta)
                except KeyboardInterrupt:
                    _stderr("bench.py: interrupted; writing what was measured")
                    break
                rows.extend(crow)
                summary = ", ".join(
                    "%s %s" % (r["backend"], ("%.0f" % r["tflops"]) if r.get("status") == "ok"
                               else r.get("status")) for r in crow)
                _stderr("[%d/%d] %s d=%d causal=%d N=%d B=%d H=%d: %s (%.1f s)"
                        % (i + 1, len(grid), c["dtype"], c["d"], c["causal"], c["N"], c["B"],
                           c["H"], summary, time.perf_counter() - t0))
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
            with open(args.from_json, encoding="utf-8") as f:
                data = json.load(f)
            meta, rows = data["meta"], data["rows"]
        except (OSError, ValueError, KeyError) as e:
            print("bench.py: cannot read %s: %s" % (args.from_json, e), file=sys.stderr)
            return 1
        out_dir = args.out or os.path.dirname(os.path.abspath(args.from_json))
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
