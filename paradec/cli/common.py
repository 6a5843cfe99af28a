"""What every ``paradec`` subcommand shares: the one-line error parser and output checks."""

from __future__ import annotations

import argparse
import re
import os
from pathlib import Path

from paradec.errors import ParadecError


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
PARAMETER_FLAGS = {"drafts": "--draft", "prune=False": "--no-prune", "dynamic=False": "--static-tree",
                   "exact=False": "--no-exact"}


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
