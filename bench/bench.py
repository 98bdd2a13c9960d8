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

import datetime
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The rest of bench.py lives beside it (bench_grid.py, bench_report.py, bench_measure.py); found
# on sys.path also where this file is loaded as a module from elsewhere (tests/test_bench_py.py).
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# What the tests and other scripts reach through this module, and what main() uses.
from bench_grid import (attention_flops, build_grid, flashgen_bwd_workspace_bytes,  # noqa: E402
                        parse_args, pass_flops, print_grid)
from bench_report import finish, load_results, merge_results, render_markdown  # noqa: E402
from bench_measure import Bench, _stderr  # noqa: E402


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
