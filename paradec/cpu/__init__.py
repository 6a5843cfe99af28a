"""The CPU this process runs on, and what a target pass costs on it: measured, never assumed.

CPUs differ more than any constant can follow. On an AVX-512 BF16 core a bf16 pass of 8-16
tokens costs about one token; on an AVX2 core without native bf16, 8 rows cost 5-9x one row in
bf16, the int8/int4 kernels are fastest and fp32 scales best with the width. So at first load
``profile`` times one decoder layer of the model's own shapes (attention over a real cache,
MLP, norms), the LM head and the per-pass set-up, in each candidate weight format, at verified
widths 1..32, and keeps the result per CPU signature and model shape under
``$PARADEC_HOME/profiles``:

    pass(format, w) = setup(w) + layers * layer(format, w) + head(format, w)

``choose`` takes the format with the cheapest `ar` step among those the weights allow (a file
quantized to 4 bits may run on the int4 kernel, one of 8 bits on int8; every model may run in
bf16 or fp32). Every policy that sizes a draft (the batch/tree budget, ProPD's cost model,
EAGLE's verified nodes) starts from the chosen format's ``PassCost`` curve, and refines its
scale online. ``paradec doctor`` prints all of it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from paradec.config import ModelConfig
from paradec.cpu.formats import FORMATS, format_name, format_parts, source_formats  # noqa: F401 (re-exported)
from paradec.cpu.info import ISA_FLAGS, CpuInfo, cpu_info  # noqa: F401 (ISA_FLAGS: re-exported)
from paradec.cpu.timing import BUSY_CORES, OthersWatch, _curve, _PassTimer, _write_json

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
}
SLOWER_WARNING = 1.3  # an explicit format whose `ar` step costs this much more than the best one is warned about
WIDTHS = (1, 2, 4, 8, 16, 32)  # verified nodes per row of a pass (others are interpolated)
PROFILE_VERSION = 6  # part of the cache key: bump when what is measured changes (6: the decode path, C linears)


@dataclass(frozen=True)
class PassCost:
    """Seconds of one target pass (batch 1) by verified width, for one weight format.

    ``predict(positions)`` interpolates between measured widths (a batched pass of b rows x w
    nodes counts as b * w positions) and extends the last segment's slope beyond them."""

    format: str
    widths: tuple[int, ...]
    seconds: tuple[float, ...]  # [len(widths)]
    # measured on this machine, so real passes may correct its shape (``CurveLatency``); a curve
    # given by hand (tests, ``load(cost=)``) keeps its shape and only its scale is refit
    measured: bool = False

    def predict(self, positions: float) -> float:
        ws, ss = self.widths, self.seconds
        if positions <= ws[0]:
            return ss[0]
        for (w0, s0), (w1, s1) in zip(zip(ws, ss), zip(ws[1:], ss[1:])):
            if positions <= w1:
                return s0 + (s1 - s0) * (positions - w0) / (w1 - w0)
        slope = max((ss[-1] - ss[-2]) / (ws[-1] - ws[-2]), 0.0) if len(ws) > 1 else 0.0
        return ss[-1] + slope * (positions - ws[-1])

    def relative(self, positions: float) -> float:
        """A pass of ``positions`` in units of an `ar` step."""
        return self.predict(positions) / self.predict(1)

    @staticmethod
    def flat(seconds: float = 0.01) -> PassCost:
        """Every width costs the same (a fixed curve for tests: verified nodes always pay; drafting
        still pays only for its measured time, unless the engine has no budget)."""
        return PassCost("flat", (1,), (seconds,))


NEAR = 1.1  # formats whose full-batch steps are this close are ranked by one row's (``Profile.choose``)


@dataclass(frozen=True)
class Profile:
    cpu: CpuInfo
    shape: str  # the model shape measured, e.g. "L30 d576 ff1536 h9/3x64 v49152"
    costs: dict[str, PassCost]  # format -> its curve
    measured_s: float  # how long measuring took
    noisy: bool = False  # measured while other processes competed for the cores (then not cached)

    def choose(self, allowed: tuple[str, ...], batch: int = 1) -> str:
        """The allowed format with the cheapest `ar` step of ``batch`` rows (ties: the cheaper pass
        of 4 positions a row). Over ``batch`` > 1 rows, the formats within ``NEAR`` of the cheapest
        there are one class, and the one cheapest for one row wins: a one-layer profile does not
        rank them (AVX2 EPYC, 16 rows: int4 and int8 priced alike, the whole model's passes
        55 vs 59 ms), and a server runs below its full batch whenever its load does."""
        have = [f for f in allowed if f in self.costs]
        cost = {f: self.costs[f].predict(batch) for f in have}
        if batch > 1:
            near = [f for f in have if cost[f] <= NEAR * min(cost.values())]
            return min(near, key=lambda f: (round(self.costs[f].predict(1), 4), cost[f]))
        return min(have, key=lambda f: (round(cost[f], 4), self.costs[f].predict(4)))

    def table(self) -> list[dict]:
        """Rows for a Markdown table: format, then ms per pass at each width."""
        return [
            {"format": f, **{f"w={w}": round(s * 1000, 1) for w, s in zip(c.widths, c.seconds)}}
            for f, c in self.costs.items()
        ]


