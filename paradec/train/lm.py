"""Resumable causal-LM training of our ``Transformer`` (target or draft), bf16 autocast on CPU.

State (weights, AdamW, step, tokens seen, RNG) is saved atomically to ``run_dir/state.pt``
every ``save_every`` steps, so a killed run resumes where it stopped; ``run_dir/log.jsonl``
keeps the loss curve; the finished model is exported as an HF checkpoint (bf16 safetensors)
that paradec and transformers both load.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from paradec.config import ModelConfig
from paradec.models import Transformer, save_model


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


def cosine_lr(step: int, total: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``lr`` to ``min_lr`` at ``total``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * frac))


def lr_at(step: int, cfg: TrainConfig) -> float:
    return cosine_lr(step, cfg.max_steps, cfg.lr, cfg.min_lr, cfg.warmup_steps)


def lm_loss(model: Transformer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)


@torch.no_grad()
def evaluate(model: Transformer, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model.eval()
    losses = [lm_loss(model, x, y).item() for x, y in batches]
    model.train()
    return float(np.mean(losses))


def save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


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
    run_dir.mkdir(parents=True, exist_ok=True)
    state_path = run_dir / "state.pt"
    torch.manual_seed(cfg.seed)
    model = Transformer(model_cfg)
    init_weights(model)
    if init_state is not None:
        model.load_state_dict(init_state)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, fused=False
    )
    step, tokens_seen, elapsed = 0, 0, 0.0
    rng = np.random.default_rng(cfg.seed)
    if state_path.exists():
        st = torch.load(state_path, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, tokens_seen, elapsed = st["step"], st["tokens_seen"], st["elapsed"]
        rng.bit_generator.state = st["rng"]
    model.train()
    log = (run_dir / "log.jsonl").open("a")
    t0 = time.perf_counter()
    budget = cfg.minutes * 60 if cfg.minutes else float("inf")
    bar = tqdm(total=cfg.max_steps, initial=step, desc=run_dir.name, unit="step", dynamic_ncols=True)
    last_eval = None

    def checkpoint() -> None:
        save_atomic(
            {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "tokens_seen": tokens_seen,
                "elapsed": elapsed + time.perf_counter() - t0,
                "rng": rng.bit_generator.state,
                "config": asdict(cfg),
            },
            state_path,
        )

    while step < cfg.max_steps and time.perf_counter() - t0 < budget:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        x, y = train.sample(cfg.batch_size, cfg.seq_len, rng)
        loss = lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        tokens_seen += int((y != -100).sum())
        rec = {
            "step": step,
            "loss": round(loss.item(), 4),
            "lr": lr_at(step - 1, cfg),
            "tokens_seen": tokens_seen,
            "elapsed_s": round(elapsed + time.perf_counter() - t0, 1),
        }
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            last_eval = rec["heldout_loss"] = round(evaluate(model, heldout), 4)
        log.write(json.dumps(rec) + "\n")
        log.flush()
        bar.update(1)
        bar.set_postfix(loss=rec["loss"], heldout=last_eval)
        if step % cfg.save_every == 0:
            checkpoint()
    bar.close()
    checkpoint()
    elapsed += time.perf_counter() - t0
    heldout_loss = evaluate(model, heldout)
    summary = {
        "steps": step,
        "max_steps": cfg.max_steps,
        "tokens_seen": tokens_seen,
        "wall_s": round(elapsed, 1),
        "heldout_loss": round(heldout_loss, 4),
        "heldout_ppl": round(math.exp(heldout_loss), 3),
        "params": sum(p.numel() for p in model.parameters()),
        "done": step >= cfg.max_steps,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    model.eval()
    summary["model"] = model
    return summary


def export(model: Transformer, tokenizer, out_dir: str | Path) -> None:
    """HF checkpoint: config.json + model.safetensors (bf16) + tokenizer files."""
    save_model(model, out_dir, torch.bfloat16)
    tokenizer.save_pretrained(str(out_dir))
