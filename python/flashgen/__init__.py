"""flashgen for PyTorch users: FlashAttention on CUDA tensors through libflashgen.so.

This file owns the Python binding: pure Python over ctypes (no compiled extension), mirroring
include/flashgen.h. Importing it needs neither PyTorch nor the library; both are looked for at
first use.

    import flashgen
    o = flashgen.attention(q, k, v, causal=True)             # q [B, Hq, Nq, d], k/v [B, Hkv, Nk, d]
    o, lse = flashgen.attention(q, k, v, return_lse=True)    # lse fp32 [B, Hq, Nq]
    print(flashgen.explain(q, k, v))                         # which kernel would run, and why
    o = flashgen.attention(q, k, v)                          # q, k, v requiring grad:
    o.float().sum().backward()                               # dQ, dK, dV from flashgen's kernels
    dq, dk, dv = flashgen.attention_backward(do, q, k, v, o, lse)  # the backward call itself

Under torch.compile flashgen.attention is a torch.library custom op (flashgen::attention_fwd, with
its backward flashgen::attention_bwd, fake/meta registrations and an autograd formula); in eager
mode a call that needs a gradient goes through a torch.autograd.Function with the same formula
(the custom op's dispatch cost ~0.4 ms of host time per forward + backward, as much as the GPU
time of a whole N = 512 call), and one that needs none goes straight to the library.

The library is found in this order: $FLASHGEN_LIBRARY (a path to libflashgen.so); a copy next to
this file; <repo>/build/libflashgen.so (when running from a checkout); ctypes.util.find_library.
"""

import atexit
import ctypes
import ctypes.util
import enum
import math
import os
import sys
import threading

__all__ = ["FlashgenError", "Status", "attention", "attention_backward", "explain",
           "explain_backward", "version", "status_string", "library_path"]


class Status(enum.IntEnum):
    """fg_status of include/flashgen.h."""
    OK = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    NO_DRIVER = 3
    NO_COMPILER = 4
    COMPILE = 5
    KERNEL_MISSING = 6
    CUDA = 7
    OUT_OF_MEMORY = 8
    CACHE = 9
    INTERNAL = 10


# fg_dtype
DTYPE_F16 = 1
DTYPE_BF16 = 2

# fg_policy
POLICY_DEFAULT = 0
POLICY_EXPORTED_ONLY = 1
POLICY_EXPORTED_AND_CACHE = 2
POLICY_JIT = 3


class FlashgenError(RuntimeError):
    """A failure reported by libflashgen (status is a Status), or the library could not be loaded
    (status is None). message is the detailed text (fg_context_last_error)."""

    def __init__(self, status, message):
        if status is not None:
            try:
                status = Status(status)
            except ValueError:
                pass
        self.status = status
        self.message = message
        if status is None:
            text = message
        else:
            name = status.name if isinstance(status, Status) else str(status)
            text = "%s: %s" % (name, message) if message else name
        super().__init__(text)


class fg_context_options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("device", ctypes.c_int),
        ("policy", ctypes.c_int),          # fg_policy
        ("cache_dir", ctypes.c_char_p),
        ("no_disk_cache", ctypes.c_int),
        ("quiet", ctypes.c_int),
    ]


class fg_attention_args(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("dtype", ctypes.c_int),           # fg_dtype
        ("causal", ctypes.c_int),
        ("batch", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.POINTER(ctypes.c_float)),
        ("q_stride", ctypes.c_int64 * 3),
        ("k_stride", ctypes.c_int64 * 3),
        ("v_stride", ctypes.c_int64 * 3),
        ("o_stride", ctypes.c_int64 * 3),
        ("scale", ctypes.c_float),
    ]


_ARGS_SIZE = ctypes.sizeof(fg_attention_args)