def shape_of(cfg: ModelConfig) -> str:
    return (
        f"L{cfg.num_layers} d{cfg.hidden_size} ff{cfg.intermediate_size} h{cfg.num_heads}/{cfg.num_kv_heads}"
        f"x{cfg.head_dim} v{cfg.vocab_size}{' qkvb' if cfg.qkv_bias else ''}"
    )


def profile_path(home: Path, cpu: CpuInfo, cfg: ModelConfig, exact: bool) -> Path:
    from paradec.models.native import signature  # the decode path in C (which build), or torch's: other curves

    key = f"{shape_of(cfg)} exact={exact} native={signature() if exact else False} v{PROFILE_VERSION}"
    return home / "profiles" / f"{cpu.key()}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"


def profile(
    cfg: ModelConfig,
    formats: tuple[str, ...],
    home: Path,
    exact: bool = True,
    remeasure: bool = False,
    widths: tuple[int, ...] = WIDTHS,
) -> tuple[Profile, Path]:
    """The pass-cost curves of ``formats`` for a model of ``cfg``'s shape on this CPU: read from
    the cache, measuring (and adding) the formats it lacks. -> (profile, its cache file)."""
    cpu = cpu_info()
    path = profile_path(home, cpu, cfg, exact)
    costs: dict[str, PassCost] = {}
    measured_s = 0.0
    if path.is_file() and not remeasure:
        try:
            raw = json.loads(path.read_text())
            costs = {f: PassCost(f, tuple(c["widths"]), tuple(c["seconds"]), True) for f, c in raw["costs"].items()}
            measured_s = float(raw.get("measured_s", 0.0))
        except (ValueError, KeyError, TypeError):  # a damaged cache file is measured again
            costs = {}
    missing = [f for f in formats if f not in costs]
    others = 0.0
    if missing:
        t0 = time.perf_counter()
        fresh, others = measure(cfg, tuple(missing), exact, widths)
        costs.update(fresh)
        measured_s += time.perf_counter() - t0
        if others <= BUSY_CORES:  # a profile taken while other processes held the cores is not kept
            _write_json(
                path,
                {
                    "cpu": asdict(cpu),
                    "shape": shape_of(cfg),
                    "exact": exact,
                    "measured_s": measured_s,
                    "costs": {f: {"widths": list(c.widths), "seconds": list(c.seconds)} for f, c in costs.items()},
                },
            )
    return Profile(cpu, shape_of(cfg), costs, measured_s, others > BUSY_CORES), path


def measure(
    cfg: ModelConfig, formats: tuple[str, ...], exact: bool = True, widths: tuple[int, ...] = WIDTHS, reps: int = 3
) -> tuple[dict[str, PassCost], float]:
    """Time one pass per width and format on random weights of ``cfg``'s shapes: ``reps`` rounds
    over every (format, width), interleaved so a burst of other load hits all of them; the level
    is the 1-token pass's fastest, the shape each round's ratios (``_curve``). -> (curves, the
    share of the CPU this process got while measuring: ~1 on a quiet machine; well under 1 when
    other processes competed)."""
    from paradec.models.llama import Transformer
    from paradec.models.quant import pack_linears, quantize_linears

    one = replace(cfg, num_layers=1, tie_word_embeddings=False)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        base = Transformer(one)
        for p in base.parameters():
            p.normal_(0, 0.02, generator=g)
        cases = {}
        for fmt in formats:
            dtype_name, quant = format_parts(fmt)
            model = Transformer(one).to(DTYPES[dtype_name])
            model.load_state_dict(base.state_dict())
            model.set_exact(exact)
            quantize_linears(model, quant)
            pack_linears(model)
            for w in widths:
                cases[fmt, w] = _PassTimer(model, cfg.num_layers, w)
        watch = OthersWatch()
        for _ in range(reps + 1):  # the first round warms the kernels up
            for timer in cases.values():
                timer.run()
        others = watch.share()
    out = {}
    for fmt in formats:  # each timer's first run warmed the kernels up
        runs = [cases[fmt, w].runs[1:] for w in widths]
        out[fmt] = PassCost(fmt, tuple(widths), _curve(runs, cases[fmt, widths[0]].seconds), True)
    return out, others


