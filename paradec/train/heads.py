"""Medusa heads + ProPD's early-pruning head, trained on the target's own continuations with the
backbone frozen (self-distillation).

A sample is a token sequence and the span of positions whose continuation is the target's own
greedy text: (stdlib context + greedy continuation) for the code model, (chat prompt + the
target's greedy answer) for a chat model. The frozen target runs once over every sequence; its
final normed hidden states and its residual stream after the early layer are kept for the
positions of the span. Head k learns the token k+2 positions ahead, the early head the next
token. Held-out accuracy per head and rank gives the static Medusa tree and the prior of
ProPD's online statistics.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from paradec.draft.base import DEFAULT_TREE_NODES
from paradec.engine import load
from paradec.models.heads import EarlyHead, Heads, MedusaHeads, save_heads
from paradec.train.boost import continuation_samples
from paradec.train.corpus import load_or_encode
from paradec.train.loop import LoopSpec, save_atomic, train_loop
from paradec.tree.builders import expected_accepted, top_paths

RANKS = 8


@dataclass
class Positions:
    """Training positions of the heads, flattened over sequences."""

    hn: torch.Tensor  # [n, hidden] final-normed hidden state at position t (bf16)
    hm: torch.Tensor  # [n, hidden] residual stream after the early layer at t (bf16)
    labels: torch.Tensor  # [n, 1 + heads]: tokens t+1, t+2, ...; -100 past the sequence's end


@torch.inference_mode()
def features(
    model, seqs: list[list[int]], spans: list[tuple[int, int]], layer: int, num_heads: int, max_tokens: int = 4096
) -> Positions:
    """Run the frozen target over ``seqs`` (batched by length) and keep positions t in
    ``spans[i] = (lo, hi)`` of each sequence (t predicts t+1)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    hns, hms, labs = [], [], []
    i = 0
    while i < len(order):
        chunk = [order[i]]
        while i + len(chunk) < len(order) and len(seqs[order[i + len(chunk)]]) * (len(chunk) + 1) <= max_tokens:
            chunk.append(order[i + len(chunk)])
        width = max(len(seqs[j]) for j in chunk)
        x = torch.zeros(len(chunk), width, dtype=torch.long)  # right-padded: causal rows never see padding
        for r, j in enumerate(chunk):
            x[r, : len(seqs[j])] = torch.tensor(seqs[j])
        pos = torch.arange(width).expand_as(x)
        h_m = model.hidden(x, pos, None, None, 0, layer)
        h = model.norm(model.hidden(h_m, pos, None, None, layer, None))
        for r, j in enumerate(chunk):
            lo, hi = spans[j]
            seq = torch.tensor(seqs[j] + [-100] * (num_heads + 1))
            hns.append(h[r, lo:hi].to(torch.bfloat16))
            hms.append(h_m[r, lo:hi].to(torch.bfloat16))
            labs.append(torch.stack([seq[t + 1 : t + 2 + num_heads] for t in range(lo, hi)]))
        i += len(chunk)
    return Positions(torch.cat(hns), torch.cat(hms), torch.cat(labs))


def window_spans(samples: np.ndarray, ctx_len: int) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """[n, ctx_len + cont_len] windows -> sequences and their continuation spans."""
    return [row.tolist() for row in samples], [(ctx_len - 1, samples.shape[1] - 1)] * len(samples)


def head_losses(medusa, early, lm_head, hn, hm, labels):
    """hn, hm [b, d]; labels [b, 1 + heads] -> per-head losses, early-head loss."""
    losses = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for k, block in enumerate(medusa.blocks):
            logits = lm_head(block(hn.float()))
            losses.append(F.cross_entropy(logits.float(), labels[:, 1 + k], ignore_index=-100))
        logits = lm_head(early.block(early.norm(hm.float())))
        early_loss = F.cross_entropy(logits.float(), labels[:, 0], ignore_index=-100)
    return losses, early_loss


@torch.inference_mode()
def accuracies(medusa, early, lm_head, data: Positions, batch: int = 2048) -> dict:
    hits = [[] for _ in medusa.blocks]
    ehits = []
    for i in range(0, len(data.labels), batch):
        hn, hm, labels = data.hn[i : i + batch], data.hm[i : i + batch], data.labels[i : i + batch]
        for k, block in enumerate(medusa.blocks):
            valid = labels[:, 1 + k] != -100
            top = lm_head(block(hn[valid].float()).to(lm_head.weight.dtype)).topk(RANKS, -1).indices
            hits[k].append(top == labels[valid, 1 + k, None])  # [n', ranks]
        etop = lm_head(early.block(early.norm(hm.float())).to(lm_head.weight.dtype)).topk(RANKS, -1).indices
        ehits.append(etop == labels[:, 0, None])
    hit = [torch.cat(h).float() for h in hits]
    ehit = torch.cat(ehits)
    return {
        "rank_accuracy": [[round(float(h[:, r].mean()), 4) for r in range(RANKS)] for h in hit],
        "top1": [round(float(h[:, 0].mean()), 4) for h in hit],
        "top5": [round(float(h[:, :5].any(-1).float().mean()), 4) for h in hit],
        "early_topk_recall": [round(float(ehit[:, :k].any(-1).float().mean()), 4) for k in range(1, RANKS + 1)],
    }


