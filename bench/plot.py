#!/usr/bin/env python3
"""plot.py: TFLOP/s against N from bench.py's results.json, one line per implementation, one
panel per (d, causal), one figure per (pass, dtype). Forward: plot.png is the first dtype of the
run, plot_<dtype>.png every other one (plot_f16.png for the default bf16,f16 run); backward:
plot_bwd.png, plot_bwd_<dtype>.png; forward + backward: plot_fwdbwd.png, plot_fwdbwd_<dtype>.png.

    python3 bench/plot.py bench/results/<date>/results.json [--out DIR]

Needs matplotlib (Agg backend, no display); bench.py calls make_plots() after a run.
"""

import json
import os
import sys

PASSES = ("fwd", "bwd", "fwdbwd")
YLABEL = {"fwd": "TFLOP/s (forward)", "bwd": "TFLOP/s (backward, 2.5× fwd FLOPs)",
          "fwdbwd": "TFLOP/s (fwd + bwd, 3.5× fwd FLOPs)"}
GRAD_ORDER = ("flashgen", "flashgen_direct", "flash", "cudnn", "efficient", "math")
STYLE = {  # backend: (label, colour, marker)
    "flashgen": ("flashgen", "#d62728", "o"),
    "flashgen_direct": ("flashgen direct (no autograd)", "#ff7f0e", "D"),
    "flash": ("SDPA flash (FA2)", "#1f77b4", "s"),
    "cudnn": ("SDPA cuDNN", "#2ca02c", "^"),
    "efficient": ("SDPA mem-efficient", "#9467bd", "v"),
    "math": ("SDPA math (standard)", "#7f7f7f", "x"),
}


def _pass(r):
    return r.get("pass", "fwd")  # rows of results.json files from before the backward


def plot_jobs(rows, meta):
    """[(pass, dtype, file name)] of the figures make_plots draws, in order (no matplotlib)."""
    dtypes = [t for t in meta.get("dtypes", []) if any(r["dtype"] == t for r in rows)]
    for r in rows:
        if r["dtype"] not in dtypes:
            dtypes.append(r["dtype"])
    jobs = []
    for p in PASSES:
        pdt = [t for t in dtypes if any(r["dtype"] == t and _pass(r) == p for r in rows)]
        for i, dt in enumerate(pdt):
            stem = "plot" if p == "fwd" else "plot_" + p
            jobs.append((p, dt, stem + ".png" if i == 0 else "%s_%s.png" % (stem, dt)))
    return jobs


def _plot_dtype(plt, rows, meta, dtype, path, pass_="fwd"):
    rows = [r for r in rows if r["dtype"] == dtype and _pass(r) == pass_]
    ds = sorted({r["d"] for r in rows})
    causals = sorted({bool(r["causal"]) for r in rows})
    if not ds or not causals:
        return False
    order = (list(meta.get("backends", STYLE)) if pass_ == "fwd"
             else list(meta.get("grad_backends") or []) + list(GRAD_ORDER))
    order += [r["backend"] for r in rows]
    backends = []
    for b in order:
        if b not in backends and any(r["backend"] == b for r in rows):
            backends.append(b)
    fig, axes = plt.subplots(len(ds), len(causals), figsize=(5.2 * len(causals), 3.9 * len(ds)),
                             squeeze=False, sharex=True)
    for i, d in enumerate(ds):
        for j, causal in enumerate(causals):
            ax = axes[i][j]
            for b in backends:
                pts = sorted((r["N"], r["tflops"]) for r in rows
                             if r["d"] == d and bool(r["causal"]) == causal and r["backend"] == b
                             and r.get("status") == "ok" and r.get("tflops"))
                if not pts:
                    continue
                label, colour, marker = STYLE.get(b, (b, None, "."))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, color=colour,
                        marker=marker, linewidth=2.2 if b == "flashgen" else 1.4,
                        linestyle="--" if b == "flashgen_direct" else "-")
            ax.set_xscale("log", base=2)
            ax.set_title("d = %d, %s" % (d, "causal" if causal else "non-causal"))
            ax.set_xlabel("N (sequence length; B·N = %s)" % meta.get("tokens", "?"))
            ax.set_ylabel(YLABEL.get(pass_, "TFLOP/s"))
            ax.set_ylim(bottom=0)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8, loc="best")
            ns = sorted({r["N"] for r in rows})
            if ns:
                ax.set_xticks(ns)
                ax.set_xticklabels([("%dk" % (n // 1024)) if n >= 1024 and n % 1024 == 0 else str(n)
                                    for n in ns])
    fig.suptitle("%s %s, %s — flashgen %s, torch %s, cuDNN %s (%s)"
                 % ({"fwd": "forward", "bwd": "backward", "fwdbwd": "forward + backward"}
                    .get(pass_, pass_), dtype, meta.get("gpu", "?"), meta.get("flashgen", "?"),
                    meta.get("torch", "?"), meta.get("cudnn", "?"), str(meta.get("date", ""))[:10]),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def make_plots(rows, meta, out_dir):
    """Writes the PNGs into out_dir; returns their paths ([] when matplotlib is missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print("plot.py: matplotlib unavailable (%s); no plots" % e, file=sys.stderr)
        return []
    paths = []
    for pass_, dt, name in plot_jobs(rows, meta):
        path = os.path.join(out_dir, name)
        try:
            if _plot_dtype(plt, rows, meta, dt, path, pass_):
                paths.append(path)
        except Exception as e:  # a plot must never lose the measurements
            print("plot.py: plotting %s %s failed: %s" % (pass_, dt, e), file=sys.stderr)
    return paths


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results_json")
    p.add_argument("--out", default=None, help="directory for the PNGs (default: the JSON's)")
    a = p.parse_args(argv)
    with open(a.results_json, encoding="utf-8") as f:
        data = json.load(f)
    out = a.out or os.path.dirname(os.path.abspath(a.results_json))
    os.makedirs(out, exist_ok=True)
    paths = make_plots(data["rows"], data["meta"], out)
    for p_ in paths:
        print(p_)
    return 0 if paths else 1


if __name__ == "__main__":
    sys.exit(main())
