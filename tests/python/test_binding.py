"""test_binding.py: tests of the Python binding (python/flashgen).

Without PyTorch: the ctypes mirrors of the structs and enums against include/flashgen.h (a tiny C
program compiled with cc prints offsetof/sizeof/values), the loader's error when libflashgen.so is
missing, version(). With PyTorch: argument errors raised before any GPU work. With PyTorch and CUDA:
results against torch.nn.functional.scaled_dot_product_attention (float64 reference; flashgen's
error at most twice bf16/f16 SDPA's plus a floor), LSE against torch.logsumexp, GQA, causal with
Nq != Nk, the (B, N, H, d) layout, streams, errors from the C side.

Run: tests/python/run_python_tests.sh (or python3 tests/python/test_binding.py). Environment:
FLASHGEN_LIBRARY (path of libflashgen.so), CC (C compiler), FLASHGEN_TEST_SOURCE_DIR (repo root).
Plain unittest; a test that cannot run here is skipped with the reason.
"""

import ctypes
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.environ.get("FLASHGEN_TEST_SOURCE_DIR") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import flashgen  # noqa: E402  (needs neither torch nor the library)

try:
    import torch
    import torch.nn.functional as F
    HAVE_TORCH = True
except ImportError:
    torch = None
    HAVE_TORCH = False

HAVE_CUDA = HAVE_TORCH and torch.cuda.is_available()


def _library_or_none():
    try:
        flashgen.library_path()
        return None
    except flashgen.FlashgenError as e:
        return str(e)


def _cc():
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    return cc if cc and shutil.which(cc) else None


class HeaderLayoutTest(unittest.TestCase):
    """The ctypes mirrors match include/flashgen.h on this platform."""

    @classmethod
    def setUpClass(cls):
        cc = _cc()
        if cc is None:
            raise unittest.SkipTest("no C compiler (cc) to read the header's layout")
        structs = (flashgen.fg_attention_args, flashgen.fg_context_options,
                   flashgen.fg_attention_backward_args)
        lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "flashgen.h"',
                 "int main(void) {"]
        for s in structs:
            name = s.__name__
            lines.append('  printf("sizeof %s %%zu\\n", sizeof(%s));' % (name, name))
            for field, _ in s._fields_:
                lines.append('  printf("field %s.%s %%zu %%zu\\n", offsetof(%s, %s), '
                             'sizeof(((%s *)0)->%s));' % (name, field, name, field, name, field))
        cls.enums = {"FG_DTYPE_F16": flashgen.DTYPE_F16, "FG_DTYPE_BF16": flashgen.DTYPE_BF16,
                     "FG_POLICY_DEFAULT": flashgen.POLICY_DEFAULT,
                     "FG_POLICY_EXPORTED_ONLY": flashgen.POLICY_EXPORTED_ONLY,
                     "FG_POLICY_EXPORTED_AND_CACHE": flashgen.POLICY_EXPORTED_AND_CACHE,
                     "FG_POLICY_JIT": flashgen.POLICY_JIT}
        for st in flashgen.Status:
            cls.enums["FG_OK" if st.name == "OK" else "FG_ERROR_" + st.name] = int(st)
        for e in cls.enums:
            lines.append('  printf("enum %s %%d\\n", (int)%s);' % (e, e))
        lines += ["  return 0;", "}"]
        with tempfile.TemporaryDirectory() as tmp:
            src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
            with open(src, "w") as f:
                f.write("\n".join(lines) + "\n")
            r = subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "include"), src, "-o",
                                exe], capture_output=True, text=True)
            if r.returncode != 0:
                raise AssertionError("the layout program did not compile (a field of the ctypes "
                                     "mirror is missing from flashgen.h?):\n" + r.stderr)
            out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
        cls.sizes, cls.fields, cls.values = {}, {}, {}
        for line in out.splitlines():
            kind, name, *nums = line.split()
            if kind == "sizeof":
                cls.sizes[name] = int(nums[0])
            elif kind == "field":
                cls.fields[name] = (int(nums[0]), int(nums[1]))
            else:
                cls.values[name] = int(nums[0])

    def _check_struct(self, s):
        name = s.__name__
        for field, _ in s._fields_:
            desc = getattr(s, field)
            self.assertEqual((desc.offset, desc.size), self.fields["%s.%s" % (name, field)],
                             "%s.%s: ctypes (offset, size) differs from the C header"
                             % (name, field))
        self.assertEqual(ctypes.sizeof(s), self.sizes[name],
                         "sizeof(%s) differs: a field was added to the header but not to the "
                         "ctypes mirror, or the padding differs" % name)

    def test_attention_args_layout(self):
        self._check_struct(flashgen.fg_attention_args)
        # The fields the binding relies on by name, at their x86-64/aarch64 LP64 places.
        if ctypes.sizeof(ctypes.c_void_p) == 8:
            self.assertEqual(flashgen.fg_attention_args.q.offset, 64)
            self.assertEqual(flashgen.fg_attention_args.scale.offset, 200)
            self.assertEqual(ctypes.sizeof(flashgen.fg_attention_args), 208)

    def test_attention_backward_args_layout(self):
        self._check_struct(flashgen.fg_attention_backward_args)

    def test_context_options_layout(self):
        self._check_struct(flashgen.fg_context_options)

    def test_enum_values(self):
        self.assertEqual(self.values, self.enums)


