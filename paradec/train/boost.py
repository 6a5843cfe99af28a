"""The SSM pool for SpecInfer, trained by collective boost-tuning (SpecInfer §3, papers.md §2.3).

1. Contexts are windows of the stdlib (train split); the target continues each greedily.
2. A base SSM is pretrained on the raw stdlib stream (an SSM too small to learn code from
   128k distilled tokens alone).
3. SSM_1 is fine-tuned from the base on every (context, target continuation) sample, loss on
   the continuation only. Samples where SSM_1's first 4 greedy tokens equal the target's are
   marked and dropped; SSM_2 is fine-tuned on the rest; and so on.
4. Coverage on held-out samples: the share where at least one of the first n SSMs matches
   the target's first 4 tokens, for n = 1..N.

Every stage caches its output in the run directory, so an interrupted run resumes.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from paradec.config import ModelConfig
from paradec.engine import Engine, load
from paradec.models import load_model, save_model
from paradec.train.corpus import load_or_encode
from paradec.train.lm import StreamBatches, TrainConfig, evaluate, export, train_lm

MATCH_TOKENS = 4


def ssm_config(target: ModelConfig) -> ModelConfig:
    """1 layer, d256, 4 heads of 64, SwiGLU 704, tied embeddings: ~2.9M parameters."""
    return replace(
        target, hidden_size=256, intermediate_size=704, num_layers=1, num_heads=4, num_kv_heads=4, head_dim=64
    )


class DistillBatches:
    """Rows of (context + target continuation); labels only on the continuation."""

    def __init__(self, samples: np.ndarray, ctx_len: int) -> None:
        self.samples = samples  # [n, ctx_len + cont_len] int64
        self.ctx_len = ctx_len

    def sample(self, batch_size, seq_len, rng):
        rows = torch.from_numpy(self.samples[rng.integers(0, len(self.samples), batch_size)].astype(np.int64))
        x, y = rows[:, :-1], rows[:, 1:].clone()
        y[:, : self.ctx_len - 1] = -100
        return x, y


def continuation_samples(
    engine, stream: np.ndarray, n: int, ctx_len: int, cont_len: int, seed: int, path: Path, batch: int = 64
) -> np.ndarray:
    """[n, ctx_len + cont_len]: random contexts + the target's greedy continuation (cached)."""
    if path.exists():
        return np.load(path)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - ctx_len, n)
    contexts = [stream[s : s + ctx_len].astype(np.int64).tolist() for s in starts]
    out = []
    for i in range(0, n, batch):
        gens = engine.generate(contexts[i : i + batch], max_new_tokens=cont_len, ignore_eos=True)
        out += [c + g.token_ids for c, g in zip(contexts[i : i + batch], gens)]
    arr = np.asarray(out, dtype=np.int64)
    np.save(path.with_suffix(".tmp.npy"), arr)
    path.with_suffix(".tmp.npy").replace(path)
    return arr


def matches(engine, samples: np.ndarray, ctx_len: int, batch: int = 256) -> np.ndarray:
    """[n] bool: the model's first MATCH_TOKENS greedy tokens equal the sample's continuation."""
    out = []
    for i in range(0, len(samples), batch):
        chunk = samples[i : i + batch]
        gens = engine.generate([r[:ctx_len].tolist() for r in chunk], max_new_tokens=MATCH_TOKENS, ignore_eos=True)
        out += [g.token_ids == r[ctx_len : ctx_len + MATCH_TOKENS].tolist() for g, r in zip(gens, chunk)]
    return np.asarray(out, dtype=bool)


def step_ms(model, reps: int = 50) -> float:
    """Median ms of one 1-token decode step after 128 cached tokens."""
    cache = model.new_cache(1, 256)
    times = []
    with torch.inference_mode():
        model(torch.arange(128)[None] + 10, None, None, cache)
        cache.advance(0, 128)
        x, pos = torch.tensor([[11]]), torch.tensor([[128]])
        for _ in range(reps):
            t = time.perf_counter()
            model(x, pos, None, cache).argmax(-1).tolist()
            times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


def train_ssm_pool(
    target_dir: str | Path,
    out_root: str | Path,
    run_dir: str | Path,
    num_ssms: int = 3,
    n_train: int = 4000,
    n_heldout: int = 400,
    ctx_len: int = 96,
    cont_len: int = 32,
    pretrain: TrainConfig | None = None,
    distill: TrainConfig | None = None,
) -> dict:
    """The code model's pool: stdlib contexts continued greedily by the target."""
    run_dir = Path(run_dir)
    (run_dir / "boost").mkdir(parents=True, exist_ok=True)
    target = load(target_dir, dtype="bf16", pack=False)  # trained through: plain linears
    tok = target.tokenizer.hf
    train_stream, heldout_stream = load_or_encode(tok, run_dir / "data", tok.eos_token_id)
    t0 = time.perf_counter()
    train = continuation_samples(target, train_stream, n_train, ctx_len, cont_len, 1, run_dir / "boost/train.npy")
    held = continuation_samples(target, heldout_stream, n_heldout, ctx_len, cont_len, 2, run_dir / "boost/heldout.npy")
    report = {
        "target": str(target_dir),
        "samples_train": n_train,
        "samples_heldout": n_heldout,
        "generation_s": round(time.perf_counter() - t0, 1),
    }
    return boost_pool(
        target,
        ssm_config(target.model.config),
        StreamBatches(train_stream),
        StreamBatches(heldout_stream).fixed(16, 16, 256),
        train,
        held,
        ctx_len,
        out_root,
        run_dir,
        num_ssms,
        pretrain,
        distill,
        report=report,
    )


