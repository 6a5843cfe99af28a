"""``paradec train aspd``: fine-tune a model to write ASPD markup, and its Seq twin.

Data, one of:
- code (the bundled code model): windows of the stdlib's training files around groups of
  independent functions (``paradec.train.aspd_data``); every token of the window is a target;
- chat (``questions`` + ``answers``, an instruct model such as the default SmolLM2): answers to
  non-evaluation questions whose lists and sections are independent
  (``paradec.train.aspd_chat``), through the chat template; the answer tokens are the targets.

Marked up with the six ASPD tokens (appended to the vocabulary when the base lacks them). The ASPD model trains
under the Indep mask with Same-Seq positions (a branch never
sees its siblings, every branch of a group starts at the same position), exactly the layout the
hybrid engine decodes with; the Seq twin trains on the same windows with the markup removed
and a plain causal mask: the fair baseline for speed and quality.

Both are LoRA adapters over every linear of every layer, plus trained embedding rows for the
ASPD tokens (the base never saw them), on a frozen base; a few MB each, merged at load time.
The loop is ``train.loop``'s: its state (adapter, AdamW, step) is saved atomically every
``save_every`` steps, so a killed run resumes; ``log.jsonl`` keeps the loss curve with held-out
losses.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from paradec.errors import ParadecError
from paradec.models import load_model
from paradec.models.adapter import DEFAULT_BASE, Adapter, AdapterConfig, copy_tokenizer, extend_vocab
from paradec.models.gguf import resolve_model
from paradec.parallel.grammar import Specials
from paradec.train.aspd_data import Example, collate, examples_from_sources
from paradec.train.corpus import read_split
from paradec.train.loop import loop_spec, train_loop


@dataclass(frozen=True)
class AspdTrainConfig:
    twin: bool = False  # the Seq twin: same windows, no markup, causal mask
    rank: int = 32
    alpha: float = 32.0
    epochs: float = 1.0
    batch_size: int = 8
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 30
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 100
    save_every: int = 25
    max_tokens: int = 512  # longest marked window
    min_branches: int = 2  # train on windows whose group has at least this many branches
    seed: int = 0
    minutes: float | None = None  # wall-clock budget of this invocation (rerun to resume)
    questions: str | None = None  # chat data: FastChat question.jsonl (non-evaluation questions)
    answers: tuple[str, ...] = ()  # chat data: answer files to those questions
    max_prompt_tokens: int = 192  # chat data: longer questions are skipped


def load_examples(tokenizer, run_dir: Path, max_tokens: int) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples, cached in ``run_dir/examples.json`` (extraction takes ~1 min)."""
    path = run_dir / "examples.json"
    if path.exists():
        raw = json.loads(path.read_text())
    else:
        raw = {}
        for name, held in (("train", False), ("heldout", True)):
            raw[name] = [asdict(e) for e in examples_from_sources(read_split(held), tokenizer, max_tokens)]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(raw))
        tmp.replace(path)
    return ([Example(**e) for e in raw["train"]], [Example(**e) for e in raw["heldout"]])


def load_chat_examples(tokenizer, run_dir: Path, cfg: AspdTrainConfig) -> tuple[list[Example], list[Example], dict]:
    """(train, held-out, stats) from chat answers, cached in ``run_dir/examples_chat.json``."""
    from paradec.train.aspd_chat import chat_examples, save_examples

    path = run_dir / "examples_chat.json"
    if not path.exists():
        end = tokenizer.eos_token or ""
        train, held, stats = chat_examples(
            cfg.questions, list(cfg.answers), tokenizer, end, cfg.max_tokens, cfg.max_prompt_tokens, cfg.min_branches
        )
        save_examples(path, train, held, stats)
    raw = json.loads(path.read_text())

    def ex(e: dict) -> Example:
        return Example(e["prompt"] + e["marked"], e["prompt"] + e["plain"], len(e["prompt"]))

    return [ex(e) for e in raw["train"]], [ex(e) for e in raw["heldout"]], raw["stats"]


def aspd_tokenizer(base_dir: Path, add_markers: bool):
    """The base's tokenizer; with ``add_markers``, ASPD's six tokens it lacks are added as
    special tokens (-> tokenizer, the added token strings)."""
    from transformers import AutoTokenizer

    from paradec.parallel.markup import BRANCH, END_BRANCH, END_PARA, END_TITLE, PARA, TITLE

    tok = AutoTokenizer.from_pretrained(str(base_dir), local_files_only=True)
    markers = [TITLE, END_TITLE, PARA, END_PARA, BRANCH, END_BRANCH]
    have = tok.convert_tokens_to_ids(markers)
    new = [m for m, i in zip(markers, have) if i is None or i == tok.unk_token_id]
    if new and add_markers:
        tok.add_special_tokens({"additional_special_tokens": new}, replace_extra_special_tokens=False)
    return tok, tuple(new) if add_markers else ()


def _loss(
    model,
    adapter,
    seqs: list[list[int]],
    branch_open: int | None,
    branch_close: int | None,
    loss_from: list[int] | None = None,
) -> torch.Tensor:
    x, y, pos, mask = collate(seqs, branch_open, branch_close, loss_from=loss_from)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = functional_call(model, adapter.merged(model), (x, pos, mask))
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)


