"""``paradec train``: the zoo's training recipes (tokenizer, target, SSM pool, heads, ASPD adapter),
each resumable from its run directory."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from paradec.cli.common import writable_dir
from paradec.errors import ParadecError


def add_train_parser(sub) -> None:
    t = sub.add_parser("train", help="training recipes for the zoo (resumable)")
    tsub = t.add_subparsers(dest="what", required=True)
    tt = tsub.add_parser("tokenizer", help="byte-level BPE on the stdlib source")
    tt.add_argument("--out", required=True)
    tt.add_argument("--vocab-size", type=int, default=8192)
    tg = tsub.add_parser("target", help="the zoo's ~23M Llama code model on the stdlib source")
    tg.add_argument("--tokenizer", required=True, help="directory written by `paradec train tokenizer`")
    tg.add_argument("--out", required=True, help="where the HF checkpoint is exported")
    tg.add_argument("--run-dir", default="runs/zoo", help="resumable state, logs, token cache")
    _add_train_schedule(tg, max_steps=1600)
    ts = tsub.add_parser("ssms", help="SSM pool for specinfer by collective boost-tuning")
    ts.add_argument("--target", default=None, help="the target (HF directory or .gguf; default: the default model)")
    ts.add_argument("--out-dir", required=True, help="writes OUT_DIR/ssm1..N and OUT_DIR/ssm_pool.json")
    ts.add_argument("--run-dir", default="runs/zoo")
    ts.add_argument("--num", type=int, default=3, help="SSMs in the pool")
    ts.add_argument("--samples", type=int, default=4000, help="target continuations to distill from")
    ts.add_argument(
        "--questions",
        default=None,
        metavar="FILE",
        help="chat model: distill from the target's answers to these questions (question.jsonl; "
        "never an evaluation set)",
    )
    ts.add_argument(
        "--answers",
        nargs="*",
        default=[],
        metavar="FILE",
        help="chat model: other models' answers to --questions (model_answer jsonl), to pretrain on",
    )
    th = tsub.add_parser("heads", help="Medusa heads + early-pruning head for ProPD (frozen backbone)")
    th.add_argument("--target", default=None, help="the target (HF directory or .gguf; default: the default model)")
    th.add_argument("--out", required=True)
    th.add_argument("--run-dir", default="runs/zoo")
    th.add_argument("--num-heads", type=int, default=4)
    th.add_argument("--early-layer", type=int, default=None, help="default: a quarter of the layers")
    th.add_argument("--epochs", type=int, default=3)
    th.add_argument(
        "--questions",
        default=None,
        metavar="FILE",
        help="chat model: train on the target's answers to these questions (question.jsonl)",
    )
    _add_eagle_parser(tsub)
    _add_aspd_parser(tsub)
    td = tsub.add_parser("datastore", help="datastore for rest and auto: the target's own answers (no training)")
    _add_chat_data(td, "build from", "more text to draft from")
    td.add_argument("--run-dir", default="runs/zoo", help="the target's answers (cached, resumable)")


def _add_chat_data(p: argparse.ArgumentParser, use: str, others: str) -> None:
    """--target, --out, and the chat data a recipe ``use``s: questions and other models' answers."""
    p.add_argument("--target", default=None, help="the target (HF directory or .gguf; default: the default model)")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--questions",
        required=True,
        metavar="FILE",
        help=f"{use} the target's answers to these questions (question.jsonl; never an evaluation set)",
    )
    p.add_argument(
        "--answers",
        nargs="*",
        default=[],
        metavar="FILE",
        help=f"other models' answers to --questions (model_answer jsonl): {others}",
    )


def _add_eagle_parser(tsub) -> None:
    te = tsub.add_parser("eagle", help="EAGLE draft head (one decoder layer on the target's features; frozen target)")
    _add_chat_data(te, "train on", "more text to read the target's features on")
    te.add_argument(
        "--draft-vocab",
        type=int,
        default=8192,
        help="draft over the K tokens the target emits most often (0: the whole vocabulary)",
    )
    te.add_argument("--run-dir", default="runs/zoo", help="answers, features, resumable state and logs")
    te.add_argument("--epochs", type=float, default=3.0)
    te.add_argument("--lr", type=float, default=1e-3)
    te.add_argument("--minutes", type=float, default=None, help="stop after this long; rerun to resume")
    te.add_argument(
        "--ttt-steps",
        type=int,
        default=1,
        help="EAGLE-3's training-time test: also train where the head reads its own predicted features, "
        "as draft nodes up to this deep do (1: teacher-forced features only)",
    )
    te.add_argument(
        "--init",
        default=None,
        metavar="PATH",
        help="start from this trained head (its weights and draft vocabulary), e.g. to train on more answers",
    )


