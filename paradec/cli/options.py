"""The generation flags of ``paradec generate``, ``chat``, ``serve`` and ``bench``: sampling, and
every registered method's options, generated from their records (``paradec.options``)."""

from __future__ import annotations

import argparse

from paradec import methods
from paradec.config import GenerationConfig, SamplingConfig


def add_sampling(p: argparse.ArgumentParser) -> None:
    gen, sampling = GenerationConfig(), SamplingConfig()  # defaults come from the config records
    p.add_argument("--max-new-tokens", type=int, default=gen.max_new_tokens)
    p.add_argument("--temperature", type=float, default=sampling.temperature, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=sampling.top_p)
    p.add_argument("--top-k", type=int, default=sampling.top_k)
    p.add_argument("--seed", type=int, default=sampling.seed)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep going past EOS (benchmarks)")
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="trees sized from this call's statistics, never from measured time, so --seed fixes sampled "
        "text (medusa, propd, eagle, auto; propd then prunes every pass)",
    )


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_options(p: argparse.ArgumentParser) -> None:
    """A flag per option of the registered methods (and acceptance's). Only flags given on the
    command line reach the engine, so a method's presets (medusa-63's tree size, specinfer+ngram's
    lookup) hold unless a flag overrides them; --help shows each record's default."""
    for o in methods.option_table().values():
        quiet = dict(default=argparse.SUPPRESS, dest=o.name)
        if o.switch:
            p.add_argument(o.flag, action="store_true" if o.sets else "store_false", **quiet, help=o.help)
            continue
        parse = int_list if o.type == "tuple[int, ...]" else {"float": float, "str": str}.get(o.type, int)
        shown = ",".join(map(str, o.default)) if isinstance(o.default, tuple) else o.default
        default = "" if o.default is None else f" (default {shown})"
        p.add_argument(o.flag, type=parse, choices=o.choices, **quiet, help=o.help + default)


def given_options(args: argparse.Namespace) -> dict:
    """The method options given on the command line (and only those)."""
    return {name: getattr(args, name) for name in methods.option_table() if hasattr(args, name)}


def off_switches() -> dict[str, str]:
    """``prune=False`` (as an error spells it) -> ``--no-prune``: the switches that turn an option off."""
    return {f"{o.name}=False": o.flag for o in methods.option_table().values() if o.switch and not o.sets}


def method_help() -> str:
    return "; ".join(f"{m.name}: {m.summary}" for m in methods.methods()) + f" (default: {methods.DEFAULT})"


def generation_options(args: argparse.Namespace) -> dict:
    return dict(
        method=args.method,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
        deterministic=args.deterministic,
        **given_options(args),
    )
