"""The chosen format's pass-cost curve, measured again on the whole loaded model.

``profile`` times one decoder layer and multiplies it by the layer count: cheap enough to try
every format at first load, and right about which format has the cheapest `ar` step. But one
layer's weights stay in the CPU's caches from pass to pass, and a real pass streams every
layer's weights from memory, so the one-layer curve is flatter than the model's. On the AMX Xeon
(SmolLM2, int4) it priced 2 / 4 / 8 verified tokens at 1.00 / 1.13 / 1.56 `ar` steps; the loaded
model's passes cost 1.18 / 1.36 / 2.10. Every draft policy sized its trees on the flatter curve,
so the drafters verified tokens that did not pay for themselves.

So once the format is chosen and the model loaded, ``whole_curve`` times the model's own passes
at the same widths (rounds interleaved over the widths, the shape from each round's ratios as in
``paradec.cpu.timing._curve``), ~5 s, and caches the curve beside the profile per CPU, model shape and
what else decides the passes' cost (the LM head's format, packing, the exact numerics). The
choice between runtimes (llama.cpp's `ar` or torch's) compares this curve with llama.cpp's, both
whole passes: the one-layer level had put torch's `ar` step at 34 ms where its passes take 19.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from paradec.cpu import WIDTHS, PassCost
from paradec.cpu.timing import BUSY_CORES, OthersWatch, _curve, _write_json, chain_inputs
from paradec.models.native import signature

WHOLE_VERSION = 3  # part of the cache key: bump when what is measured changes (2: the decode plan; 3: C linears)


def whole_curve(model, key: str, profile_path: Path | None, reps: int = 3) -> PassCost:
    """``model``'s measured pass cost by verified width (read from beside ``profile_path`` when
    cached there under ``key``, ``whole_key``'s; None: measured, not cached)."""
    fmt = key.split()[0]
    cached = cached_curve(key, profile_path)
    if cached is not None:
        return cached
    watch = OthersWatch()
    runs = _runs(model, WIDTHS, reps)
    cost = PassCost(fmt, WIDTHS, _curve(runs, min(runs[0])), True)
    if profile_path is not None and watch.share() <= BUSY_CORES:  # not kept when measured beside other work
        path = _cache_path(key, profile_path)
        _write_json(path, {"key": key, "widths": list(cost.widths), "seconds": list(cost.seconds)})
    return cost


def whole_key(fmt: str, quant_head: str | None, pack: bool, exact: bool) -> str:
    """What decides a loaded model's pass cost besides the CPU and the shape (the profile's key):
    the format, the head's, packing, the exact numerics and which C path runs the pass."""
    native = signature() if exact else False
    return f"{fmt} head={quant_head} pack={pack} exact={exact} native={native} v{WHOLE_VERSION}"


def cached_curve(key: str, profile_path: Path | None) -> PassCost | None:
    """The curve cached under ``key`` beside ``profile_path``, else None."""
    path = None if profile_path is None else _cache_path(key, profile_path)
    if path is None or not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        return PassCost(key.split()[0], tuple(raw["widths"]), tuple(raw["seconds"]), True)
    except (ValueError, KeyError, TypeError):  # a damaged cache file is measured again
        return None


def _cache_path(key: str, profile_path: Path) -> Path:
    """Beside the format profile (this CPU and model shape: its name), by ``key``."""
    return profile_path.with_name(f"{profile_path.stem}-whole-{hashlib.sha256(key.encode()).hexdigest()[:8]}.json")


def _runs(model, widths: tuple[int, ...], reps: int) -> list[list[float]]:
    """[width][round] seconds of one whole pass (embedding to logits) of ``width`` tree tokens
    after a CONTEXT-token prefix of random keys and values; the first round warms up and is dropped."""
    cases = [chain_inputs(model, w) for w in widths]
    runs: list[list[float]] = [[] for _ in widths]
    with torch.inference_mode():
        for _ in range(reps + 1):
            for times, (cache, tokens, positions, mask) in zip(runs, cases):
                t = time.perf_counter()
                model.normed_logits(model.hidden(tokens, positions, mask, cache))
                times.append(time.perf_counter() - t)
    return [times[1:] for times in runs]
