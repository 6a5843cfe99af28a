"""Shared fixtures: tiny random checkpoints of each family, built once per test session."""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from types import SimpleNamespace

import pytest
import torch

from paradec.testing import make_checkpoint, make_tokenizer, stdlib_text

torch.set_num_threads(2)


@pytest.fixture(scope="session", autouse=True)
def _session_paradec_home(tmp_path_factory):
    """Converted GGUF models are cached in a directory of this test session (subprocesses
    inherit it), so the default model is converted once per run and never in ~/.cache. The
    target runtime is paradec's own unless a test asks for llama.cpp (tests/test_llamacpp.py), so a
    test's subject does not depend on whether llama-cpp-python is installed."""
    os.environ["PARADEC_HOME"] = str(tmp_path_factory.mktemp("paradec_home"))
    os.environ["PARADEC_BACKEND"] = "torch"


def run_cli(*args: str, env: dict[str, str] | None = None) -> SimpleNamespace:
    """``paradec ARGS`` in this process: its exit status, stdout and stderr (warnings printed there,
    as an interpreter of its own prints them). No interpreter start-up and torch import: ~4 s a
    call. Tests of the entry point itself (--json, streaming, a broken pipe) run a subprocess."""
    from paradec.cli import main

    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(record=True) as w,
        ):
            warnings.simplefilter("default")
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's errors
                code = exc.code
        for m in w:
            err.write(warnings.formatwarning(m.message, m.category, m.filename, m.lineno))
    finally:
        torch.set_num_threads(threads)  # --threads sets it for the process
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


# family, kwargs: MHA untied, GQA tied, Qwen2 (qkv bias) with GQA, Mistral with GQA, llama3 RoPE scaling
VARIANTS = {
    "llama": dict(family="llama"),
    "llama-gqa-tied": dict(family="llama", num_heads=4, num_kv_heads=2, tie_word_embeddings=True),
    "qwen2": dict(family="qwen2", num_heads=4, num_kv_heads=2),
    "mistral": dict(family="mistral", num_heads=4, num_kv_heads=1),
    "llama-rope-llama3": dict(
        family="llama",
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
}


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer(512, stdlib_text(60_000))


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("ckpt")
    return {
        name: make_checkpoint(root / name, tokenizer=tokenizer, seed=i, **kw)
        for i, (name, kw) in enumerate(VARIANTS.items())
    }


@pytest.fixture(scope="session")
def llama_dir(checkpoints):
    return checkpoints["llama"]


@pytest.fixture(scope="session")
def drafters(tmp_path_factory, tokenizer):
    """(a 1-layer draft model, random Medusa heads + early head) for the tiny llama: any tree they
    propose must still give `ar`'s tokens."""
    from paradec.models.heads import EarlyHead, Heads, MedusaHeads, save_heads

    tmp = tmp_path_factory.mktemp("drafters")
    draft = make_checkpoint(tmp / "draft", tokenizer=tokenizer, seed=21, num_layers=1)
    torch.manual_seed(0)
    medusa, early = MedusaHeads(64, 3), EarlyHead(64, 1e-6)
    for p in list(medusa.parameters()) + list(early.block.parameters()):
        torch.nn.init.normal_(p, std=0.3)
    save_heads(
        Heads(medusa, early, 1, {"rank_accuracy": [[0.4, 0.2], [0.2, 0.1], [0.1, 0.05]], "tree_nodes": 6}),
        tmp / "heads",
    )
    return draft, tmp / "heads"


# three top-level functions; the third calls the first two (ASPD extraction and data tests)
THREE_FUNCTIONS = """import math


def area(r):
    return math.pi * r * r


def perimeter(r):
    return 2 * math.pi * r


def describe(r):
    return f"{area(r)} {perimeter(r)}"
"""

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\nclass Config:\n    def __init__(self", "x"]


def two_token_joint_tv(engine, n: int = 1600, **opts) -> tuple[float, float, dict, dict]:
    """Sample the first two tokens of "def f(x):" n times under ``opts`` (temperature 0.15,
    top-k 3: 9 cells) and compare with the target's exact joint.

    Returns (total variation, the bound a correct sampler stays under, counts, exact joint).
    """
    import math

    from paradec.config import SamplingConfig
    from paradec.sampling import probs

    cfg = SamplingConfig(temperature=0.15, top_k=3)
    prompt = engine.tokenizer.encode("def f(x):")
    with torch.inference_mode():
        p1 = probs(engine.model(torch.tensor([prompt]))[0, -1], cfg)
        exact = {}
        for t1 in p1.nonzero().flatten().tolist():
            p2 = probs(engine.model(torch.tensor([prompt + [t1]]))[0, -1], cfg)
            for t2 in p2.nonzero().flatten().tolist():
                exact[(t1, t2)] = float(p1[t1] * p2[t2])
    torch.manual_seed(0)  # rows draw their seeds from the global generator when seed=None
    counts: dict = {}
    for _ in range(n // 200):
        for g in engine.generate([prompt] * 200, max_new_tokens=3, temperature=0.15, top_k=3, ignore_eos=True, **opts):
            key = tuple(g.token_ids[:2])
            counts[key] = counts.get(key, 0) + 1
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - exact.get(k, 0.0)) for k in set(counts) | set(exact))
    return tv, 0.5 * math.sqrt(9 / n) + 0.02, counts, exact
