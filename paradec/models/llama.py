"""The Llama-family decoder (Llama, Qwen2, Mistral): one small file, no speculation inside.

The model is a pure function of (tokens, positions, mask, cache): it writes the new tokens'
K/V into the cache's scratch slots but never commits them, never samples, and has no modes.
``hidden`` can run a range of layers, so a caller can stop after layer m, drop rows, and
continue (ProPD's early pruning).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from paradec.config import ModelConfig
from paradec.kv import KVCache

# bf16 GEMMs on this CPU (oneDNN) give row i the same bits whatever the row count, except a
# 1-row product with an inner dimension over this, which takes another kernel (measured).
GEMV_INNER_LIMIT = 1024


def linear(layer: nn.Module, x: torch.Tensor, exact: bool = True, prefill: bool = False) -> torch.Tensor:
    """``layer(x)`` with each row's result independent of how many rows there are.

    x [..., in] -> [..., out]. A single row with a long inner dimension is computed as two
    (itself twice), so an `ar` step and a verified tree give a token the same bits. The
    quantized layers (``models.quant``) are row-invariant as they are. ``prefill``: a prompt
    pass, which takes a quantized layer's dense weights where it has them (``prefill_linear``).
    """
    if prefill and (dense := getattr(layer, "prefill_linear", None)) is not None:
        return dense(x)
    if exact and x.numel() == x.shape[-1] and layer.in_features > GEMV_INNER_LIMIT and isinstance(layer, nn.Linear):
        return layer(torch.cat([x, x], 0))[:1]
    return layer(x)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """[head_dim // 2] inverse frequencies, with linear or llama3 scaling when configured."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    rs = dict(cfg.rope_scaling or ())
    if rs.get("rope_type") == "linear":
        inv = inv / float(rs["factor"])
    elif rs.get("rope_type") == "llama3":
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv.float()


def rope_tables(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [batch, n] -> cos, sin [batch, n, 1, head_dim]; sin's first half negated,
    so that x * cos + roll(x, head_dim / 2) * sin is x rotated (HF's rotate_half form)."""
    angles = positions[..., None].float() * inv_freq  # [batch, n, head_dim // 2]
    sin = angles.sin()
    angles = torch.cat((angles, angles), -1)[:, :, None]
    return angles.cos().to(dtype), torch.cat((-sin, sin), -1)[:, :, None].to(dtype)


class RMSNorm(nn.Module):
    """Normalizes in fp32, casts back, then scales (the order transformers uses)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * (xf.square().mean(-1, keepdim=True) + self.eps).rsqrt()).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.wqkv = nn.Linear(cfg.hidden_size, q_dim + 2 * kv_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.exact = True  # shape-invariant numerics for cached passes (``Transformer.set_exact``)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | None,
        slots: torch.Tensor | None = None,
        prefill: bool = False,
    ) -> torch.Tensor:
        # x: [batch, n, hidden]; cos/sin: [batch, n, 1, head_dim]; mask: [batch, 1, n, span] bool (or its
        # attention_bias on a cached pass that is not a prefill);
        # slots: [batch, n] scratch slot of each token (None: the next n)
        b, n, _ = x.shape
        heads, kv = self.n_heads, self.n_kv
        qkv = linear(self.wqkv, x, self.exact, prefill).view(b, n, heads + 2 * kv, self.head_dim)
        qk = qkv[:, :, : heads + kv]  # queries and keys rotate together: [batch, n, heads + kv, head_dim]
        # rotate_half(x) * sin == roll(x, half) * (sin with its first half negated): one op, same bits
        qk = (qk * cos + qk.roll(self.head_dim // 2, -1) * sin).transpose(1, 2)  # [batch, heads + kv, n, head_dim]
        q, k = qk[:, :heads], qk[:, heads:]
        v = qkv[:, :, heads + kv :].transpose(1, 2)  # [batch, kv_heads, n, head_dim]
        if cache is not None:
            # k_t [batch, kv_heads, head_dim, span] (the cache's transposed keys); v [batch, kv_heads, span, head_dim]
            k_t, v = cache.write(self.layer, k, v, slots)
            k = k_t.transpose(-1, -2)
        if cache is not None and not prefill:  # a decode step or a tree, of any width
            out = cached_attention(q, k_t, v, mask) if self.exact else fast_cached_attention(q, k_t, v, mask)
        else:  # training, scoring, prefill: one fused kernel (causal when there is no mask)
            gqa = self.n_kv != self.n_heads
            if gqa and x.device.type == "cpu" and mask is not None:
                # the CPU kernel's enable_gqa path does not take every mask layout; expand instead
                rep = self.n_heads // self.n_kv
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
                gqa = False
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None and cache is None, enable_gqa=gqa
            )
        return linear(self.wo, out.transpose(1, 2).reshape(b, n, -1), self.exact, prefill)


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


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.w_gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.w_down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.exact = True

    def forward(self, x: torch.Tensor, prefill: bool = False) -> torch.Tensor:
        gate, up = linear(self.w_gate_up, x, self.exact, prefill).split(self.inter, -1)
        return linear(self.w_down, F.silu(gate) * up, self.exact, prefill)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, cache, slots=None, prefill=False):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, cache, slots, prefill)
        return x + self.mlp(self.mlp_norm(x), prefill)


class Transformer(nn.Module):
    """A decoder-only LM.

    forward(tokens [batch, n], positions [batch, n], mask [batch, 1, n, span] | None, cache)
      -> logits [batch, n, vocab]
    With ``cache=None`` it is a plain causal pass (training, scoring).
    """

    backend = "torch"  # the runtime the scheduler drives (the other one: ``models.llamacpp``)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.exact = True
        self.prefill_path: str | None = None  # the dense weights prompt passes take ("bf16", "fp32"; ``cpu.prefill``)

    def set_exact(self, exact: bool) -> None:
        """Shape-invariant numerics for decode/verification passes (default): a token's K/V,
        hidden state and logits get the same bits in a 1-token `ar` step as inside a verified
        tree, so greedy speculation in bf16 reproduces `ar` exactly. ``False``: the plain fp32
        attention path, faster at long contexts, exact in fp32 only."""
        self.exact = exact
        for block in self.layers:
            block.attn.exact = block.mlp.exact = exact

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(self.inv_freq, positions, dtype)

    def hidden(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | None,
        start: int = 0,
        stop: int | None = None,
        slots: torch.Tensor | None = None,
        prefill: bool = False,
    ) -> torch.Tensor:
        """Run layers [start, stop) on x: token ids [batch, n] when start == 0, else hidden
        states [batch, n, hidden]. Returns hidden states [batch, n, hidden] (not normed).
        ``slots`` [batch, n]: the scratch slot of each token's K/V (default: the next n).
        ``prefill``: a prompt pass, the same for every method, so it takes the fused attention
        kernel; every other cached pass (an `ar` step, a verified tree of any width) takes the
        shape-invariant path, so a token gets the same bits in all of them."""
        if start == 0:
            x = self.embed(x)
        cos, sin = self.rope(positions, x.dtype)
        if cache is not None and not prefill and mask is not None:
            # the cached attention's form, once for every layer
            mask = attention_bias(mask, torch.float64 if self.exact else torch.float32)
        for block in self.layers[start:stop]:
            x = block(x, cos, sin, mask, cache, slots, prefill)
        return x

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: [..., hidden] -> [..., vocab]."""
        return self.normed_logits(h)[0]

    def normed_logits(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [..., hidden] -> (logits [..., vocab], final-normed hidden [..., hidden]): what a
        verification pass hands the acceptance step and the drafters."""
        hn = self.norm(h)
        return linear(self.lm_head, hn, self.exact), hn

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        prefill: bool = False,
    ) -> torch.Tensor:
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        return self.logits(self.hidden(tokens, positions, mask, cache, prefill=prefill))

    def new_cache(self, batch: int, max_len: int, live: int | None = None) -> KVCache:
        """A KV cache of ``batch`` rows of ``max_len`` slots, ``live`` of them in use (default all)."""
        p = self.embed.weight
        cfg = self.config
        return KVCache(cfg.num_layers, batch, cfg.num_kv_heads, cfg.head_dim, max_len, p.dtype, p.device, live)
