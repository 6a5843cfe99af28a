"""``paradec train eagle``: EAGLE's draft head, trained on the target's own answers.

Data: the target's greedy answers to non-evaluation questions through its chat template (the
heads recipe's data, ``chat_recipes.target_answers``: arena-hard by default; cached and
resumable). The frozen target runs once over every (prompt + answer) sequence; its final normed
hidden states are the features f_t (cached in ``run_dir/eagle_features.pt``).

Loss (EAGLE-1/2): the head reads pairs (f_t, x_{t+1}) under a causal mask, predicts f^_{t+1};
``SmoothL1(f^_{t+1}, f_{t+1}) + cls_weight * CE(lm_head(f^_{t+1}), x_{t+2})`` over every
position (the prompt's too: the head must read it as context at decode time). AdamW, cosine
schedule, a few epochs; state saved atomically every ``save_every`` steps (rerun to resume).
Held out: the split's questions; reported: teacher-forced top-1 (the head's first guess given
true features) and, after training, acceptance per depth of greedy chains drafted by the
trained head on held-out prompts (``EagleDrafter`` through ``Engine.generate``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from paradec.engine import load
from paradec.errors import ParadecError
from paradec.models.eagle import EagleHead
from paradec.train.chat_recipes import target_answers
from paradec.train.lm import cosine_lr, save_atomic


@dataclass(frozen=True)
class EagleTrainConfig:
    epochs: float = 3.0
    batch_seqs: int = 4  # sequences per step
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    cls_weight: float = 0.1
    max_len: int = 640  # tokens per sequence (prompt + answer)
    save_every: int = 25
    seed: int = 0
    minutes: float | None = None
    accept_prompts: int = 12  # held-out prompts for the acceptance-per-depth measurement
    accept_tokens: int = 64


@torch.inference_mode()
def features(model, seqs: list[list[int]]) -> list[torch.Tensor]:
    """The target's final normed hidden state at every position: per sequence [n, hidden] (bf16)."""
    out = []
    for seq in tqdm(seqs, desc="features", unit="seq", dynamic_ncols=True):
        ids = torch.tensor([seq], device=model.embed.weight.device)
        h = model.hidden(ids, torch.arange(len(seq))[None], None, None)
        out.append(model.norm(h)[0].to(torch.bfloat16).cpu())
    return out


def _batch_loss(head: EagleHead, embed, lm_head, seqs: list[list[int]], feats: list[torch.Tensor],
                cls_weight: float) -> tuple[torch.Tensor, float, int]:
    """-> (loss, teacher-forced top-1 hits, positions with a label)."""
    width = max(len(s) for s in seqs) - 1
    hidden = feats[0].shape[-1]
    b = len(seqs)
    f_in = torch.zeros(b, width, hidden)
    f_out = torch.zeros(b, width, hidden)
    x_in = torch.zeros(b, width, dtype=torch.long)
    y = torch.full((b, width), -100, dtype=torch.long)
    valid = torch.zeros(b, width, dtype=torch.bool)
    for i, (s, f) in enumerate(zip(seqs, feats)):
        n = len(s) - 1  # pairs (f_t, x_{t+1}), t = 0 .. n-1
        f_in[i, :n] = f[:n].float()
        f_out[i, :n] = f[1:n + 1].float()
        x_in[i, :n] = torch.tensor(s[1:])
        y[i, : n - 1] = torch.tensor(s[2:])
        valid[i, :n] = True
    pos = torch.arange(width).expand(b, width)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred = head(f_in, x_in, pos, embed)  # [b, width, hidden]
        logits = lm_head(pred)
    reg = F.smooth_l1_loss(pred.float()[valid], f_out[valid])
    cls = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
    labelled = y != -100
    hits = float((logits.argmax(-1) == y)[labelled].sum())
    return reg + cls_weight * cls, hits, int(labelled.sum())


