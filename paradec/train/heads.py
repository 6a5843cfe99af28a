"""Medusa heads + ProPD's early-pruning head, trained on the target's own continuations with the
backbone frozen (self-distillation).

Samples are (stdlib context + the target's greedy continuation), the same ones the SSM pool is
distilled from. The frozen target runs once over every sample; its final normed hidden states
and its residual stream after the early layer are kept for the continuation positions. Head k
learns the token k+2 positions ahead, the early head the next token. Held-out accuracy per head
and rank gives the static Medusa tree and the prior of ProPD's online statistics.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import paradec
from paradec.models.heads import EarlyHead, Heads, MedusaHeads, save_heads
from paradec.train.boost import continuation_samples
from paradec.train.corpus import load_or_encode
from paradec.tree.builders import expected_accepted, top_paths

RANKS = 8


@torch.inference_mode()
def features(model, samples: np.ndarray, ctx_len: int, layer: int, batch: int = 32):
    """-> final normed hidden [n, T, d], layer-m hidden [n, T, d] (bf16) for T = cont positions
    (position t predicts t+1; t runs over ctx_len-1 .. end-1)."""
    finals, earlies = [], []
    for i in range(0, len(samples), batch):
        x = torch.from_numpy(samples[i: i + batch].astype(np.int64))
        pos = torch.arange(x.shape[1]).expand_as(x)
        h_m = model.hidden(x, pos, None, None, 0, layer)
        h = model.hidden(h_m, pos, None, None, layer, None)
        finals.append(model.norm(h)[:, ctx_len - 1: -1].to(torch.bfloat16))
        earlies.append(h_m[:, ctx_len - 1: -1].to(torch.bfloat16))
    return torch.cat(finals), torch.cat(earlies)


def head_losses(medusa, early, lm_head, hn, hm, labels):
    """hn, hm [b, T, d]; labels [b, T + 1]: labels[:, t + 1] is the token after position t."""
    losses = []
    T = hn.shape[1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for k, block in enumerate(medusa.blocks):
            if T - 1 - k <= 0:
                continue
            logits = lm_head(block(hn[:, : T - 1 - k].float()))
            losses.append(F.cross_entropy(logits.float().flatten(0, 1), labels[:, 2 + k:].flatten()))
        logits = lm_head(early.block(early.norm(hm.float())))
        early_loss = F.cross_entropy(logits.float().flatten(0, 1), labels[:, 1:].flatten())
    return losses, early_loss


@torch.inference_mode()
def accuracies(medusa, early, lm_head, hn, hm, labels) -> dict:
    T = hn.shape[1]
    rank_acc, top1, top5 = [], [], []
    for k, block in enumerate(medusa.blocks):
        top = lm_head(block(hn[:, : T - 1 - k].float()).to(lm_head.weight.dtype)).topk(RANKS, -1).indices
        hit = top == labels[:, 2 + k:, None]  # [b, T', ranks]
        rank_acc.append([round(float(hit[..., r].float().mean()), 4) for r in range(RANKS)])
        top1.append(round(float(hit[..., 0].float().mean()), 4))
        top5.append(round(float(hit[..., :5].any(-1).float().mean()), 4))
    etop = lm_head(early.block(early.norm(hm.float())).to(lm_head.weight.dtype)).topk(RANKS, -1).indices
    ehit = etop == labels[:, 1:, None]
    early_recall = [round(float(ehit[..., :k].any(-1).float().mean()), 4) for k in range(1, RANKS + 1)]
    return {"rank_accuracy": rank_acc, "top1": top1, "top5": top5, "early_topk_recall": early_recall}


def train_heads(target_dir: str | Path, out_dir: str | Path, run_dir: str | Path, num_heads: int = 4,
                early_layer: int | None = None, epochs: int = 3, lr: float = 1e-3, n_train: int = 4000,
                n_heldout: int = 400, ctx_len: int = 96, cont_len: int = 32, tree_nodes: int = 16) -> dict:
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    (run_dir / "boost").mkdir(parents=True, exist_ok=True)
    target = paradec.load(target_dir, dtype="bf16")
    model, tok = target.model, target.tokenizer.hf
    layer = early_layer if early_layer is not None else max(1, model.config.num_layers // 4)
    train_stream, heldout_stream = load_or_encode(tok, run_dir / "data", tok.eos_token_id)
    train = continuation_samples(target, train_stream, n_train, ctx_len, cont_len, 1, run_dir / "boost/train.npy")
    held = continuation_samples(target, heldout_stream, n_heldout, ctx_len, cont_len, 2, run_dir / "boost/heldout.npy")
    hn, hm = features(model, train, ctx_len, layer)
    hn_h, hm_h = features(model, held, ctx_len, layer)
    labels = torch.from_numpy(train[:, ctx_len - 1:].astype(np.int64))  # [n, cont + 1]
    labels_h = torch.from_numpy(held[:, ctx_len - 1:].astype(np.int64))
    d = model.config.hidden_size
    torch.manual_seed(0)
    medusa, early = MedusaHeads(d, num_heads), EarlyHead(d, model.config.rms_norm_eps)
    early.norm.weight.data.copy_(model.norm.weight.float())  # start as "the final norm, applied early"
    params = list(medusa.parameters()) + list(early.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    lm_head = model.lm_head  # frozen, bf16
    batch, steps = 64, epochs * ((len(train) + 63) // 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    rng = np.random.default_rng(0)
    log = []
    for step in tqdm(range(steps), desc="heads", unit="step", dynamic_ncols=True):
        idx = torch.from_numpy(rng.integers(0, len(train), batch))
        losses, early_loss = head_losses(medusa, early, lm_head, hn[idx], hm[idx], labels[idx])
        loss = sum(losses) / len(losses) + early_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            log.append({"step": step, "loss": round(loss.item(), 4)})
    medusa, early = medusa.eval(), early.eval()
    acc = accuracies(medusa, early, lm_head, hn_h, hm_h, labels_h)
    paths = top_paths(acc["rank_accuracy"], tree_nodes)
    meta = {**acc, "tree_nodes": tree_nodes, "expected_tau_static": round(1 + expected_accepted(acc["rank_accuracy"], paths), 3),
            "trained_on_samples": int(len(train)), "heldout_samples": int(len(held)), "epochs": epochs,
            "wall_s": round(time.perf_counter() - t0, 1), "loss_log": log}
    save_heads(Heads(medusa, early, layer, meta), out_dir)
    return json.loads((Path(out_dir) / "heads.json").read_text())