def train_heads(
    target_dir: str | Path,
    out_dir: str | Path,
    run_dir: str | Path,
    num_heads: int = 4,
    early_layer: int | None = None,
    epochs: int = 3,
    lr: float = 1e-3,
    n_train: int = 4000,
    n_heldout: int = 400,
    ctx_len: int = 96,
    cont_len: int = 32,
    tree_nodes: int = DEFAULT_TREE_NODES,
) -> dict:
    """The code model's recipe: contexts from the stdlib, continued greedily by the target."""
    run_dir = Path(run_dir)
    (run_dir / "boost").mkdir(parents=True, exist_ok=True)
    target = load(target_dir, dtype="bf16", pack=False)  # trained through: plain linears
    tok = target.tokenizer.hf
    train_stream, heldout_stream = load_or_encode(tok, run_dir / "data", tok.eos_token_id)
    train = continuation_samples(target, train_stream, n_train, ctx_len, cont_len, 1, run_dir / "boost/train.npy")
    held = continuation_samples(target, heldout_stream, n_heldout, ctx_len, cont_len, 2, run_dir / "boost/heldout.npy")
    return fit_heads(
        target.model,
        window_spans(train, ctx_len),
        window_spans(held, ctx_len),
        out_dir,
        num_heads,
        early_layer,
        epochs,
        lr,
        tree_nodes,
    )


def fit_heads(
    model,
    train: tuple[list, list],
    held: tuple[list, list],
    out_dir: str | Path,
    num_heads: int = 4,
    early_layer: int | None = None,
    epochs: int = 3,
    lr: float = 1e-3,
    tree_nodes: int = DEFAULT_TREE_NODES,
    batch: int = 2048,
    cache: Path | None = None,
    run_dir: Path | None = None,
) -> dict:
    """Train Medusa heads + the early head on self-distillation samples (frozen target).

    train, held: (sequences, spans): positions t in span (lo, hi) of a sequence are followed by
    the target's own greedy text. batch: positions per optimizer step. cache: a file that keeps
    the target's features between runs (they cost a pass of the target over every sequence).
    run_dir: where the loop's checkpoint and log go (``train.loop``: a killed run resumes).
    """
    t0 = time.perf_counter()
    layer = early_layer if early_layer is not None else max(1, model.config.num_layers // 4)
    data, data_h = _cached_features(model, train, held, layer, num_heads, cache)
    medusa, early = _new_heads(model, num_heads)
    opt = torch.optim.AdamW([*medusa.parameters(), *early.parameters()], lr=lr, weight_decay=0.0)
    lm_head = model.lm_head  # frozen, bf16
    n = len(data.labels)
    steps = epochs * ((n + batch - 1) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    rng = np.random.default_rng(0)

    def batch_loss(_: int) -> tuple[torch.Tensor, dict]:
        idx = torch.from_numpy(rng.integers(0, n, batch))
        losses, early_loss = head_losses(medusa, early, lm_head, data.hn[idx], data.hm[idx], data.labels[idx])
        return sum(losses) / len(losses) + early_loss, {}

    with tempfile.TemporaryDirectory() as scratch:  # no run_dir: a run that is not resumed
        run = Path(run_dir or scratch)
        spec = LoopSpec(run, steps, lr, eval_every=steps, **FILES)
        train_loop(spec, {"medusa": medusa, "early": early}, opt, batch_loss, dict, scheduler=sched, rng=rng)
        log = [json.loads(line) for line in (run / spec.log_file).read_text().splitlines()]
    log = [{"step": r["step"] - 1, "loss": r["loss"]} for r in log if (r["step"] - 1) % 50 == 0 or r["step"] == steps]
    medusa, early = medusa.eval(), early.eval()
    acc = accuracies(medusa, early, lm_head, data_h)
    paths = top_paths(acc["rank_accuracy"], tree_nodes)
    meta = {
        **acc,
        "tree_nodes": tree_nodes,
        "expected_tau_static": round(1 + expected_accepted(acc["rank_accuracy"], paths), 3),
        "trained_on_positions": int(n),
        "heldout_positions": int(len(data_h.labels)),
        "epochs": epochs,
        "wall_s": round(time.perf_counter() - t0, 1),
        "loss_log": log,
    }
    save_heads(Heads(medusa, early, layer, meta), out_dir)
    return json.loads((Path(out_dir) / "heads.json").read_text())


FILES = {"state_file": "heads_state.pt", "log_file": "heads_log.jsonl", "label": "heads"}  # in a run dir


def _new_heads(model, num_heads: int) -> tuple[MedusaHeads, EarlyHead]:
    d = model.config.hidden_size
    torch.manual_seed(0)
    medusa, early = MedusaHeads(d, num_heads), EarlyHead(d, model.config.rms_norm_eps)
    early.norm.weight.data.copy_(model.norm.weight.float())  # start as "the final norm, applied early"
    return medusa, early


def _cached_features(model, train, held, layer: int, num_heads: int, cache: Path | None) -> tuple[Positions, Positions]:
    """The training and held-out positions, from ``cache`` when it holds these (a pass of the
    target over every sequence is what they cost)."""
    key = (layer, num_heads, len(train[0]), len(held[0]))
    if cache is not None and cache.is_file() and torch.load(cache, weights_only=False)["key"] == key:
        return torch.load(cache, weights_only=False)["data"]
    data, data_h = features(model, *train, layer, num_heads), features(model, *held, layer, num_heads)
    if cache is not None:
        save_atomic({"key": key, "data": (data, data_h)}, cache)
    return data, data_h
