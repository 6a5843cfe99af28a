"""The server's engine loop around its requests: set up before the first one, stopped by signals
(no HTTP here; ``test_serve.py`` drives the API with the official client)."""

from __future__ import annotations

import sys
import threading

import pytest

pytest.importorskip("fastapi")

import paradec  # noqa: E402
from paradec import factories, methods  # noqa: E402
from paradec.serve import Worker, build_app  # noqa: E402


def test_a_second_signal_inside_request_stop_does_not_hang_the_server(llama_dir):
    """`paradec serve`'s SIGTERM handler calls ``request_stop`` on the main thread, and a second
    SIGTERM (pkill signals `timeout` and its child alike) may run its handler inside the first's.
    Simulated: at every Python call made inside ``request_stop``, ``request_stop`` again. It had
    set a threading.Event, whose lock the inner call then waited for forever."""
    worker = Worker(paradec.load(llama_dir, warmup=False), max_batch=1)

    def second_signal(frame, event, arg):
        if event == "call":
            worker.request_stop()  # the profiler is off inside its own hook: one level deep

    def first_signal():
        sys.setprofile(second_signal)
        try:
            worker.request_stop()
        finally:
            sys.setprofile(None)

    handler = threading.Thread(target=first_signal, daemon=True)
    handler.start()
    handler.join(10)
    assert not handler.is_alive(), "request_stop deadlocked"
    worker.run()  # stopped: it returns at once


def test_the_default_method_is_set_up_before_the_first_request(llama_dir):
    """Its drafter's one-time set-up (EAGLE's LM rows: 0.1-0.5 s) runs when the app is built, so
    the first request does not wait for it."""
    built = []
    count = lambda target, gen: built.append(gen.method) or factories.root(target, gen)  # noqa: E731
    methods.register(methods.Method("counted", "`ar`, counting its drafters", drafter=count))
    try:
        build_app(paradec.load(llama_dir, warmup=False), "tiny", method="counted")
        assert built == ["counted"]
    finally:
        methods.unregister("counted")
