"""The Llama-family decoder (Llama, Qwen2, Mistral): one small file, no speculation inside.

The model is a pure function of (tokens, positions, mask, cache): it writes the new tokens'
K/V into the cache's scratch slots but never commits them, never samples, and has no modes.
``hidden`` can run a range of layers, so a caller can stop after layer m, drop rows, and
continue (ProPD's early pruning).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from paradec.config import ModelConfig
from paradec.kv import KVCache
from paradec.models.decode import LayerKernels, attention_bias, decode_layer, linear, linear_kernel, rms_norm, rotate
from paradec.models.native import LayerTable, native_layers, supports


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
    """``rms_norm`` with its weight: normalizes in fp32, casts back, then scales."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


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
        prefill: bool = False,
    ) -> torch.Tensor:
        """Training, scoring and prompt passes: one fused attention kernel (causal when there is
        no mask); decode and verification passes run ``decode_layer``.
        x: [batch, n, hidden]; cos/sin: [batch, n, 1, head_dim]; mask: [batch, 1, n, span] bool."""
        b, n, _ = x.shape
        heads, kv = self.n_heads, self.n_kv
        qkv = linear(self.wqkv, x, self.exact, prefill).view(b, n, heads + 2 * kv, self.head_dim)
        qk = rotate(qkv[:, :, : heads + kv], cos, sin).transpose(1, 2)  # [batch, heads + kv, n, head_dim]
        q, k = qk[:, :heads], qk[:, heads:]
        v = qkv[:, :, heads + kv :].transpose(1, 2)  # [batch, kv_heads, n, head_dim]
        if cache is not None:  # a prompt pass: its K/V stay in the cache
            # k_t [batch, kv_heads, head_dim, span] (the cache's transposed keys); v [batch, kv_heads, span, head_dim]
            k_t, v = cache.write(self.layer, k, v)
            k = k_t.transpose(-1, -2)
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
        if cache is not None and not prefill:  # a decode step or a tree, of any width
            return decode_layer(self.kernels(), x, cos, sin, mask, cache, slots)
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, cache, prefill)
        return x + self.mlp(self.mlp_norm(x), prefill)

    def kernels(self, native: bool = False) -> LayerKernels:
        """``native``: the quantized linears take their C kernels (``models.native``)."""
        attn, mlp = self.attn, self.mlp
        return LayerKernels(
            attn.layer,
            self.attn_norm.weight,
            self.mlp_norm.weight,
            self.attn_norm.eps,
            attn.n_heads,
            attn.n_kv,
            attn.head_dim,
            mlp.inter,
            attn.exact,
            linear_kernel(attn.wqkv, attn.exact, native),
            linear_kernel(attn.wo, attn.exact, native),
            linear_kernel(mlp.w_gate_up, mlp.exact, native),
            linear_kernel(mlp.w_down, mlp.exact, native),
        )


# Bumped whenever any module, parameter or buffer is registered anywhere in the process
# (PyTorch's global registration hooks): a cached decode plan (``Transformer.plan``) may then
# hold a tensor or a layer its model no longer has, and is rebuilt.
_GENERATION = [0]


def _bump(*_) -> None:
    _GENERATION[0] += 1


def modules_generation() -> int:
    """How many modules, parameters and buffers the process has registered: a plan built from
    modules (``Transformer.plan``, ``EagleHead``'s) is stale once this moves."""
    return _GENERATION[0]


for _register in (
    torch.nn.modules.module.register_module_module_registration_hook,
    torch.nn.modules.module.register_module_parameter_registration_hook,
    torch.nn.modules.module.register_module_buffer_registration_hook,
):
    _register(_bump)