def train_eagle(target_dir: str | Path, out_dir: str | Path, run_dir: str | Path, questions_path: str | Path,
                cfg: EagleTrainConfig) -> dict:
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    target = load(target_dir, dtype="bf16")
    train_recs, held_recs = target_answers(target, questions_path, run_dir)

    def seqs_of(recs):
        return [(r["prompt_ids"] + r["answer_ids"])[: cfg.max_len] for r in recs if len(r["answer_ids"]) > 2]

    train, held = seqs_of(train_recs), seqs_of(held_recs)
    if not train or not held:
        raise ParadecError("no answers to train on; check questions= (a FastChat question.jsonl)")
    cache = run_dir / "eagle_features.pt"
    key = [len(train), len(held), cfg.max_len, sum(map(len, train))]
    if cache.is_file() and torch.load(cache, weights_only=False)["key"] == key:
        f_train, f_held = torch.load(cache, weights_only=False)["data"]
    else:
        f_train, f_held = features(target.model, train), features(target.model, held)
        save_atomic({"key": key, "data": (f_train, f_held)}, cache)

    torch.manual_seed(cfg.seed)
    model = target.model.float()  # the frozen embedding and LM head in fp32 (autocast runs bf16)
    embed, lm_head = model.embed, model.lm_head
    head = EagleHead(model.config)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    per_epoch = max(1, len(train) // cfg.batch_seqs)
    total = max(1, int(cfg.epochs * per_epoch))
    state_path = run_dir / "eagle_state.pt"
    step, elapsed = 0, 0.0
    if state_path.exists():
        st = torch.load(state_path, weights_only=False)
        head.load_state_dict(st["head"])
        opt.load_state_dict(st["opt"])
        step, elapsed = st["step"], st["elapsed"]

    @torch.no_grad()
    def heldout() -> dict:
        hits = n = 0
        losses = []
        for i in range(0, len(held), 8):
            loss, h, k = _batch_loss(head, embed, lm_head, held[i: i + 8], f_held[i: i + 8], cfg.cls_weight)
            losses.append(loss.item())
            hits, n = hits + h, n + k
        return {"heldout_loss": round(float(np.mean(losses)), 4), "heldout_top1": round(hits / max(1, n), 4)}

    t0 = time.perf_counter()
    log = (run_dir / "eagle_log.jsonl").open("a")
    if step == 0:
        log.write(json.dumps({"step": 0, **heldout()}) + "\n")
    budget = cfg.minutes * 60 if cfg.minutes else float("inf")
    bar = tqdm(total=total, initial=step, desc="eagle", unit="step", dynamic_ncols=True)
    while step < total and time.perf_counter() - t0 < budget:
        epoch, k = divmod(step, per_epoch)
        idx = np.random.default_rng(cfg.seed + epoch).permutation(len(train))[k * cfg.batch_seqs: (k + 1) * cfg.batch_seqs]
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, total, cfg.lr, cfg.min_lr, cfg.warmup_steps)
        loss, hits, n = _batch_loss(head, embed, lm_head, [train[i] for i in idx], [f_train[i] for i in idx],
                                    cfg.cls_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        rec = {"step": step, "loss": round(loss.item(), 4), "top1": round(hits / max(1, n), 4),
               "elapsed_s": round(elapsed + time.perf_counter() - t0, 1)}
        if step % per_epoch == 0 or step == total:
            rec.update(heldout())
        log.write(json.dumps(rec) + "\n")
        log.flush()
        bar.update(1)
        bar.set_postfix(loss=rec["loss"], top1=rec["top1"])
        if step % cfg.save_every == 0:
            save_atomic({"head": head.state_dict(), "opt": opt.state_dict(), "step": step,
                         "elapsed": elapsed + time.perf_counter() - t0}, state_path)
    bar.close()
    elapsed += time.perf_counter() - t0
    save_atomic({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed}, state_path)
    summary = {"steps": step, "total_steps": total, "done": step >= total, "train_sequences": len(train),
               "heldout_sequences": len(held), "train_tokens": sum(map(len, train)), "wall_s": round(elapsed, 1),
               **heldout(), "params": sum(p.numel() for p in head.parameters()), "config": asdict(cfg)}
    if summary["done"]:
        head.save(out_dir, summary)
        summary["accept_per_depth"] = acceptance_per_depth(target_dir, out_dir, held_recs, cfg)
        head.save(out_dir, summary)
    (run_dir / "eagle_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def acceptance_per_depth(target_dir, head_dir: Path, held_recs: list[dict], cfg: EagleTrainConfig) -> list[float]:
    """Greedy chains of depth 5 drafted by the trained head on held-out prompts: P(the drafted
    token at depth d is accepted), d = 1..5 (over all steps: the chain is accepted to depth d)."""
    engine = load(target_dir, dtype="bf16", eagle=head_dir)
    prompts = [r["prompt_ids"] for r in held_recs[: cfg.accept_prompts]]
    out = engine.generate(prompts, method="eagle", max_new_tokens=cfg.accept_tokens, eagle_topk=1, eagle_depth=5,
                          tree_nodes=5, ignore_eos=True)
    offered = [sum(g.stats.offered[d] for g in out if len(g.stats.offered) > d) for d in range(5)]
    reached = [sum(g.stats.reached[d] for g in out if len(g.stats.reached) > d) for d in range(5)]
    return [round(r / max(1, o), 4) for r, o in zip(reached, offered)]
