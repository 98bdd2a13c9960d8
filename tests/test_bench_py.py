#!/usr/bin/env python3
"""CPU checks of bench/bench.py and bench/plot.py (plain unittest; needs neither torch nor a GPU):
--help and --dry-run run with torch unimportable, the grid has the size and shapes of
ANCHORS.md for every pass (--pass fwd|bwd|fwdbwd|all), the FLOP formulas (backward 2.5x and
forward + backward 3.5x the forward, causal halves), and the Markdown report renders forward
and backward rows from synthetic results.json files, merged with --from-json A B; every name
bench.py's modules (and peer_kernels.py) use is defined, peer_kernels.py's arguments and trace
parsing (the measuring code runs only on a GPU).

    python3 tests/test_bench_py.py
"""

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import json
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench", "bench.py")
PLOT = os.path.join(ROOT, "bench", "plot.py")

# Runs bench.py's main with `import torch` made to fail, so a lazy import is proven.
NO_TORCH = ("import sys, runpy; sys.modules['torch'] = None; sys.modules['numpy'] = None; "
            "sys.modules['matplotlib'] = None; sys.argv = [%r] + sys.argv[1:]; "
            "runpy.run_path(%r, run_name='__main__')" % (BENCH, BENCH))


def run_bench(*args):
    return subprocess.run([sys.executable, "-c", NO_TORCH] + list(args), capture_output=True,
                          text=True, timeout=120)


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_bench():
    return load_module("bench_under_test", BENCH)


def grid_lines(stdout):
    """The dry-run's config lines, split: #, pass, dtype, d, causal, B, H, N, GFLOP, ..."""
    return [l.split() for l in stdout.splitlines() if l[:1].isdigit()]