def train_aspd(base_dir: str | Path, out_dir: str | Path, run_dir: str | Path, cfg: AspdTrainConfig) -> dict:
    """Train (or resume) one adapter in ``run_dir``; export it to ``out_dir``; returns the summary."""
    base_arg, out_dir, run_dir = Path(base_dir), Path(out_dir), Path(run_dir)
    base_dir = resolve_model(base_arg)  # a GGUF file is converted once (cached)
    if not (base_dir / "tokenizer.json").is_file():
        raise ParadecError(f"no tokenizer.json in {base_dir}; pass base=PATH to a model directory or GGUF file")
    chat = cfg.questions is not None
    run_dir.mkdir(parents=True, exist_ok=True)
    tok, new_tokens = aspd_tokenizer(base_dir, add_markers=chat)
    sp = Specials.from_tokenizer(
        tok,
        "use a tokenizer from `paradec train tokenizer` (the zoo's has them), "
        "or chat data (questions=, answers=), which adds them",
    )
    train, held = _examples(tok, sp, run_dir, cfg)
    field = "plain" if cfg.twin else "marked"  # the twin: the same answers without markup
    train_seqs, held_seqs = [getattr(e, field) for e in train], [getattr(e, field) for e in held]
    train_from, held_from = [e.loss_from for e in train], [e.loss_from for e in held]
    b_open, b_close = (None, None) if cfg.twin else (sp.branch, sp.end_branch)
    new_tokens = () if cfg.twin else new_tokens  # the twin never sees the markers: the base's vocabulary
    model, adapter = _new_adapter(base_dir, new_tokens, () if cfg.twin else tuple(sorted(sp.ids)), cfg)
    opt = torch.optim.AdamW(adapter.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)
    per_epoch = len(train_seqs) // cfg.batch_size
    total = max(1, int(cfg.epochs * per_epoch))

    def batch_loss(step: int) -> tuple[torch.Tensor, dict]:
        epoch, k = divmod(step, per_epoch)  # each epoch its own shuffle
        picked = np.random.default_rng(cfg.seed + epoch).permutation(len(train_seqs))
        picked = picked[k * cfg.batch_size : (k + 1) * cfg.batch_size]
        batch = [train_seqs[i] for i in picked]
        loss = _loss(model, adapter, batch, b_open, b_close, [train_from[i] for i in picked])
        return loss, {"+tokens_seen": sum(len(s) - 1 - train_from[i] for s, i in zip(batch, picked))}

    @torch.no_grad()
    def heldout_loss() -> float:
        losses = [
            _loss(model, adapter, held_seqs[i : i + 16], b_open, b_close, held_from[i : i + 16]).item()
            for i in range(0, len(held_seqs), 16)
        ]
        return round(float(np.mean(losses)), 4)

    spec = loop_spec(cfg, run_dir, total, eval_at_start=True)
    res = train_loop(spec, {"adapter": adapter}, opt, batch_loss, lambda: {"heldout_loss": heldout_loss()})
    summary = {
        "kind": "seq-twin" if cfg.twin else "aspd",
        "steps": res.step,
        "total_steps": total,
        "train_examples": len(train_seqs),
        "heldout_examples": len(held_seqs),
        "tokens_seen": res.counters.get("tokens_seen", 0),
        "wall_s": round(res.elapsed, 1),
        "heldout_loss": heldout_loss(),
        "trainable_params": sum(p.numel() for p in adapter.parameters()),
        "done": res.done,
        "config": asdict(cfg),
    }
    if summary["done"]:
        export_adapter(adapter, base_arg, out_dir, summary, tok if new_tokens else None)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _new_adapter(base_dir: Path, new_tokens: tuple, token_ids: tuple, cfg: AspdTrainConfig):
    """The frozen base in fp32 (its vocabulary extended by ``new_tokens``) and a fresh LoRA
    adapter over it that also trains the rows of ``token_ids``."""
    torch.manual_seed(cfg.seed)
    model = load_model(base_dir, torch.float32).requires_grad_(False)
    extend_vocab(model, len(new_tokens))
    acfg = AdapterConfig(base="", rank=cfg.rank, alpha=cfg.alpha, token_ids=token_ids, new_tokens=new_tokens)
    return model, Adapter(model, acfg)


def _examples(tok, sp: Specials, run_dir: Path, cfg: AspdTrainConfig) -> tuple[list[Example], list[Example]]:
    """Training and held-out examples: chat answers (``cfg.questions``) or stdlib code windows;
    training keeps the groups of at least ``cfg.min_branches`` branches (held-out keeps all)."""
    if cfg.questions is not None:
        train, held, _ = load_chat_examples(tok, run_dir.parent, cfg)
    else:
        train, held = load_examples(tok, run_dir.parent, cfg.max_tokens)
    if cfg.min_branches > 2:  # the plan length the model learns follows the data's
        train = [e for e in train if e.marked.count(sp.branch) >= cfg.min_branches]
    if not train:
        raise ParadecError(
            f"no training example has a group of {cfg.min_branches} branches; lower min_branches= or pass more answers"
        )
    return train, held


def export_adapter(adapter: Adapter, base_arg: Path, out_dir: Path, summary: dict, tokenizer=None) -> None:
    """adapter files + tokenizer (``tokenizer``: the one with the added tokens) into ``out_dir``;
    the base recorded relative to it, or as ``default`` for paradec's default model."""
    from paradec.zoo import default_gguf

    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        is_default = base_arg.resolve() == default_gguf().resolve()
    except ParadecError:
        is_default = False
    if is_default:
        base = DEFAULT_BASE
    else:
        try:
            base = Path(os.path.relpath(base_arg.resolve(), out_dir.resolve())).as_posix()
        except ValueError:  # another drive (Windows)
            base = str(base_arg.resolve())
    adapter.cfg = AdapterConfig(**{**asdict(adapter.cfg), "base": base})
    adapter.save(out_dir)
    copy_tokenizer(resolve_model(base_arg), out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))
    (out_dir / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