@dataclass(frozen=True)
class FormatChoice:
    """The weight format a model runs in, and why."""

    name: str  # "int4", "bf16", ...
    dtype: torch.dtype  # of activations (and of weights, unquantized)
    quant: str  # the decoder linears': none, int8, int4
    cost: PassCost | None  # its measured pass-cost curve (None off the CPU)
    reason: str  # one line
    allowed: tuple[str, ...] = ()  # the formats the weights allowed "auto" to choose from
    profile: Profile | None = None
    profile_path: Path | None = None
    against: PassCost | None = None  # llama.cpp chosen by auto: the torch curve it was weighed against


class ParadecWarning(UserWarning):
    """A choice that works but costs: the message names the measured cost and the fix."""


def choose_format(
    model_dir: Path,
    dtype: str | torch.dtype,
    quant: str,
    device: str,
    exact: bool = True,
    home: Path | None = None,
    batch: int = 1,
) -> FormatChoice:
    """Resolve ``dtype`` / ``quant`` ("auto" or explicit) for ``model_dir`` on ``device``; "auto"
    takes the cheapest `ar` step of ``batch`` rows (a server: its --max-batch)."""
    import warnings

    from paradec.models.gguf import paradec_home

    if isinstance(dtype, torch.dtype):
        dtype = next(k for k, v in DTYPES.items() if v == dtype)
    dtype = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(dtype, dtype)
    if not device.startswith("cpu"):
        d = "bf16" if dtype == "auto" else dtype
        q = "none" if quant == "auto" else quant
        return FormatChoice(format_name(d, q), DTYPES[d], q, None, f"{device}: not measured (CPU only)")
    allowed = source_formats(model_dir)
    if dtype == "auto" and quant in ("auto", "none"):
        pool = allowed if quant == "auto" else tuple(f for f in allowed if format_parts(f)[1] == "none")
        asked = None
    else:
        d = dtype if dtype != "auto" else "bf16"  # the packed kernels' fast activations
        asked = format_name(d, "none" if quant == "auto" else quant)
        pool = allowed
    cfg = _model_config(model_dir)
    home = home or paradec_home()
    standard = tuple(dict.fromkeys(pool + ((asked,) if asked in FORMATS else ())))
    prof, path = profile(cfg, standard, home, exact)
    if asked is not None and asked not in prof.costs:  # "int4-fp32" and the like: w = 1 and 4 only
        extra, path = profile(cfg, (asked,), home, exact, widths=(1, 4))
        prof = replace(prof, costs={**prof.costs, **extra.costs}, noisy=prof.noisy or extra.noisy)
    best = prof.choose(pool, batch)
    ms = {f: c.predict(batch) * 1000 for f, c in prof.costs.items()}
    if asked is None:
        name = best
        others = ", ".join(f"{f} {ms[f]:.0f}" for f in pool if f != best)
        rows = "" if batch == 1 else f" of {batch} rows"
        reason = f"auto: the cheapest `ar` step{rows} here ({best} {ms[best]:.0f} ms; {others} ms)"
    else:
        name = asked
        reason = "asked for"
        if ms[asked] > SLOWER_WARNING * ms[best]:
            warnings.warn(
                ParadecWarning(
                    f"{asked} costs {ms[asked] / ms[best]:.1f}x {best}'s `ar` step on this CPU ({ms[asked]:.0f} vs "
                    f"{ms[best]:.0f} ms, measured; `paradec doctor` shows all); leave dtype/quant at auto to run {best}"
                ),
                stacklevel=3,
            )
    d, q = format_parts(name)
    return FormatChoice(name, DTYPES[d], q, prof.costs[name], reason, allowed, prof, path)


def _model_config(model_dir: Path) -> ModelConfig:
    """The model's shape (an adapter's: its base's)."""
    from paradec.errors import ParadecError
    from paradec.models.adapter import is_adapter, read_adapter

    if not Path(model_dir).is_dir():
        raise ParadecError(
            f"model directory {str(model_dir)!r} does not exist; pass model=PATH "
            "to a Hugging Face-format directory (config.json + *.safetensors)"
        )
    if is_adapter(model_dir):
        from paradec.models.gguf import resolve_model

        return ModelConfig.from_dir(resolve_model(read_adapter(model_dir)[1]))
    return ModelConfig.from_dir(model_dir)