class fg_attention_backward_args(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("causal", ctypes.c_int),
        ("batch", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("d_o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("dq", ctypes.c_void_p),
        ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("q_stride", ctypes.c_int64 * 3),
        ("k_stride", ctypes.c_int64 * 3),
        ("v_stride", ctypes.c_int64 * 3),
        ("o_stride", ctypes.c_int64 * 3),
        ("do_stride", ctypes.c_int64 * 3),
        ("dq_stride", ctypes.c_int64 * 3),
        ("dk_stride", ctypes.c_int64 * 3),
        ("dv_stride", ctypes.c_int64 * 3),
        ("scale", ctypes.c_float),
        ("deterministic", ctypes.c_int),
        ("workspace", ctypes.c_void_p),
        ("workspace_size", ctypes.c_size_t),
    ]


_BWD_ARGS_SIZE = ctypes.sizeof(fg_attention_backward_args)


# ---- loading the library ----

_lib = None
_lib_path = None
_load_lock = threading.Lock()


def _candidates():
    """(where, path) pairs in search order; path None means ctypes.util.find_library."""
    env = os.environ.get("FLASHGEN_LIBRARY")
    if env:
        return [("$FLASHGEN_LIBRARY", env)]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    return [("next to the package", os.path.join(here, "libflashgen.so")),
            ("the build directory", os.path.join(repo, "build", "libflashgen.so")),
            ("ctypes.util.find_library('flashgen')", None)]


_PROTOTYPES = {  # name: (restype, argtypes), as in include/flashgen.h
    "fg_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "fg_version": (ctypes.c_char_p, []),
    "fg_context_create": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(fg_context_options)]),
    "fg_last_create_error": (ctypes.c_char_p, []),
    "fg_context_destroy": (None, [ctypes.c_void_p]),
    "fg_context_last_error": (ctypes.c_char_p, [ctypes.c_void_p]),
    "fg_attention_forward": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(fg_attention_args),
                                            ctypes.c_void_p]),
    "fg_explain": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(fg_attention_args),
                                  ctypes.c_char_p, ctypes.c_size_t]),
    "fg_explain_backward": (ctypes.c_int, [ctypes.c_void_p,
                                           ctypes.POINTER(fg_attention_backward_args),
                                           ctypes.c_char_p, ctypes.c_size_t]),
    "fg_attention_backward": (ctypes.c_int, [ctypes.c_void_p,
                                             ctypes.POINTER(fg_attention_backward_args),
                                             ctypes.c_void_p]),
}


_fns = {}


def _fn(name):
    """The C function `name` with its prototype, or FlashgenError if the library lacks it."""
    f = _fns.get(name)
    if f is not None:
        return f
    lib = _library()
    try:
        f = getattr(lib, name)
    except AttributeError:
        raise FlashgenError(None, "flashgen: %s has no symbol %s (a library older than this "
                            "binding?); set FLASHGEN_LIBRARY to a current libflashgen.so"
                            % (_lib_path, name)) from None
    f.restype, f.argtypes = _PROTOTYPES[name]
    _fns[name] = f
    return f