class BenchCli(unittest.TestCase):
    def test_help_without_torch(self):
        r = run_bench("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for flag in ("--quick", "--dtypes", "--backends", "--write-benchmarks-md", "--dry-run",
                     "--lib", "--reps", "--tokens", "--hidden", "--pass", "--bwd-backends",
                     "--from-json"):
            self.assertIn(flag, r.stdout)

    def test_dry_run_default_grid(self):
        r = run_bench("--dry-run")  # --pass all: fwd, bwd, fwdbwd
        self.assertEqual(r.returncode, 0, r.stderr)
        # forward: 2 dtypes x d in {64, 96, 128, 192, 256} x 2 causal x 6 N; the backward passes
        # at d in {64, 128}
        self.assertIn("configs: 216", r.stdout)
        self.assertIn("configs fwd: 120", r.stdout)
        for p in ("bwd", "fwdbwd"):
            self.assertIn("configs %s: 48" % p, r.stdout)
        self.assertIn("passes fwd,bwd,fwdbwd", r.stdout)
        self.assertIn("backward backends flashgen,flashgen_direct,flash,cudnn", r.stdout)
        lines = grid_lines(r.stdout)
        self.assertEqual(len(lines), 216)
        self.assertEqual([c[1] for c in lines], ["fwd"] * 120 + ["bwd"] * 48 + ["fwdbwd"] * 48)
        per_pass = {}
        for cols in lines:
            _, pass_, dtype, d, causal, B, H, N, gflop = cols[:9]
            d, B, H, N = int(d), int(B), int(H), int(N)
            self.assertIn(dtype, ("bf16", "f16"))
            self.assertEqual(B * N, 16384)
            self.assertEqual(H, 2048 // d)  # H * d = 2048, or the largest below (d = 96, 192)
            fwd = 4 * B * H * N * N * d / (2 if causal == "yes" else 1)
            want = fwd * {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}[pass_]
            self.assertAlmostEqual(float(gflop), want / 1e9, places=2)
            per_pass.setdefault(pass_, []).append((dtype, d, causal, N))
        self.assertEqual({c[1] for c in per_pass["fwd"]}, {64, 96, 128, 192, 256})
        self.assertEqual(per_pass["bwd"], [c for c in per_pass["fwd"] if c[1] in (64, 128)])
        self.assertEqual(per_pass["bwd"], per_pass["fwdbwd"])
        # --d names the head dims of every pass
        r = run_bench("--dry-run", "--d", "96")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual({int(c[3]) for c in grid_lines(r.stdout)}, {96})
        self.assertIn("configs bwd: 24", r.stdout)

    def test_dry_run_quick(self):
        r = run_bench("--dry-run", "--quick")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("configs: 36", r.stdout)  # bf16 x {128, 64} x causal both x {1k, 4k, 16k}
        self.assertIn("configs bwd: 12", r.stdout)  # x 3 passes
        self.assertNotIn(" f16 ", r.stdout)
        r = run_bench("--dry-run", "--quick", "--pass", "bwd")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("configs: 12", r.stdout)
        self.assertEqual({c[1] for c in grid_lines(r.stdout)}, {"bwd"})

    def test_dry_run_passes(self):
        for arg, want in (("fwd", ["fwd"]), ("bwd", ["bwd"]), ("fwdbwd", ["fwdbwd"]),
                          ("all", ["fwd", "bwd", "fwdbwd"]), ("fwdbwd,fwd", ["fwd", "fwdbwd"]),
                          ("bwd,bwd", ["bwd"])):
            r = run_bench("--dry-run", "--pass", arg, "--d", "64", "--n", "1024,4096")
            self.assertEqual(r.returncode, 0, (arg, r.stderr))
            passes = [c[1] for c in grid_lines(r.stdout)]
            self.assertEqual(passes, [p for p in want for _ in range(8)], arg)  # pass-major
            self.assertIn("configs: %d" % (8 * len(want)), r.stdout)

    def test_dry_run_grad_backends(self):
        r = run_bench("--dry-run", "--pass", "bwd", "--backends", "flash,cudnn")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("backward backends flash,cudnn", r.stdout)  # flashgen_direct needs flashgen
        r = run_bench("--dry-run", "--pass", "bwd", "--bwd-backends", "flashgen-direct,cudnn")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("backward backends flashgen_direct,cudnn", r.stdout)
        r = run_bench("--dry-run", "--pass", "bwd", "--backends", "math",
                      "--bwd-backends", "flash")
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("--pass fwd", r.stderr)  # says what to do
        r = run_bench("--dry-run", "--pass", "fwd", "--backends", "math",
                      "--bwd-backends", "flash")
        self.assertEqual(r.returncode, 0, r.stderr)  # no backward pass: nothing to complain of

    def test_dry_run_options(self):
        r = run_bench("--dry-run", "--pass", "fwd", "--dtypes", "f16", "--d", "128", "--causal",
                      "1", "--n", "2048,8192", "--tokens", "32768", "--hidden", "4096")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("configs: 2", r.stdout)
        self.assertIn("   16   32   2048", r.stdout.replace("yes", ""))  # B = 16, H = 32

    def test_bad_arguments(self):
        for args in (("--dtypes", "fp8"), ("--backends", "flash,xformers"), ("--causal", "maybe"),
                     ("--n", "0"), ("--d", "x"), ("--pass", "backward"), ("--pass", ","),
                     ("--bwd-backends", "flash,xformers")):
            r = run_bench("--dry-run", *args)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            self.assertIn("bench.py", r.stderr)

    def test_measure_without_torch_says_so(self):
        r = run_bench("--quick", "--out", tempfile.mkdtemp())
        self.assertEqual(r.returncode, 1)
        self.assertIn("PyTorch is needed", r.stderr)


class BenchFormulas(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bench = load_bench()

    def test_flops(self):
        f = self.bench.attention_flops
        self.assertEqual(f(1, 1, 2, 3, False), 4 * 2 * 2 * 3)
        self.assertEqual(f(1, 1, 2, 3, True), 4 * 2 * 2 * 3 // 2)
        self.assertEqual(f(1, 16, 16384, 128, False), 4 * 16 * 16384 ** 2 * 128)
        for B, H, N, d in ((32, 32, 512, 64), (4, 16, 4096, 128)):
            self.assertEqual(2 * f(B, H, N, d, True), f(B, H, N, d, False))

    def test_pass_flops(self):
        pf, f = self.bench.pass_flops, self.bench.attention_flops
        self.assertEqual(pf(1, 1, 2, 3, False), f(1, 1, 2, 3, False))
        self.assertEqual(pf(1, 1, 2, 3, False, "fwd"), 4 * 2 * 2 * 3)
        self.assertEqual(pf(1, 1, 2, 3, False, "bwd"), 10 * 2 * 2 * 3)    # 2.5 x forward
        self.assertEqual(pf(1, 1, 2, 3, True, "bwd"), 5 * 2 * 2 * 3)      # causal halves
        self.assertEqual(pf(1, 1, 2, 3, False, "fwdbwd"), 14 * 2 * 2 * 3)  # 3.5 x forward
        self.assertEqual(pf(1, 1, 2, 3, True, "fwdbwd"), 7 * 2 * 2 * 3)
        for B, H, N, d in ((32, 32, 512, 64), (1, 16, 16384, 128), (2, 32, 8192, 64)):
            for causal in (False, True):
                fwd = f(B, H, N, d, causal)
                self.assertEqual(2 * pf(B, H, N, d, causal, "bwd"), 5 * fwd)
                self.assertEqual(2 * pf(B, H, N, d, causal, "fwdbwd"), 7 * fwd)
                self.assertIsInstance(pf(B, H, N, d, causal, "bwd"), int)
        with self.assertRaises(ValueError):
            pf(1, 1, 2, 3, False, "backward")

    def test_workspace_formula(self):
        ws = self.bench.flashgen_bwd_workspace_bytes
        self.assertEqual(ws(1, 16, 16384, 128), 16 * 16384 * 129 * 4)  # (d + 1) floats per row
        self.assertEqual(ws(32, 32, 512, 64), ws(1, 32, 16384, 64))  # O(B*N): the same at 16k
        self.assertEqual(2 * ws(1, 16, 8192, 128), ws(1, 16, 16384, 128))

    def test_grid_module(self):
        args = self.bench.parse_args(["--quick", "--pass", "fwd"])
        grid = self.bench.build_grid(args)
        self.assertEqual(len(grid), 12)
        self.assertEqual({c["N"] for c in grid}, {1024, 4096, 16384})
        self.assertEqual({c["d"] for c in grid}, {64, 128})
        self.assertEqual({c["causal"] for c in grid}, {False, True})
        self.assertTrue(all(c["B"] * c["N"] == 16384 and c["H"] * c["d"] == 2048 for c in grid))
        args = self.bench.parse_args(["--quick"])
        self.assertEqual(args.passes, ["fwd", "bwd", "fwdbwd"])
        self.assertEqual(args.grad_backends, ["flashgen", "flashgen_direct", "flash", "cudnn"])
        grid = self.bench.build_grid(args)
        self.assertEqual(len(grid), 36)
        self.assertEqual([c["pass"] for c in grid], ["fwd"] * 12 + ["bwd"] * 12 + ["fwdbwd"] * 12)
        for c in grid:
            self.assertEqual(c["flops"], self.bench.pass_flops(c["B"], c["H"], c["N"], c["d"],
                                                               c["causal"], c["pass"]))

    def test_markdown_and_from_json(self):
        b = self.bench
        rows = []
        for causal in (False, True):
            for N in (512, 16384):
                B, H = 16384 // N, 16
                fl = b.attention_flops(B, H, N, 128, causal)
                for name, ms, extra in (("flashgen", 2.0, 0.0), ("flash", 3.0, 1.0),
                                        ("cudnn", 1.5, 2.0), ("math", 20.0, 3000.0)):
                    r = dict(dtype="bf16", d=128, causal=causal, B=B, H=H, N=N, flops=fl,
                             backend=name, io_mib=256.0)
                    if name == "math" and N == 16384:
                        r.update(status="skipped", reason="math would need too much")
                    else:
                        r.update(status="ok", median_ms=ms, tflops=fl / (ms * 1e-3) / 1e12,
                                 extra_mib=extra, device_delta_mib=extra, reference="flash",
                                 max_diff=0.05 if name == "cudnn" else 0.001)
                    rows.append(r)
        meta = {"gpu": "Test GPU", "backends": ["flashgen", "flash", "cudnn", "math"],
                "tokens": 16384, "hidden": 2048, "command": "python3 bench/bench.py",
                "dtypes": ["bf16"], "date": "2026-01-01"}
        md = b.render_markdown(rows, meta)
        self.assertIn("| bf16 | 128 | no | 32 | 16 | 512 |", md)
        self.assertIn("1.50×", md)  # flashgen / flash = 3.0 ms / 2.0 ms
        self.assertIn("0.75×", md)  # flashgen / cudnn = 1.5 / 2.0
        self.assertIn("⚠", md)      # cudnn max diff 0.05 > 2e-2
        self.assertIn("10.0×", md)  # speed-up over math at N = 512
        self.assertIn("skipped: math would need too much", md)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.json")
            with open(path, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f)
            bm = os.path.join(tmp, "BENCHMARKS.md")
            r = run_bench("--from-json", path, "--no-plot", "--write-benchmarks-md", bm)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.exists(os.path.join(tmp, "results.md")))
            with open(bm) as f:
                text = f.read()
            self.assertIn("Test GPU", text)
            self.assertIn("python3 bench/bench.py", text)


def synthetic_grad_rows(bench, passes=("bwd", "fwdbwd")):
    """bwd / fwdbwd rows as Bench.run_config_grad writes them (bf16, d = 128, causal both,
    N = 512 and 16384): flashgen 2.0 ms, flashgen direct 1.9 ms, flash 2.5 ms, cuDNN 1.6 ms, and
    cuDNN unsupported at causal N = 16384."""
    rows = []
    for pass_ in passes:
        for causal in (False, True):
            for N in (512, 16384):
                B, H, d = 16384 // N, 16, 128
                fl = bench.pass_flops(B, H, N, d, causal, pass_)
                ws = bench.flashgen_bwd_workspace_bytes(B, H, N, d) / 1048576.0
                for name, ms in (("flashgen", 2.0), ("flashgen_direct", 1.9), ("flash", 2.5),
                                 ("cudnn", 1.6)):
                    r = {"pass": pass_, "dtype": "bf16", "d": d, "causal": causal, "B": B, "H": H,
                         "N": N, "flops": fl, "backend": name, "io_mib": 512.0,
                         "grads_mib": 192.0}
                    if name == "cudnn" and causal and N == 16384:
                        r.update(status="unsupported", reason="cuDNN refused the shape")
                        rows.append(r)
                        continue
                    extra = {"flashgen": ws, "flashgen_direct": ws, "flash": 8.0,
                             "cudnn": 40.0}[name]
                    diffs = {"dq": 0.0, "dk": 0.0, "dv": 0.0} if name == "flash" else \
                        {"dq": 3.9e-3, "dk": 7.8e-3, "dv": 2.0e-3}
                    scaled = max(diffs.values()) / 4.0
                    if name == "cudnn" and not causal and N == 512:
                        diffs = {"dq": 0.5, "dk": 7.8e-3, "dv": 2.0e-3}
                        scaled = 0.5 / 4.0  # above the bf16 limit of 2e-2: flagged
                    if name == "flashgen" and N == 16384 and not causal:
                        diffs = {"dq": 0.05, "dk": 0.01, "dv": 0.01}
                        scaled = 0.05 / 4.0  # 0.05 absolute, but below the limit once scaled
                    r.update(status="ok", median_ms=ms, tflops=fl / (ms * 1e-3) / 1e12,
                             extra_mib=extra, device_delta_mib=extra, reference="flash",
                             grad_max_diff=diffs, max_diff=max(diffs.values()),
                             max_diff_scaled=scaled, nonfinite=False,
                             suspicious=scaled > 2e-2)
                    if name.startswith("flashgen"):
                        r["fg_workspace_mib"] = ws
                    rows.append(r)
    return rows


GRAD_META = {"gpu": "Test GPU", "backends": ["flashgen", "flash", "cudnn"],
             "grad_backends": ["flashgen", "flashgen_direct", "flash", "cudnn"],
             "passes": ["bwd", "fwdbwd"], "tokens": 16384, "hidden": 2048,
             "command": "python3 bench/bench.py --pass bwd,fwdbwd", "dtypes": ["bf16"],
             "date": "2026-01-02"}


class BenchBackwardReport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bench = load_bench()

    def section(self, md, title):
        """The text of one '## title' section."""
        start = md.index("## " + title)
        end = md.find("\n## ", start + 3)
        return md[start:] if end < 0 else md[start:end]

    def table_row(self, text, prefix):
        rows = [l for l in text.splitlines() if l.startswith(prefix)]
        self.assertEqual(len(rows), 1, (prefix, text))
        return [c.strip() for c in re.split(r"(?<!\\)\|", rows[0].strip("|"))]

    def test_backward_tables(self):
        b = self.bench
        md = b.render_markdown(synthetic_grad_rows(b), GRAD_META)
        self.assertNotIn("## Forward TFLOP/s", md)  # no forward rows: no forward sections
        self.assertNotIn("standard attention", md)
        bwd = self.section(md, "Backward TFLOP/s (Test GPU)")
        head = self.table_row(bwd, "| dtype |")
        self.assertEqual(head, ["dtype", "d", "causal", "B", "H", "N", "flashgen",
                                "flashgen direct", "flash", "cudnn", "flashgen/flash",
                                "flashgen/cudnn", "autograd µs",
                                "flashgen max\\|Δ\\| dq / dk / dv"])
        cells = self.table_row(bwd, "| bf16 | 128 | no | 32 | 16 | 512 |")
        # bwd FLOPs = 2.5 x 4*32*16*512^2*128 = 1.72e11 / 2 ms = 86 TFLOP/s
        self.assertEqual(cells[6], "86")
        self.assertEqual(cells[7], "90")  # direct: 1.9 ms
        self.assertEqual(cells[8], "69")  # flash: 2.5 ms
        self.assertEqual(cells[9], "107 ⚠")  # cuDNN: scaled dq diff 0.125 > 2e-2
        self.assertEqual(cells[10], "1.25×")  # flashgen / flash = 2.5 / 2.0
        self.assertEqual(cells[11], "0.80×")  # flashgen / cuDNN = 1.6 / 2.0
        self.assertEqual(cells[12], "+100")  # autograd overhead: 2.0 - 1.9 ms
        self.assertEqual(cells[13], "3.9e-03 / 7.8e-03 / 2.0e-03 vs flash")
        cells = self.table_row(bwd, "| bf16 | 128 | no | 1 | 16 | 16384 |")
        self.assertEqual(cells[6], "2749")  # 0.05 absolute dq diff, under the limit once scaled
        self.assertEqual(cells[13], "5.0e-02 / 1.0e-02 / 1.0e-02 vs flash")
        cells = self.table_row(bwd, "| bf16 | 128 | yes | 1 | 16 | 16384 |")
        self.assertEqual(cells[9], "n/a")
        self.assertEqual(cells[11], "—")
        self.assertIn("flashgen/flash: 4 of 4 rows at 1.00× or above; min 1.25×", bwd)
        self.assertIn("flashgen/cudnn: 0 of 3 rows at 1.00× or above", bwd)

        fb = self.section(md, "Forward + backward TFLOP/s (Test GPU)")
        cells = self.table_row(fb, "| bf16 | 128 | yes | 32 | 16 | 512 |")
        # fwd+bwd FLOPs = 3.5 x 4*32*16*512^2*128 / 2 (causal) = 1.20e11 / 2 ms = 60 TFLOP/s
        self.assertEqual(cells[6], "60")
        self.assertIn("3.5 × 4·B·H·N²·d", fb)

        mem = self.section(md, "Peak extra device memory of one backward call (MiB)")
        head = self.table_row(mem, "| dtype |")
        self.assertEqual(head, ["dtype", "d", "causal", "N", "grads MiB", "N×N MiB", "flashgen",
                                "flashgen direct", "flash", "cudnn", "flashgen B/row"])
        cells = self.table_row(mem, "| bf16 | 128 | no | 16384 |")
        self.assertEqual(cells[5], "16384")  # 16 * 16384^2 * 4 bytes
        self.assertEqual(self.table_row(mem, "| bf16 | 128 | no | 512 |")[5], "512")
        self.assertEqual(cells[6], "129 / 129")  # the workspace: 16 * 16384 * 129 * 4 bytes
        self.assertEqual(cells[10], "516")  # (d + 1) * 4 bytes per query row: O(N)
        self.assertEqual(self.table_row(mem, "| bf16 | 128 | no | 512 |")[10], "516")
        self.assertIn("at the largest N measured (N = 16384)", mem)
        self.assertNotIn("fwdbwd", mem)  # the memory table is the backward pass's

        notes = self.section(md, "Notes")
        self.assertIn("- bwd bf16 d=128 causal N=16384 cudnn: unsupported: cuDNN refused the "
                      "shape", notes)
        self.assertIn("- bwd bf16 d=128 non-causal N=512 cudnn: max |Δ| dq 0.5, dk 0.0078, "
                      "dv 0.002 vs flash (largest / max(1, max |ref|) = 0.125, limit 0.02) — "
                      "suspicious", notes)
        self.assertNotIn("flashgen: max |Δ|", notes)
        self.assertIn("python3 bench/bench.py --pass bwd,fwdbwd", self.section(md, "Run"))

    def test_forward_then_backward(self):
        """Forward rows keep their sections and columns, the backward ones follow."""
        b = self.bench
        fwd = [dict(r, **{"pass": "fwd"}) for r in synthetic_grad_rows(b, ("bwd",))
               if r["backend"] != "flashgen_direct"]
        for r in fwd:
            r["flops"] = b.attention_flops(r["B"], r["H"], r["N"], r["d"], r["causal"])
        rows = fwd + synthetic_grad_rows(b, ("bwd",))
        md = b.render_markdown(rows, dict(GRAD_META, passes=["fwd", "bwd"]))
        order = [md.index(t) for t in ("## Forward TFLOP/s", "## Peak extra device memory of one "
                                       "call", "## Backward TFLOP/s", "## Peak extra device "
                                       "memory of one backward call", "## Notes", "## Run")]
        self.assertEqual(order, sorted(order))
        fwd_sec = self.section(md, "Forward TFLOP/s")
        self.assertIn("| dtype | d | causal | B | H | N | flashgen | flash | cudnn | "
                      "flashgen/flash | flashgen/cudnn | flashgen max\\|Δ\\| |", fwd_sec)
        self.assertNotIn("direct", fwd_sec)
        self.assertNotIn("Forward + backward", md)

    def test_from_json_merge_and_benchmarks_md(self):
        b = self.bench
        fwd_rows = []  # an older forward-only results.json: rows without "pass"
        for N in (512, 16384):
            B = 16384 // N
            fl = b.attention_flops(B, 16, N, 128, False)
            for name, ms in (("flashgen", 1.0), ("flash", 1.4)):
                fwd_rows.append(dict(dtype="bf16", d=128, causal=False, B=B, H=16, N=N, flops=fl,
                                     backend=name, io_mib=256.0, status="ok", median_ms=ms,
                                     tflops=fl / (ms * 1e-3) / 1e12, extra_mib=0.0,
                                     device_delta_mib=0.0, reference="flash", max_diff=0.001))
        fwd_meta = {"gpu": "Test GPU", "backends": ["flashgen", "flash"], "tokens": 16384,
                    "hidden": 2048, "command": "python3 bench/bench.py --pass fwd",
                    "dtypes": ["bf16"], "date": "2026-01-01"}
        grad = synthetic_grad_rows(b, ("bwd",))
        later = [dict(r, median_ms=4.0, tflops=r["flops"] / 4e-3 / 1e12) for r in grad
                 if r["backend"] == "flash" and r["N"] == 512 and not r["causal"]]
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for name, meta, rows in (("fwd", fwd_meta, fwd_rows), ("bwd", GRAD_META, grad),
                                     ("again", dict(GRAD_META, command="python3 again"),
                                      later)):
                os.makedirs(os.path.join(tmp, name))
                paths.append(os.path.join(tmp, name, "results.json"))
                with open(paths[-1], "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f)
            out = os.path.join(tmp, "merged")
            bm = os.path.join(tmp, "BENCHMARKS.md")
            r = run_bench("--from-json", *paths, "--out", out, "--no-plot",
                          "--write-benchmarks-md", bm)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(out, "results.json")) as f:
                merged = json.load(f)
            self.assertEqual(len(merged["rows"]), len(fwd_rows) + len(grad))  # one replaced
            self.assertEqual(merged["meta"]["passes"], ["fwd", "bwd"])
            self.assertEqual([x["command"] for x in merged["meta"]["runs"]],
                             ["python3 bench/bench.py --pass fwd",
                              "python3 bench/bench.py --pass bwd,fwdbwd", "python3 again"])
            with open(os.path.join(out, "results.md")) as f:
                md = f.read()
            # the forward table as before (columns of the united --backends)
            self.assertIn("| bf16 | 128 | no | 32 | 16 | 512 | 69 | 49 | — | 1.40× | — |", md)
            bwd = self.section(md, "Backward TFLOP/s")
            cells = self.table_row(bwd, "| bf16 | 128 | no | 32 | 16 | 512 |")
            self.assertEqual(cells[8], "43")  # the later file's flash row (4 ms, not 2.5)
            self.assertEqual(cells[10], "2.00×")
            with open(bm) as f:
                text = f.read()
            self.assertIn("Attention (forward, backward), flashgen against PyTorch's SDPA", text)
            self.assertIn("`python3 again` (2026-01-02)", text)
            self.assertIn("## Backward TFLOP/s (Test GPU)", text)
            # Merging the merged file again keeps its runs; a run all of whose rows a later
            # file replaces (the whole forward grid rerun) is no longer listed.
            newfwd = os.path.join(tmp, "newfwd.json")
            with open(newfwd, "w") as f:
                json.dump({"meta": dict(fwd_meta, command="python3 fwd again",
                                        date="2026-01-03"), "rows": fwd_rows}, f)
            out2 = os.path.join(tmp, "merged2")
            r = run_bench("--from-json", os.path.join(out, "results.json"), newfwd, "--out",
                          out2, "--no-plot")
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(out2, "results.json")) as f:
                merged2 = json.load(f)
            self.assertEqual(len(merged2["rows"]), len(fwd_rows) + len(grad))
            self.assertEqual([x["command"] for x in merged2["meta"]["runs"]],
                             ["python3 bench/bench.py --pass bwd,fwdbwd", "python3 again",
                              "python3 fwd again"])
            r = run_bench("--from-json", paths[0], os.path.join(tmp, "missing.json"))
            self.assertEqual(r.returncode, 1)
            self.assertIn("cannot read", r.stderr)

    def test_plot_names(self):
        plot = load_module("plot_under_test", PLOT)
        rows = [{"pass": p, "dtype": t} for p in ("fwd", "bwd", "fwdbwd") for t in ("bf16", "f16")]
        rows.append({"dtype": "bf16"})  # an old forward row
        jobs = plot.plot_jobs(rows, {"dtypes": ["bf16", "f16"]})
        self.assertEqual(jobs, [("fwd", "bf16", "plot.png"), ("fwd", "f16", "plot_f16.png"),
                                ("bwd", "bf16", "plot_bwd.png"),
                                ("bwd", "f16", "plot_bwd_f16.png"),
                                ("fwdbwd", "bf16", "plot_fwdbwd.png"),
                                ("fwdbwd", "f16", "plot_fwdbwd_f16.png")])
        jobs = plot.plot_jobs([{"pass": "bwd", "dtype": "f16"}], {"dtypes": ["bf16", "f16"]})
        self.assertEqual(jobs, [("bwd", "f16", "plot_bwd.png")])


class BenchNames(unittest.TestCase):
    """Every global name that bench.py's modules use is defined, imported or a builtin: the
    measuring code (bench_measure.py) runs only with torch and a GPU, so a name lost when code
    moves between the modules would otherwise show first on the GPU machine."""

    @staticmethod
    def undefined(path):
        import builtins
        import symtable
        top = symtable.symtable(open(path).read(), path, "exec")
        defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
        bad = set()

        def walk(t):
            for s in t.get_symbols():
                free_at_top = t.get_type() == "module" and not (s.is_assigned() or s.is_imported())
                if s.is_referenced() and (s.is_global() or free_at_top):
                    n = s.get_name()
                    if n not in defined and not hasattr(builtins, n) and n != "__file__":
                        bad.add("%s (in %s)" % (n, t.get_name()))
            for c in t.get_children():
                walk(c)

        walk(top)
        return sorted(bad)

    def test_modules_define_what_they_use(self):
        for name in ("bench.py", "bench_grid.py", "bench_report.py", "bench_measure.py", "plot.py",
                     "peer_kernels.py"):
            path = os.path.join(ROOT, "bench", name)
            self.assertEqual(self.undefined(path), [], name)

    def test_peer_kernels_arguments_and_trace(self):
        pk = load_module("peer_kernels", os.path.join(ROOT, "bench", "peer_kernels.py"))
        a = pk.parse_args([])
        self.assertEqual(a.problems, pk.DEFAULT_PROBLEMS)
        self.assertEqual(a.backends, ["cudnn", "flash", "flashgen"])
        a = pk.parse_args(["--pass", "bwd", "--d", "64", "--n", "1024", "--causal", "1",
                           "--backends", "cudnn"])
        self.assertEqual((a.problems, a.backends), ([("bwd", 64, 1, 1024)], ["cudnn"]))
        self.assertEqual(pk.parse_args(["--pass", "fwd", "--d", "96"]).problems,
                         [("fwd", 96, 0, 4096)])
        for bad in (["--backends", "triton"], ["--pass", "bwd", "--n", "1000"], ["--d", "100"]):
            with self.assertRaises(SystemExit):
                pk.parse_args(bad)
        # A chrome trace as torch.profiler writes it: kernels grouped by name, mean durations.
        events = [{"cat": "kernel", "name": "k1", "dur": 10.0,
                   "args": {"grid": [132, 1, 1], "block": [384, 1, 1],
                            "registers per thread": 168, "shared memory": 216064}},
                  {"cat": "cpu_op", "name": "aten::add", "dur": 5.0},
                  {"cat": "kernel", "name": "k1", "dur": 30.0, "args": {}},
                  {"cat": "kernel", "name": "k0", "dur": 2.0, "args": {"grid": [8, 1, 1]}}]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.json")
            with open(path, "w") as f:
                json.dump({"traceEvents": events}, f)
            rows = pk.kernel_table(path)
        self.assertEqual(rows, [("k1", 2, 20.0, [132, 1, 1], [384, 1, 1], 168, 216064),
                                ("k0", 1, 2.0, [8, 1, 1], None, None, None)])

    def test_the_check_sees_a_missing_name(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "m.py")
            with open(path, "w") as f:
                f.write("import os\nX = 1\ndef f():\n    return write_json(X) + os.sep\n"
                        "class B:\n    def m(self):\n        return MAX_REPS\n")
            self.assertEqual(self.undefined(path), ["MAX_REPS (in m)", "write_json (in f)"])


if __name__ == "__main__":
    prog = unittest.main(exit=False, verbosity=1)
    res = prog.result
    failed = len(res.failures) + len(res.errors)
    print("bench_py: %d passed, %d failed, %d skipped"
          % (res.testsRun - failed - len(res.skipped), failed, len(res.skipped)))
    sys.exit(1 if failed else 0)
