"""The decode path: one layer of a cached pass that is not a prompt pass (an `ar` step, a verified
tree of any width), with numerics that give a token the same bits whatever the pass's shape.

``Transformer.plan`` captures every layer's weights and kernels once (``LayerKernels``), and
``decode_layer`` runs a layer from them: no module calls, no module attribute lookups. The
primitives here (``rms_norm``, ``rotate``, ``linear``) are the ones the modules in
``models.llama`` use for training and prompt passes too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from paradec.kv import KVCache

# bf16 GEMMs on this CPU (oneDNN) give row i the same bits whatever the row count, except a
# 1-row product with an inner dimension over this, which takes another kernel (measured).
GEMV_INNER_LIMIT = 1024


def linear(layer: nn.Module, x: torch.Tensor, exact: bool = True, prefill: bool = False) -> torch.Tensor:
    """``layer(x)`` with each row's result independent of how many rows there are.

    x [..., in] -> [..., out]. A single row with a long inner dimension is computed as two
    (itself twice), so an `ar` step and a verified tree give a token the same bits. The
    quantized layers (``models.quant``) are row-invariant as they are. ``prefill``: a prompt
    pass, which takes a quantized layer's dense weights where it has them (``prefill_linear``),
    else its C kernel where it runs (``native_prefill``).
    """
    if prefill and (dense := getattr(layer, "prefill_linear", None)) is not None:
        return dense(x)
    native = prefill and getattr(layer, "native_prefill", False) and x.dtype in (torch.bfloat16, torch.float32)
    if native and (kernel := layer.native_kernel()) is not None:  # the C kernels take bf16 or fp32
        return kernel(x)
    if exact and x.numel() == x.shape[-1] and layer.in_features > GEMV_INNER_LIMIT and isinstance(layer, nn.Linear):
        return layer(torch.cat([x, x], 0))[:1]
    return layer(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim], weight [dim] -> [..., dim]: normalized in fp32, cast back, then scaled (the
    order transformers uses)."""
    xf = x.float()
    return weight * (xf * (xf.square().mean(-1, keepdim=True) + eps).rsqrt()).to(x.dtype)