def _library():
    """The loaded libflashgen, or FlashgenError saying where it looked and what to set."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _load_lock:
        if _lib is not None:
            return _lib
        tried = []
        for where, path in _candidates():
            if path is None:
                path = ctypes.util.find_library("flashgen")
                if path is None:
                    tried.append("%s: not found" % where)
                    continue
            elif not os.path.exists(path):
                tried.append("%s: %s does not exist" % (where, path))
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s: %s: %s" % (where, path, e))
                continue
            _lib, _lib_path = lib, path
            return lib
        raise FlashgenError(None, "flashgen: cannot load libflashgen.so. Looked in:\n  "
                            + "\n  ".join(tried)
                            + "\nBuild it (cmake --build build --target flashgen_shared) or set "
                            "FLASHGEN_LIBRARY to the path of libflashgen.so.")


def _text(b):
    return b.decode("utf-8", "replace") if b else ""


def library_path():
    """The path of the loaded libflashgen.so (loading it if needed)."""
    _library()
    return _lib_path


def version():
    """The version of the C library, "MAJOR.MINOR.PATCH"."""
    return _text(_fn("fg_version")())


def status_string(code):
    """Static English text for a status code (fg_status_string)."""
    return _text(_fn("fg_status_string")(int(code)))


# ---- one fg_context per CUDA device ----

_contexts = {}
_contexts_lock = threading.Lock()
_atexit_registered = False


def _destroy_contexts():
    with _contexts_lock:
        items = list(_contexts.items())
        _contexts.clear()
    torch = sys.modules.get("torch")
    for device, ctx in items:
        try:  # kernels still queued use modules the context owns
            if torch is not None:
                torch.cuda.synchronize(device)
        except Exception:
            pass
        _fn("fg_context_destroy")(ctx)


def _context(device):
    """The context of CUDA device `device` (an ordinal), created on first use."""
    global _atexit_registered
    ctx = _contexts.get(device)  # the common case, without the lock (dict reads are atomic)
    if ctx is not None:
        return ctx
    with _contexts_lock:
        ctx = _contexts.get(device)
        if ctx is not None:
            return ctx
        opts = fg_context_options()
        opts.size = ctypes.sizeof(fg_context_options)
        opts.device = device
        handle = ctypes.c_void_p()
        status = _fn("fg_context_create")(ctypes.byref(handle), ctypes.byref(opts))
        if status != Status.OK:
            raise FlashgenError(status, _text(_fn("fg_last_create_error")()))
        if not _atexit_registered:
            atexit.register(_destroy_contexts)
            _atexit_registered = True
        _contexts[device] = handle
        return handle


# ---- argument checks and packing ----

_NAMES = ("q", "k", "v")


def _torch_dtype_code(torch, dtype):
    if dtype == torch.float16:
        return DTYPE_F16
    if dtype == torch.bfloat16:
        return DTYPE_BF16
    return None


def _check(q, k, v, scale):
    """Validates what the Python side can see; returns the fg_dtype code. Ordered so that a good
    call costs few attribute lookups (this runs on every call)."""
    import torch
    Tensor = torch.Tensor
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)):
        for name, t in zip(_NAMES, (q, k, v)):
            if not isinstance(t, Tensor):
                raise TypeError("flashgen: %s must be a torch.Tensor, got %s"
                                % (name, type(t).__name__))
    qs, ks, vs = q.shape, k.shape, v.shape
    for name, sh in zip(_NAMES, (qs, ks, vs)):
        if len(sh) != 4:
            raise ValueError("flashgen: %s must be 4-D [batch, heads, seqlen, head_dim], got "
                             "shape %s" % (name, tuple(sh)))
    dtype = q.dtype
    code = _torch_dtype_code(torch, dtype)
    if code is None:
        raise TypeError("flashgen: q has dtype %s; flashgen takes torch.float16 or torch.bfloat16"
                        % dtype)
    if k.dtype != dtype or v.dtype != dtype:
        name, t = ("k", k) if k.dtype != dtype else ("v", v)
        raise TypeError("flashgen: %s has dtype %s but q has %s; all three must match"
                        % (name, t.dtype, dtype))
    if ks != vs:
        raise ValueError("flashgen: k and v must have the same shape, got %s and %s"
                         % (tuple(ks), tuple(vs)))
    if ks[0] != qs[0]:
        raise ValueError("flashgen: q has batch %d but k and v have %d" % (qs[0], ks[0]))
    if ks[3] != qs[3]:
        raise ValueError("flashgen: q has head_dim %d but k and v have %d" % (qs[3], ks[3]))
    if qs[1] > 0 and ks[1] == 0:
        raise ValueError("flashgen: k and v have no heads but q has %d" % qs[1])
    if qs[3] > 1:
        for name, t in zip(_NAMES, (q, k, v)):
            if t.stride(3) != 1:
                raise ValueError("flashgen: the last dimension of %s must be contiguous (stride 1, "
                                 "got %d); call %s.contiguous() first" % (name, t.stride(3), name))
    if scale is not None:
        s = float(scale)
        if not math.isfinite(s) or s <= 0:
            raise ValueError("flashgen: scale must be finite and positive, got %r" % (scale,))
    if not (q.is_cuda and k.is_cuda and v.is_cuda):
        for name, t in zip(_NAMES, (q, k, v)):
            if not t.is_cuda:
                raise ValueError("flashgen: %s is on %s; flashgen runs on CUDA tensors (move it "
                                 "with %s.cuda())" % (name, t.device, name))
    dev = q.get_device()
    if k.get_device() != dev or v.get_device() != dev:
        name, t = ("k", k) if k.get_device() != dev else ("v", v)
        raise ValueError("flashgen: %s is on %s but q is on %s; all three must be on one device"
                         % (name, t.device, q.device))
    return code


def _strides(t):
    """Element strides of dims 0..2. A dimension of size 1 is never stepped over, so its stride is
    replaced by the contiguous one (torch may leave anything there)."""
    shape = t.shape
    contiguous = (shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3])
    s = tuple(t.stride(i) if shape[i] > 1 else contiguous[i] for i in range(3))
    if s == (0, 0, 0):
        # All zero means "contiguous" to the C API; this tensor is broadcast instead.
        raise ValueError("flashgen: this tensor is broadcast (all strides 0); call .contiguous()")
    return s


def _pack(code, q, k, v, o, lse, causal, scale):
    qs, ks = q.shape, k.shape
    return fg_attention_args(
        size=_ARGS_SIZE, dtype=code, causal=1 if causal else 0,
        batch=qs[0], heads_q=qs[1], heads_kv=ks[1], seqlen_q=qs[2], seqlen_k=ks[2],
        head_dim=qs[3], q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
        lse=None if lse is None else ctypes.cast(lse.data_ptr(), ctypes.POINTER(ctypes.c_float)),
        q_stride=_strides(q), k_stride=_strides(k), v_stride=_strides(v), o_stride=_strides(o),
        scale=0.0 if scale is None else float(scale))


def _outputs(q, return_lse):
    import torch
    o = torch.empty(tuple(q.shape), dtype=q.dtype, device=q.device)
    lse = None
    if return_lse:
        lse = torch.empty(tuple(q.shape[:3]), dtype=torch.float32, device=q.device)
    return o, lse


def _forward(q, k, v, causal, scale, return_lse):
    """The forward through the library: (O, lse or None)."""
    code = _check(q, k, v, scale)
    o, lse = _outputs(q, return_lse)
    if o.numel() == 0 and (lse is None or lse.numel() == 0):
        return o, lse  # nothing to compute
    if k.shape[2] == 0:
        # An empty softmax: O = 0 and lse = -inf (the library's documented result).
        o.zero_()
        if lse is not None:
            lse.fill_(-math.inf)
        return o, lse
    import torch
    device = q.get_device()
    ctx = _context(device)
    a = _pack(code, q, k, v, o, lse, causal, scale)
    # The context makes its own CUDA context current; no device switch is needed here.
    stream = torch.cuda.current_stream(device).cuda_stream
    status = _fn("fg_attention_forward")(ctx, ctypes.byref(a), ctypes.c_void_p(stream))
    if status != Status.OK:
        raise FlashgenError(status, _text(_fn("fg_context_last_error")(ctx)))
    return o, lse


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    """Exact attention O = softmax(scale * Q K^T) V on the GPU.

    q: [B, Hq, Nq, d]; k, v: [B, Hkv, Nk, d]; CUDA tensors of one device, all torch.float16 or
    all torch.bfloat16; any strides for the first three dimensions (so (B, N, H, d) tensors
    viewed with .transpose(1, 2) work without a copy), the last dimension contiguous. Hq must be
    a multiple of Hkv (GQA, MQA); d a multiple of 8 from 32 to 256.

    causal: query i sees keys j <= i + Nk - Nq (aligned to the bottom-right corner when Nq != Nk);
    a row that sees no key gets O = 0 and lse = -inf.
    scale: the softmax scale; None means 1/sqrt(d).

    Returns O, a new contiguous tensor [B, Hq, Nq, d] of q's dtype, or (O, lse) with lse fp32
    [B, Hq, Nq] (natural log of the softmax denominator) when return_lse is true. The kernel is
    enqueued on torch.cuda.current_stream(). Raises TypeError/ValueError for arguments the Python
    side can check, FlashgenError with the library's message for the rest.

    Autograd: when q, k or v requires grad (and grad mode is on), backward() computes dQ, dK, dV
    with flashgen's backward kernels (attention_backward), through a torch.autograd.Function in
    eager mode. The lse output carries no gradient (a loss that uses it raises in backward).
    Under torch.compile the call is the custom op flashgen::attention_fwd (traced with its fake
    kernel; the same forward and backward).
    """
    import torch
    scale = None if scale is None else float(scale)
    if _compiling(torch):
        if _ops_ns is None:  # torch.compile cannot trace the registration (nor its lock)
            raise FlashgenError(None, "flashgen: its custom ops are not registered yet; import "
                                "torch before flashgen, or call flashgen.attention once outside "
                                "torch.compile")
        o, lse = _ops_ns.attention_fwd(q, k, v, bool(causal), scale)
        return (o, lse) if return_lse else o
    if _ops_ns is None and hasattr(torch.library, "custom_op"):
        _ops(torch)  # now, outside any compiled region, for a later torch.compile
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        o, lse = _eager_fn(torch).apply(q, k, v, bool(causal), scale)
        return (o, lse) if return_lse else o
    o, lse = _forward(q, k, v, causal, scale, return_lse)
    return (o, lse) if return_lse else o


def attention_backward(do, q, k, v, o, lse, causal=False, scale=None, dq=None, dk=None, dv=None,
                       deterministic=False):
    """The backward pass (fg_attention_backward): dQ, dK, dV of a loss whose gradient with respect
    to O = attention(q, k, v, causal, scale) is do.

    q, k, v, causal and scale must be exactly the forward's; o and lse its outputs (lse from
    attention(..., return_lse=True)); do has O's shape and dtype, any strides with a contiguous
    last dimension. dq, dk, dv: tensors to write (shapes of q, k, v, same dtype and device), or
    None to allocate them. With GQA/MQA, dK and dV of a KV head sum over the query heads it
    serves. deterministic: the same bits from run to run (dQ's additions in a fixed order; some
    speed is lost, see include/flashgen.h). Returns (dq, dk, dv); the kernels are enqueued on
    torch.cuda.current_stream().
    """
    import torch
    code = _check(q, k, v, scale)
    for name, t, like in (("o", o, q), ("do", do, q)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(like.shape) or \
                t.dtype != like.dtype or t.device != like.device:
            raise ValueError("flashgen: %s must be a tensor of q's shape %s, dtype and device"
                             % (name, tuple(like.shape)))
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != tuple(q.shape[:3]) or \
            lse.dtype != torch.float32 or lse.device != q.device:
        raise ValueError("flashgen: lse must be the forward's fp32 [B, Hq, Nq] log-sum-exp on q's "
                         "device (attention(..., return_lse=True))")
    if do.dim() == 4 and (do.stride(3) != 1 or do.data_ptr() % 16 or
                          any(do.stride(i) % 8 for i in range(3))):
        do = do.contiguous()  # e.g. the expanded ones of loss = o.sum()
    lse = lse.contiguous()
    outs = []
    for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if t is None:
            t = torch.empty(tuple(like.shape), dtype=like.dtype, device=like.device)
        elif tuple(t.shape) != tuple(like.shape) or t.dtype != like.dtype or t.device != like.device:
            raise ValueError("flashgen: %s must have the shape %s, dtype and device of %s"
                             % (name, tuple(like.shape), name[1:]))
        outs.append(t)
    dq, dk, dv = outs
    if q.numel() == 0:
        dk.zero_(), dv.zero_()
        return dq, dk, dv
    qs, ks = q.shape, k.shape
    a = fg_attention_backward_args(
        size=_BWD_ARGS_SIZE, dtype=code, causal=1 if causal else 0,
        batch=qs[0], heads_q=qs[1], heads_kv=ks[1], seqlen_q=qs[2], seqlen_k=ks[2],
        head_dim=qs[3], q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
        d_o=do.data_ptr(), lse=lse.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(),
        dv=dv.data_ptr(), q_stride=_strides(q), k_stride=_strides(k), v_stride=_strides(v),
        o_stride=_strides(o), do_stride=_strides(do), dq_stride=_strides(dq),
        dk_stride=_strides(dk), dv_stride=_strides(dv),
        scale=0.0 if scale is None else float(scale), deterministic=1 if deterministic else 0)
    device = q.get_device()
    ctx = _context(device)
    stream = torch.cuda.current_stream(device).cuda_stream
    status = _fn("fg_attention_backward")(ctx, ctypes.byref(a), ctypes.c_void_p(stream))
    if status != Status.OK:
        raise FlashgenError(status, _text(_fn("fg_context_last_error")(ctx)))
    return dq, dk, dv


def _compiling(torch):
    comp = getattr(torch, "compiler", None)
    return bool(comp is not None and hasattr(comp, "is_compiling") and comp.is_compiling())


_ops_ns = None
_ops_lock = threading.Lock()


def _ops(torch):
    """Registers the custom ops once (torch.library.custom_op, PyTorch >= 2.4) and returns a
    namespace with attention_fwd and attention_bwd."""
    global _ops_ns
    if _ops_ns is not None:
        return _ops_ns
    with _ops_lock:
        if _ops_ns is not None:
            return _ops_ns
        from typing import Optional, Tuple
        lib = torch.library
        if not hasattr(lib, "custom_op"):
            raise FlashgenError(None, "flashgen: autograd and torch.compile need "
                                "torch.library.custom_op (PyTorch >= 2.4); this is %s"
                                % torch.__version__)
        Tensor = torch.Tensor

        @lib.custom_op("flashgen::attention_fwd", mutates_args=())
        def attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool,
                          scale: Optional[float]) -> Tuple[Tensor, Tensor]:
            return _forward(q, k, v, causal, scale, True)

        @attention_fwd.register_fake
        def _(q, k, v, causal, scale):
            return (torch.empty(tuple(q.shape), dtype=q.dtype, device=q.device),
                    torch.empty(tuple(q.shape[:3]), dtype=torch.float32, device=q.device))

        @lib.custom_op("flashgen::attention_bwd", mutates_args=())
        def attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                          causal: bool, scale: Optional[float]) -> Tuple[Tensor, Tensor, Tensor]:
            return attention_backward(do, q, k, v, o, lse, causal, scale)

        @attention_bwd.register_fake
        def _(do, q, k, v, o, lse, causal, scale):
            return tuple(torch.empty(tuple(t.shape), dtype=t.dtype, device=t.device)
                         for t in (q, k, v))

        def setup_context(ctx, inputs, output):
            _save(ctx, *inputs, *output)

        def backward(ctx, do, dlse):
            return _grads(ctx, do, dlse, attention_bwd)

        attention_fwd.register_autograd(backward, setup_context=setup_context)

        class _Ns:
            pass
        ns = _Ns()
        ns.attention_fwd, ns.attention_bwd = attention_fwd, attention_bwd
        _ops_ns = ns
        return ns


def _save(ctx, q, k, v, causal, scale, o, lse):
    """What the backward needs (both autograd paths): the inputs, O and the log-sum-exp."""
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale = causal, scale
    ctx.set_materialize_grads(False)


def _grads(ctx, do, dlse, backward_fn):
    """The gradients of (q, k, v, causal, scale) from dO (both autograd paths; backward_fn is the
    custom op attention_bwd under torch.compile, attention_backward in eager mode)."""
    if dlse is not None:
        raise FlashgenError(None, "flashgen: the log-sum-exp output of attention carries "
                            "no gradient; use it only outside the differentiated loss")
    q, k, v, o, lse = ctx.saved_tensors
    if do is None:
        return None, None, None, None, None
    dq, dk, dv = backward_fn(do, q, k, v, o, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


_eager_cls = None


def _eager_fn(torch):
    """The eager autograd path: a torch.autograd.Function with the custom op's formula. Measured
    on an H100 host (bench/NOTES.md, session 15), the custom op's dispatch made one forward +
    backward at B 32, H 32, N 512, d 64 take 626 us of host time against 191 us for the two
    direct calls, so the GPU (~700 us of work) waited for the host."""
    global _eager_cls
    if _eager_cls is not None:
        return _eager_cls
    with _ops_lock:
        if _eager_cls is None:
            class AttentionFunction(torch.autograd.Function):
                @staticmethod
                def forward(ctx, q, k, v, causal, scale):
                    o, lse = _forward(q, k, v, causal, scale, True)
                    _save(ctx, q, k, v, causal, scale, o, lse)
                    return o, lse

                @staticmethod
                def backward(ctx, do, dlse):
                    return _grads(ctx, do, dlse, attention_backward)

            _eager_cls = AttentionFunction
    return _eager_cls


def explain(q, k, v, causal=False, scale=None, return_lse=False):
    """Which kernel flashgen.attention would run for these tensors, and why (fg_explain).
    Launches and compiles nothing; allocates an output like attention does."""
    code = _check(q, k, v, scale)
    o, lse = _outputs(q, return_lse)
    if o.numel() == 0 or k.shape[2] == 0:
        return ("empty problem (shape q %s, k %s): flashgen.attention launches nothing"
                % (tuple(q.shape), tuple(k.shape)))
    import torch
    device = q.get_device()
    ctx = _context(device)
    a = _pack(code, q, k, v, o, lse, causal, scale)
    buf = ctypes.create_string_buffer(1 << 16)
    with torch.cuda.device(device):
        status = _fn("fg_explain")(ctx, ctypes.byref(a), buf, len(buf))
    if status != Status.OK:
        raise FlashgenError(status, _text(_fn("fg_context_last_error")(ctx)))
    return _text(buf.value)


def explain_backward(q, k, v, causal=False, scale=None, deterministic=False):
    """Which backward plan flashgen.attention_backward (and autograd) would run for these shapes,
    and why (fg_explain_backward): the key, the record or rule, the variant, where its binary
    comes from, the three launches and the workspace. Launches and compiles nothing."""
    code = _check(q, k, v, scale)
    if q.numel() == 0 or k.shape[2] == 0:
        return ("empty problem (shape q %s, k %s): the backward launches no main kernel"
                % (tuple(q.shape), tuple(k.shape)))
    import torch
    qs, ks = q.shape, k.shape
    a = fg_attention_backward_args(
        size=_BWD_ARGS_SIZE, dtype=code, causal=1 if causal else 0, batch=qs[0], heads_q=qs[1],
        heads_kv=ks[1], seqlen_q=qs[2], seqlen_k=ks[2], head_dim=qs[3],
        scale=0.0 if scale is None else float(scale), deterministic=1 if deterministic else 0)
    device = q.get_device()
    ctx = _context(device)
    buf = ctypes.create_string_buffer(1 << 16)
    with torch.cuda.device(device):
        status = _fn("fg_explain_backward")(ctx, ctypes.byref(a), buf, len(buf))
    if status != Status.OK:
        raise FlashgenError(status, _text(_fn("fg_context_last_error")(ctx)))
    return _text(buf.value)


# With torch already imported, the custom ops are registered now, so that a first call made
# under torch.compile finds them (tracing cannot register them).
if "torch" in sys.modules and hasattr(getattr(sys.modules["torch"], "library", None), "custom_op"):
    _ops(sys.modules["torch"])

