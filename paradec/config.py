"""Frozen configuration records, built once at the edge (CLI, ``paradec.load``) and passed down.

``ModelConfig`` is read from a Hugging Face ``config.json``; ``SamplingConfig``, ``AcceptConfig``
and ``GenerationConfig`` describe one ``generate`` call (a method's own options are records of
its own, declared beside its drafter: ``paradec.options``). Nothing below the edge reads globals or
environment variables.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from paradec.errors import ParadecError
from paradec.options import option

# HF architecture name -> (bias on q/k/v projections, bias on o projection) decided per family.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder (Llama, Qwen2, Mistral)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, float | str], ...] | None = None  # sorted (key, value) pairs
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def context_length(self) -> int:
        """Longest sequence this runtime decodes exactly (sliding-window models: the window)."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @classmethod
    def from_hf(cls, raw: dict, source: str = "config.json") -> ModelConfig:
        if not isinstance(raw, dict):
            raise ParadecError(f"{source} is not a JSON object; pass a Hugging Face config.json")
        archs = raw.get("architectures") or []
        arch = archs[0] if archs else _arch_from_model_type(raw.get("model_type"))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ParadecError(
                f"unsupported architecture {arch!r} in {source}; paradec runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)} checkpoints"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise ParadecError(
                f"unsupported hidden_act {raw.get('hidden_act')!r} in {source}; "
                "paradec runs SiLU-gated Llama-family models"
            )
        try:
            heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            head_dim = raw.get("head_dim") or hidden // heads
            eos = raw.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            rope_scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
            rope_theta = float(raw.get("rope_theta", 0) or 0)
            if isinstance(rope_scaling, dict) and "rope_theta" in rope_scaling and not rope_theta:
                rope_theta = float(rope_scaling["rope_theta"])
            rope_scaling = _normalize_rope_scaling(rope_scaling, source)
            is_qwen = arch == "Qwen2ForCausalLM"
            sliding = raw.get("sliding_window") if raw.get("use_sliding_window", not is_qwen) else None
            return cls(
                architecture=arch,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                rope_theta=rope_theta or 10000.0,
                rope_scaling=rope_scaling,
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=is_qwen or bool(raw.get("attention_bias", False)),
                o_bias=(not is_qwen) and bool(raw.get("attention_bias", False)),
                mlp_bias=bool(raw.get("mlp_bias", False)),
                sliding_window=int(sliding) if sliding else None,
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ParadecError(
                f"{source} is missing or has a bad field ({exc}); pass a Hugging Face Llama/Qwen2/Mistral config.json"
            ) from None

    def __post_init__(self) -> None:
        sizes = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
        }
        bad = [k for k, v in sizes.items() if v < 1]
        if bad:
            raise ParadecError(f"config.json has {bad[0]} = {sizes[bad[0]]}; it must be >= 1 (a broken config)")
        if self.num_heads % self.num_kv_heads:
            raise ParadecError(
                f"config.json has {self.num_heads} attention heads, not a multiple of "
                f"{self.num_kv_heads} key/value heads (a broken config)"
            )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ParadecError(
                f"no config.json in {model_dir}; pass model=PATH to a Hugging Face "
                "model directory (config.json + *.safetensors)"
            )
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ParadecError(
                f"{path} is not valid JSON ({exc.__class__.__name__}); re-export the checkpoint"
            ) from None
        return cls.from_hf(raw, str(path))


def _arch_from_model_type(model_type: str | None) -> str:
    return {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}.get(
        model_type or "", str(model_type)
    )


def _normalize_rope_scaling(rs: dict | None, source: str) -> tuple | None:
    if not rs:
        return None
    if not isinstance(rs, dict):
        raise ParadecError(f"rope_scaling in {source} is {type(rs).__name__}, not an object; fix config.json")
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ("linear", "llama3"):
        raise ParadecError(
            f"unsupported rope_scaling type {kind!r} in {source}; paradec supports default, linear and llama3 RoPE"
        )
    keep = {
        k: v
        for k, v in rs.items()
        if k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    }
    return tuple(sorted({**keep, "rope_type": kind}.items()))


MIN_TEMPERATURE = 1e-5  # below it (and above 0) the scaled logits overflow float32: vLLM's greedy threshold


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ParadecError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:  # logits / temperature would overflow to inf
            raise ParadecError(
                f"temperature {self.temperature:g} is too small to sample with; use 0 for greedy "
                f"or >= {MIN_TEMPERATURE:g}"
            )
        if self.top_k < 0:
            raise ParadecError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ParadecError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ParadecError(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


ACCEPTORS = ("mss", "naive", "typical")
# The most nodes one step may verify: a tree past this costs more than it can accept on any
# hardware we measured, and its scratch slots are reserved in every row's KV cache.
MAX_TREE_NODES = 64


def expansion_nodes(expansion: tuple[int, ...]) -> int:
    """Non-root nodes of one SSM's tree with ``expansion[l]`` children per node at level l."""
    total, width = 0, 1
    for k in expansion:
        width *= k
        total += width
    return total


@dataclass(frozen=True)
class AcceptConfig:
    """How a sampled step accepts draft tokens (greedy acceptance is always exact match)."""

    acceptor: str = option(
        "mss", "sampling acceptance (typical is LOSSY: Medusa's typical acceptance)", choices=ACCEPTORS
    )
    typical_epsilon: float = option(0.09, "typical acceptance: p(x) > min(epsilon, delta * exp(-entropy))")
    typical_delta: float = option(0.3, "typical acceptance: see --typical-epsilon")

    def __post_init__(self) -> None:
        if self.acceptor not in ACCEPTORS:
            raise ParadecError(f"unknown acceptor {self.acceptor!r}; choose one of {', '.join(ACCEPTORS)}")


T = TypeVar("T")


@dataclass(frozen=True)
class GenerationConfig:
    """One ``generate`` call: length, stopping, sampling, and the decoding method with its options."""

    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    method: str = "ar"
    accept: AcceptConfig = field(default_factory=AcceptConfig)
    # trees sized from this call's own statistics, never from measured time (a cost model's, the
    # statistics kept across calls): a seed then fixes sampled text
    deterministic: bool = False
    options: tuple[Any, ...] = ()  # the method's options records (``paradec.options``), one per kind

    def __post_init__(self) -> None:
        if any(not s for s in self.stop):
            raise ParadecError("a stop string is empty; pass non-empty stop strings")
        if self.max_new_tokens < 1:
            raise ParadecError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def option(self, kind: type[T]) -> T:
        """The method's ``kind`` options (its defaults where the method has none of that kind)."""
        return next((o for o in self.options if type(o) is kind), None) or kind()

    def with_option(self, kind: type, **changes: Any) -> GenerationConfig:
        """This config with ``changes`` to its ``kind`` options."""
        others = tuple(o for o in self.options if type(o) is not kind)
        return replace(self, options=(*others, replace(self.option(kind), **changes)))