def _add_aspd_parser(tsub) -> None:
    ta = tsub.add_parser(
        "aspd",
        help="ASPD fine-tune (LoRA adapter) of a model: on chat answers whose lists and "
        "sections are independent (--questions/--answers), or on stdlib function groups",
    )
    ta.add_argument("--base", required=True, help="the model to fine-tune: a directory or a GGUF file")
    ta.add_argument(
        "--questions",
        default=None,
        metavar="FILE",
        help="chat data: question.jsonl of non-evaluation questions (e.g. arena-hard); the ASPD tokens "
        "are added to the vocabulary if the base lacks them",
    )
    ta.add_argument(
        "--answers",
        nargs="+",
        default=(),
        metavar="FILE",
        help="chat data: answers to those questions (FastChat model_answer files, paradec self-answers)",
    )
    ta.add_argument("--max-tokens", type=int, default=512, help="longest example (prompt + marked answer)")
    ta.add_argument("--out", required=True, help="where the adapter is exported (loads like a model directory)")
    ta.add_argument("--run-dir", default="runs/aspd/model", help="resumable state and logs")
    ta.add_argument("--twin", action="store_true", help="train the Seq twin: same windows, markup removed")
    ta.add_argument("--epochs", type=float, default=1.0)
    ta.add_argument("--rank", type=int, default=32)
    ta.add_argument(
        "--min-branches",
        type=int,
        default=2,
        help="train on windows whose function group has at least this many branches",
    )
    ta.add_argument("--batch-size", type=int, default=8)
    ta.add_argument("--lr", type=float, default=1e-3)
    ta.add_argument("--minutes", type=float, default=None, help="stop after this long; rerun to resume")
    ta.add_argument("--seed", type=int, default=0)


def _add_train_schedule(p: argparse.ArgumentParser, max_steps: int) -> None:
    p.add_argument("--max-steps", type=int, default=max_steps)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--minutes", type=float, default=None, help="stop after this long; rerun to resume")
    p.add_argument("--seed", type=int, default=0)