class LibraryTest(unittest.TestCase):

    def test_import_needs_no_library_and_missing_library_is_explained(self):
        missing = os.path.join(tempfile.gettempdir(), "flashgen-none", "libflashgen.so")
        code = ("import flashgen\n"
                "try:\n"
                "    flashgen.version()\n"
                "except flashgen.FlashgenError as e:\n"
                "    assert e.status is None\n"
                "    print(e)\n"
                "else:\n"
                "    raise SystemExit('no error')\n")
        env = dict(os.environ, FLASHGEN_LIBRARY=missing,
                   PYTHONPATH=os.path.join(ROOT, "python"))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(missing, r.stdout)
        self.assertIn("FLASHGEN_LIBRARY", r.stdout)
        self.assertIn("does not exist", r.stdout)

    def test_error_carries_status_and_message(self):
        e = flashgen.FlashgenError(1, "head_dim is 36")
        self.assertIs(e.status, flashgen.Status.INVALID_ARGUMENT)
        self.assertEqual(e.message, "head_dim is 36")
        self.assertEqual(str(e), "INVALID_ARGUMENT: head_dim is 36")
        self.assertIsInstance(e, RuntimeError)

    def test_version(self):
        why = _library_or_none()
        if why:
            self.skipTest("libflashgen.so not found (build it, or set FLASHGEN_LIBRARY)")
        v = flashgen.version()
        self.assertRegex(v, r"^\d+\.\d+\.\d+$")
        with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
            m = re.search(r"project\(\s*flashgen\s+VERSION\s+(\d+\.\d+\.\d+)", f.read())
        if m:
            self.assertEqual(v, m.group(1))

    def test_status_string(self):
        if _library_or_none():
            self.skipTest("libflashgen.so not found (build it, or set FLASHGEN_LIBRARY)")
        texts = {flashgen.status_string(s) for s in flashgen.Status}
        self.assertEqual(len(texts), len(flashgen.Status), "status texts are not distinct")
        self.assertTrue(all(texts))

    def test_context_on_a_machine_without_gpu(self):
        if _library_or_none():
            self.skipTest("libflashgen.so not found (build it, or set FLASHGEN_LIBRARY)")
        try:
            flashgen._context(0)
        except flashgen.FlashgenError as e:
            self.assertIn(e.status, (flashgen.Status.NO_DRIVER, flashgen.Status.CUDA))
            self.assertTrue(e.message, "fg_last_create_error gave no message")
        else:
            self.skipTest("a CUDA device is present; the CUDA tests cover contexts")


