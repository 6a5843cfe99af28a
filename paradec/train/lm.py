"""Resumable causal-LM training of our ``Transformer`` (target or draft), bf16 autocast on CPU.

State (weights, AdamW, step, tokens seen, RNG) is saved atomically to ``run_dir/state.pt``
every ``save_every`` steps, so a killed run resumes where it stopped; ``run_dir/log.jsonl``
keeps the loss curve; the finished model is exported as an HF checkpoint (bf16 safetensors)
that paradec and transformers both load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from paradec.config import ModelConfig
from paradec.models import Transformer, save_model
from paradec.train.loop import loop_spec, train_loop


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    max_steps: int = 2000
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 16
    save_every: int = 25
    seed: int = 0
    minutes: float | None = None  # wall-clock budget of this invocation (resume later)


class Batches(Protocol):
    def sample(self, batch_size: int, seq_len: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """-> inputs [batch, seq_len], labels [batch, seq_len] (-100 = no loss)."""


class StreamBatches:
    """Random windows of one token stream (pretraining)."""

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens = tokens  # [n] uint16

    def sample(self, batch_size, seq_len, rng):
        starts = rng.integers(0, len(self.tokens) - seq_len - 1, batch_size)
        chunk = np.stack([self.tokens[s : s + seq_len + 1] for s in starts]).astype(np.int64)
        chunk = torch.from_numpy(chunk)
        return chunk[:, :-1], chunk[:, 1:]

    def fixed(self, n_batches: int, batch_size: int, seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        rng = np.random.default_rng(1234)
        return [self.sample(batch_size, seq_len, rng) for _ in range(n_batches)]


def init_weights(model: Transformer) -> None:
    depth_scale = 1 / math.sqrt(2 * model.config.num_layers)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            if name.endswith("bias"):
                torch.nn.init.zeros_(p)
            continue
        std = 0.02 * (depth_scale if name.endswith(("wo.weight", "w_down.weight")) else 1.0)
        torch.nn.init.normal_(p, std=std)


def lm_loss(model: Transformer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)


@torch.no_grad()
def evaluate(model: Transformer, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    was_training = model.training
    model.eval()
    losses = [lm_loss(model, x, y).item() for x, y in batches]
    model.train(was_training)
    return float(np.mean(losses))


def train_lm(
    model_cfg: ModelConfig,
    train: Batches,
    heldout: list,
    run_dir: str | Path,
    cfg: TrainConfig,
    init_state: dict | None = None,
) -> dict:
    """Train (or resume) in ``run_dir``; returns the summary also written to summary.json."""
    run_dir = Path(run_dir)
    torch.manual_seed(cfg.seed)
    model = Transformer(model_cfg)
    init_weights(model)
    if init_state is not None:
        model.load_state_dict(init_state)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, fused=False
    )
    rng = np.random.default_rng(cfg.seed)

    def batch_loss(_: int) -> tuple[torch.Tensor, dict]:
        x, y = train.sample(cfg.batch_size, cfg.seq_len, rng)  # inputs, labels [batch, seq_len]
        return lm_loss(model, x, y), {"+tokens_seen": int((y != -100).sum())}

    spec = loop_spec(cfg, run_dir, cfg.max_steps)
    res = train_loop(
        spec, {"model": model}, opt, batch_loss, lambda: {"heldout_loss": round(evaluate(model, heldout), 4)}, rng=rng
    )
    heldout_loss = evaluate(model, heldout)
    summary = {
        "steps": res.step,
        "max_steps": cfg.max_steps,
        "tokens_seen": res.counters.get("tokens_seen", 0),
        "wall_s": round(res.elapsed, 1),
        "heldout_loss": round(heldout_loss, 4),
        "heldout_ppl": round(math.exp(heldout_loss), 3),
        "params": sum(p.numel() for p in model.parameters()),
        "done": res.done,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["model"] = model
    return summary


def export(model: Transformer, tokenizer, out_dir: str | Path) -> None:
    """HF checkpoint: config.json + model.safetensors (bf16) + tokenizer files."""
    save_model(model, out_dir, torch.bfloat16)
    tokenizer.save_pretrained(str(out_dir))
