"""bench_grid.py: bench.py's grid, no torch: the backends, passes and limits, the FLOP
formulas (ANCHORS.md), the command line and the configurations it selects (--dry-run prints
them). bench.py is the entry point; see its docstring."""

import argparse
import os


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
    multiple of 128, as on the grid: the Hopper kernel rounds each head's rows up to its block).
    Not counted: the partial sums of the grid's tail without a mask (fewer key blocks than the
    GPU's SMs, 8 Bc d + 16 bytes each: at most 0.25 MiB at d = 64 and 8.5 MiB at d = 128 on an
    H100's grid here)."""
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


def _name_list(text, flag, what, allowed, hint, aliases=None, lower=False):
    """A comma-separated list of names from `allowed` (after `aliases`), in the order given,
    duplicates dropped; argparse's error naming `flag` for an unknown name or an empty list."""
    out = []
    for x in text.replace(" ", "").split(","):
        if not x:
            continue
        key = x.lower() if lower else x
        name = (aliases or {}).get(key, key)
        if name not in allowed:
            raise argparse.ArgumentTypeError("%s: unknown %s %r (%s)" % (flag, what, x, hint))
        if name not in out:
            out.append(name)
    if not out:
        raise argparse.ArgumentTypeError("%s: empty list" % flag)
    return out


def _dtype_list(text):
    return _name_list(text, "--dtypes", "dtype", tuple(DTYPE_ALIASES.values()), "use bf16, f16",
                      aliases=DTYPE_ALIASES, lower=True)


def _backend_list(text):
    return _name_list(text, "--backends", "backend", ALL_BACKENDS,
                      "choose from %s" % ",".join(ALL_BACKENDS))


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
    return _name_list(text, "--bwd-backends", "backend", ALL_GRAD_BACKENDS,
                      "choose from %s" % ",".join(ALL_GRAD_BACKENDS),
                      aliases={"flashgen-direct": "flashgen_direct", "direct": "flashgen_direct"})


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