@unittest.skipUnless(HAVE_TORCH, "PyTorch is not installed")
class ArgumentTest(unittest.TestCase):
    """Errors the binding raises before touching the library or the GPU."""

    def _qkv(self, device="cpu", dtype=None, d=64):
        dtype = dtype or torch.float16
        q = torch.zeros(1, 2, 8, d, dtype=dtype, device=device)
        k = torch.zeros(1, 2, 8, d, dtype=dtype, device=device)
        return q, k, k.clone()

    def test_cpu_tensor(self):
        q, k, v = self._qkv()
        with self.assertRaises(ValueError) as cm:
            flashgen.attention(q, k, v)
        self.assertIn("q is on cpu", str(cm.exception))
        self.assertIn("CUDA", str(cm.exception))

    def test_last_dim_not_contiguous(self):
        q, k, v = self._qkv()
        qt = torch.zeros(1, 2, 64, 8, dtype=q.dtype).transpose(2, 3)  # [1, 2, 8, 64], stride 8
        with self.assertRaises(ValueError) as cm:
            flashgen.attention(qt, k, v)
        self.assertIn("q.contiguous()", str(cm.exception))

    def test_dtypes(self):
        q, k, v = self._qkv(dtype=torch.float32)
        with self.assertRaisesRegex(TypeError, "float16 or torch.bfloat16"):
            flashgen.attention(q, k, v)
        q, k, v = self._qkv()
        with self.assertRaisesRegex(TypeError, "k has dtype torch.bfloat16"):
            flashgen.attention(q, k.to(torch.bfloat16), v)

    def test_shapes(self):
        q, k, v = self._qkv()
        with self.assertRaisesRegex(ValueError, "4-D"):
            flashgen.attention(q[0], k, v)
        with self.assertRaisesRegex(ValueError, "same shape"):
            flashgen.attention(q, k, v[:, :, :4])
        with self.assertRaisesRegex(ValueError, "head_dim"):
            flashgen.attention(q[..., :32], k, v)

    def test_scale(self):
        q, k, v = self._qkv()
        for bad in (0.0, -1.0, float("nan"), float("inf")):
            with self.assertRaisesRegex(ValueError, "scale"):
                flashgen.attention(q, k, v, scale=bad)


