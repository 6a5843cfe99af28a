"""``paradec train eagle``: EAGLE's draft head, trained on the target's features.

Data: the target's greedy answers to non-evaluation questions through its chat template (the
heads recipe's data, ``chat_recipes.target_answers``: arena-hard by default; cached and
resumable), plus, when given (``answers``), other models' answers to the same training
questions: EAGLE trains on a fixed chat corpus, not the target's text, because what it learns is
the target's feature dynamics, read off whatever text the target runs over. The frozen target
runs once over every (prompt + answer) sequence; its final normed hidden states are the features
f_t, and its greedy next token at every position is the label (cached in
``run_dir/eagle_features.pt`` by sequence, so adding answer files later costs only their own
sequences; ``init`` then warm-starts from the head trained before, with its draft vocabulary).

Draft vocabulary (``draft_vocab`` K): the K tokens most often the target's greedy label on the
training text; the head's CE reads only those rows of the LM head, as its drafts will.

Loss (EAGLE-1/2): the head reads pairs (f_t, x_{t+1}) under a causal mask, predicts f^_{t+1};
``SmoothL1(f^_{t+1}, f_{t+1}) + cls_weight * CE(p_{t+2}, q^_{t+2})`` over every position (the
prompt's too: the head must read it as context at decode time), where p is the target's
distribution from its true feature f_{t+1} and q^ the head's, both over the draft vocabulary.
With ``ttt_steps`` > 1 (EAGLE-3's training-time test) the same loss is also taken where the head
reads its own predicted features, as draft nodes deeper than 1 do at decode time. AdamW, cosine
schedule, a few epochs; state saved atomically every ``save_every`` steps (rerun to resume).
Held out: the split's questions; reported: teacher-forced top-1 (the head's first guess given
true features) and, after training, acceptance per depth of greedy chains drafted by the
trained head on held-out prompts (``EagleDrafter`` through ``Engine.generate``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from paradec.engine import load
from paradec.errors import ParadecError
from paradec.models.eagle import EagleHead, load_eagle
from paradec.train.chat_data import chat_conversations, load_questions
from paradec.train.chat_recipes import target_answers
from paradec.train.loop import loop_spec, save_atomic, train_loop

FEATURES_FORMAT = 2  # eagle_features.pt: {"format", "seqs": {seq_key: (features [n, hidden], labels [n])}}


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
    draft_vocab: int | None = 8192  # None: draft over the whole vocabulary
    answers: tuple[str, ...] = ()  # other models' answers (FastChat model_answer jsonl) to train on too
    init: str | None = None  # start from this trained head (its weights and draft vocabulary)
    ttt_steps: int = 1  # > 1: EAGLE-3's training-time test over this many draft depths (``_batch_loss``)


@torch.inference_mode()
def features(model, seqs: list[list[int]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The target's final normed hidden state at every position, per sequence [n, hidden]
    (bf16), and its greedy next token there, per sequence [n] (int32)."""
    feats, labels = [], []
    for seq in tqdm(seqs, desc="features", unit="seq", dynamic_ncols=True):
        ids = torch.tensor([seq], device=model.embed.weight.device)
        f = model.norm(model.hidden(ids, torch.arange(len(seq))[None], None, None))[0]
        feats.append(f.to(torch.bfloat16).cpu())
        labels.append(model.lm_head(f).argmax(-1).to(torch.int32).cpu())
    return feats, labels


def seq_key(seq: list[int]) -> str:
    return hashlib.sha1(np.asarray(seq, dtype=np.int64).tobytes()).hexdigest()[:20]


def cached_features(model, seqs: list[list[int]], path: Path) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``features`` of ``seqs``, each sequence's computed once: ``path`` keeps them by the
    sequence's tokens, so adding answer files computes the new sequences only."""
    store = torch.load(path, weights_only=False) if path.is_file() else {}
    if store.get("format") != FEATURES_FORMAT:
        store = {"format": FEATURES_FORMAT, "seqs": {}}
    todo = [s for s in dict.fromkeys(map(tuple, seqs)) if seq_key(s) not in store["seqs"]]
    for chunk in range(0, len(todo), 200):  # saved every 200 sequences: an interrupted run keeps them
        part = [list(s) for s in todo[chunk : chunk + 200]]
        for s, f, lab in zip(part, *features(model, part)):
            store["seqs"][seq_key(s)] = (f, lab)
        save_atomic(store, path)
    pairs = [store["seqs"][seq_key(s)] for s in seqs]
    return [f for f, _ in pairs], [lab for _, lab in pairs]


