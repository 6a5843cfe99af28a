"""`paradec serve`: the official openai client against a server started in the test (uvicorn in a
thread, loopback only), continuous batching of mixed requests, disconnects, and bad inputs."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

import paradec  # noqa: E402
from paradec.serve import build_app  # noqa: E402
from paradec.testing import GGUF_CHAT_TEMPLATE  # noqa: E402

KEY = "test-key"
NAME = "tiny"
METHODS = ["ar", "auto", "pld", "specinfer", "medusa", "propd"]
PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "class Stack:\n    def push(self, item):",
    "for i in range(",
    "with open(path) as f:",
]


class _Server:
    def __init__(self, app) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def _engine(llama_dir, drafters):
    draft, heads = drafters
    engine = paradec.load(llama_dir, dtype="bf16", drafts=[draft], heads=heads, warmup=False)
    engine.tokenizer.hf.chat_template = GGUF_CHAT_TEMPLATE
    return engine


@pytest.fixture(scope="module")
def served(llama_dir, drafters):
    app = build_app(_engine(llama_dir, drafters), NAME, max_batch=8, max_queue=128, api_key=KEY, max_tokens_limit=200)
    server = _Server(app)
    yield server, app.state.worker
    server.stop()


@pytest.fixture(scope="module")
def solo(llama_dir, drafters):
    """The reference: `Engine.generate` on an engine of its own, one prompt at a time."""
    engine = _engine(llama_dir, drafters)
    run = lambda prompt, **kw: engine.generate(prompt, **kw)  # noqa: E731
    run.engine = engine
    return run


@pytest.fixture(scope="module")
def client(served):
    server, _ = served
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.mark.parametrize("method", METHODS)
def test_completions_chat_and_stream_equal_generate(client, solo, method):
    prompt = PROMPTS[1]
    ref = solo(prompt, method=method, max_new_tokens=24)
    out = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=24, temperature=0, extra_body={"method": method}
    )
    assert out.choices[0].text == ref.text
    assert out.choices[0].finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert out.usage.completion_tokens == len(ref.token_ids)
    assert out.usage.prompt_tokens == len(solo.engine.tokenizer.encode(prompt))
    stream = client.completions.create(
        model=NAME,
        prompt=prompt,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"method": method},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
    assert chunks[-1].usage.completion_tokens == len(ref.token_ids) and not chunks[-1].choices

    messages = [{"role": "user", "content": "Write a stack class."}]
    ref = solo(messages, method=method, max_new_tokens=20)
    chat = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=20, temperature=0, extra_body={"method": method}
    )
    assert chat.choices[0].message.content == ref.text and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == len(ref.token_ids)
    pieces = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=20, temperature=0, stream=True, extra_body={"method": method}
    )
    assert "".join(c.choices[0].delta.content or "" for c in pieces) == ref.text


def test_usage_counts_and_done_marker(served, solo):
    server, _ = served
    prompt = PROMPTS[0]
    ref = solo(prompt, max_new_tokens=10)
    body = {"model": NAME, "prompt": prompt, "max_tokens": 10, "temperature": 0, "stream": True}
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1])
    assert text == ref.text
    out = httpx.post(
        server.url + "/v1/completions",
        json={**body, "stream": False},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    ).json()
    assert out["usage"]["completion_tokens"] == len(ref.token_ids)
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    assert out["object"] == "text_completion" and out["model"] == NAME


def test_auto_is_the_default_and_reports_which_drafters_ran(served, client, solo):
    ref = solo(PROMPTS[1], max_new_tokens=24)  # the API's default: `ar`
    out = client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=24, temperature=0)
    assert out.choices[0].text == ref.text
    mine = out.model_dump()["usage"]["paradec"]
    assert mine["method"] == "auto" and mine["steps"] >= 1
    assert sum(mine["drafters"].values()) == mine["steps"] and set(mine["drafters"]) <= {
        "ar",
        "pld",
        "specinfer",
        "medusa",
    }
    plain = client.completions.create(
        model=NAME, prompt=PROMPTS[1], max_tokens=24, temperature=0, extra_body={"method": "ar"}
    )
    assert "drafters" not in plain.model_dump()["usage"]["paradec"]
    server, _ = served
    metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text
    assert "paradec_drafter_steps_total{drafter=" in metrics


def test_concurrent_mixed_requests_equal_their_solo_runs(served, client, solo):
    """16 clients x 5 requests, mixed methods and sampling settings: no failures, every greedy
    reply and every seeded sampled reply (but ProPD's) equals its solo run, and passes really
    batched."""
    _, worker = served
    jobs = [
        (PROMPTS[(c + r) % len(PROMPTS)], METHODS[(c * 5 + r) % len(METHODS)], 0.0 if (c + r) % 3 else 0.8, c * 10 + r)
        for c in range(16)
        for r in range(5)
    ]
    # a seeded sampled request is deterministic on the server by default: so is its solo run
    refs = {
        job: solo(
            job[0], method=job[1], max_new_tokens=16, temperature=job[2], seed=job[3], deterministic=job[2] > 0
        ).text
        for job in set(jobs)
    }

    def one_client(c: int) -> list[bool]:
        ok = []
        for prompt, method, temperature, seed in jobs[c * 5 : (c + 1) * 5]:
            out = client.completions.create(
                model=NAME,
                prompt=prompt,
                max_tokens=16,
                temperature=temperature,
                seed=seed,
                extra_body={"method": method},
            )
            if method == "propd" and temperature > 0:
                # ProPD sizes its tree from measured time, so a seed does not fix its sampled text
                # (README, "what a seed fixes"); greedy it is still exact
                ok.append(out.usage.completion_tokens > 0 or (method, temperature))
                continue
            ok.append(out.choices[0].text == refs[(prompt, method, temperature, seed)] or (method, temperature))
        return ok

    with ThreadPoolExecutor(16) as pool:
        results = [ok for oks in pool.map(one_client, range(16)) for ok in oks]
    bad = [r for r in results if r is not True]
    assert len(results) == 80 and not bad, f"{len(bad)} replies differ from their solo runs: {bad}"
    metrics = httpx.get(served[0].url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    count = _metric(metrics, "paradec_batch_size_count")
    alone = _metric(metrics, 'paradec_batch_size_bucket{le="1.0"}')
    assert count > alone, "no pass verified more than one request"


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def test_disconnect_mid_stream_frees_the_row(served, client):
    server, worker = served
    body = {"model": NAME, "prompt": PROMPTS[2], "max_tokens": 200, "temperature": 0, "stream": True}
    metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    before = _metric(metrics, 'paradec_requests_total{outcome="cancelled"}') if "cancelled" in metrics else 0.0
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    ) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 2:
                break  # the client goes away mid-stream
    deadline = time.time() + 20
    while worker.jobs or worker.scheduler.groups:
        assert time.time() < deadline, "the disconnected request kept its row"
        time.sleep(0.02)
    after = _metric(
        httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text,
        'paradec_requests_total{outcome="cancelled"}',
    )
    assert after == before + 1
    out = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=4, temperature=0)
    assert out.usage.completion_tokens >= 1  # the server still serves


@pytest.mark.parametrize(
    "case, status",
    [
        ("{not json", 400),
        ({"model": NAME}, 400),  # no prompt
        ({"model": NAME, "prompt": "x", "n": 2}, 400),
        ({"model": NAME, "prompt": "x", "temperature": -1}, 400),
        ({"model": NAME, "prompt": "x", "max_tokens": 10_000}, 400),
        ({"model": NAME, "prompt": "x", "method": "nope"}, 400),
        ({"model": NAME, "prompt": "x " * 400}, 400),  # longer than the context
        ({"model": NAME, "prompt": "x", "stop": 7}, 400),
        ({"model": NAME, "prompt": "x", "temperature": 1e-300}, 400),  # once a 500 that failed every stream beside it
        ({"model": NAME, "prompt": "x", "max_tokens": True}, 400),  # once accepted as 1
        ({"model": NAME, "prompt": "x", "stream": "yes"}, 400),  # once accepted as true
        ('{"model": "tiny", "prompt": "\\ud800"}', 400),  # a lone surrogate: once a plain-text 500
        ('{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}]}', 400),
        (b'{"model": "tiny", "prompt": "\xff\xfe"}', 400),  # not UTF-8
        ("chunked-too-large", 413),  # no Content-Length: once read whole (10 MB in 26 s) before the 400
        ({"model": "other", "prompt": "x"}, 404),
        ("wrong-key", 401),
        ("no-key", 401),
        ("too-large", 413),
    ],
)
def test_bad_inputs_get_their_status_and_the_server_serves_on(served, client, case, status):
    server, _ = served
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    body = case
    if case == "wrong-key":
        headers["Authorization"], body = "Bearer nope", {"model": NAME, "prompt": "x"}
    elif case == "no-key":
        del headers["Authorization"]
        body = {"model": NAME, "prompt": "x"}
    elif case == "too-large":
        body = {"model": NAME, "prompt": "x" * (2 << 20)}
    elif case == "chunked-too-large":
        body = (b"x" * 65536 for _ in range(40))  # a generator: sent chunked, with no Content-Length
    content = body if isinstance(body, (str, bytes)) or case == "chunked-too-large" else json.dumps(body)
    route = "/v1/chat/completions" if isinstance(body, str) and "messages" in body else "/v1/completions"
    r = httpx.post(server.url + route, content=content, headers=headers, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"] and not (error["param"] or "x").isdigit()
    assert client.completions.create(model=NAME, prompt="x", max_tokens=2, temperature=0).choices[0].text is not None


def test_models_health_and_a_full_queue(llama_dir, drafters):
    app = build_app(_engine(llama_dir, drafters), NAME, max_batch=1, max_queue=1)
    server = _Server(app)
    try:
        assert httpx.get(server.url + "/health").json() == {"status": "ok"}
        models = openai.OpenAI(base_url=server.url + "/v1", api_key="x").models.list()
        assert [m.id for m in models.data] == [NAME]
        body = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0}

        def post(_):
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
            return r.status_code, r.headers.get("retry-after")

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(post, range(4)))
        assert (429, "1") in answers and (200, None) in answers
    finally:
        server.stop()


def test_every_route_answers_in_openai_shape_and_asks_for_the_key(served):
    server, _ = served
    key = {"Authorization": f"Bearer {KEY}"}
    for method, path, status in (("GET", "/v1/nope", 404), ("GET", "/v1/completions", 405), ("GET", "/nope", 404)):
        r = httpx.request(method, server.url + path, headers=key)
        assert r.status_code == status and r.json()["error"]["message"], r.text
    for path in ("/metrics", "/openapi.json", "/v1/models"):  # the key guards every route but /health
        assert httpx.get(server.url + path).status_code == 401
    assert httpx.get(server.url + "/metrics", headers=key).status_code == 200
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200
    replica = health.headers["x-paradec-replica"]
    assert socket.gethostname() not in replica and str(os.getpid()) not in replica


def test_a_stalled_body_times_out(served, monkeypatch):
    import paradec.serve.gate as gate_module

    monkeypatch.setattr(gate_module, "BODY_TIMEOUT_S", 0.5)
    server, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + KEY.encode()
            + b'\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model":'
        )
        reply = s.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 408"), reply


def test_only_loopback_host_names_when_bound_to_the_loopback(llama_dir, drafters):
    from paradec.serve.app import LOOPBACK_HOSTS

    app = build_app(_engine(llama_dir, drafters), NAME, max_batch=1, allowed_hosts=LOOPBACK_HOSTS)
    server = _Server(app)
    try:
        assert httpx.get(server.url + "/health").status_code == 200
        assert httpx.get(f"http://localhost:{server.port}/health").status_code == 200
        rebound = httpx.get(server.url + "/v1/models", headers={"Host": "attacker.example"})
        assert rebound.status_code == 400 and "Host" in rebound.json()["error"]["message"]
    finally:
        server.stop()


def test_a_client_that_leaves_a_plain_request_cancels_it(llama_dir, drafters):
    app = build_app(_engine(llama_dir, drafters), NAME, max_batch=2)
    worker = app.state.worker
    step = worker.scheduler.step

    def slow_step():  # 200 tokens take ~10 s: the client leaves long before
        time.sleep(0.05)
        yield from step()

    worker.scheduler.step = slow_step
    server = _Server(app)
    try:
        body = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=body, timeout=0.5)
        deadline = time.time() + 5
        while worker.jobs or worker.scheduler.groups:
            assert time.time() < deadline, "a request whose client left kept decoding"
            time.sleep(0.05)
        metrics = httpx.get(server.url + "/metrics").text
        assert _metric(metrics, 'paradec_requests_total{outcome="cancelled"}') == 1
        deadline = time.time() + 5
        while _metric(httpx.get(server.url + "/metrics").text, "paradec_running_requests") != 0:
            assert time.time() < deadline, "paradec_running_requests stayed up while idle"
            time.sleep(0.05)
    finally:
        server.stop()


def test_a_seed_fixes_sampled_propd_through_the_server(served, client):
    """ProPD sizes trees from the server's measured statistics; a seeded request uses its own."""
    ask = dict(model=NAME, prompt=PROMPTS[1], max_tokens=24, temperature=0.8, seed=7, extra_body={"method": "propd"})
    first = client.completions.create(**ask).choices[0].text
    for p in PROMPTS:  # the server's shared statistics move meanwhile
        client.completions.create(model=NAME, prompt=p, max_tokens=16, temperature=0, extra_body={"method": "propd"})
    assert client.completions.create(**ask).choices[0].text == first