def _reference(q, k, v, causal, scale):
    """float64 SDPA on upcast inputs, the same-dtype SDPA, and the float64 log-sum-exp; rows that
    see no key are marked in `valid`."""
    B, Hq, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kr = k.repeat_interleave(Hq // Hkv, dim=1)  # head h reads kv head h // (Hq / Hkv)
    vr = v.repeat_interleave(Hq // Hkv, dim=1)
    i = torch.arange(Nq, device=q.device).view(Nq, 1)
    j = torch.arange(Nk, device=q.device).view(1, Nk)
    mask = (j <= i + Nk - Nq) if causal else torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    valid = mask.any(dim=1)  # [Nq]
    ref = F.scaled_dot_product_attention(q.double(), kr.double(), vr.double(), attn_mask=mask,
                                         scale=scale)
    low = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, scale=scale)
    s = scale * (q.double() @ kr.double().transpose(-1, -2))
    lse = torch.logsumexp(s.masked_fill(~mask, -math.inf), dim=-1)
    return ref, low, lse, valid


@unittest.skipUnless(HAVE_CUDA, "PyTorch with CUDA is not available")
class CudaTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        why = _library_or_none()
        if why:
            raise unittest.SkipTest("libflashgen.so not found: " + why)

    def _inputs(self, B, Hq, Hkv, Nq, Nk, d, dtype, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        mk = lambda H, N: torch.randn(B, H, N, d, generator=g, device="cuda").to(dtype)  # noqa
        return mk(Hq, Nq), mk(Hkv, Nk), mk(Hkv, Nk)

    def _compare(self, q, k, v, causal, scale=None):
        o, lse = flashgen.attention(q, k, v, causal=causal, scale=scale, return_lse=True)
        torch.cuda.synchronize()
        self.assertEqual(o.shape, q.shape)
        self.assertEqual(o.dtype, q.dtype)
        self.assertTrue(o.is_contiguous())
        self.assertEqual(lse.shape, q.shape[:3])
        self.assertEqual(lse.dtype, torch.float32)
        ref, low, lse_ref, valid = _reference(q, k, v, causal, scale)
        ov, rv, lv = o[:, :, valid].double(), ref[:, :, valid], low[:, :, valid].double()
        self.assertFalse(torch.isnan(o).any().item(), "NaN in O")
        err = (ov - rv).abs().max().item() if ov.numel() else 0.0
        err_sdpa = (lv - rv).abs().max().item() if lv.numel() else 0.0
        floor = 1e-3
        self.assertLessEqual(err, 2 * err_sdpa + floor,
                             "flashgen error %.3g, %s SDPA error %.3g" % (err, q.dtype, err_sdpa))
        lse_err = (lse[:, :, valid].double() - lse_ref[:, :, valid]).abs()
        tol = 1e-3 * lse_ref[:, :, valid].abs().clamp(min=1.0)
        self.assertTrue(bool((lse_err <= tol).all()), "LSE error %.3g" % lse_err.max().item())
        if not bool(valid.all()):  # rows that see no key: exactly 0 and -inf
            self.assertTrue(bool((o[:, :, ~valid] == 0).all()), "an empty row is not 0")
            empty_lse = lse[:, :, ~valid]
            self.assertTrue(bool((torch.isinf(empty_lse) & (empty_lse < 0)).all()),
                            "an empty row's LSE is not -inf")
        return o

    def test_plain_bf16(self):
        self._compare(*self._inputs(2, 4, 4, 128, 128, 64, torch.bfloat16), causal=False)

    def test_causal_gqa_f16_fewer_queries_than_keys(self):
        self._compare(*self._inputs(1, 8, 2, 100, 257, 128, torch.float16, seed=1), causal=True)

    def test_causal_mqa_more_queries_than_keys(self):
        q, k, v = self._inputs(2, 4, 1, 200, 70, 40, torch.bfloat16, seed=2)
        self._compare(q, k, v, causal=True)  # 130 rows per head see no key

    def test_decode_row_d256(self):
        self._compare(*self._inputs(1, 2, 2, 1, 300, 256, torch.float16, seed=3), causal=True)

    def test_bnhd_layout_and_scale(self):
        B, N, H, d = 2, 77, 6, 96
        g = torch.Generator(device="cuda").manual_seed(4)
        x = [torch.randn(B, N, H, d, generator=g, device="cuda").half() for _ in range(3)]
        q, k, v = (t.transpose(1, 2) for t in x)  # [B, H, N, d] views, strides {N*H*d, d, H*d}
        self.assertEqual(q.stride(), (N * H * d, d, H * d, 1))
        o = self._compare(q, k, v, causal=True, scale=0.3)
        o_contig = flashgen.attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                      causal=True, scale=0.3)
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(o, o_contig), "strided and contiguous inputs differ")

    def test_runs_on_the_current_stream(self):
        q, k, v = self._inputs(1, 2, 2, 64, 64, 64, torch.bfloat16, seed=5)
        expected = flashgen.attention(q, k, v)
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            o = flashgen.attention(q, k, v)
        s.synchronize()
        self.assertTrue(torch.equal(o, expected))

    def test_empty_problems(self):
        q, k, v = self._inputs(1, 2, 2, 5, 0, 64, torch.float16)
        o, lse = flashgen.attention(q, k, v, return_lse=True)
        self.assertTrue(bool((o == 0).all()))
        self.assertTrue(bool(torch.isneginf(lse).all()))
        q, k, v = self._inputs(0, 2, 2, 5, 5, 64, torch.float16)
        self.assertEqual(flashgen.attention(q, k, v).shape, (0, 2, 5, 64))

    def test_errors_from_the_library(self):
        q, k, v = self._inputs(1, 2, 2, 16, 16, 36, torch.float16)  # d not a multiple of 8
        with self.assertRaises(flashgen.FlashgenError) as cm:
            flashgen.attention(q, k, v)
        self.assertEqual(cm.exception.status, flashgen.Status.INVALID_ARGUMENT)
        self.assertTrue(cm.exception.message, "no message from fg_context_last_error")
        self.assertIn(cm.exception.message, str(cm.exception))
        q, k, v = self._inputs(1, 3, 2, 16, 16, 64, torch.float16)  # Hq not a multiple of Hkv
        with self.assertRaises(flashgen.FlashgenError) as cm:
            flashgen.attention(q, k, v)
        self.assertEqual(cm.exception.status, flashgen.Status.INVALID_ARGUMENT)

    def test_explain(self):
        q, k, v = self._inputs(1, 4, 4, 128, 128, 64, torch.bfloat16)
        text = flashgen.explain(q, k, v, causal=True)
        self.assertIsInstance(text, str)
        self.assertRegex(text, r"d64|head_dim\W+64|d\s*=\s*64")
        text = flashgen.explain_backward(q, k, v, causal=True)
        self.assertIn("bwd_d64_bf16_causal", text)
        self.assertIn("_pre", text)