@dataclass(frozen=True)
class DecodePlan:
    """How a model's decode and verification passes run (``Transformer.plan``), built once and
    again when the process registers a module, parameter or buffer anywhere (``generation``)."""

    generation: int
    owner: int  # id() of the model it was built for
    layers: list[LayerKernels]
    native: bool  # in C (``runs_native``)
    head: Callable[[torch.Tensor], torch.Tensor] | None  # the LM head's C kernel, or None
    table: LayerTable | None  # every layer for ``pd_layers``: the pass in one C call, or None


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
        self.native: bool | None = None  # the C small ops (``set_native``): None where they build and fit
        self._plan: DecodePlan | None = None

    def set_exact(self, exact: bool) -> None:
        """Shape-invariant numerics for decode/verification passes (default): a token's K/V,
        hidden state and logits get the same bits in a 1-token `ar` step as inside a verified
        tree, so greedy speculation in bf16 reproduces `ar` exactly. ``False``: the plain fp32
        attention path, faster at long contexts, exact in fp32 only."""
        self.exact = exact
        for block in self.layers:
            block.attn.exact = block.mlp.exact = exact
        self._plan = None

    def plan(self) -> list[LayerKernels]:
        """Every layer's ``LayerKernels``, built on first use and again after the model changes:
        a module, parameter or buffer registered anywhere (a layer quantized, packed or replaced),
        a move or cast of the whole model (``_apply``), ``set_exact``. (A layer moved or cast on
        its own, ``model.layers[i].to(...)``, is not seen: cast the model.)"""
        if self._plan is None or (self._plan.generation, self._plan.owner) != (_GENERATION[0], id(self)):
            weight = self.embed.weight
            native = self.exact and self.native is not False
            native = native and supports(weight.dtype, weight.device, self.config.head_dim)
            layers = [block.kernels(native) for block in self.layers]
            own = getattr(self.lm_head, "native_kernel", None) if native else None
            table = LayerTable.of(layers, weight.dtype) if native else None  # the pass in one C call
            self._plan = DecodePlan(_GENERATION[0], id(self), layers, native, own() if own is not None else None, table)
        return self._plan.layers

    def set_native(self, native: bool | None) -> None:
        """Whether decode and verification passes may take the C small ops and the quantized
        linears' C kernels (``models.native``; the LM head's in every pass): None (default) where
        they build and fit the model, False for torch's."""
        self.native = native
        self._plan = None

    def head(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The LM head as decode passes run it, [..., hidden] -> [..., vocab]: its C kernel where
        they run in C (``runs_native``), else the module. For what reads the head beside a pass
        (Medusa's and the early heads' vocabulary projections)."""
        self.plan()
        return self._plan.head if self._plan.native and self._plan.head is not None else self.lm_head

    def runs_native(self) -> bool:
        """Whether decode and verification passes take the C small ops (``models.native``)."""
        self.plan()
        return self._plan.native

    def _apply(self, fn, recurse=True):
        self._plan = None
        return super()._apply(fn, recurse)

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
        if cache is None or prefill:  # training, scoring, a prompt: the modules
            for block in self.layers[start:stop]:
                x = block(x, cos, sin, mask, cache, slots, prefill)
            return x
        return self.decode(x, cos, sin, mask, cache, start, stop, slots)  # a decode step or a tree

    def decode(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache,
        start: int = 0,
        stop: int | None = None,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Layers [start, stop) of a decode or verification pass, from the decode plan (in C where
        ``runs_native``): hidden states x [batch, n, hidden] -> [batch, n, hidden]. cos/sin from
        ``rope``; mask [batch, 1, n, span] bool, or on torch's path already ``attention_bias``'s
        float form (built once a pass)."""
        plan = self.plan()[start:stop]
        if self._plan.native:  # in C (``runs_native``): in one call where every linear is a quantized one
            table = None if self._plan.table is None else (self._plan.table, start)
            return native_layers(plan, x, cos, sin, mask, cache, slots, table)
        mask = self.decode_mask(mask)  # the cached attention's form, once for every layer
        for kernels in plan:
            x = decode_layer(kernels, x, cos, sin, mask, cache, slots)
        return x

    def decode_mask(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        """mask [batch, 1, n, span] bool (or None) -> the form ``decode`` takes, built once a pass:
        as it is in C, else ``attention_bias``'s float form."""
        if mask is None or mask.dtype != torch.bool or self.runs_native():
            return mask
        return attention_bias(mask, torch.float64 if self.exact else torch.float32)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: [..., hidden] -> [..., vocab]."""
        return self.normed_logits(h)[0]

    def normed_logits(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [..., hidden] -> (logits [..., vocab], final-normed hidden [..., hidden]): what a
        verification pass hands the acceptance step and the drafters."""
        hn = self.norm(h)
        if not hn.requires_grad and self.runs_native() and self._plan.head is not None:
            return self._plan.head(hn), hn
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