def draft_vocabulary(labels: list[torch.Tensor], size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` tokens most often the target's greedy label, most frequent first: [size]."""
    counts = torch.bincount(torch.cat(labels).long(), minlength=vocab_size)
    return counts.argsort(descending=True, stable=True)[:size]


def ttt_mask(width: int, steps: int) -> torch.Tensor:
    """The training-time-test attention mask over ``steps`` copies of a ``width``-pair sequence,
    laid out step-major: [steps * width, steps * width] bool. Query (k, t) (step k >= 0, pair t)
    sees what a depth-(k + 1) draft node at position t sees at decode time: the true pairs up to
    t - k (the head's cache), then its ancestors (i, t - k + i), i = 1 .. k, each one step
    deeper (the last of them itself). Step 0 is the plain causal mask."""
    t = torch.arange(width)
    mask = torch.zeros(steps, width, steps, width, dtype=torch.bool)
    for k in range(steps):
        mask[k, :, 0] = t[None, :] <= t[:, None] - k  # the true pairs in the cache
        for i in range(1, k + 1):
            mask[k, :, i] = t[None, :] == t[:, None] - k + i  # the ancestor one step i deep
        mask[k, t, k, t] = True  # itself (also for t < k, which have no ancestors and no loss)
    return mask.view(steps * width, steps * width)


def ttt_predict(head: EagleHead, embed, f_in: torch.Tensor, x_in: torch.Tensor, steps: int) -> torch.Tensor:
    """f_in [b, width, hidden] (f_t), x_in [b, width] (x_{t+1}) -> the head's predicted features
    [b, steps * width, hidden], step-major: step k at position t reads, in place of f_t, step k-1's
    prediction at t - 1 (detached; zeros at t = 0) and attends by ``ttt_mask``. The steps before
    the last run without gradients; the last pass recomputes them all with gradients."""
    b, width, hidden = f_in.shape
    pos = torch.arange(width).expand(b, width)
    mask = ttt_mask(width, steps)[None, None] if steps > 1 else None  # [1, 1, steps * width, steps * width]
    inputs = [f_in]  # per step: the features its pairs read [b, width, hidden]
    with torch.no_grad():
        for k in range(1, steps):
            span = k * width
            out = head(torch.cat(inputs, 1), x_in.repeat(1, k), pos.repeat(1, k), embed, mask[..., :span, :span])
            fed = f_in.new_zeros(b, width, hidden)
            fed[:, 1:] = out[:, span - width : span - 1]  # step k-1's prediction for position t
            inputs.append(fed)
    return head(torch.cat(inputs, 1), x_in.repeat(1, steps), pos.repeat(1, steps), embed, mask)


def _batch_loss(
    head: EagleHead,
    embed,
    lm_w: torch.Tensor,
    seqs: list[list[int]],
    feats: list[torch.Tensor],
    labels: list[torch.Tensor],
    cls_weight: float,
    steps: int = 1,
) -> tuple[torch.Tensor, list[float], list[int]]:
    """lm_w [K, hidden]: the LM head rows of the draft vocabulary -> (loss, teacher-forced top-1
    hits per step (the head's first guess is the target's greedy token), positions per step).

    ``steps`` > 1 is EAGLE-3's training-time test: step k's pair at position t reads the feature
    the head predicted at step k - 1 for position t (made from position t - 1's input), not the
    target's, under ``ttt_mask``, as a draft node k + 1 deep does. Every step predicts the same
    targets f_{t+1} and p(x_{t+2}). The fed-back features are detached: the steps before the last
    run without gradients, and the last pass (all steps at once, step-major) carries the loss,
    the mean over steps."""
    width = max(len(s) for s in seqs) - 1
    hidden = feats[0].shape[-1]
    b = len(seqs)
    f_in = torch.zeros(b, width, hidden)
    f_out = torch.zeros(b, width, hidden)
    x_in = torch.zeros(b, width, dtype=torch.long)
    y = torch.full((b, width), -1, dtype=torch.long)  # the target's greedy token after x_{t+1}
    valid = torch.zeros(b, width, dtype=torch.bool)
    for i, (s, f, lab) in enumerate(zip(seqs, feats, labels)):
        n = len(s) - 1  # pairs (f_t, x_{t+1}), t = 0 .. n-1
        f_in[i, :n] = f[:n].float()
        f_out[i, :n] = f[1 : n + 1].float()
        x_in[i, :n] = torch.tensor(s[1:])
        y[i, :n] = lab[1 : n + 1].long()
        valid[i, :n] = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred = ttt_predict(head, embed, f_in, x_in, steps)  # [b, steps * width, hidden]
        logits = pred @ lm_w.T  # [b, steps * width, K]
    with torch.no_grad():
        p = (f_out[valid] @ lm_w.float().T).softmax(-1)  # [positions, K]: the target's p on the draft vocabulary
    loss, hits, counts = 0.0, [], []
    for k in range(steps):
        here = valid.clone()
        here[:, :k] = False  # no step-k input before position k
        sel = here[valid]  # [positions]: which of the target rows this step predicts
        lg = logits[:, k * width : (k + 1) * width][here].float()  # [positions', K]
        reg = F.smooth_l1_loss(pred[:, k * width : (k + 1) * width].float()[here], f_out[here])
        cls = -(p[sel] * lg.log_softmax(-1)).sum(-1).mean()
        loss = loss + (reg + cls_weight * cls) / steps
        guess = lg.argmax(-1)
        if head.vocab is not None:
            guess = head.vocab[guess]
        hits.append(float((guess == y[here]).sum()))
        counts.append(int(here.sum()))
    return loss, hits, counts


def train_eagle(
    target_dir: str | Path, out_dir: str | Path, run_dir: str | Path, questions_path: str | Path, cfg: EagleTrainConfig
) -> dict:
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    target = load(target_dir, dtype="bf16", pack=False)  # trained through: plain linears
    train_recs, held_recs = target_answers(target, questions_path, run_dir)
    train, held, own = _eagle_sequences(target, train_recs, held_recs, questions_path, cfg)
    cache = run_dir / "eagle_features.pt"
    feats, labels = cached_features(target.model, train + held, cache)  # one load and save of the store
    n_train = len(train)
    f_train, l_train, f_held, l_held = feats[:n_train], labels[:n_train], feats[n_train:], labels[n_train:]

    torch.manual_seed(cfg.seed)
    model = target.model.float()  # the frozen embedding and LM head in fp32 (autocast runs bf16)
    embed = model.embed
    head = _new_head(model, cfg, l_train)
    lm_w = head.lm_rows(model.lm_head).detach()  # [K, hidden]
    coverage = float(torch.isin(torch.cat(l_held).long(), head.vocab).float().mean()) if head.vocab is not None else 1.0
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    per_epoch = max(1, len(train) // cfg.batch_seqs)
    total = max(1, int(cfg.epochs * per_epoch))

    def batch_loss(step: int) -> tuple[torch.Tensor, dict]:
        epoch, k = divmod(step, per_epoch)
        order = np.random.default_rng(cfg.seed + epoch).permutation(len(train))
        idx = order[k * cfg.batch_seqs : (k + 1) * cfg.batch_seqs]
        seqs, feats_, labels_ = [train[i] for i in idx], [f_train[i] for i in idx], [l_train[i] for i in idx]
        loss, hits, n = _batch_loss(head, embed, lm_w, seqs, feats_, labels_, cfg.cls_weight, cfg.ttt_steps)
        return loss, {"top1": round(hits[0] / max(1, n[0]), 4)}

    def heldout() -> dict:
        return _heldout_metrics(head, embed, lm_w, held, f_held, l_held, cfg)

    # a resumed run must be this run: its data, length, draft vocabulary and warm start
    run_key = [cfg.draft_vocab, len(train), total, cfg.init] + ([cfg.ttt_steps] if cfg.ttt_steps > 1 else [])
    spec = loop_spec(cfg, run_dir, total, eval_every=per_epoch, eval_at_start=True, run_key=run_key, **FILES)
    res = train_loop(spec, {"head": head}, opt, batch_loss, heldout)
    summary = {
        "steps": res.step,
        "total_steps": total,
        "done": res.done,
        "train_sequences": len(train),
        "train_sequences_target": own,
        "draft_vocab": None if head.vocab is None else len(head.vocab),
        "heldout_label_coverage": round(coverage, 4),
        "heldout_sequences": len(held),
        "train_tokens": sum(map(len, train)),
        "wall_s": round(res.elapsed, 1),
        **heldout(),
        "params": sum(p.numel() for p in head.parameters()),
        "config": asdict(cfg),
    }
    if summary["done"]:
        head.save(out_dir, summary)
        summary["accept_per_depth"] = acceptance_per_depth(target_dir, out_dir, held_recs, cfg)
        head.save(out_dir, summary)
    (run_dir / "eagle_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


FILES = {"state_file": "eagle_state.pt", "log_file": "eagle_log.jsonl", "label": "eagle"}  # in a run dir


def _new_head(model, cfg: EagleTrainConfig, labels: list[torch.Tensor]) -> EagleHead:
    """A fresh head, its draft vocabulary the most frequent ``cfg.draft_vocab`` tokens of
    ``labels``; or ``cfg.init``'s weights and vocabulary (a warm start)."""
    if cfg.init is not None:
        return load_eagle(cfg.init, model.config, torch.float32, model.embed.weight.device).requires_grad_(True).train()
    head, vocab_size = EagleHead(model.config), model.lm_head.out_features
    if cfg.draft_vocab is not None and cfg.draft_vocab < vocab_size:
        head.set_vocab(draft_vocabulary(labels, cfg.draft_vocab, vocab_size))
    return head


@torch.no_grad()
def _heldout_metrics(head, embed, lm_w, held, f_held, l_held, cfg: EagleTrainConfig) -> dict:
    """Held-out loss and top-1 (per training-time-test step when there are several)."""
    hits, n = np.zeros(cfg.ttt_steps), np.zeros(cfg.ttt_steps)
    losses = []
    for i in range(0, len(held), 8):
        batch = held[i : i + 8], f_held[i : i + 8], l_held[i : i + 8]
        loss, h, k = _batch_loss(head, embed, lm_w, *batch, cfg.cls_weight, cfg.ttt_steps)
        losses.append(loss.item())
        hits, n = hits + h, n + k
    top1 = [round(float(h / max(1, k)), 4) for h, k in zip(hits, n)]
    out = {"heldout_loss": round(float(np.mean(losses)), 4), "heldout_top1": top1[0]}
    return out | ({"heldout_top1_per_step": top1} if cfg.ttt_steps > 1 else {})


def _eagle_sequences(target, train_recs, held_recs, questions_path, cfg: EagleTrainConfig):
    """The target's own answers as training and held-out sequences (prompt + answer, cut at
    ``max_len``), plus the conversations of ``cfg.answers`` on training questions. -> (train,
    held, how many training sequences are the target's own)."""

    def seqs_of(recs):
        return [(r["prompt_ids"] + r["answer_ids"])[: cfg.max_len] for r in recs if len(r["answer_ids"]) > 2]

    train, held = seqs_of(train_recs), seqs_of(held_recs)
    if not train or not held:
        raise ParadecError("no answers to train on; check questions= (a FastChat question.jsonl)")
    own = len(train)
    if cfg.answers:
        held_ids = {r["question_id"] for r in held_recs}
        questions = {q: text for q, text in load_questions(questions_path) if q not in held_ids}
        convs = chat_conversations(target.tokenizer.hf, list(cfg.answers), questions)
        train += [conv[: cfg.max_len] for conv in convs if len(conv) > 3]
    return train, held, own


def acceptance_per_depth(target_dir, head_dir: Path, held_recs: list[dict], cfg: EagleTrainConfig) -> list[float]:
    """Greedy chains of depth 5 drafted by the trained head on held-out prompts: P(the drafted
    token at depth d is accepted), d = 1..5 (over all steps: the chain is accepted to depth d)."""
    engine = load(target_dir, dtype="bf16", eagle=head_dir)
    prompts = [r["prompt_ids"] for r in held_recs[: cfg.accept_prompts]]
    out = engine.generate(
        prompts,
        method="eagle",
        max_new_tokens=cfg.accept_tokens,
        eagle_topk=1,
        eagle_depth=5,
        tree_nodes=5,
        ignore_eos=True,
    )
    offered = [sum(g.stats.offered[d] for g in out if len(g.stats.offered) > d) for d in range(5)]
    reached = [sum(g.stats.reached[d] for g in out if len(g.stats.reached) > d) for d in range(5)]
    return [round(r / max(1, o), 4) for r, o in zip(reached, offered)]
