#!/usr/bin/env python3
"""CPU checks of bench/bench.py (plain unittest; needs neither torch nor a GPU):
--help and --dry-run run with torch unimportable, the grid has the size and shapes of
ANCHORS.md, the FLOP formula halves for causal, and the Markdown report renders from rows.

    python3 tests/test_bench_py.py
"""

import importlib.util
import os
import subprocess
import sys
import tempfile
import json
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench", "bench.py")

# Runs bench.py's main with `import torch` made to fail, so a lazy import is proven.
NO_TORCH = ("import sys, runpy; sys.modules['torch'] = None; sys.modules['numpy'] = None; "
            "sys.modules['matplotlib'] = None; sys.argv = [%r] + sys.argv[1:]; "
            "runpy.run_path(%r, run_name='__main__')" % (BENCH, BENCH))


def run_bench(*args):
    return subprocess.run([sys.executable, "-c", NO_TORCH] + list(args), capture_output=True,
                          text=True, timeout=120)


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BenchCli(unittest.TestCase):
    def test_help_without_torch(self):
        r = run_bench("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for flag in ("--quick", "--dtypes", "--backends", "--write-benchmarks-md", "--dry-run",
                     "--lib", "--reps", "--tokens", "--hidden"):
            self.assertIn(flag, r.stdout)

    def test_dry_run_default_grid(self):
        r = run_bench("--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("configs: 48", r.stdout)  # 2 dtypes x 2 d x 2 causal x 6 N
        lines = [l.split() for l in r.stdout.splitlines() if l[:1].isdigit()]
        self.assertEqual(len(lines), 48)
        for cols in lines:
            _, dtype, d, causal, B, H, N, gflop = cols[:8]
            d, B, H, N = int(d), int(B), int(H), int(N)
            self.assertIn(dtype, ("bf16", "f16"))
            self.assertEqual(B * N, 16384)
            self.assertEqual(H * d, 2048)
            want = 4 * B * H * N * N * d / (2 if causal == "yes" else 1)
            self.assertAlmostEqual(float(gflop), want / 1e9, places=2)

    def test_dry_run_quick(self):
        r = run_bench("--dry-run", "--quick")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("configs: 12", r.stdout)  # bf16 x {128, 64} x causal both x {1k, 4k, 16k}
        self.assertNotIn(" f16 ", r.stdout)

    def test_dry_run_options(self):
        r = run_bench("--dry-run", "--dtypes", "f16", "--d", "128", "--causal", "1", "--n",
                      "2048,8192", "--tokens", "32768", "--hidden", "4096")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("configs: 2", r.stdout)
        self.assertIn("   16   32   2048", r.stdout.replace("yes", ""))  # B = 16, H = 32

    def test_bad_arguments(self):
        for args in (("--dtypes", "fp8"), ("--backends", "flash,xformers"), ("--causal", "maybe"),
                     ("--n", "0"), ("--d", "x")):
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

    def test_grid_module(self):
        args = self.bench.parse_args(["--quick"])
        grid = self.bench.build_grid(args)
        self.assertEqual(len(grid), 12)
        self.assertEqual({c["N"] for c in grid}, {1024, 4096, 16384})
        self.assertEqual({c["d"] for c in grid}, {64, 128})
        self.assertEqual({c["causal"] for c in grid}, {False, True})
        self.assertTrue(all(c["B"] * c["N"] == 16384 and c["H"] * c["d"] == 2048 for c in grid))

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


if __name__ == "__main__":
    prog = unittest.main(exit=False, verbosity=1)
    res = prog.result
    failed = len(res.failures) + len(res.errors)
    print("bench_py: %d passed, %d failed, %d skipped"
          % (res.testsRun - failed - len(res.skipped), failed, len(res.skipped)))
    sys.exit(1 if failed else 0)
