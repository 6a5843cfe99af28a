"""How a pass is timed on this machine (``paradec.cpu``'s profile, ``cpu.whole``'s whole-model
curve, ``cpu.prefill``'s prompt kernels): each case run in interleaved rounds, a curve's shape from
each round's ratios (``_curve``), and the share of the cores other processes took meanwhile
(``OthersWatch``): a measurement taken beside other work is used but not cached (``BUSY_CORES``)."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

BUSY_CORES = 0.5  # a profile is cached only if other processes used at most this many cores meanwhile
CONTEXT = 256  # keys a measured pass attends over


def _write_json(path: Path, obj: dict) -> None:
    """Write atomically (a temporary file renamed): a reader never sees half a profile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _curve(runs: list[list[float]], fastest: float) -> tuple[float, ...]:
    """One runtime's seconds by width: ``runs[i]``, width i's pass in each round after the warm-up;
    ``fastest``, the narrowest pass's best time. The shape is each width's median ratio to the
    narrowest pass of the same round. The CPU's speed drifts while it is measured (its clock, other
    tenants: a 1-token pass went 34 -> 21 ms over three back-to-back measurements here), and
    taking each width's own minimum mixed rounds, which flattened a curve that rises 26 % from
    1 to 4 tokens into a flat one."""
    ratios = [statistics.median(t / f for t, f in zip(r, runs[0])) for r in runs]
    return tuple(fastest * r for r in _monotone(ratios))


class OthersWatch:
    """How many cores the rest of the machine kept busy while this process measured, from
    ``/proc/stat``: a measurement taken beside other work is not cached (``BUSY_CORES``)."""

    def __init__(self) -> None:
        self.wall, self.mine, self.busy = time.perf_counter(), time.process_time(), _busy_seconds()

    def share(self) -> float:
        """CPU seconds the other processes spent, per second since this watch began (0: unknown)."""
        if self.busy is None:
            return 0.0
        others = max(0.0, (_busy_seconds() - self.busy) - (time.process_time() - self.mine))
        return others / max(1e-9, time.perf_counter() - self.wall)


def chain_inputs(model, width: int) -> tuple:
    """What a measured pass of a ``width``-token chain after CONTEXT cached tokens feeds ``model``:
    (a cache of random keys and values, tokens [1, width], positions [1, width], mask [1, 1, width,
    CONTEXT + width] or None for one token: each token sees the prefix, itself and those before it)."""
    cache = model.new_cache(1, CONTEXT + width)
    cache.keys.normal_()
    cache.values.normal_()
    cache.advance(0, CONTEXT)
    mask = None
    if width > 1:
        mask = torch.ones(1, 1, width, CONTEXT + width, dtype=torch.bool)
        mask[0, 0, :, CONTEXT:] = torch.ones(width, width, dtype=torch.bool).tril()
    tokens = torch.arange(width)[None] % model.config.vocab_size
    return cache, tokens, torch.arange(CONTEXT, CONTEXT + width)[None], mask


def _busy_seconds() -> float | None:
    """CPU seconds every process on the machine has run so far (Linux's /proc/stat), else None."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        ticks = [int(x) for x in fields]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class _PassTimer:
    """setup + ``layers`` x one block + the head, each part the fastest of the runs so far. The
    block runs as a decode pass does (``Transformer.decode``: the decode plan, in C where
    ``models.native`` builds)."""

    def __init__(self, model, layers: int, width: int) -> None:
        self.model, self.layers, self.width = model, layers, width
        self.cache, self.tokens, self.positions, self.mask = chain_inputs(model, width)
        self.best = [float("inf")] * 3
        self.runs: list[float] = []  # seconds of each whole (estimated) pass, one per round

    def run(self) -> None:
        m = self.model
        t0 = time.perf_counter()
        x = m.embed(self.tokens)
        cos, sin = m.rope(self.positions, x.dtype)
        mask = m.decode_mask(self.mask)  # built once a pass
        t1 = time.perf_counter()
        h = m.decode(x, cos, sin, mask, self.cache)
        t2 = time.perf_counter()
        m.normed_logits(h)
        t3 = time.perf_counter()
        self.best = [min(b, t) for b, t in zip(self.best, (t1 - t0, t2 - t1, t3 - t2))]
        self.runs.append(t1 - t0 + self.layers * (t2 - t1) + t3 - t2)

    @property
    def seconds(self) -> float:
        return self.best[0] + self.layers * self.best[1] + self.best[2]


def _monotone(seconds: list[float]) -> list[float]:
    """A wider pass never costs less than a narrower one (a dip is noise)."""
    out, top = [], 0.0
    for s in seconds:
        top = max(top, s)
        out.append(top)
    return out