def _grad_reference(q, k, v, do, causal, scale, dtype):
    """dQ, dK, dV of sum(do * SDPA(q, k, v)) by autograd through the math SDPA, with the inputs
    in `dtype` (float64: the yardstick; q's dtype: the naive same-precision computation)."""
    B, Hq, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qq, kk, vv = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    kr = kk.repeat_interleave(Hq // Hkv, dim=1)
    vr = vv.repeat_interleave(Hq // Hkv, dim=1)
    i = torch.arange(Nq, device=q.device).view(Nq, 1)
    j = torch.arange(Nk, device=q.device).view(1, Nk)
    mask = (j <= i + Nk - Nq) if causal else torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    from torch.nn.attention import sdpa_kernel, SDPBackend
    with sdpa_kernel([SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(qq, kr, vr, attn_mask=mask, scale=scale)
    o.backward(do.to(dtype))
    return qq.grad, kk.grad, vv.grad


@unittest.skipUnless(HAVE_CUDA, "PyTorch with CUDA is not available")
class BackwardTest(unittest.TestCase):
    """loss.backward() through flashgen.attention, against autograd of the math SDPA in float64
    (error at most twice the same-dtype math SDPA's, plus eps(dtype) * max|ref|)."""

    @classmethod
    def setUpClass(cls):
        why = _library_or_none()
        if why:
            raise unittest.SkipTest("libflashgen.so not found: " + why)

    def _check(self, B, Hq, Hkv, Nq, Nk, d, dtype, causal, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        mk = lambda H, N: torch.randn(B, H, N, d, generator=g, device="cuda").to(dtype)  # noqa
        q, k, v = (t.requires_grad_(True) for t in (mk(Hq, Nq), mk(Hkv, Nk), mk(Hkv, Nk)))
        do = torch.randn(B, Hq, Nq, d, generator=g, device="cuda").to(dtype)
        o = flashgen.attention(q, k, v, causal=causal)
        o.backward(do)
        ref = _grad_reference(q, k, v, do, causal, None, torch.float64)
        low = _grad_reference(q, k, v, do, causal, None, dtype)
        for name, got, r, lo in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref, low):
            self.assertEqual(got.shape, r.shape, name)
            self.assertEqual(got.dtype, dtype, name)
            self.assertFalse(bool(torch.isnan(got).any()), "NaN in " + name)
            err = (got.double() - r).abs().max().item()
            err_low = (lo.double() - r).abs().max().item()
            # The floor: one rounding of the output in dtype (as flashgen check does).
            floor = torch.finfo(dtype).eps * r.abs().max().item()
            self.assertLessEqual(err, 2 * err_low + floor,
                                 "%s: flashgen error %.3g, same-dtype math SDPA %.3g"
                                 % (name, err, err_low))
        # The direct call gives the same gradients as autograd did.
        _, lse = flashgen.attention(q.detach(), k.detach(), v.detach(), causal=causal,
                                    return_lse=True)
        dq, dk, dv = flashgen.attention_backward(do, q.detach(), k.detach(), v.detach(),
                                                 o.detach(), lse, causal=causal)
        torch.cuda.synchronize()
        for got, want in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
            self.assertLessEqual((got.double() - want.double()).abs().max().item(),
                                 4 * torch.finfo(dtype).eps * max(1.0, want.abs().max().item()))

    def test_bf16_plain(self):
        self._check(2, 4, 4, 128, 128, 64, torch.bfloat16, False)

    def test_f16_causal_gqa_fewer_queries(self):
        self._check(1, 8, 2, 100, 257, 128, torch.float16, True, seed=1)

    def test_bf16_mqa_odd_d(self):
        self._check(2, 4, 1, 77, 33, 40, torch.bfloat16, False, seed=2)

    def test_bf16_d256_causal(self):
        self._check(1, 2, 2, 130, 130, 256, torch.bfloat16, True, seed=3)

    def test_loss_sum_expanded_grad(self):
        # loss = o.sum() hands backward an expanded (all-zero-stride) gradient.
        q, k, v = (torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
                   .requires_grad_(True) for _ in range(3))
        flashgen.attention(q, k, v).float().sum().backward()
        self.assertFalse(bool(torch.isnan(q.grad).any()))

    def test_lse_has_no_gradient(self):
        q, k, v = (torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
                   .requires_grad_(True) for _ in range(3))
        o, lse = flashgen.attention(q, k, v, return_lse=True)
        with self.assertRaises(Exception) as cm:
            lse.sum().backward()
        self.assertIn("log-sum-exp", str(cm.exception))

    def test_deterministic_gives_the_same_bits(self):
        g = torch.Generator(device="cuda").manual_seed(5)
        q, do = (torch.randn(2, 8, 700, 128, generator=g, device="cuda").to(torch.bfloat16)
                 for _ in range(2))
        k, v = (torch.randn(2, 2, 900, 128, generator=g, device="cuda").to(torch.bfloat16)
                for _ in range(2))
        o, lse = flashgen.attention(q, k, v, causal=True, return_lse=True)
        runs = [flashgen.attention_backward(do, q, k, v, o, lse, causal=True, deterministic=True)
                for _ in range(3)]
        plain = flashgen.attention_backward(do, q, k, v, o, lse, causal=True)
        torch.cuda.synchronize()
        for i in range(3):
            for a, b in zip(runs[0], runs[i]):
                self.assertTrue(torch.equal(a, b), "deterministic runs differ")
        for a, b in zip(runs[0], plain):  # the same gradients up to the order of dQ's sums
            self.assertLessEqual((a.double() - b.double()).abs().max().item(), 0.05)

    def test_torch_compile(self):
        if not hasattr(torch, "compile"):
            self.skipTest("no torch.compile")
        def f(q, k, v):
            return flashgen.attention(q, k, v, causal=True).float().square().sum()
        g = torch.Generator(device="cuda").manual_seed(4)
        base = [torch.randn(1, 4, 96, 64, generator=g, device="cuda").to(torch.bfloat16)
                for _ in range(3)]
        eager = [t.clone().requires_grad_(True) for t in base]
        comp = [t.clone().requires_grad_(True) for t in base]
        f(*eager).backward()
        torch.compile(f, fullgraph=True)(*comp).backward()
        for a, b in zip(eager, comp):
            self.assertTrue(torch.equal(a.grad, b.grad), "compiled gradients differ from eager")

    def test_torch_compile_as_the_first_call(self):
        # A fresh process whose first flashgen call is compiled (torch imported first: the custom
        # ops are registered at import), then its eager autograd (a torch.autograd.Function)
        # against it, bit for bit.
        if not hasattr(torch, "compile"):
            self.skipTest("no torch.compile")
        code = "\n".join([
            "import torch, flashgen",
            "def f(q, k, v):",
            "    return flashgen.attention(q, k, v, causal=True).float().square().sum()",
            "g = torch.Generator(device='cuda').manual_seed(6)",
            "base = [torch.randn(1, 2, 80, 64, generator=g, device='cuda').to(torch.bfloat16)",
            "        for _ in range(3)]",
            "comp = [t.clone().requires_grad_(True) for t in base]",
            "eager = [t.clone().requires_grad_(True) for t in base]",
            "torch.compile(f, fullgraph=True)(*comp).backward()",
            "f(*eager).backward()",
            "assert type(flashgen.attention(*eager).grad_fn).__name__.startswith('AttentionFunction')",
            "assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager, comp))",
            "print('ok')"])
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("ok", r.stdout)


def main():
    prog = unittest.main(module=__name__, exit=False, verbosity=2)
    r = prog.result
    failed = len(r.failures) + len(r.errors) + len(r.unexpectedSuccesses)
    skipped = len(r.skipped)
    passed = r.testsRun - failed - skipped
    print("python: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 0 if r.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