def _train_config(args: argparse.Namespace):
    from paradec.train.lm import TrainConfig

    for name in ("max_steps", "batch_size", "seq_len"):
        if getattr(args, name) < 1:
            raise ParadecError(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 < args.lr < math.inf:
        raise ParadecError("--lr must be > 0")
    return TrainConfig(
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        lr=args.lr,
        min_lr=args.lr / 10,
        max_steps=args.max_steps,
        minutes=args.minutes,
        seed=args.seed,
        warmup_steps=min(100, args.max_steps // 10 + 1),
    )


def cmd_train(args: argparse.Namespace) -> None:
    if getattr(args, "target", "") is None:
        from paradec.zoo import default_gguf

        args.target = default_gguf()
    RECIPES[args.what](args)


def _train_tokenizer(args: argparse.Namespace) -> None:
    from paradec.train.tokenizer import train_tokenizer

    if not 300 <= args.vocab_size <= 65535:
        raise ParadecError("--vocab-size must be in [300, 65535] (tokens are stored as uint16)")
    writable_dir(Path(args.out), "--out")
    tok = train_tokenizer(args.out, args.vocab_size)
    print(json.dumps({"out": args.out, "vocab_size": len(tok)}))


def _train_target(args: argparse.Namespace) -> None:
    from paradec.train.recipes import train_target

    summary = train_target(args.tokenizer, args.out, args.run_dir, _train_config(args))
    print(json.dumps(summary))


def _train_ssms(args: argparse.Namespace) -> None:
    from paradec.train.boost import train_ssm_pool

    if args.num < 1 or args.samples < 64:
        raise ParadecError("--num must be >= 1 and --samples >= 64")
    if args.questions:
        from paradec.train.chat_recipes import train_chat_ssms

        report = train_chat_ssms(args.target, args.out_dir, args.run_dir, args.questions, args.answers, args.num)
    else:
        report = train_ssm_pool(args.target, args.out_dir, args.run_dir, args.num, args.samples)
    print(json.dumps({k: v for k, v in report.items() if k != "ssms"}))


def _train_heads(args: argparse.Namespace) -> None:
    from paradec.train.heads import train_heads

    if args.num_heads < 1 or args.epochs < 1:
        raise ParadecError("--num-heads and --epochs must be >= 1")
    if args.early_layer is not None:  # checked before any data is made
        from paradec.config import ModelConfig
        from paradec.models.gguf import resolve_model

        layers = ModelConfig.from_dir(resolve_model(args.target)).num_layers
        if not 1 <= args.early_layer < layers:
            raise ParadecError(
                f"--early-layer {args.early_layer}: the target has {layers} layers; pass 1 .. {layers - 1}"
            )
    if args.questions:
        from paradec.train.chat_recipes import train_chat_heads

        meta = train_chat_heads(
            args.target, args.out, args.run_dir, args.questions, args.num_heads, args.early_layer, args.epochs
        )
    else:
        meta = train_heads(args.target, args.out, args.run_dir, args.num_heads, args.early_layer, args.epochs)
    print(json.dumps({k: meta[k] for k in ("top1", "top5", "early_topk_recall", "expected_tau_static")}))


def _train_eagle(args: argparse.Namespace) -> None:
    from paradec.train.eagle import EagleTrainConfig, train_eagle

    if args.epochs <= 0 or not 0 < args.lr < math.inf:
        raise ParadecError("--epochs and --lr must be > 0")
    if not Path(args.questions).is_file():
        raise ParadecError(f"--questions {args.questions}: no such file; pass a FastChat question.jsonl")
    for f in args.answers:
        if not Path(f).is_file():
            raise ParadecError(f"--answers {f}: no such file; pass FastChat model_answer jsonl files")
    if not 1 <= args.ttt_steps <= 8:
        raise ParadecError(f"--ttt-steps {args.ttt_steps}: pass 1 .. 8")
    if args.draft_vocab < 0:
        raise ParadecError("--draft-vocab must be >= 0 (0: the whole vocabulary)")
    if args.init is not None and not (Path(args.init) / "eagle.json").is_file():
        raise ParadecError(f"--init {args.init}: no EAGLE head there (eagle.json missing); pass a head directory")
    writable_dir(Path(args.out), "--out")
    cfg = EagleTrainConfig(
        epochs=args.epochs,
        lr=args.lr,
        min_lr=args.lr / 10,
        minutes=args.minutes,
        draft_vocab=args.draft_vocab or None,
        answers=tuple(args.answers),
        init=args.init,
        ttt_steps=args.ttt_steps,
    )
    summary = train_eagle(args.target, args.out, args.run_dir, args.questions, cfg)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))


def _train_datastore(args: argparse.Namespace) -> None:
    from paradec.train.datastore import build_chat_datastore

    for f in [args.questions, *args.answers]:
        if not Path(f).is_file():
            raise ParadecError(f"{f}: no such file; pass FastChat question.jsonl / model_answer jsonl files")
    writable_dir(Path(args.out), "--out")
    meta = build_chat_datastore(args.target, args.out, args.run_dir, args.questions, tuple(args.answers))
    print(json.dumps(meta))


def _train_aspd(args: argparse.Namespace) -> None:
    from paradec.train.aspd import AspdTrainConfig, train_aspd

    if args.epochs <= 0 or args.rank < 1 or args.batch_size < 1 or not 0 < args.lr < math.inf or args.min_branches < 2:
        raise ParadecError("--epochs and --lr must be > 0, --rank and --batch-size >= 1, --min-branches >= 2")
    if bool(args.questions) != bool(args.answers):
        raise ParadecError("chat data needs both --questions FILE and --answers FILE [FILE ...]")
    if args.max_tokens < 64:
        raise ParadecError("--max-tokens must be >= 64")
    cfg = AspdTrainConfig(
        twin=args.twin,
        rank=args.rank,
        alpha=float(args.rank),
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        min_lr=args.lr / 10,
        minutes=args.minutes,
        seed=args.seed,
        min_branches=args.min_branches,
        questions=args.questions,
        answers=tuple(args.answers),
        max_tokens=args.max_tokens,
    )
    summary = train_aspd(args.base, args.out, args.run_dir, cfg)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))


RECIPES = {
    "tokenizer": _train_tokenizer,
    "target": _train_target,
    "ssms": _train_ssms,
    "heads": _train_heads,
    "eagle": _train_eagle,
    "aspd": _train_aspd,
    "datastore": _train_datastore,
}
