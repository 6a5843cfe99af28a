"""`paradec serve --replicas 2`: two engine replicas on a local Ray instance (loopback only) behind
Ray Serve's proxy answer with the same OpenAI routes and the same text as one server."""

from __future__ import annotations

import socket
import warnings
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("fastapi")

import paradec  # noqa: E402

PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "class Stack:\n    def push(self, item):",
    "for i in range(",
    "with open(path) as f:",
    "x = [",
    "try:\n    import",
    "while True:",
]


@pytest.fixture(scope="module")
def ray_server(llama_dir, tmp_path_factory):
    from paradec.serve import ray_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    load = dict(model_dir=str(llama_dir), dtype="bf16", warmup=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ray.serve's pydantic deprecation warnings
        try:
            ray_app.start(
                load,
                "tiny",
                2,
                host="127.0.0.1",
                port=port,
                replica_cpus=0.5,
                temp_dir=str(tmp_path_factory.mktemp("ray")),
                max_batch=4,
            )
            yield f"http://127.0.0.1:{port}"
        finally:
            ray_app.stop()


def test_two_replicas_serve_and_agree_with_one_engine(ray_server, llama_dir):
    engine = paradec.load(llama_dir, dtype="bf16", warmup=False)
    refs = {p: engine.generate(p, max_new_tokens=12).text for p in PROMPTS}

    def ask(i: int) -> tuple[str, str, str]:
        p = PROMPTS[i % len(PROMPTS)]
        r = httpx.post(
            ray_server + "/v1/completions",
            json={"model": "tiny", "prompt": p, "max_tokens": 12, "temperature": 0},
            timeout=120,
        )
        r.raise_for_status()
        return p, r.json()["choices"][0]["text"], r.headers["x-paradec-replica"]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(32)))
    assert all(text == refs[p] for p, text, _ in answers)
    assert len({replica for _, _, replica in answers}) == 2, "requests did not reach both replicas"
    models = httpx.get(ray_server + "/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
