"""bench_measure.py: bench.py's measurements (torch and a CUDA GPU, imported inside the
methods that need them): class Bench sets up the flashgen binding and the SDPA backends and times
every configuration of the grid, its backends' calls interleaved in rounds (bench/README.md has
the method). bench.py is the entry point; see its docstring."""

import datetime
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import warnings

from bench_grid import (DIFF_LIMIT, ELEM_BYTES, GRAD_NAMES, INPUT_MEMORY_FRACTION,
    MATH_MEMORY_FRACTION, MAX_INPUT_SETS, MAX_REPS, MIN_REPS_SLOW, MiB, REFERENCE_ORDER, REPO,
    ROUNDS, SDPA_BACKEND_NAMES, flashgen_bwd_workspace_bytes)
from bench_report import write_json


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
            return _inputs_oom(base_row, args.backends, e)
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
            return _inputs_oom(base_row, args.grad_backends, e)
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


def _inputs_oom(base_row, backends, e):
    """A configuration's rows when its inputs did not fit: one "oom" row per backend."""
    return [dict(base_row, backend=b, status="oom", reason="allocating the inputs: %s" % _short(e))
            for b in backends]


def _short(e, limit=600):
    s = ("%s: %s" % (type(e).__name__, e)).replace("\n", " ").strip()
    return s if len(s) <= limit else s[:limit] + "…"
