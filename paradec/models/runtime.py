"""Which runtime runs the target: the checks and the measured choice behind ``load(backend=...)``.

llama.cpp's kernels (``models.llamacpp``) run a GGUF file as it is, `ar` only; paradec's torch
runtime runs every method. ``load`` asks ``llamacpp_runs`` (does llama.cpp's build run on this
CPU without killing the process), ``check_llamacpp`` (was backend=llamacpp asked for something
only torch runs) and ``llamacpp_choice`` (do llama.cpp's measured passes beat torch's).
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import torch

from paradec.cpu import FormatChoice, ParadecWarning
from paradec.errors import ParadecError
from paradec.models.gguf import is_gguf, paradec_home
from paradec.models.llamacpp import LlamaCppModel, crashes, llamacpp_cost

# `auto` runs on llama.cpp's kernels (as `ar`) when their `ar` step is this many times cheaper than
# torch's: the most auto's drafters gained over `ar` in benchmarks/README.md is below it
AUTO_MARGIN = 2.0


def llamacpp_runs(source: Path, asked: str, threads: int | None) -> bool:
    """Whether llama.cpp's kernels run on this CPU without killing the process (``llamacpp.crashes``);
    if not: backend=llamacpp is an error with the fix, auto a warning and torch."""
    crash = crashes(source, threads or torch.get_num_threads(), paradec_home())
    if crash is not None and asked == "llamacpp":
        raise ParadecError(crash)
    if crash is not None:
        warnings.warn(ParadecWarning(f"{crash}; running on torch"), stacklevel=3)
    return crash is None


def check_llamacpp(source: Path, torch_only: list[str]) -> None:
    """backend=llamacpp asked for: a GGUF file, and nothing only torch runs."""
    if not is_gguf(source):
        raise ParadecError("the llamacpp backend runs a GGUF file; pass model=FILE.gguf, or backend=torch")
    if torch_only:
        raise ParadecError(
            f"the llamacpp backend cannot take {', '.join(torch_only)} (llama.cpp runs the GGUF's own "
            "format on the CPU, `ar` only, with no drafts or heads); drop them or use backend=torch"
        )


def llamacpp_choice(lc: LlamaCppModel, choice: FormatChoice, asked: str, margin: float = 1.0) -> FormatChoice | None:
    """llama.cpp's format record, its measured curve and why it runs; None: auto, and torch's
    best format is faster on this CPU (``margin``: by more than this factor, its drafters' room)."""
    lc_cost, lc_path, _ = llamacpp_cost(lc, paradec_home())
    if asked == "auto" and not lc_cost.predict(1) * margin < choice.cost.predict(1):
        return None
    reason = "asked for (backend=llamacpp)"
    if asked == "auto":
        ms = lc_cost.predict(1) * 1e3, choice.cost.predict(1) * 1e3
        than = f"{margin:g}x less than" if margin != 1.0 else "<"
        reason = f"auto: llama.cpp's `ar` step {ms[0]:.0f} ms {than} torch {choice.name}'s {ms[1]:.0f} ms on this CPU"
    against = choice.cost if asked == "auto" else None
    return replace(
        choice, name="gguf", quant="gguf", cost=lc_cost, reason=reason, profile_path=lc_path, against=against
    )