PRETRAIN = TrainConfig(seq_len=128, batch_size=32, lr=2e-3, min_lr=2e-4, max_steps=800, warmup_steps=50, eval_every=200)
DISTILL = TrainConfig(seq_len=0, batch_size=32, lr=1e-3, min_lr=1e-4, max_steps=300, warmup_steps=20, eval_every=100)


def _export_ssm(model, tok, out_dir: Path, save_tokenizer: bool):
    """Save one tuned SSM (with the tokenizer, or without: a chat tokenizer is MBs and the target's
    is the draft's) and load it back as an Engine, as ``specinfer`` will."""
    if save_tokenizer:
        export(model, tok.hf, out_dir)
    else:
        save_model(model, out_dir, torch.bfloat16)
    return Engine(load_model(out_dir, torch.bfloat16), tok)


def boost_pool(
    target,
    cfg: ModelConfig,
    pretrain_data,
    held_lm: list,
    train: np.ndarray,
    held: np.ndarray,
    ctx_len: int,
    out_root: str | Path,
    run_dir: str | Path,
    num_ssms: int,
    pretrain: TrainConfig | None = None,
    distill: TrainConfig | None = None,
    init_state: dict | None = None,
    save_tokenizer: bool = True,
    report: dict | None = None,
) -> dict:
    """Collective boost-tuning: pretrain a base SSM on ``pretrain_data``, then SSM_i fine-tuned
    from it on the (context, target continuation) samples SSM_1..SSM_{i-1} did not match.

    train, held: [n, ctx_len + cont_len] self-distillation windows. Writes OUT_ROOT/ssm1..N and
    OUT_ROOT/ssm_pool.json; every stage resumes from RUN_DIR.
    """
    run_dir, out_root = Path(run_dir), Path(out_root)
    t0 = time.perf_counter()
    tok = target.tokenizer
    base = train_lm(cfg, pretrain_data, held_lm, run_dir / "ssm_base", pretrain or PRETRAIN, init_state=init_state)
    base_state = base.pop("model").state_dict()
    distill = distill or replace(DISTILL, seq_len=train.shape[1] - 1)
    held_distill = [DistillBatches(held, ctx_len).sample(50, 0, np.random.default_rng(i)) for i in range(4)]
    remaining = train
    report = {**(report or {}), "samples_train": int(len(train)), "samples_heldout": int(len(held))}
    report.update(ctx_len=ctx_len, cont_len=int(train.shape[1] - ctx_len), base=dict(base), ssms=[])
    held_hits = []
    for i in range(1, num_ssms + 1):
        summary = train_lm(
            cfg, DistillBatches(remaining, ctx_len), held_distill, run_dir / f"ssm{i}", distill, init_state=base_state
        )
        model = summary.pop("model")
        ssm = _export_ssm(model, tok, out_root / f"ssm{i}", save_tokenizer)
        hit_train = matches(ssm, remaining, ctx_len)
        held_hits.append(matches(ssm, held, ctx_len))
        report["ssms"].append(
            {
                "name": f"ssm{i}",
                "trained_on": int(len(remaining)),
                "matched_own_train": float(hit_train.mean()),
                "heldout_match_4": float(held_hits[-1].mean()),
                "heldout_ppl_pretrain_text": round(math.exp(evaluate(model, held_lm)), 3),
                "distill": summary,
                "params": sum(p.numel() for p in model.parameters()),
            }
        )
        remaining = remaining[~hit_train]
        if len(remaining) < 64:
            break
    return _write_report(report, held_hits, target, out_root, time.perf_counter() - t0)


def _write_report(report: dict, held_hits: list, target, out_root: Path, seconds: float) -> dict:
    """The pool's held-out coverage as SSMs are added, the step costs, and OUT_ROOT/ssm_pool.json."""
    report["coverage_heldout"] = [float(np.any(held_hits[:n], axis=0).mean()) for n in range(1, len(held_hits) + 1)]
    report["target_step_ms"] = step_ms(target.model)
    report["ssm_step_ms"] = step_ms(load_model(out_root / "ssm1", torch.bfloat16))
    report["wall_s"] = round(seconds, 1)
    (out_root / "ssm_pool.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
