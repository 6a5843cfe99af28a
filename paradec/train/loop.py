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
    log; a field named ``+name`` is a counter, summed across steps and invocations). ``heldout()``
    -> held-out metrics (run in eval mode, without gradients). ``scheduler``: a torch LR
    scheduler stepped after every optimizer step, instead of the cosine schedule. ``rng``: a
    numpy Generator whose state is saved and restored with the checkpoint."""
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = _Checkpoint(spec, parts, opt, scheduler, rng)
    res = ckpt.load()
    params = [p for part in parts.values() for p in part.parameters() if p.requires_grad]
    t0, budget = time.perf_counter(), spec.minutes * 60 if spec.minutes else float("inf")
    _set_mode(parts, train=True)
    with (spec.run_dir / spec.log_file).open("a") as log:
        if spec.eval_at_start and res.step == 0:
            log.write(json.dumps({"step": 0, **_evaluate(parts, heldout)}) + "\n")
        bar = tqdm(total=spec.total, initial=res.step, desc=spec.label, unit="step", dynamic_ncols=True)
        while res.step < spec.total and time.perf_counter() - t0 < budget:
            rec = _one_step(spec, opt, params, step, scheduler, res)
            rec["elapsed_s"] = round(res.elapsed + time.perf_counter() - t0, 1)
            if res.step % spec.eval_every == 0 or res.step == spec.total:
                res.last_eval = _evaluate(parts, heldout)
                rec.update(res.last_eval)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            bar.update(1)
            bar.set_postfix(loss=rec["loss"])
            if res.step % spec.save_every == 0:
                ckpt.save(res, res.elapsed + time.perf_counter() - t0)
        bar.close()
    res.elapsed += time.perf_counter() - t0
    ckpt.save(res, res.elapsed)
    res.done = res.step >= spec.total
    _set_mode(parts, train=False)
    return res


def _one_step(spec: LoopSpec, opt, params, step, scheduler, res: LoopResult) -> dict:
    """One optimizer step on step ``res.step``'s batch -> its log record (counters summed into ``res``)."""
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
            res.counters[key[1:]] = rec[key[1:]] = res.counters.get(key[1:], 0) + value
        else:
            rec[key] = value
    return rec


def _set_mode(parts: dict[str, torch.nn.Module], train: bool) -> None:
    for part in parts.values():
        part.train(train)


def _evaluate(parts: dict[str, torch.nn.Module], heldout: Callable[[], dict]) -> dict:
    _set_mode(parts, train=False)
    with torch.no_grad():
        out = heldout()
    _set_mode(parts, train=True)
    return out


class _Checkpoint:
    """``run_dir/<state_file>``: what a resumed run needs, written atomically."""

    def __init__(self, spec: LoopSpec, parts: dict, opt, scheduler, rng) -> None:
        self.spec, self.parts, self.opt, self.scheduler, self.rng = spec, parts, opt, scheduler, rng
        self.path = spec.run_dir / spec.state_file

    def load(self) -> LoopResult:
        """Restore this run's checkpoint, if any: -> where it stands (step 0 without one)."""
        st = torch.load(self.path, weights_only=False) if self.path.exists() else None
        if st is not None and st.get("run_key") != self.spec.run_key:
            if st["step"] < (st.get("total") or 0):
                raise ParadecError(
                    f"{self.path} holds an unfinished run with other data or settings; rerun that one to "
                    "finish it, or pass a new --run-dir (or delete that file to start over)"
                )
            st = None  # a finished run of another configuration: start over
        if st is None:
            return LoopResult(0, 0.0, {}, None)
        for name, part in self.parts.items():
            part.load_state_dict(st[name])
        self.opt.load_state_dict(st["opt"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(st["scheduler"])
        if self.rng is not None:
            self.rng.bit_generator.state = st["rng"]
        return LoopResult(st["step"], st["elapsed"], st.get("counters", {}), None)

    def save(self, res: LoopResult, elapsed: float) -> None:
        save_atomic(
            {
                **{name: part.state_dict() for name, part in self.parts.items()},
                "opt": self.opt.state_dict(),
                "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
                "rng": None if self.rng is None else self.rng.bit_generator.state,
                "step": res.step,
                "total": self.spec.total,
                "elapsed": elapsed,
                "counters": res.counters,
                "run_key": self.spec.run_key,
                "config": self.spec.config,
            },
            self.path,
        )
