"""Shared fixtures: tiny random checkpoints of each family, built once per test session."""

from __future__ import annotations

import pytest
import torch

from paradec.testing import make_checkpoint, make_tokenizer, stdlib_text

torch.set_num_threads(2)

# family, kwargs: MHA untied, GQA tied, Qwen2 (qkv bias) with GQA, Mistral with GQA, llama3 RoPE scaling
VARIANTS = {
    "llama": dict(family="llama"),
    "llama-gqa-tied": dict(family="llama", num_heads=4, num_kv_heads=2, tie_word_embeddings=True),
    "qwen2": dict(family="qwen2", num_heads=4, num_kv_heads=2),
    "mistral": dict(family="mistral", num_heads=4, num_kv_heads=1),
    "llama-rope-llama3": dict(family="llama", rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                            "original_max_position_embeddings": 64}),
}


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer(512, stdlib_text(60_000))


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("ckpt")
    return {name: make_checkpoint(root / name, tokenizer=tokenizer, seed=i, **kw)
            for i, (name, kw) in enumerate(VARIANTS.items())}


@pytest.fixture(scope="session")
def llama_dir(checkpoints):
    return checkpoints["llama"]


PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\nclass Config:\n    def __init__(self", "x"]
