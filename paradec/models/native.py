"""The decode path in C (``native.c``: the small ops; ``native_mm.c``: the quantized linears).

A torch decode step of SmolLM2 (int4, 2 cores of an AVX2 EPYC, 200-token context) took 24-27 ms,
of which 10-16 ms was neither the linears nor the LM head: ~45 small ops a layer (norms, RoPE, the
KV writes, the exact attention, residual adds, SiLU) at a few microseconds of dispatch each
(``benchmarks/pass_cost.py --parts``), about llama.cpp's whole step. ``native_layers`` runs a
layer as three C calls and the layer's four linears. Of the rest, most was torch's int4 kernel,
which decodes every 4-bit weight to a float for each row: int4 and int8 layers (and the LM head)
take C kernels too (``q4_kernel``, ``q8_kernel``), which quantize each row of activations to int8
in blocks of 32 and take exact integer dot products a block, as llama.cpp's Q4_1 x Q8_1 and Q8_0 x
Q8_0 do, but on 8 columns at once (``pack_q4``, ``pack_q8``: the weights' columns interleaved in
groups of 8, one a vector lane; int4 2x a column at a time). bf16 and fp32 linears stay torch's.
Where every linear of the layers is such a kernel, a pass runs all its layers in one C call
(``native_layers.c``, one OpenMP region, ``LayerTable``): ~240 calls a pass, each with Python,
ctypes and an OpenMP fork around it, had cost 2.3 ms of a 9.1 ms int4 `ar` pass.

The C code is compiled on first use with the system's C compiler (``cc``, or ``$CC``) into
``$PARADEC_HOME/native`` (one library per source, compiler and CPU), ~2 s, with OpenMP where the
compiler has it (the linears' threads; it binds to the runtime torch already loaded), and loaded
with ctypes. Without a compiler, on a CPU without AVX2 and FMA (its loops would be scalar), or
with ``PARADEC_NATIVE=0``, the torch path runs, as before.

Its numerics are shape-invariant by construction: a token's result is the same sequence of fp32
operations in an `ar` step and in a tree (the attention sums its visible keys in slot order; a
linear's output element sums its blocks in order into 8 lanes reduced in one fixed tree, whatever
the row count, tile or thread; no reassociation, no FMA contraction), so greedy verification stays
token-identical to `ar`, at the price of fp32 arithmetic where the torch path needs fp64 for the
same guarantee. It is another rounding of the same model than the torch path's: every decode and
verification pass of a model takes the one path (``Transformer.native``), so every method is
lossless against the same target.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from paradec.kv import KVCache
from paradec.models.decode import LayerKernels

SOURCES = tuple(Path(__file__).with_name(f) for f in ("native.c", "native_mm.c", "native_layers.c"))
HEADER = Path(__file__).with_name("native.h")  # what the C files share (part of the build's key)
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared")
OPENMP = "-fopenmp"  # the quantized linears' threads (the process's OpenMP runtime: torch's); dropped if absent
DTYPES = {torch.bfloat16: 1, torch.float32: 0}
MAX_HEAD_DIM = 512  # the C attention's accumulator
_i64, _ptr, _f32, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int


def _home() -> Path:
    from paradec.models.gguf import paradec_home

    return paradec_home() / "native"


def _cpu_signature() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next(ln for ln in lines if ln.startswith(("flags", "Features")))
    except (OSError, StopIteration):
        flags = ""
    return platform.machine() + flags


def _compiler() -> str | None:
    if os.environ.get("PARADEC_NATIVE", "1") == "0":
        return None
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


@functools.cache
def build_key() -> str | None:
    """What the library is built from (sources, compiler, flags, CPU), hashed: part of the key of
    every cached measurement of the decode path, so a changed C path is measured again. None
    where no library would be built."""
    cc = _compiler()
    if cc is None:
        return None
    source = b"".join(src.read_bytes() for src in (*SOURCES, HEADER))
    return hashlib.sha256(source + " ".join((cc, *FLAGS, OPENMP, _cpu_signature())).encode()).hexdigest()[:16]


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled C path (``SOURCES``), built once per ``build_key``; None where it cannot be
    (no compiler, a build error, ``PARADEC_NATIVE=0``): the torch path runs instead."""
    cc, key = _compiler(), build_key()
    if cc is None or key is None:
        return None
    path = _home() / f"decode-{key}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # built aside, then moved: never half-written
            built = Path(tmp) / path.name
            for extra in ([OPENMP], []):  # single-threaded linears where the compiler has no OpenMP
                cmd = [cc, *FLAGS, *extra, *map(str, SOURCES), "-o", str(built), "-lm"]
                run = subprocess.run(cmd, capture_output=True, text=True)
                if run.returncode == 0:
                    break
            if run.returncode != 0:
                why = run.stderr.strip()[:200]
                warnings.warn(f"paradec: the native decode ops did not build ({why}); torch runs them", stacklevel=2)
                return None
            os.replace(built, path)
    lib = ctypes.CDLL(str(path))
    if not (lib.pd_vectorized() and lib.pd_quantized()):  # scalar C loses to torch's vectorized ops: keep those
        return None
    lib.pd_add_norm.argtypes = [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _f32, _int]
    lib.pd_silu_mul.argtypes = [_ptr, _ptr, _i64, _i64, _int]
    tensors = [_ptr, _ptr, _ptr, _ptr, _i64, _ptr, _i64, _ptr, _ptr, _i64, _ptr]
    lib.pd_attend.argtypes = tensors + [_i64] * 7 + [_int, _int]  # ..., shape, dtype, threads
    lib.pd_q4_linear.argtypes = [_ptr, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _int, _int]
    lib.pd_q8_linear.argtypes = [_ptr, _i64, _i64, _ptr, _ptr, _ptr, _i64, _int, _int]
    # layers, count, x, cos, sin, kc, k_layer, k_row, vc, v_layer, v_row, idx, mask, span, then the shape, dt, threads
    lib.pd_layers.argtypes = (
        [_ptr, _i64, _ptr, _ptr, _ptr, *[_ptr, _i64, _i64] * 2, _ptr, _ptr] + [_i64] * 10 + [_int] * 2
    )
    for fn in (lib.pd_add_norm, lib.pd_silu_mul, lib.pd_attend):
        fn.restype = None
    return lib


