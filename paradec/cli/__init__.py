"""``paradec`` command line: thin over the library.

Every user error is one line on stderr (``paradec: error: ...``) and exit status 2.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from paradec import methods
from paradec.cli.common import Parser, add_model_args, flag_message, load_options, model_and_companions, writable_dir
from paradec.cli.options import add_options, add_sampling, generation_options, given_options, method_help
from paradec.cli.serve import add_serve_parsers, cmd_bench_serve, cmd_serve
from paradec.cli.train import add_train_parser, cmd_train
from paradec.errors import ParadecError
from paradec.models.quant import QUANTS


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="paradec", description="Lossless fast decoding for Hugging Face-format LLMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_decode_parsers(sub)
    add_serve_parsers(sub)
    _add_tool_parsers(sub)
    _add_bench_parser(sub)
    add_train_parser(sub)
    return parser


def _add_decode_parsers(sub) -> None:
    """generate and chat."""
    g = sub.add_parser("generate", help="generate text for one prompt")
    add_model_args(g)
    g.add_argument("--method", default=methods.DEFAULT, choices=methods.names(), metavar="METHOD", help=method_help())
    add_sampling(g)
    add_options(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object (last stdout line)")
    g.add_argument("prompt")

    c = sub.add_parser("chat", help="interactive multi-turn chat (streams; /exit quits, /reset forgets)")
    add_model_args(c)
    c.add_argument(
        "--method",
        default=methods.DEFAULT,
        choices=[m.name for m in methods.methods() if m.drafter],
        metavar="METHOD",
        help=method_help(),
    )
    c.add_argument("--system", default=None, help="system message")
    add_sampling(c)
    add_options(c)


def _add_tool_parsers(sub) -> None:
    """convert, demo, doctor, aspd."""
    cv = sub.add_parser("convert", help="convert a model file to a Hugging Face directory")
    cvsub = cv.add_subparsers(dest="what", required=True, parser_class=Parser)
    cg = cvsub.add_parser("gguf", help="GGUF (llama/mistral/qwen2; F32..Q8_0, Q4_K..Q6_K) -> HF directory")
    cg.add_argument("file", help="the .gguf file")
    cg.add_argument("out", help="a new directory for config.json, model.safetensors and the tokenizer")

    d = sub.add_parser("demo", help="the default model decoded by every lossless method, side by side")
    d.add_argument("--max-new-tokens", type=int, default=64)
    d.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    d.add_argument("--model", default=None, help="another model directory or .gguf file")
    d.add_argument(
        "--quant",
        default="auto",
        choices=("auto", *QUANTS),
        help="int8 / int4 weights (every method is "
        "then lossless against the quantized model); auto: the format this CPU runs fastest",
    )
    d.add_argument("--aspd", action="store_true", help="also run the bundled ASPD code model (hybrid decoding)")

    dr = sub.add_parser(
        "doctor",
        help="this CPU, the weight format paradec chose for a model, and what a pass "
        "of each width costs (measured once, cached)",
    )
    dr.add_argument("--model", default=None, help="a model directory or .gguf file (default: SmolLM2-135M-Instruct)")
    dr.add_argument("--remeasure", action="store_true", help="measure again instead of reading the cache")
    dr.add_argument("--json", action="store_true", help="print one JSON object")
    a = sub.add_parser("aspd", help="ASPD tools")
    asub = a.add_subparsers(dest="what", required=True, parser_class=Parser)
    ae = asub.add_parser("extract", help="find independent segments in answers (jsonl in, jsonl out + stats)")
    ae.add_argument("input")
    ae.add_argument("output")
    ae.add_argument("--judge-url", default=None, help="OpenAI-compatible endpoint for the independence judge")
    ae.add_argument("--judge-model", default="gpt-4o")
    ae.add_argument("--tokenizer", default=None, help="count tokens with this HF tokenizer (default: words)")


def _add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="side-by-side benchmark: paradec methods vs transformers peers")
    add_model_args(b, backend=False)  # a method's runtime is its name's: ar@llamacpp
    b.add_argument("--methods", default="ar,hf,pld", help="comma-separated: " + ", ".join(_bench_methods()))
    b.add_argument(
        "--prompts",
        required=True,
        help="question.jsonl (Spec-Bench), HumanEval jsonl(.gz), text, "
        "or stdlib:heldout (code followed by independent functions, for aspd)",
    )
    b.add_argument(
        "--twin",
        default=None,
        metavar="PATH",
        help="Seq twin of the ASPD model (method seq-twin; NLL reference); default: the aspd-seq "
        "directory next to the ASPD model (zoo/smollm2/aspd-seq for the default)",
    )
    b.add_argument("--limit", type=int, default=None)
    b.add_argument("--per-category", type=int, default=None, help="first K prompts of each category")
    bd = _bench_defaults()
    b.add_argument("--max-new-tokens", type=int, default=bd["max_new_tokens"])
    b.add_argument("--batch-size", type=int, default=bd["batch_size"])
    b.add_argument("--temperature", type=float, default=bd["temperature"])
    b.add_argument("--repeats", type=int, default=bd["repeats"])
    b.add_argument("--seed", type=int, default=bd["seed"])
    b.add_argument("--stop-at-eos", action="store_true", help="let EOS end a text (default: fixed length)")
    b.add_argument(
        "--lockstep",
        action="store_true",
        help="batch 1: decode the methods of the default format one step of each in turn, as the demo "
        "does (the machine's drift falls on all alike); peers and other formats run whole around them",
    )
    b.add_argument(
        "--oracle-depth",
        type=int,
        default=bd["oracle_depth"],
        help="oracle: the chain of `ar`'s own next tokens it drafts (the draft budget verifies what pays of it)",
    )
    add_options(b)  # each applies to the methods that have it; --tree-nodes also turns the draft budget off
    b.add_argument(
        "--first-turn",
        action="store_true",
        help="conversations: the first turn only (MT-bench without its second-turn prompts)",
    )
    b.add_argument(
        "--no-chat",
        action="store_true",
        help="question.jsonl turns as plain text (default: through the model's chat template)",
    )
    b.add_argument("--out", required=True, help="directory for results.json, results.md, *.png")


def cmd_generate(args: argparse.Namespace) -> None:
    import paradec

    methods.generation_config(**generation_options(args))  # bad options fail now, not after the load
    method = methods.get(args.method)
    model, given = model_and_companions(args, [method], method.loads)
    engine = paradec.load(**load_options(args, model, given), methods_used=(args.method,))
    kwargs = dict(generation_options(args), chat=args.chat)
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

    methods.generation_config(**generation_options(args))  # bad options fail now, not after the load
    if args.system is not None:
        try:
            args.system.encode("utf-8")
        except UnicodeEncodeError:
            raise ParadecError("--system is not valid UTF-8 text; pass UTF-8") from None
    method = methods.get(args.method)
    model, given = model_and_companions(args, [method], method.loads)
    engine = paradec.load(**load_options(args, model, given), methods_used=(args.method,))
    print(f"paradec chat ({Path(str(model)).name}, method {args.method}); /exit quits, /reset forgets", file=sys.stderr)
    # undecodable bytes reach the tokenizer's UTF-8 check (one line, the chat goes on), not a traceback
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape")
    chat_loop(engine, generation_options(args), args.system, stdin=stdin)


def cmd_convert(args: argparse.Namespace) -> None:
    from paradec.models.gguf import convert_gguf

    out = Path(args.out)
    writable_dir(out, "OUT_DIR")  # a file in the way, or no permission: before the conversion, not after it
    if out.exists() and any(out.iterdir()):
        raise ParadecError(f"{out} exists and is not empty; pass a new directory")
    print(json.dumps({"out": str(convert_gguf(args.file, out))}))


def _bench_defaults() -> dict:
    import dataclasses

    from paradec.bench.harness import BenchConfig

    return {f.name: f.default for f in dataclasses.fields(BenchConfig) if f.default is not dataclasses.MISSING}


def _bench_methods() -> tuple[str, ...]:
    from paradec.bench.harness import bench_methods

    return bench_methods()


def cmd_bench(args: argparse.Namespace) -> None:
    from paradec.bench.harness import BenchConfig, method_needs, run_bench, write_outputs
    from paradec.bench.peers import split_method
    from paradec.zoo import aspd_twin

    names = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if not names:
        raise ParadecError("--methods is empty; pass a comma-separated list, e.g. --methods ar,pld")
    if args.per_category is not None and args.per_category < 1:
        raise ParadecError("--per-category must be >= 1")
    needs = set().union(*(method_needs(m) for m in names))
    registered = [methods.get(split_method(m)[0]) for m in names if split_method(m)[0] in methods.names()]
    model, given = model_and_companions(args, registered, needs, whole_pool=len(names) > 1)
    twin = args.twin
    if "aspd_model" in needs:
        twin = twin or aspd_twin(model)
    if args.limit is not None and args.limit < 1:
        raise ParadecError("--limit must be >= 1")
    writable_dir(Path(args.out), "--out")  # before the run, not after it
    options = given_options(args)
    cfg = BenchConfig(
        model=str(model),
        methods=names,
        twin=str(twin) if twin else None,
        prompts=args.prompts,
        out=args.out,
        companions={k: tuple(map(str, v)) if isinstance(v, list) else str(v) for k, v in given.items() if v},
        options=options,
        limit=args.limit,
        per_category=args.per_category,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        temperature=args.temperature,
        repeats=args.repeats,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
        stop_at_eos=args.stop_at_eos,
        oracle_depth=args.oracle_depth,
        chat=not args.no_chat,
        first_turn=args.first_turn,
        exact=not args.no_exact,
        full_trees="tree_nodes" in options,  # compare drafters at one tree size: the budget cuts nothing
        quant=args.quant,
        quant_head=args.quant_head,
        threads=args.threads,
        lockstep=args.lockstep,
    )
    result = run_bench(cfg)
    print(write_outputs(result, args.out))


def cmd_aspd(args: argparse.Namespace) -> None:
    from paradec.parallel.pipeline import extract_file, make_judge

    judge = make_judge(args.judge_url, args.judge_model) if args.judge_url else None
    count = None
    if args.tokenizer:
        from pathlib import Path

        from paradec.tokenizer import load_tokenizer

        hf = load_tokenizer(Path(args.tokenizer), ()).hf
        count = lambda s: len(hf(s, add_special_tokens=False).input_ids)  # noqa: E731
    print(json.dumps(extract_file(args.input, args.output, judge, count)))


def cmd_doctor(args: argparse.Namespace) -> None:
    from paradec.doctor import doctor

    print(doctor(args.model, remeasure=args.remeasure, as_json=args.json))


def cmd_demo(args: argparse.Namespace) -> None:
    from paradec.demo import run_demo

    if args.max_new_tokens < 1:
        raise ParadecError("--max-new-tokens must be >= 1")
    run_demo(args.max_new_tokens, args.dtype, args.model, args.aspd, quant=args.quant)


COMMANDS = {
    "generate": cmd_generate,
    "chat": cmd_chat,
    "convert": cmd_convert,
    "train": cmd_train,
    "demo": cmd_demo,
    "doctor": cmd_doctor,
    "serve": cmd_serve,
    "bench-serve": cmd_bench_serve,
    "bench": cmd_bench,
    "aspd": cmd_aspd,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except ParadecError as exc:
        print(f"paradec: error: {flag_message(str(exc), parser)}", file=sys.stderr)
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
