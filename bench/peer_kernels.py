#!/usr/bin/env python3
"""Which kernels PyTorch's attention backends launch for a problem, and their launch shapes.

For each problem and backend (SDPA cuDNN, SDPA flash = FlashAttention-2, and flashgen when its
library loads) one forward (or forward + backward) is run under torch.profiler, and each kernel is
printed with its mean duration, grid, block, registers per thread and dynamic shared memory.
The peers' kernel names spell their tiles (cuDNN's `..._bprop_wgmma_..._64x64x128_...`, FA2's
Flash_bwd_kernel_traits<...>), the grid says whether they are persistent: the facts to compare a
flashgen kernel with (bench/NOTES.md, session 16). A measuring aid, not a benchmark: for ratios
use bench.py, which times every backend the same way.

  python3 bench/peer_kernels.py                          # a default set of problems
  python3 bench/peer_kernels.py --pass bwd --d 128 --n 4096 --causal 1
  python3 bench/peer_kernels.py --backends cudnn --min-us 50

Problems are bench.py's grid rows: B N = 16384 tokens, H = 2048 // d, bf16, (B, H, N, d) tensors.
"""
import argparse
import contextlib
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from bench_grid import SDPA_BACKEND_NAMES  # noqa: E402  (the names bench.py uses)

DEFAULT_PROBLEMS = [("fwd", 128, 1, 512), ("fwd", 64, 1, 1024), ("bwd", 128, 0, 4096),
                    ("bwd", 128, 1, 4096), ("bwd", 64, 0, 4096), ("bwd", 64, 0, 1024)]
BACKENDS = ("cudnn", "flash", "flashgen")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"),
                    help="forward, or forward then backward (the default set if no --pass)")
    ap.add_argument("--d", type=int, default=128, help="head dim (with --pass; default 128)")
    ap.add_argument("--n", type=int, default=4096, help="sequence length (with --pass)")
    ap.add_argument("--causal", type=int, choices=(0, 1), default=0, help="with --pass")
    ap.add_argument("--backends", default=",".join(BACKENDS),
                    help="comma-separated: cudnn, flash, flashgen (default all three)")
    ap.add_argument("--min-us", type=float, default=0.0,
                    help="print only kernels of at least this mean duration (us)")
    ap.add_argument("--calls", type=int, default=3, help="profiled calls per backend (default 3)")
    a = ap.parse_args(argv)
    names = [b for b in a.backends.split(",") if b]
    bad = [b for b in names if b not in BACKENDS]
    if bad:
        ap.error("--backends: unknown %s (known: %s)" % (", ".join(bad), ", ".join(BACKENDS)))
    a.backends = names
    if a.n < 1 or 16384 % a.n or a.d < 8 or a.d > 256 or a.d % 8:
        ap.error("--n must divide 16384 (the grid's B N = 16384) and --d be a multiple of 8 "
                 "from 8 to 256 (H = 2048 // d, as bench.py's grid)")
    a.problems = [(a.pass_, a.d, a.causal, a.n)] if a.pass_ else DEFAULT_PROBLEMS
    return a


def kernel_table(trace_path):
    """[(name, calls, mean us, grid, block, registers, shared memory)] of a chrome trace's
    kernels, in order of first launch."""
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    seen = {}
    for e in events:
        a = e.get("args", {})
        s = seen.setdefault(e["name"], [0, 0.0, a.get("grid"), a.get("block"),
                                        a.get("registers per thread"), a.get("shared memory")])
        s[0] += 1
        s[1] += e["dur"]
    return [(name, c, dur / c, g, b, r, sm) for name, (c, dur, g, b, r, sm) in seen.items()]


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile
    if not torch.cuda.is_available():
        sys.exit("peer_kernels.py: needs a CUDA GPU")
    fg = None
    if "flashgen" in a.backends:
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        try:
            import flashgen as fg
        except Exception as e:  # the library not built, or not found: say so, go on without it
            print("flashgen not measured: %s" % e)
    tmp = tempfile.mkdtemp(prefix="peer_kernels_")
    for pass_, d, causal, n in a.problems:
        B, H = 16384 // n, 2048 // d
        q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16,
                               requires_grad=pass_ == "bwd") for _ in range(3))
        do = torch.randn_like(q)
        for be in a.backends:
            if be == "flashgen" and fg is None:
                continue
            if be == "flashgen":
                fwd = lambda: fg.attention(q, k, v, causal=bool(causal))  # noqa: E731
                ctx = contextlib.nullcontext()
            else:
                fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))  # noqa: E731
                ctx = sdpa_kernel([getattr(SDPBackend, SDPA_BACKEND_NAMES[be])])

            def step():
                o = fwd()
                if pass_ == "bwd":
                    torch.autograd.grad(o, (q, k, v), do)

            print("== %s d=%d causal=%d N=%d B=%d H=%d %s" % (pass_, d, causal, n, B, H, be))
            try:
                with ctx:
                    for _ in range(2):
                        step()
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(a.calls):
                            step()
                        torch.cuda.synchronize()
            except RuntimeError as e:
                print("   not run: %s" % str(e).splitlines()[0])
                continue
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            for name, c, us, g, b, r, sm in kernel_table(path):
                if us >= a.min_us:
                    print("   %9.1f us x%-2d grid %s block %s regs %s smem %s  %s"
                          % (us, c // a.calls if c >= a.calls else c, g, b, r, sm, name[:160]))


if __name__ == "__main__":
    main()
