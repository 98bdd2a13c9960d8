"""bench_report.py: bench.py's reports, no torch: results.json read, merged (--from-json A B)
and written, results.md and BENCHMARKS.md rendered from the rows, the plots (plot.py; matplotlib
only there). bench.py is the entry point; see its docstring."""

import json
import os
import statistics
import sys

from bench_grid import (ALL_BACKENDS, ALL_GRAD_BACKENDS, ALL_PASSES, DIFF_LIMIT, GRAD_LABELS,
    GRAD_NAMES, HERE, MiB, PASS_TITLES, STANDARD_ATTENTION_N, row_pass)


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
    grad_backends) united, passes those of the rows, and meta["runs"] listing the command, date
    and passes of each run that still gives rows (a merged file brings its own runs along)."""
    if len(loaded) == 1:
        return loaded[0]
    merged, meta = {}, dict(loaded[0][0])
    for key in ("backends", "dtypes", "grad_backends"):
        vals = []
        for m, _ in loaded:
            vals += [v for v in (m.get(key) or []) if v not in vals]
        meta[key] = vals
    runs, origin, gpus = [], {}, set()
    for i, (m, rows) in enumerate(loaded):
        passes = m.get("passes") or sorted({row_pass(r) for r in rows}, key=ALL_PASSES.index)
        own = [{"command": m.get("command"), "date": m.get("date"), "passes": passes,
                "wall_s": m.get("wall_s")}]
        runs += [(run, i) for run in (m.get("runs") or own)]  # a merged file keeps its runs
        gpus.add(m.get("gpu"))
        for r in rows:
            merged[_row_key(r)] = r
            origin[_row_key(r)] = i
    # A run whose every row a later file replaced is no longer listed.
    live = {(origin[k], row_pass(r)) for k, r in merged.items()}
    meta["runs"] = [run for run, i in runs if any((i, p) in live for p in run.get("passes") or [])]
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