def available() -> bool:
    """Whether this machine runs the C small ops (a model still needs ``supports``)."""
    return library() is not None


def signature() -> str:
    """The C path a measurement of the decode path was taken with, for its cache key: the
    library's ``build_key``, or "torch" where it does not run."""
    return build_key() if available() else "torch"


def supports(dtype: torch.dtype, device: torch.device | str, head_dim: int) -> bool:
    """Whether a model of this dtype, device and head size can take the native path here."""
    return dtype in DTYPES and torch.device(device).type == "cpu" and head_dim <= MAX_HEAD_DIM and library() is not None


def _quantized_kernel(
    name: str, weights: tuple[torch.Tensor, ...], n_in: int, n_out: int, bias: torch.Tensor | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [..., n_in] bf16 or fp32 -> [..., n_out] in x's dtype through the C linear ``name``, which
    reads ``weights`` (held by the closure) by pointer."""
    lib = library()

    def mm(x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, n_in).contiguous()
        y = torch.empty(*x.shape[:-1], n_out, dtype=x.dtype)
        ptrs = (t.data_ptr() for t in weights)
        shape = (n_out, DTYPES[x.dtype], torch.get_num_threads())
        if not getattr(lib, name)(x2.data_ptr(), x2.shape[0], n_in, *ptrs, y.data_ptr(), *shape):
            raise MemoryError(f"{name}: no memory for the activations' int8 form")
        return y if bias is None else y + bias

    mm.parts = (4 if name == "pd_q4_linear" else 8, weights, n_in, n_out, bias)  # what ``LayerTable`` reads
    return mm


def q4_kernel(
    q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, bias: torch.Tensor | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """An int4 linear (w = d q + m in blocks of 32 along the input) in C, for decode passes:
    x [..., in] bf16 or fp32 -> [..., out] in x's dtype. q [out, in / 2] uint8 (``pack_q4``), d and
    m [out / 8, in / 32, 8] fp32 (``pack_q4`` makes all three). Each row of x is quantized to int8
    in blocks of 32 (``native_mm.c``)."""
    return _quantized_kernel("pd_q4_linear", (q, d, m), 2 * q.shape[1], q.shape[0], bias)


def q8_kernel(
    q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, n_out: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """An int8 linear (w = scale q, one scale an output) in C, for decode passes: x [..., in] bf16
    or fp32 -> [..., n_out] in x's dtype. q [n_out rounded up to 8, in] int8 and scale [the same]
    fp32 as ``pack_q8`` makes them; in % 32 == 0."""
    return _quantized_kernel("pd_q8_linear", (q, scale), q.shape[1], n_out, bias)


def pack_q4(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [out, in] ints in 0..15, d and m [out, in / 32] -> the C kernel's layout (``q4_tile`` in
    ``native_mm.c``), outputs in groups of 8 (out % 8 == 0): q [out, in / 2] uint8 holding, for each
    group and block of 32 inputs, 4 x 32 bytes, the h-th 32 being 4 bytes a column (low nibbles:
    its weights 4h..4h+3 of the block, high: 16+4h..16+4h+3); d and m [out / 8, in / 32, 8] fp32."""
    out, n_in = q.shape
    blocks = n_in // 32
    g = q.reshape(out // 8, 8, blocks, 2, 4, 4).to(torch.uint8)  # (group, column, block, half, h, t)
    g = g.permute(0, 2, 4, 1, 5, 3)  # (group, block, h, column, t, half)
    packed = (g[..., 0] | (g[..., 1] << 4)).reshape(out, n_in // 2).contiguous()
    d, m = (t.float().reshape(out // 8, 8, blocks).transpose(1, 2).contiguous() for t in (d, m))
    return packed, d, m


def pack_q8(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [out, in] int8 and scale [out] -> the C kernel's layout (``q8_tile`` in ``native_mm.c``),
    outputs in groups of 8, the last padded with zero weights: q [out rounded up to 8, in] int8
    holding, for each group and block of 32 inputs, 8 x 32 bytes, the h-th 32 being 4 bytes a
    column (its weights 4h..4h+3 of the block); scale [out rounded up to 8] fp32."""
    out, n_in = q.shape
    groups = -(-out // 8)
    padded = q.new_zeros(groups * 8, n_in)
    padded[:out] = q
    g = padded.reshape(groups, 8, n_in // 32, 8, 4).permute(0, 2, 3, 1, 4)  # (group, block, h, column, t)
    s = scale.new_zeros(groups * 8, dtype=torch.float32)
    s[:out] = scale
    return g.reshape(groups * 8, n_in).contiguous(), s


def _checked(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A linear's output as the C ops read it: contiguous, in the activations' dtype."""
    if t.dtype != dtype:
        raise RuntimeError(f"a linear returned {t.dtype} where the model's activations are {dtype}")
    return t.contiguous()


class PdLinear(ctypes.Structure):
    _fields_ = [(f, _i64) for f in ("kind", "n_in", "n_out")] + [(f, _ptr) for f in ("q", "d", "m", "bias")]


class PdLayer(ctypes.Structure):
    _fields_ = [("layer", _i64), ("attn_norm", _ptr), ("mlp_norm", _ptr), ("eps", ctypes.c_double)] + [
        (f, PdLinear) for f in ("qkv", "wo", "gate_up", "down")
    ]


ONE_CALL = True  # whole passes in one C call where every linear is a quantized one in C (False: a call a step)


class LayerTable:
    """A plan's layers as ``pd_layers`` (``native_layers.c``) reads them: every pointer of every
    layer, built once per plan; it holds the tensors it points to."""

    def __init__(self, layers: ctypes.Array, tensors: list[torch.Tensor]) -> None:
        self.layers, self.tensors = layers, tensors

    @classmethod
    def of(cls, plan: list[LayerKernels], dtype: torch.dtype) -> LayerTable | None:
        """None unless every linear of ``plan`` is a quantized kernel in C (``q4_kernel``,
        ``q8_kernel``) whose bias, like the norms, is in the activations' ``dtype``."""
        if not ONE_CALL or not plan or library() is None:
            return None
        tensors, rows = [], []
        for k in plan:
            linears = []
            for mm in (k.qkv, k.wo, k.gate_up, k.down):
                parts = getattr(mm, "parts", None)
                if parts is None or (parts[4] is not None and parts[4].dtype != dtype):
                    return None
                kind, weights, n_in, n_out, bias = parts
                ptrs = [t.data_ptr() for t in weights] + [None] * (3 - len(weights))
                tensors += [*weights, *([] if bias is None else [bias])]
                linears.append(PdLinear(kind, n_in, n_out, *ptrs, None if bias is None else bias.data_ptr()))
            if k.attn_norm.dtype != dtype or k.mlp_norm.dtype != dtype:
                return None
            tensors += [k.attn_norm, k.mlp_norm]
            rows.append(PdLayer(k.layer, k.attn_norm.data_ptr(), k.mlp_norm.data_ptr(), k.eps, *linears))
        return cls((PdLayer * len(rows))(*rows), tensors)

    def at(self, start: int) -> ctypes.c_void_p:
        """The table from layer ``start`` of its plan on."""
        return ctypes.c_void_p(ctypes.addressof(self.layers) + start * ctypes.sizeof(PdLayer))


def native_layers(
    plan: list[LayerKernels],
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None,
    cache: KVCache,
    slots: torch.Tensor | None,
    table: tuple[LayerTable, int] | None = None,
) -> torch.Tensor:
    """``decode_layer`` over the layers of ``plan`` in C: x [batch, n, hidden] -> [batch, n, hidden].

    cos/sin [batch, n, 1, head_dim] in x's dtype; mask [batch, 1, n, span] bool (None: every
    slot visible); slots [batch, n] (None: the next n). Writes the tokens' K/V. ``table``: the
    plan's ``LayerTable`` and where ``plan`` starts in it, for the pass in one C call (None: a
    call a step, the linears' kernels called from here)."""
    lib, dt, threads = library(), DTYPES[x.dtype], torch.get_num_threads()
    b, n, hidden = x.shape
    x = x.clone(memory_format=torch.contiguous_format)  # the residual stream, updated in place
    rows = b * n
    idx, end = cache.write_slots(n, slots)  # [batch, n] int64, and the slots attended over
    head_dim = cos.shape[-1]
    cos, sin = (t.expand(b, n, 1, head_dim).contiguous() for t in (cos, sin))  # a row's own table
    m = None if mask is None else mask.expand(b, 1, n, mask.shape[-1]).reshape(b, n, -1).contiguous()
    m_ptr, m_span = (None, 0) if m is None else (m.data_ptr(), m.shape[-1])
    keys, values = cache.keys, cache.values  # [layers, capacity, kv, hd, max_len], [layers, capacity, kv, max_len, hd]
    if table is not None and plan:
        k = plan[0]
        shape = (b, n, hidden, k.heads, k.kv_heads, k.head_dim, k.inter, cache.max_len, end)
        if not lib.pd_layers(
            table[0].at(table[1]), len(plan), x.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            keys.data_ptr(), keys.stride(0), keys.stride(1), values.data_ptr(), values.stride(0), values.stride(1),
            idx.data_ptr(), m_ptr, m_span, *shape, dt, threads,
        ):  # fmt: skip
            raise MemoryError("pd_layers: no memory for a pass's activations")
        return x
    h = torch.empty_like(x)
    delta = None
    for k in plan:
        kv_ptr = keys[k.layer].data_ptr(), values[k.layer].data_ptr()
        lib.pd_add_norm(x.data_ptr(), delta, k.attn_norm.data_ptr(), h.data_ptr(), rows, hidden, k.eps, dt)
        qkv = _checked(k.qkv(h), x.dtype)
        att = torch.empty(b, n, k.heads * k.head_dim, dtype=x.dtype)
        shape = (b, n, k.heads, k.kv_heads, k.head_dim, cache.max_len, end)
        lib.pd_attend(
            qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), kv_ptr[0], keys.stride(1), kv_ptr[1], values.stride(1),
            idx.data_ptr(), m_ptr, m_span, att.data_ptr(), *shape, dt, threads,
        )  # fmt: skip
        o = _checked(k.wo(att), x.dtype)
        lib.pd_add_norm(x.data_ptr(), o.data_ptr(), k.mlp_norm.data_ptr(), h.data_ptr(), rows, hidden, k.eps, dt)
        gu = _checked(k.gate_up(h), x.dtype)
        act = torch.empty(b, n, k.inter, dtype=x.dtype)
        lib.pd_silu_mul(gu.data_ptr(), act.data_ptr(), rows, k.inter, dt)
        delta_t = _checked(k.down(act), x.dtype)
        delta = delta_t.data_ptr()
    if delta is not None:
        lib.pd_add_norm(x.data_ptr(), delta, None, None, rows, hidden, 0.0, dt)
    return x
