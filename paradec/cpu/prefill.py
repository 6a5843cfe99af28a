"""Whether a quantized model's prompt passes run through dense weights on this CPU, and which.

The packed int4/int8 kernels (``models.quant``) are built for the few rows of a decode step; a
prompt is hundreds of rows. One decoder layer's linears of SmolLM2 at 128 rows (the shapes
measured here, random weights):

| CPU | int4 kernel | packed bf16 | fp32 |
|---|---|---|---|
| AMX Xeon | 6.9 ms | 0.64 ms | |
| the same, capped to AVX2 | 19.7 ms | (not packed) | 7.9 ms |

So at load a quantized model times its own layer shapes at ``ROWS`` rows through the quantized
kernel and each dense candidate (packed bf16 where oneDNN packs bf16, fp32 everywhere), and
gives its layers the fastest candidate that is ``MARGIN`` times faster than the kernel and whose
copy of the weights takes at most ``MEMORY_SHARE`` of the machine's memory. The verdict is cached
beside the format profile (per CPU and model shape), so a machine's prefill numerics, and so
its texts, do not change from run to run with the timing noise.

Unlike the quantized kernels, the dense products give a row bits that depend on how many rows
the pass has (both candidates, on both CPU kinds above), so a model with a dense prompt path
prefills each prompt in passes of its own (``Scheduler._prefill``, ASPD's decoder): a prompt's K/V,
and so its text, never depend on what else was submitted with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch
from torch import nn

from paradec.cpu.timing import BUSY_CORES, OthersWatch, _write_json
from paradec.errors import ParadecError
from paradec.models.native import signature as native_signature

ROWS = 128  # prompt rows a candidate is timed at
MARGIN = 1.5  # a dense path is taken only this many times faster than the quantized kernel
MEMORY_SHARE = 0.25  # ... and only if its weights take at most this share of the machine's memory
PREFILL_VERSION = 2  # part of the cache key: bump when what is measured changes (2: C kernels)
BYTES = {"bf16": 2, "fp32": 4}
PREFILLS = ("auto", "kernel", "bf16", "fp32")  # what ``load(prefill=...)`` takes


def prefill_path(model: nn.Module, quant: str, profile_path: Path | None, asked: str = "auto") -> str | None:
    """The prompt path, "bf16", "fp32" or None (the quantized kernels), for ``model``'s decoder
    linears once quantized to ``quant`` (read from beside ``profile_path`` when cached there)."""
    if quant == "none" or asked == "kernel" or next(model.parameters()).device.type != "cpu":
        return None
    if asked != "auto":  # named: taken as it is, if this CPU can build it
        if not _builds(asked) or (asked == "bf16" and model.embed.weight.dtype != torch.bfloat16):
            raise ParadecError(
                f"prefill={asked} cannot run here (bf16 copies need bf16 activations and a CPU "
                "whose oneDNN packs bf16: AVX-512 BF16 or AMX); use prefill=fp32, kernel or auto"
            )
        return asked
    decoder = [m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    shapes = sorted({(m.in_features, m.out_features, m.bias is not None) for m in decoder})
    params = sum(m.weight.numel() for m in decoder)
    dtype = model.embed.weight.dtype  # of the activations: an fp32 model's prompts stay in fp32
    key = f"{quant} {dtype} {shapes} native={native_signature()} v{PREFILL_VERSION}"
    path = None if profile_path is None else _cache_path(key, profile_path)
    verdict = _read(path)
    if verdict is None:
        watch = OthersWatch()
        verdict = measure(shapes, quant, dtype)
        if path is not None and watch.share() <= BUSY_CORES:  # not kept when measured beside other work
            _write_json(path, {"key": key, **verdict})
    fits = [k for k in verdict["usable"] if params * BYTES[k] <= MEMORY_SHARE * _memory_bytes() and _builds(k)]
    return fits[0] if fits else None


def measure(
    shapes: list[tuple[int, int, bool]], quant: str, dtype: torch.dtype = torch.bfloat16, reps: int = 5
) -> dict:
    """Seconds of one set of ``shapes`` at ``ROWS`` rows of ``dtype`` activations per path
    (fastest of ``reps`` rounds, interleaved) and the dense paths that pay, fastest first (bf16
    weights for bf16 activations only)."""
    from paradec.models.quant import Int4Linear, Int8Linear, dense_linear

    g = torch.Generator().manual_seed(0)
    layers = {"kernel": [], "bf16": [] if dtype == torch.bfloat16 else None, "fp32": []}
    xs = []
    for i, o, bias in shapes:
        layer = nn.Linear(i, o, bias=bias)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        layer = layer.to(dtype)
        int4 = quant == "int4" and Int4Linear.fits(layer)
        q = Int4Linear.from_linear(layer) if int4 else Int8Linear.from_linear(layer)
        layers["kernel"].append(q.native_kernel() or q)  # the kernel a prompt would take without a dense path
        for kind in [k for k in ("bf16", "fp32") if layers[k] is not None]:
            try:
                layers[kind].append(dense_linear(q.dequantized(), layer.bias, kind))
            except RuntimeError:  # oneDNN packs bf16 only where the CPU has native bf16
                layers[kind] = None
        xs.append(torch.randn(ROWS, i, generator=g).to(dtype))
    kinds = [k for k, v in layers.items() if v is not None]
    seconds = {k: float("inf") for k in kinds}
    with torch.inference_mode():
        for _ in range(reps + 1):
            for k in kinds:
                t = time.perf_counter()
                for layer, x in zip(layers[k], xs):
                    layer(x)
                seconds[k] = min(seconds[k], time.perf_counter() - t)
    usable = [k for k in sorted(kinds, key=seconds.get) if k != "kernel" and seconds[k] * MARGIN <= seconds["kernel"]]
    return {"seconds": seconds, "usable": usable}


def _builds(kind: str) -> bool:
    """Whether this process can build ``kind``'s layers (a verdict cached under another ISA cap,
    or by another torch build, may name packed bf16 where oneDNN cannot pack it now)."""
    from paradec.models.quant import dense_linear

    try:
        dense_linear(torch.zeros(16, 32), None, kind)
    except RuntimeError:
        return False
    return True


def describe(quant: str, profile_path: Path | None) -> str | None:
    """One line for ``paradec doctor``: the prompt path cached beside ``profile_path`` and why
    (None: not measured yet)."""
    found = [] if profile_path is None else sorted(profile_path.parent.glob(f"{profile_path.stem}-prefill-*.json"))
    for path in found:
        verdict, key = _read(path), json.loads(path.read_text()).get("key", "")
        current = key.endswith(f" native={native_signature()} v{PREFILL_VERSION}")  # not a stale verdict
        if verdict is None or not key.startswith(f"{quant} ") or not current:
            continue
        ms = {k: f"{v * 1e3:.2f} ms" for k, v in verdict["seconds"].items()}
        timed = ", ".join(f"{k} {v}" for k, v in ms.items())
        took = f"dense {verdict['usable'][0]} weights" if verdict["usable"] else f"the {quant} kernels"
        return f"{took} (one layer's linears at {ROWS} rows: {timed}; {path})"
    return None if quant != "none" else "the decode weights (nothing quantized)"


def _read(path: Path | None) -> dict | None:
    if path is None or not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        return {"seconds": dict(raw["seconds"]), "usable": [k for k in raw["usable"] if k in BYTES]}
    except (ValueError, KeyError, TypeError):  # a damaged cache file is measured again
        return None


def _cache_path(key: str, profile_path: Path) -> Path:
    """Beside the format profile (this CPU and model shape: its name), by ``key``."""
    return profile_path.with_name(f"{profile_path.stem}-prefill-{hashlib.sha256(key.encode()).hexdigest()[:8]}.json")


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: assume room for the copy
        return 1 << 62
