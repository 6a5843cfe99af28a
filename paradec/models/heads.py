"""Heads on the target's hidden states; they share the target's (frozen) LM head.

- ``MedusaHeads``: K heads, head k predicts the token k+2 positions after the one whose final
  (normed) hidden state it reads — i.e. depth k+1 of the next tree, whose depth-0 token (the
  bonus) the target's own LM head already predicts. Each head is a residual SiLU block, zero
  initialized, so an untrained head starts as the LM head itself (Medusa's choice).
- ``EarlyHead``: reads the residual stream after layer m and predicts the next token; ProPD
  prunes tree nodes whose token is not in their parent's early top-k.

Saved as ``heads.safetensors`` + ``heads.json`` (sizes, the early layer, measured accuracies).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from paradec.errors import ParadecError
from paradec.models.llama import RMSNorm


class ResBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ResBlock(hidden) for _ in range(num_heads))

    def forward(
        self, hn: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor], heads: int | None = None
    ) -> torch.Tensor:
        """hn [..., hidden] (final-normed) -> logits [..., heads, vocab] of the first ``heads``
        (default all). One LM-head call for all heads: on a CPU (or at batch 1 on a GPU) it reads
        the vocab matrix once, not K times."""
        return lm_head(torch.stack([block(hn) for block in self.blocks[:heads]], dim=-2))


class EarlyHead(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden, eps)
        self.block = ResBlock(hidden)

    def forward(self, h: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """h [..., hidden] (residual stream after layer m) -> logits [..., vocab]."""
        return lm_head(self.block(self.norm(h)))


@dataclass
class Heads:
    medusa: MedusaHeads
    early: EarlyHead | None
    early_layer: int  # layers [0, early_layer) run before pruning
    meta: dict = field(default_factory=dict)  # accuracies measured at training time

    @property
    def rank_accuracy(self) -> list[list[float]] | None:
        """[head][rank] P(the target's token is this head's rank-r guess), held-out."""
        return self.meta.get("rank_accuracy")


def save_heads(heads: Heads, out_dir: str | Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {f"medusa.{k}": v.detach().to(torch.bfloat16).contiguous() for k, v in heads.medusa.state_dict().items()}
    if heads.early is not None:
        tensors.update(
            {f"early.{k}": v.detach().to(torch.bfloat16).contiguous() for k, v in heads.early.state_dict().items()}
        )
    tmp = out_dir / "heads.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out_dir / "heads.safetensors")
    hidden = heads.medusa.blocks[0].linear.in_features
    meta = {
        "hidden_size": hidden,
        "num_heads": len(heads.medusa.blocks),
        "early_layer": heads.early_layer,
        "has_early_head": heads.early is not None,
        **heads.meta,
    }
    (out_dir / "heads.json.tmp").write_text(json.dumps(meta, indent=2) + "\n")
    (out_dir / "heads.json.tmp").replace(out_dir / "heads.json")


def load_heads(path: str | Path, hidden: int, eps: float, dtype: torch.dtype, device) -> Heads:
    path = Path(path)
    if not (path / "heads.json").is_file() or not (path / "heads.safetensors").is_file():
        raise ParadecError(
            f"no heads.json + heads.safetensors in {path}; pass heads=PATH written by `paradec train heads`"
        )
    try:
        meta = json.loads((path / "heads.json").read_text())
        if not isinstance(meta, dict):
            raise ValueError
        num_heads = int(meta["num_heads"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        raise ParadecError(
            f"{path / 'heads.json'} is malformed (an object with num_heads, hidden_size, ...); "
            "retrain with `paradec train heads`"
        ) from None
    if meta.get("hidden_size") != hidden:
        raise ParadecError(
            f"heads in {path} were trained for hidden size {meta.get('hidden_size')}, the target "
            f"has {hidden}; train heads for this target"
        )
    try:
        tensors = load_file(str(path / "heads.safetensors"))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ParadecError(
            f"cannot read {path / 'heads.safetensors'} ({str(exc).splitlines()[0]}); the file is "
            "corrupt: retrain with `paradec train heads`"
        ) from None

    def loaded(module: nn.Module, prefix: str, problem: str) -> nn.Module:
        try:
            module.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
        except RuntimeError:
            raise ParadecError(f"{problem} in {path}; retrain with `paradec train heads`") from None
        return module.to(device=device, dtype=dtype).eval().requires_grad_(False)

    medusa = loaded(
        MedusaHeads(hidden, num_heads),
        "medusa.",
        f"heads.json says {num_heads} heads but heads.safetensors holds other weights",
    )
    early = None
    if meta.get("has_early_head"):
        early = loaded(EarlyHead(hidden, eps), "early.", "heads.safetensors has no usable early head")
    extra = {k: v for k, v in meta.items() if k not in ("hidden_size", "num_heads", "early_layer", "has_early_head")}
    return Heads(medusa, early, int(meta.get("early_layer", 0)), extra)
