"""The one resumable training loop every recipe runs (LM, ASPD adapter, EAGLE head, Medusa heads).

A recipe brings its trainable parts, its optimizer, a batch step and a held-out evaluation;
the loop owns the rest: the learning-rate schedule, gradient clipping, the JSONL log, the
progress bar, the wall-clock budget of one invocation, and the checkpoint. The checkpoint
(``run_dir/<state>``) is written atomically every ``save_every`` steps and at the end, so a run
that is killed resumes from its last save. It holds every part's state, the optimizer, the
scheduler, the step, the time spent, the recipe's ``run_key`` and the recipe's own counters.
A checkpoint of another run (another ``run_key``) that is not finished is refused with one
line, and a finished one is started over.

    result = train_loop(LoopSpec(run_dir, total=100, lr=1e-3, ...), parts={"model": model}, opt=opt,
                        step=lambda i: (loss, {"tokens": n}), heldout=lambda: {"heldout_loss": 2.1})
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from paradec.errors import ParadecError


@dataclass(frozen=True)
class LoopSpec:
    run_dir: Path
    total: int  # optimizer steps of the whole run
    lr: float
    min_lr: float = 0.0
    warmup_steps: int = 0
    grad_clip: float = 1.0
    eval_every: int = 100  # held-out evaluation every this many steps (and at the last)
    save_every: int = 25
    minutes: float | None = None  # wall-clock budget of this invocation (resume later)
    state_file: str = "state.pt"
    log_file: str = "log.jsonl"
    label: str = "train"  # the progress bar's
    eval_at_start: bool = False  # log the held-out metrics of the untrained parts at step 0
    run_key: list | None = None  # what makes a checkpoint this run's (None: any checkpoint here is)
    config: dict = field(default_factory=dict)  # saved with the checkpoint, for the record


@dataclass
class LoopResult:
    step: int
    elapsed: float  # seconds over every invocation
    counters: dict  # the recipe's own sums (tokens seen, ...), carried across invocations
    last_eval: dict | None
    done: bool = False  # every step of ``total`` has run


def loop_spec(cfg, run_dir: str | Path, total: int, **kw) -> LoopSpec:
    """The loop's settings from a recipe's config record (its lr, min_lr, warmup_steps, grad_clip,
    eval_every, save_every and minutes fields), saved with the checkpoint."""
    fields = ("lr", "min_lr", "warmup_steps", "grad_clip", "eval_every", "save_every", "minutes")
    own = {f: getattr(cfg, f) for f in fields if hasattr(cfg, f)}
    return LoopSpec(Path(run_dir), total, **{**own, "label": Path(run_dir).name, **kw}, config=asdict(cfg))


def cosine_lr(step: int, total: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``lr`` to ``min_lr`` at ``total``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * frac))


def save_atomic(obj, path: Path) -> None:
    """torch.save to a temporary file, then rename: a killed save never leaves half a file."""
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def train_loop(
    spec: LoopSpec,
    parts: dict[str, torch.nn.Module],
    opt: torch.optim.Optimizer,
    step: Callable[[int], tuple[torch.Tensor, dict]],
    heldout: Callable[[], dict],
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    rng=None,
) -> LoopResult:
    """Run (or resume) ``spec.total`` steps. ``step(i)`` -> (loss of step i's batch, fields for the
    log; numeric fields named in ``counters`` style, ``+name``, are summed across steps and
    invocations). ``heldout()`` -> held-out metrics (in eval mode, no grad). ``scheduler``: a torch
    LR scheduler stepped after every optimizer step, instead of the cosine schedule. ``rng``: a
    numpy Generator whose state is saved and restored with the checkpoint."""
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    path = spec.run_dir / spec.state_file
    params = [p for part in parts.values() for p in part.parameters() if p.requires_grad]
    res = LoopResult(0, 0.0, {}, None)
    st = torch.load(path, weights_only=False) if path.exists() else None
    if st is not None and st.get("run_key") != spec.run_key:
        if st["step"] < (st.get("total") or 0):
            raise ParadecError(
                f"{path} holds an unfinished run with other data or settings; rerun that one to finish "
                "it, or pass a new --run-dir (or delete that file to start over)"
            )
        st = None  # a finished run of another configuration: start over
    if st is not None:
        for name, part in parts.items():
            part.load_state_dict(st[name])
        opt.load_state_dict(st["opt"])
        if scheduler is not None:
            scheduler.load_state_dict(st["scheduler"])
        if rng is not None:
            rng.bit_generator.state = st["rng"]
        res.step, res.elapsed, res.counters = st["step"], st["elapsed"], st.get("counters", {})
    t0 = time.perf_counter()

    def checkpoint() -> None:
        save_atomic(
            {
                **{name: part.state_dict() for name, part in parts.items()},
                "opt": opt.state_dict(),
                "scheduler": None if scheduler is None else scheduler.state_dict(),
                "rng": None if rng is None else rng.bit_generator.state,
                "step": res.step,
                "total": spec.total,
                "elapsed": res.elapsed + time.perf_counter() - t0,
                "counters": res.counters,
                "run_key": spec.run_key,
                "config": spec.config,
            },
            path,
        )

    def evaluate() -> dict:
        for part in parts.values():
            part.eval()
        with torch.no_grad():
            out = heldout()
        for part in parts.values():
            part.train()
        return out

    for part in parts.values():
        part.train()
    budget = spec.minutes * 60 if spec.minutes else float("inf")
    with (spec.run_dir / spec.log_file).open("a") as log:
        if spec.eval_at_start and res.step == 0:
            log.write(json.dumps({"step": 0, **evaluate()}) + "\n")
        bar = tqdm(total=spec.total, initial=res.step, desc=spec.label, unit="step", dynamic_ncols=True)
        while res.step < spec.total and time.perf_counter() - t0 < budget:
            if scheduler is None:
                for group in opt.param_groups:
                    group["lr"] = cosine_lr(res.step, spec.total, spec.lr, spec.min_lr, spec.warmup_steps)
            loss, fields = step(res.step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, spec.grad_clip)
            opt.step()
            if scheduler is not None:
                scheduler.step()
            res.step += 1
            rec = {"step": res.step, "loss": round(loss.item(), 4), "lr": opt.param_groups[0]["lr"]}
            for key, value in fields.items():
                if key.startswith("+"):  # a counter: summed over the run
                    res.counters[key[1:]] = res.counters.get(key[1:], 0) + value
                    rec[key[1:]] = res.counters[key[1:]]
                else:
                    rec[key] = value
            rec["elapsed_s"] = round(res.elapsed + time.perf_counter() - t0, 1)
            if res.step % spec.eval_every == 0 or res.step == spec.total:
                res.last_eval = evaluate()
                rec.update(res.last_eval)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            bar.update(1)
            bar.set_postfix(loss=rec["loss"])
            if res.step % spec.save_every == 0:
                checkpoint()
        bar.close()
    checkpoint()
    res.elapsed += time.perf_counter() - t0
    res.done = res.step >= spec.total
    for part in parts.values():
        part.eval()
    return res
