"""``GET /metrics``: Prometheus text from prometheus_client, one registry per server."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from paradec.state import Stats

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
STEP_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("paradec_requests", "Requests finished, by outcome", ["outcome"], registry=r)
        self.errors = Counter("paradec_errors", "Requests answered with an error", registry=r)
        self.prompt_tokens = Counter("paradec_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.tokens = Counter("paradec_generated_tokens", "Tokens generated", registry=r)
        self.request_steps = Counter("paradec_request_steps", "Decode steps of finished requests", registry=r)
        self.drafter_steps = Counter(
            "paradec_drafter_steps",
            "Decode steps of finished requests by the drafter that proposed (auto)",
            ["drafter"],
            registry=r,
        )
        self.tau = Gauge("paradec_tau", "Tokens per target pass (tau) of the finished requests so far", registry=r)
        self.step_seconds = Histogram(
            "paradec_step_seconds", "Wall time of one decode step (all live requests)", buckets=STEP_BUCKETS, registry=r
        )
        self.batch_size = Histogram(
            "paradec_batch_size", "Requests verified in one target pass", buckets=BATCH_BUCKETS, registry=r
        )
        self.running = Gauge("paradec_running_requests", "Requests decoding now", registry=r)
        self.queue_length = Gauge("paradec_queue_length", "Requests waiting for a cache row", registry=r)
        self._tokens = self._steps = 0

    def observe_step(self, seconds: float, batch: int) -> None:
        self.step_seconds.observe(seconds)
        self.batch_size.observe(batch)
        self.running.set(batch)

    def observe_request(self, stats: Stats, cancelled: bool) -> None:
        self.requests.labels("cancelled" if cancelled else "ok").inc()
        self.tokens.inc(stats.new_tokens)
        self.request_steps.inc(stats.steps)
        for drafter, steps in stats.drafters.items():
            self.drafter_steps.labels(drafter).inc(steps)
        self._tokens += stats.new_tokens
        self._steps += stats.steps
        self.tau.set(self._tokens / self._steps if self._steps else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
