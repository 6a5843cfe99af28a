"""``paradec doctor``: what this CPU is, which weight format paradec runs a model in here and
why, and what a target pass of each width costs (the curve every draft policy starts from)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import torch

from paradec.bench.report import markdown_table
from paradec.cpu import WIDTHS, _model_config, choose_format, cpu_info, profile, source_formats
from paradec.cpu.prefill import describe
from paradec.models.gguf import paradec_home, resolve_model


def doctor(model: str | Path | None = None, remeasure: bool = False, as_json: bool = False) -> str:
    from paradec.zoo import default_gguf

    model = model if model is not None else default_gguf()
    model_dir = resolve_model(model)
    cpu = cpu_info()
    allowed = source_formats(model_dir)
    if remeasure:  # measured again and cached; choose_format then reads it
        profile(_model_config(model_dir), allowed, paradec_home(), remeasure=True)
    choice = choose_format(model_dir, "auto", "auto", "cpu")
    prof, path = choice.profile, choice.profile_path
    if remeasure:
        for old in [*path.parent.glob(f"{path.stem}-whole-*.json"), *path.parent.glob(f"{path.stem}-prefill-*.json")]:
            old.unlink()
    cost = _whole(model, choice)
    backend, lc = _backend(model, model_dir, cost, remeasure)
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    report = {
        "cpu": asdict(cpu),
        "kind": cpu.kind,
        "blas": blas.group(1) if blas else "unknown",
        "model": Path(str(model)).name,
        "shape": prof.shape,
        "allowed": list(allowed),
        "chosen": choice.name,
        "reason": choice.reason,
        "profile": str(path),
        "measured_s": round(prof.measured_s, 1),
        "noisy": prof.noisy,
        "backend": backend,
        "prompts": _prompts(model, choice),  # the weights prompt passes take (``cpu.prefill``)
        "decode_ops": _decode_ops(),  # who runs a decode pass's small ops (``models.native``)
        "whole_model_ms_per_pass": {w: round(cost.predict(w) * 1000, 2) for w in WIDTHS},
        "ms_per_pass": {
            f: {w: round(c.predict(w) * 1000, 2) for w in WIDTHS}
            for f, c in {**prof.costs, **({"llamacpp": lc} if lc else {})}.items()
        },
    }
    if as_json:
        return json.dumps(report)
    table = prof.table() + (
        [{"format": "llamacpp", **{f"w={w}": round(s * 1000, 1) for w, s in zip(lc.widths, lc.seconds)}}] if lc else []
    )
    lines = [
        f"CPU       {cpu.kind}",
        f"          {cpu.cores} logical CPUs; flags: {' '.join(cpu.isa) or 'unknown'}; torch {cpu.torch}, BLAS "
        f"{report['blas']}",
        f"model     {report['model']} ({prof.shape}); its weights allow: {', '.join(allowed)}",
        f"format    {choice.name}: {choice.reason}",
        f"          a pass of 1 node takes {cost.predict(1) * 1e3:.1f} ms, of 2 / 4 / 8 / 16 nodes "
        f"{' / '.join(f'{cost.relative(w):.2f}' for w in (2, 4, 8, 16))} `ar` steps (the whole model's passes, "
        "measured once after load): the draft budget starts from this curve",
        f"profile   {path} (measured in {prof.measured_s:.1f} s; --remeasure to redo)"
        if not prof.noisy
        else "profile   not cached: other processes kept the cores busy while measuring; rerun on a quiet machine",
        f"prompts   {report['prompts']}",
        f"decode    {report['decode_ops']}",
        f"backend   {backend}",
        "",
        f"ms per target pass, by verified width (batch 1, {prof.shape}; one layer's time x layers + head, which "
        "chooses the format; llamacpp: the whole GGUF in llama.cpp):",
        markdown_table(table, list(table[0])),
    ]
    return "\n".join(lines)


def _whole(model, choice):
    """The chosen format's curve measured on the whole loaded model (``paradec.cpu.whole``): its
    cache as ``load`` keys it by default, else the model loaded and timed."""
    from paradec.cpu.whole import cached_curve, whole_key
    from paradec.engine import load

    cached = cached_curve(whole_key(choice.name, None, True, True), choice.profile_path)
    return cached or load(model, backend="torch", warmup=False, batch_budget=False).cost


def _decode_ops() -> str:
    """Who runs the norms, RoPE, KV writes, attention and residuals of a decode pass."""
    from paradec.models.native import library

    lib = library()
    if lib is None:
        return "torch's ops (no C compiler, no AVX2 + FMA, or PARADEC_NATIVE=0: the C small ops are off)"
    return f"in C: the small ops, and the int4/int8 linears ({lib._name}; PARADEC_NATIVE=0 turns them off)"


def _prompts(model, choice) -> str:
    """The prompt path ``load`` takes for the chosen format (``paradec.cpu.prefill``): its cached
    verdict, else the model loaded to measure it."""
    from paradec.engine import load

    found = describe(choice.quant, choice.profile_path)
    if found is None:
        load(model, backend="torch", warmup=False, batch_budget=False)
        found = (
            describe(choice.quant, choice.profile_path) or f"the {choice.quant} kernels (not cached: a busy machine)"
        )
    return found


def _backend(model, model_dir: Path, torch_cost, remeasure: bool):
    """(one line: the runtime ``load(backend="auto")`` takes for this model and why, llama.cpp's
    measured curve or None)."""
    from paradec.config import ModelConfig
    from paradec.models.gguf import is_gguf
    from paradec.models.llamacpp import INSTALL, LlamaCppModel, available, crashes, llamacpp_cost
    from paradec.models.runtime import EXACT_BUILD, PROBE_ROWS, batch_exactness

    if not is_gguf(model):
        return "torch (llama.cpp runs GGUF files; this model is a directory)", None
    if not available():
        return f"torch (llama-cpp-python is not installed; {INSTALL} adds llama.cpp's kernels)", None
    crash = crashes(model, torch.get_num_threads(), paradec_home())
    if crash is not None:
        return f"torch ({crash})", None
    lc = LlamaCppModel(model, ModelConfig.from_dir(model_dir), torch.get_num_threads())
    cost, _, _ = llamacpp_cost(lc, paradec_home(), remeasure)
    ms, torch_ms = cost.predict(1) * 1e3, torch_cost.predict(1) * 1e3
    pick = "llamacpp" if ms < torch_ms else "torch"
    chains, rows = batch_exactness(lc, paradec_home())
    drafting = (
        "this build verifies chains exactly: pld, rest and auto's lookups run there too"
        if chains
        else f"drafting methods run on torch (this build's batched logits are not its single-token ones; {EXACT_BUILD})"
    ) + (f"; a batch holds at most {rows} rows exactly (more are decoded in several)" if rows < max(PROBE_ROWS) else "")
    return (
        f"auto, for `ar`: {pick} (llama.cpp's `ar` step {ms:.0f} ms, torch's {torch_ms:.0f} ms); {drafting}; "
        "a llama.cpp pass of "
        f"2 / 4 / 8 tokens costs {' / '.join(f'{cost.relative(w):.2f}' for w in (2, 4, 8))} of its `ar` steps"
    ), cost
