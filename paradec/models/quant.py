"""Weight-only quantized linears on torch's packed CPU kernels (``paradec.load(..., quant=...)``).

- ``int8``: one int8 weight per element, one scale per output channel, ``torch._weight_int8pack_mm``.
- ``int4``: 4-bit weights in groups of 32 along the input, an affine (scale, zero) per group,
  ``aten._weight_int4pack_mm_for_cpu``: w = (q - 8) * scale + zero. A GGUF Q4_1 block is exactly
  such a group (w = d * q + m, 32 weights, q in 0..15, m the block's minimum and m + 15d its
  maximum), so quantizing the converted weights by each group's min and max recovers the file's
  own q and (d, m); only scale and zero are stored in bf16 (the kernel's format).

Both kernels give a row the same bits whatever the number of rows (measured on this CPU, and
checked in tests), so an `ar` step and a verified tree agree token for token, as in bf16. The
target that every method is lossless against is the quantized model itself.

Where the decode path runs in C (``models.native``), decode and verification passes take each
layer's ``native_kernel()`` instead: the same 4-bit q with fp32 d and m (the file's Q4_1 values
unrounded), or the same int8 weights, times activations quantized to int8 in blocks of 32 (as
llama.cpp multiplies), row-invariant by construction; prompt passes too, unless a dense copy
(below) measures faster. An int4 layer keeps torch's packed form beside it (torch's path, and
where C does not run): half a byte a weight more.

- bf16 weights stay bf16 but are **packed** where oneDNN can: ``PackedLinear`` reorders a weight
  once into oneDNN's blocked layout (``mkldnn._reorder_linear_weight``). A plain bf16 ``F.linear``
  reorders it on every call: on an AMX Xeon a 576 x 1536 layer took 140-315 us at 1 or 8 rows
  (two quiet runs), the packed product ~90 us. A layer is packed only if a probe on this CPU finds each row's bits
  independent of the row count (``packs_invariantly``), so packing never costs exactness.

A quantized layer may also carry a **prefill path** (``prefill_linear``): its own dequantized
weights, dense (packed bf16 or fp32), for prompt passes only. The packed int4/int8 kernels are
built for a few rows: on the AMX Xeon one decoder layer's linears at 256 rows took 13.4 ms in int4
and 1.0 ms through packed bf16 (5x faster prompts for the whole model); capped to AVX2, 39 ms
against 16 ms through fp32. Every method prefills alike, so the prompt's K/V stay the same for
all of them; decode and verification passes keep the quantized kernels (``paradec.cpu.prefill``
decides by measurement whether a CPU gets it, and which).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from paradec.models import native as native_mod

QUANTS = ("none", "int8", "int4")
PACK_HINT = 1  # the row count oneDNN's blocked layout is chosen for: 1 keeps rows invariant up to 128+ (16: to 32)
PROBE_ROWS = (2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64)  # row counts the invariance probe tries
INT4_GROUP = 32
INT4_N_MULTIPLE = 16  # the packed int4 layout needs out_features % 16 == 0


class Int8Linear(nn.Module):
    """x [..., in] -> [..., out] with int8 weights [out, in] and per-channel scales [out]; x in
    the dtype of the layer it was made from."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)  # [out, in] int8
        self.register_buffer("scales", scales)  # [out] in the activations' dtype
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.prefill_linear: nn.Module | None = None  # dense weights for prompt passes (``dense_linear``)
        self.native_prefill = False  # without them, prompt passes take ``native_kernel()`` where it runs
        # the C kernel's form (``models.native``; made by the first ``native_kernel()``): q and the
        # scales fp32 in its order (``native.pack_q8``)
        self.register_buffer("native_q", None, persistent=False)
        self.register_buffer("native_s", None, persistent=False)

    @classmethod
    def from_linear(cls, layer: nn.Linear, prefill: str | None = None) -> Int8Linear:
        """``prefill``: "bf16" or "fp32" to give it a dense prefill path (``prefill_linear``)."""
        w = layer.weight.detach().float()
        scale = (w.abs().amax(1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        bias = None if layer.bias is None else layer.bias.detach().clone()
        out = cls(q, scale.to(layer.weight.dtype), bias)
        if prefill is not None:
            out.prefill_linear = dense_linear(out.dequantized(), bias, prefill)
        return out

    def dequantized(self) -> torch.Tensor:
        """[out, in] fp32: the weights this layer multiplies by."""
        return self.weight.float() * self.scales.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel()(x)

    def native_kernel(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """``kernel()`` in C (``models.native``: activations quantized to int8 in blocks of 32, as
        llama.cpp's Q8_0 x Q8_0), or None where this machine or layer cannot take it."""
        if self.in_features % INT4_GROUP or not self.weight.is_cpu or not native_mod.available():
            return None
        if self.native_q is None:  # its layout, made once: a second copy of the weights (``weight`` stays torch's)
            self.native_q, self.native_s = native_mod.pack_q8(self.weight, self.scales.float())
        return native_mod.q8_kernel(self.native_q, self.native_s.float().contiguous(), self.bias, self.out_features)

    def kernel(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """This layer's product as a closure over its tensors: [..., in] -> [..., out]."""
        weight, scales, bias, n_in, n_out = self.weight, self.scales, self.bias, self.in_features, self.out_features

        def mm(x: torch.Tensor) -> torch.Tensor:
            y = torch._weight_int8pack_mm(x.reshape(-1, n_in), weight, scales).view(*x.shape[:-1], n_out)
            return y if bias is None else y + bias

        return mm


class Int4Linear(nn.Module):
    """x [..., in] -> [..., out] with 4-bit weights in groups of ``INT4_GROUP`` along ``in``."""

    def __init__(
        self,
        packed: torch.Tensor,
        scales_zeros: torch.Tensor,
        bias: torch.Tensor | None,
        in_features: int,
        out_features: int,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", packed)  # the kernel's packed layout of q [out, in] (uint8)
        self.register_buffer("scales_zeros", scales_zeros)  # [in / group, out, 2] in the activations' dtype
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.prefill_linear: nn.Module | None = None  # dense weights for prompt passes (``dense_linear``)
        self.native_prefill = False  # without them, prompt passes take ``native_kernel()`` where it runs
        # the C kernel's form (``models.native``; set by ``from_linear`` where it runs): the same q,
        # and d, m fp32 (w = d q + m, unrounded), in its order (``native.pack_q4``)
        self.register_buffer("native_q", None, persistent=False)
        self.register_buffer("native_d", None, persistent=False)
        self.register_buffer("native_m", None, persistent=False)

    @staticmethod
    def levels(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """w [out, in] -> q [out, in] int32 in 0..15, scale and minimum [out, in / group] fp32
        (w ~ q * scale + minimum).

        A group whose values already sit on 16 evenly spaced levels keeps them: a dequantized GGUF
        Q4_0 block (d * (q - 8), symmetric, its top level often unused), Q4_1 block (d * q + m) or
        Q4_K sub-block (d * sc * q - dmin * m) comes back as its own 4-bit values, the step being
        the smallest gap between its distinct values. Any other group spans its min..max in 15 steps.
        """
        out, inp = w.shape
        g = w.float().reshape(out, inp // INT4_GROUP, INT4_GROUP)
        lo, hi = g.amin(-1), g.amax(-1)
        scale = (hi - lo) / 15
        gaps = g.sort(-1).values.diff(dim=-1)  # [out, groups, group - 1]
        step = torch.where(gaps > (hi - lo)[..., None] * 1e-5, gaps, torch.inf).amin(-1)
        levels = (g - lo[..., None]) / step[..., None]
        on_grid = step.isfinite() & ((levels - levels.round()).abs() <= 1e-3).all(-1) & (levels.round().amax(-1) <= 15)
        scale = torch.where(on_grid, step, scale)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = ((g - lo[..., None]) / safe[..., None]).round().clamp(0, 15).to(torch.int32)
        return q.reshape(out, inp), scale, lo

    @staticmethod
    def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """w [out, in] -> q [out, in] int32 in 0..15, scale and zero [out, in / group] fp32
        (w ~ (q - 8) * scale + zero; ``levels``)."""
        q, scale, lo = Int4Linear.levels(w)
        return q, scale, lo + 8 * scale

    @classmethod
    def from_linear(cls, layer: nn.Linear, prefill: str | None = None) -> Int4Linear:
        """``prefill``: "bf16" or "fp32" to give it a dense prefill path (``prefill_linear``)."""
        q, scale, lo = cls.levels(layer.weight.detach())
        zero = lo + 8 * scale
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # bf16 is the kernel's storage (a model in fp32 takes the same bf16-rounded values in fp32)
        scales_zeros = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
        bias = None if layer.bias is None else layer.bias.detach().clone()
        out = cls(packed, scales_zeros.to(layer.weight.dtype), bias, layer.in_features, layer.out_features)
        if native_mod.available() and layer.weight.is_cpu:
            out.native_q, out.native_d, out.native_m = native_mod.pack_q4(q, scale, lo)
        if prefill is not None:  # the weights the kernel multiplies by: (q - 8) * scale + zero, from the stored bf16
            s, z = scales_zeros.float().transpose(0, 1).unbind(-1)  # [out, groups] each
            groups = q.float().reshape(q.shape[0], -1, INT4_GROUP)
            w = ((groups - 8) * s[..., None] + z[..., None]).reshape(q.shape)
            out.prefill_linear = dense_linear(w, bias, prefill)
        return out

    @staticmethod
    def fits(layer: nn.Linear) -> bool:
        return layer.in_features % INT4_GROUP == 0 and layer.out_features % INT4_N_MULTIPLE == 0

    def dequantized(self) -> torch.Tensor:
        """[out, in] fp32, computed by the kernel itself (x = the fp32 identity)."""
        eye = torch.eye(self.in_features)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, INT4_GROUP, self.scales_zeros.float())
        return y.T.contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel()(x)

    def native_kernel(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """``kernel()`` in C (``models.native``: the unrounded d and m, activations quantized to
        int8 in blocks of 32, as llama.cpp's Q4_1 x Q8_1), or None where this layer has no C form."""
        if self.native_q is None or not self.native_q.is_cpu:
            return None
        d, m = (t.float().contiguous() for t in (self.native_d, self.native_m))
        return native_mod.q4_kernel(self.native_q, d, m, self.bias)

    def kernel(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """This layer's product as a closure over its tensors: [..., in] -> [..., out]."""
        packed, scales_zeros, bias = self.packed, self.scales_zeros, self.bias
        n_in, n_out, op = self.in_features, self.out_features, torch.ops.aten._weight_int4pack_mm_for_cpu

        def mm(x: torch.Tensor) -> torch.Tensor:
            y = op(x.reshape(-1, n_in), packed, INT4_GROUP, scales_zeros).view(*x.shape[:-1], n_out)
            return y if bias is None else y + bias

        return mm


class PackedLinear(nn.Module):
    """x [..., in] -> [..., out] in bf16, the weight [out, in] held in oneDNN's blocked layout
    (reordered once, not on every call as ``F.linear`` does). The packed tensor is opaque: it is
    an attribute, not a buffer, and the model it sits in is not saved or moved."""

    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), PACK_HINT)
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.detach().clone(), requires_grad=False)

    def dequantized(self) -> torch.Tensor:
        """[out, in] fp32: the weights, read back through the kernel (x = the identity, exact)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return torch.ops.mkldnn._linear_pointwise(eye, self.packed, None, "none", [], "").float().T.contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel()(x)

    def kernel(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """This layer's product as a closure over its tensors: [..., in] -> [..., out]."""
        packed, bias, n_in, n_out, op = self.packed, self.bias, self.in_features, self.out_features, torch.ops.mkldnn

        def mm(x: torch.Tensor) -> torch.Tensor:
            y = op._linear_pointwise(x.reshape(-1, n_in), packed, bias, "none", [], "")
            return y.view(*x.shape[:-1], n_out)

        return mm


class DenseLinear(nn.Module):
    """x [..., in] -> [..., out] in x's dtype, through fp32 weights [out, in] (an fp32 GEMM): a
    quantized layer's prefill path where bf16 is not packed (AVX2: bf16 GEMMs are slow there)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("weight", weight.float().contiguous(), persistent=False)  # [out, in] fp32
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)  # [out] fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight, self.bias).to(x.dtype)


def dense_linear(weight: torch.Tensor, bias: torch.Tensor | None, kind: str) -> nn.Module:
    """weight [out, in] (fp32, a quantized layer's dequantized values) -> a prefill path: "bf16"
    (packed for oneDNN; the values rounded to bf16) or "fp32" (``DenseLinear``, exact)."""
    if kind == "fp32":
        return DenseLinear(weight, bias)
    layer = nn.utils.skip_init(nn.Linear, weight.shape[1], weight.shape[0], bias=bias is not None, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return PackedLinear(layer)


_INVARIANT: dict[tuple[int, int, bool], bool] = {}  # (in, out, bias) -> the probe's verdict, once per process


def packs_invariantly(in_features: int, out_features: int, bias: bool = False) -> bool:
    """Whether oneDNN's packed bf16 product gives each row the same bits at every row count on
    this CPU (probed on random values: the kernel's blocking depends on the shape, not the values).
    False where torch has no oneDNN or it cannot pack."""
    key = (in_features, out_features, bias)
    if key not in _INVARIANT:
        _INVARIANT[key] = _probe(in_features, out_features, bias)
    return _INVARIANT[key]


def _probe(in_features: int, out_features: int, bias: bool) -> bool:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    g = torch.Generator().manual_seed(0)
    layer = nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(max(PROBE_ROWS) + 1, in_features, generator=g).to(torch.bfloat16)  # [rows, in]
    try:
        with torch.inference_mode():
            packed = PackedLinear(layer)
            alone = torch.cat([packed(x[i : i + 1]) for i in range(len(x))])  # [rows, out]
            return all(torch.equal(packed(x[o : o + m]), alone[o : o + m]) for m in PROBE_ROWS for o in (0, 1))
    except RuntimeError:  # a torch whose oneDNN cannot take this shape or dtype
        return False


def pack_linears(model: nn.Module) -> dict[str, str]:
    """Replace the bf16 ``nn.Linear``s of a CPU model (those ``quantize_linears`` left) with
    ``PackedLinear``s where they pack invariantly. Returns {module name: "packed"}."""
    packed = {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            ok = isinstance(child, nn.Linear) and child.weight.dtype == torch.bfloat16 and child.weight.is_cpu
            if ok and packs_invariantly(child.in_features, child.out_features, child.bias is not None):
                setattr(module, child_name, PackedLinear(child))
                packed[f"{name}.{child_name}" if name else child_name] = "packed"
    return packed


def quantize_linears(
    model: nn.Module, quant: str, head: str | None = None, prefill: str | None = None
) -> dict[str, str]:
    """Replace the decoder's linears (attention, MLP) with ``quant`` ones and the LM head with
    ``head`` ones (default: int8 for any quant; "none" keeps it). An int4 layer whose shape the
    packed kernel cannot take stays int8. ``prefill`` ("bf16", "fp32"): the decoder's quantized
    linears get that dense prefill path too (prompt passes do not read the LM head); without one,
    prompts take the layers' C kernels where they run (``native_prefill``), else torch's. Returns
    {module name: format} for the record."""
    if quant not in QUANTS:
        raise ValueError(quant)
    head = head if head is not None else ("none" if quant == "none" else "int8")
    formats = {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            full = f"{name}.{child_name}" if name else child_name
            kind = head if full == "lm_head" else quant
            if kind == "int4" and not Int4Linear.fits(child):
                kind = "int8"
            if kind == "none":
                continue
            dense = None if full == "lm_head" else prefill
            layer = Int4Linear.from_linear(child, dense) if kind == "int4" else Int8Linear.from_linear(child, dense)
            layer.native_prefill = dense is None and full != "lm_head"  # no dense path: the C kernel if it runs
            setattr(module, child_name, layer)
            formats[full] = kind
    return formats