def linear_kernel(layer: nn.Module, exact: bool, native: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """``layer``'s product for decode passes, [..., in] -> [..., out]: a quantized or packed
    layer's own closure over its tensors (``kernel()``; a quantized layer's C kernel if
    ``native``, ``native_kernel()``), else ``linear`` (the GEMV rule)."""
    if native and (own := getattr(layer, "native_kernel", None)) is not None and (kernel := own()) is not None:
        return kernel
    kernel = getattr(layer, "kernel", None)
    return kernel() if kernel is not None else functools.partial(linear, layer, exact=exact)


@dataclass(frozen=True, slots=True)
class LayerKernels:
    """One decoder layer as a decode or verification pass runs it (``decode_layer``): its norm
    weights and its linears' kernels, captured once, so a pass makes no module calls and no
    module attribute lookups (~10 % of an int4 `ar` step of SmolLM2 on 2 cores)."""

    layer: int
    attn_norm: torch.Tensor  # [hidden]
    mlp_norm: torch.Tensor  # [hidden]
    eps: float
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    exact: bool  # the shape-invariant attention (``cached_attention``)
    qkv: Callable[[torch.Tensor], torch.Tensor]  # [..., hidden] -> [..., (heads + 2 kv_heads) * head_dim]
    wo: Callable[[torch.Tensor], torch.Tensor]  # [..., heads * head_dim] -> [..., hidden]
    gate_up: Callable[[torch.Tensor], torch.Tensor]  # [..., hidden] -> [..., 2 * inter]
    down: Callable[[torch.Tensor], torch.Tensor]  # [..., inter] -> [..., hidden]


def decode_layer(
    k: LayerKernels,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None,
    cache: KVCache,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer of a cached pass that is not a prefill (an `ar` step, a verified tree of any
    width): x [batch, n, hidden] -> [batch, n, hidden]. cos/sin [batch, n, 1, head_dim]; mask
    [batch, 1, n, span] bool or its ``attention_bias`` (None: every slot visible); slots
    [batch, n] scratch slot of each token (None: the next n). Writes the tokens' K/V."""
    b, n, _ = x.shape
    heads, kv = k.heads, k.kv_heads
    qkv = k.qkv(rms_norm(x, k.attn_norm, k.eps)).view(b, n, heads + 2 * kv, k.head_dim)
    qk = rotate(qkv[:, :, : heads + kv], cos, sin).transpose(1, 2)  # [batch, heads + kv, n, head_dim]
    v = qkv[:, :, heads + kv :].transpose(1, 2)  # [batch, kv_heads, n, head_dim]
    k_t, v = cache.write(k.layer, qk[:, heads:], v, slots)  # [b, kv, head_dim, span], [b, kv, span, head_dim]
    attend = cached_attention if k.exact else fast_cached_attention
    out = attend(qk[:, :heads], k_t, v, mask)  # [batch, heads, n, head_dim]
    x = x + k.wo(out.transpose(1, 2).reshape(b, n, -1))
    gate, up = k.gate_up(rms_norm(x, k.mlp_norm, k.eps)).split(k.inter, -1)
    return x + k.down(F.silu(gate) * up)


def rotate(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """qk [batch, n, heads, head_dim] rotated by RoPE: x * cos + rotate_half(x) * sin, where
    rotate_half(x) * sin == roll(x, head_dim / 2) * (sin with its first half negated), one op
    and the same bits (``rope_tables``)."""
    return qk * cos + qk.roll(qk.shape[-1] // 2, -1) * sin


def attention_bias(mask: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """mask [batch, 1, n, span] bool -> the additive bias the cached attention adds to its scores
    (0 where visible, -inf elsewhere), in the scores' dtype: fp64 for ``cached_attention``, fp32
    for ``fast_cached_attention``. Built once per pass, not once per layer."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def cached_attention(q: torch.Tensor, k_t: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Attention of a decode / verification pass whose output for a query does not depend on the
    pass's shape, so greedy verification in bf16 picks exactly `ar`'s tokens.

    q [batch, heads, n, head_dim]; k_t [batch, kv_heads, head_dim, span] (keys, transposed, as
    the cache stores them); v [batch, kv_heads, span, head_dim]; mask [batch, 1, n, span] bool,
    or its ``attention_bias`` (None: every slot visible) -> [batch, heads, n, head_dim] in q's dtype.

    A query sees the same keys in an `ar` step (prefix + path, contiguous, alone) as in a tree
    (prefix + ancestors at scattered slots, among other queries), but GEMM kernels block by the
    product's shape, so fp32 products round differently by query and key count, and one
    flipped bf16 bit in the residual stream moves a near-tied argmax. Measured on SmolLM2 (12
    chat prompts, 96 tokens): fp32 attention left `ar` on 10 of 12 prompts; fp32 scores made
    row-invariant for oneDNN/MKL's AVX-512 kernels still left it under MKL's AVX2 kernels
    (rows past a block of 6, and the key count). So every reduction runs in fp64: a product
    of two fp32 values is exact in fp64, and a sum of 64 of them (the scores), or over the
    keys (softmax, probabilities @ values), then differs by order only in the last fp64 bits,
    which reach the bf16 or fp32 result with probability ~1e-13 or ~1e-7 per element. It
    costs about what fp32 scores did in bf16, up to 18 % more in fp32 (per layer, 1-16 queries,
    256-1024 keys).
    """
    b, h, n, d = q.shape
    kv = k_t.shape[1]
    rep = h // kv
    rows = rep * n  # heads of one KV group share its keys: [b, kv, rows, d]
    scores = q.double().reshape(b, kv, rows, d) @ k_t.double() * (1.0 / math.sqrt(d))  # [b, kv, rows, span]
    if mask is not None:
        bias = mask if mask.is_floating_point() else attention_bias(mask)
        scores = (scores.view(b, kv, rep, n, -1) + bias[:, :, None]).view(b, kv, rows, -1)
    out = scores.softmax(-1) @ v.double()  # [b, kv, rows, d]
    return out.view(b, h, n, d).to(q.dtype)


def fast_cached_attention(
    q: torch.Tensor, k_t: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """``cached_attention`` in plain fp32 (``exact=False``): cheaper at long spans, but its
    rounding depends on the pass's shape, so bf16 verification may leave `ar` at a near tie."""
    b, h, n, d = q.shape
    kv = k_t.shape[1]
    rep = h // kv
    qf = q.float().reshape(b, kv, rep * n, d)
    scores = qf @ k_t.float() * (1.0 / math.sqrt(d))  # [b, kv, rep*n, span]
    if mask is not None:
        bias = mask if mask.is_floating_point() else attention_bias(mask, torch.float32)
        scores = (scores.view(b, kv, rep, n, -1) + bias[:, :, None]).view(b, kv, rep * n, -1)
    return (scores.softmax(-1) @ v.float()).view(b, h, n, d).to(q.dtype)
