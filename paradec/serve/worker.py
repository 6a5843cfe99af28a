"""The server's engine loop: one thread owns the model and a ``Scheduler`` (continuous batching).

Requests wait in a bounded queue. At every step boundary the worker admits waiting requests
while cache rows are free (each is prefilled alone and joins the running batch), runs one
``Scheduler.step`` (every live request's tree in ONE target pass) and hands each request its
new text. A finished or cancelled request leaves and frees its row at the next step. Each
request is its own group: its own drafter state (SSM caches, n-gram tables; ProPD's policy
is the engine's, learned per batch size) and its own sampling settings and seeded generator.

A method with a loop of its own (``Method.decode``/``stream``, as ASPD's hybrid decoder) cannot share
the scheduler's cache; such a request runs its own stream, advanced one forward pass per
worker step, interleaved with the scheduler's steps (at most ``max_batch`` of them at once).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

from paradec import methods
from paradec.config import MAX_TREE_NODES, GenerationConfig
from paradec.engine import Engine
from paradec.scheduler import Group, Scheduler
from paradec.serve.metrics import Metrics
from paradec.state import Stats, StepEvent
from paradec.text import TextStream

# Scratch slots per cache row for a request's trees: a request whose drafter may propose more
# (several SSMs with wide expansions) is refused with a clear error.
TREE_SCRATCH = 4 * MAX_TREE_NODES


class QueueFull(Exception):
    """The server has as many requests waiting as it accepts; retry later."""


@dataclass(eq=False)
class Job:
    """One request: prompt ids and settings in; text deltas out through ``emit``."""

    ids: list[int]
    gen: GenerationConfig
    # called from the worker thread: a text piece (with ``trace``: (text, trace dict)), or None at the end
    emit: Callable[[str | tuple[str, dict] | None, Job], None]
    text: TextStream | None = None  # its tokens -> its text (the scheduler's methods)
    finish_reason: str = "length"
    completion_tokens: int = 0
    error: str | None = None
    group: Group | None = None
    cancelled: bool = False
    own: Generator | None = None  # a method with its own loop: its stream, one piece per pass
    stats: Stats | None = None  # what its decode cost (the shared loop's methods), once it has ended
    trace: bool = False  # emit (text, how it was committed) per token instead of text per step (the chat page)


class Worker:
    """Owns ``engine``; ``submit`` is thread-safe, everything else runs on the worker thread."""

    def __init__(self, engine: Engine, max_batch: int = 8, max_queue: int = 64, metrics: Metrics | None = None) -> None:
        self.engine = engine
        context = engine.model.config.context_length
        self.scheduler = Scheduler(
            engine,
            max_batch,
            context + 1 + TREE_SCRATCH,
            engine.tokenizer.eos_ids,
            engine.budget,
            interleave_prefill=True,
        )  # a long prompt does not stop the others
        self.waiting: queue.Queue[Job] = queue.Queue(max_queue)
        self.metrics = metrics or Metrics()
        self.jobs: dict[Group, Job] = {}
        self.own: list[Job] = []  # requests of methods with their own loop (ASPD)
        self.max_own = max_batch
        self._held: Job | None = None  # taken from the queue, waiting for a free place
        # a plain flag, not a threading.Event: SIGTERM's handler sets it on the main thread, and a second
        # SIGTERM (pkill signals `timeout` and its child alike) ran inside the first one's Event.set,
        # which holds the Event's lock: the server hung for good
        self._stopping = False
        self._thread = threading.Thread()  # set by start(); run() may also be called on the main thread

    def start(self) -> None:
        """Run the loop on a thread of its own (once; later calls do nothing)."""
        if not self._thread.is_alive() and not self._stopping:
            self._thread = threading.Thread(target=self.run, name="paradec-engine", daemon=True)
            self._thread.start()

    def request_stop(self) -> None:
        """Ask the loop to cancel what is running and waiting, and return (signal-safe: one
        attribute store, no lock, so a signal arriving inside it may call it again)."""
        self._stopping = True

    def stop(self, timeout: float = 10.0) -> None:
        """``request_stop`` and wait for the loop's thread."""
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        try:
            self.waiting.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        self.metrics.queue_length.set(self.waiting.qsize())

    def cancel(self, job: Job) -> None:
        """The client is gone: the request leaves at the next step boundary (thread-safe)."""
        job.cancelled = True

    # ---- the loop (one thread: the worker's own, or the main thread) -------------------------
    def run(self) -> None:
        """The engine loop, until ``request_stop``; then every request still here ends as cancelled."""
        while not self._stopping:
            self._admit()
            self._step_own()
            self.metrics.running.set(len(self.jobs) + len(self.own))
            if not self.scheduler.groups:
                if self.own:
                    continue
                try:
                    job = self.waiting.get(timeout=0.05)
                except queue.Empty:
                    continue
                self._admit(job)
                continue
            t, batch = time.perf_counter(), self.scheduler.cache.batch
            try:
                for group, event in self.scheduler.step():
                    self._deliver(self.jobs[group], event)
            except Exception as exc:  # a bug must not hang every client: fail what runs, serve on
                self._fail_running(f"the engine failed: {type(exc).__name__}: {exc}")
                continue
            self.metrics.observe_step(time.perf_counter() - t, batch)
            self._reap()
        held = [self._held] if self._held is not None else []
        for job in list(self.jobs.values()) + self.own + held + self._drain():
            job.finish_reason, job.error = "cancelled", "the server is shutting down"
            job.emit(None, job)
        self.own.clear()

    def _step_own(self) -> None:
        """One forward pass of every running request of a method with its own loop."""
        for job in list(self.own):
            try:
                if job.cancelled:
                    job.own.close()
                    raise StopIteration(("cancelled", job.completion_tokens))
                piece = next(job.own)
                if piece:
                    job.emit(piece, job)
            except StopIteration as end:
                job.finish_reason, job.completion_tokens = end.value or ("length", 0)
                self.own.remove(job)
                job.emit(None, job)
            except Exception as exc:  # a bug fails this request only: its state is its own
                job.error, job.finish_reason = f"the engine failed: {type(exc).__name__}: {exc}", "error"
                self.metrics.errors.inc()
                self.own.remove(job)
                job.emit(None, job)

    def _admit(self, job: Job | None = None) -> None:
        """Admit ``job`` and then waiting jobs while rows are free (a job that does not fit the
        cache is failed, not left waiting)."""
        while True:
            if job is None and self._held is not None:
                job, self._held = self._held, None
            if job is None:
                if not self.scheduler.free_rows:
                    return
                try:
                    job = self.waiting.get_nowait()
                except queue.Empty:
                    return
            self.metrics.queue_length.set(self.waiting.qsize())
            if job.cancelled:
                job = None
                continue
            method = methods.get(job.gen.method)
            if method.stream is not None:  # its own loop: a stream of its own, not scheduler rows
                if len(self.own) >= self.max_own:
                    self._held = job  # first in line at the next step
                    return
                self.metrics.prompt_tokens.inc(len(job.ids))
                job.own = method.stream(self.engine, job.ids, job.gen)
                self.own.append(job)
                job = None
                continue
            try:
                rows = self.engine.new_rows([job.ids], job.gen)
                drafter = method.drafter(self.engine, job.gen)
                if not self.scheduler.fits(rows, drafter):
                    raise ValueError(
                        f"method {job.gen.method} with these options proposes trees of up to "
                        f"{drafter.max_nodes} nodes; this server reserves {TREE_SCRATCH}"
                    )
                self.metrics.prompt_tokens.inc(len(job.ids))
                job.text = self.engine.text_stream(job.gen)
                job.group = self.scheduler.admit(rows, job.gen, drafter)
                self.jobs[job.group] = job
            except Exception as exc:  # a bad request must not take the loop down
                job.error, job.finish_reason = str(exc), "error"
                self.metrics.errors.inc()
                job.emit(None, job)
            job = None

    def _deliver(self, job: Job, event: StepEvent) -> None:
        row = job.group.rows[event.row]
        if job.trace:
            self._deliver_traced(job, event, row)
            return
        if job.text.add(event.token_ids):
            row.finish("stop")
        piece = job.text.close() if row.done else job.text.piece()
        if piece:
            job.emit(piece, job)

    @staticmethod
    def _deliver_traced(job: Job, event: StepEvent, row) -> None:
        """One (text, trace) piece per committed token: an accepted draft token ("draft"), the
        target's own next token after a drafted step ("bonus"), or a plain `ar` step's ("plain").
        A piece's text may be empty (held back: an unfinished character or a possible stop string)."""
        last = len(event.token_ids) - 1
        for k, tok in enumerate(event.token_ids):
            stopped = job.text.add([tok])
            if stopped:
                row.finish("stop")
            piece = job.text.close() if stopped or (row.done and k == last) else job.text.piece()
            kind = "draft" if k < event.accepted else "bonus" if event.drafted else "plain"
            trace = {
                "step": event.step,
                "kind": kind,
                "drafter": event.drafter,
                "accepted": event.accepted,
                "drafted": event.drafted,
                "depth": event.depth,
            }
            job.emit((piece, trace), job)
            if stopped:
                return

    def _reap(self) -> None:
        """Finished and cancelled jobs end (their rows leave at the next step)."""
        for group, job in list(self.jobs.items()):
            if job.cancelled:
                group.cancelled = True
            if group.done:
                row = group.rows[0]
                job.finish_reason = "cancelled" if job.cancelled else row.finish_reason
                job.completion_tokens, job.stats = len(row.new_ids), row.stats
                if group.error is not None:  # its own sampling or drafter failed; the others went on
                    job.error, job.finish_reason = f"the engine failed: {group.error}", "error"
                    self.metrics.errors.inc()
                else:
                    self.metrics.observe_request(row.stats, job.cancelled)
                del self.jobs[group]
                job.emit(None, job)

    def _fail_running(self, message: str) -> None:
        """End every running request with ``message`` and start over with an empty cache."""
        for job in list(self.jobs.values()):
            job.error, job.finish_reason = message, "error"
            self.metrics.errors.inc()
            job.emit(None, job)
        self.jobs.clear()
        for group in self.scheduler.groups:
            group.cancelled = True
        self.scheduler.groups.clear()
        self.scheduler.cache.remove_rows(0, self.scheduler.cache.batch)

    def _drain(self) -> list[Job]:
        out = []
        while True:
            try:
                out.append(self.waiting.get_nowait())
            except queue.Empty:
                return out
