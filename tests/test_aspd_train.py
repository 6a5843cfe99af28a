"""ASPD fine-tuning: the LoRA adapter round-trips through its files, training on marked windows
learns (loss falls, resumes where it stopped), and `paradec bench` compares aspd, ar and the Seq twin."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
from conftest import THREE_FUNCTIONS
from torch.func import functional_call

import paradec
from paradec.models import load_model
from paradec.models.adapter import Adapter, AdapterConfig
from paradec.parallel.quality import complete_part, parses
from paradec.testing import make_checkpoint, make_tokenizer, stdlib_text
from paradec.train.aspd import AspdTrainConfig, train_aspd
from paradec.train.aspd_data import examples_from_sources
from paradec.train.tokenizer import ASPD_TOKENS

SOURCES = [
    '"""A module."""\n' + THREE_FUNCTIONS,
    "import os\n\n\ndef left(a):\n    return a + 1\n\n\ndef right(b):\n    return b * 2\n\n\nprint(1)\n",
]


@pytest.fixture(scope="module")
def aspd_tok():
    return make_tokenizer(512, stdlib_text(60_000), special=ASPD_TOKENS)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, aspd_tok):
    return make_checkpoint(
        tmp_path_factory.mktemp("aspd_base") / "base", tokenizer=aspd_tok, seed=5, tie_word_embeddings=True
    )


def test_adapter_files_load_as_the_merged_model(tmp_path, base_dir):
    base = load_model(base_dir, torch.float32)
    adapter = Adapter(base, AdapterConfig(base="../base", rank=4, alpha=8.0, token_ids=(1, 5)))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in adapter.parameters():
            p.copy_((torch.randn_like(p) * 0.05).to(torch.bfloat16).float())  # representable in the file
    out = base_dir.parent / "adapter"
    adapter.save(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((base_dir / name).read_bytes())
    x = torch.tensor([[3, 1, 9, 5, 22, 7]])
    expected = functional_call(base, adapter.merged(base), (x,))
    merged = paradec.load(out, dtype="fp32").model
    assert torch.allclose(merged(x), expected, atol=1e-4)
    assert not torch.allclose(base(x), expected, atol=1e-2)  # the adapter changes the model
    (out / "adapter.safetensors").write_bytes(b"junk")
    proc = subprocess.run(
        [sys.executable, "-m", "paradec", "generate", "--model", str(out), "x"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "adapter" in proc.stderr and "Traceback" not in proc.stderr


def _write_examples(root, tok):
    ex = examples_from_sources(SOURCES, tok)
    assert len(ex) == 2
    (root / "examples.json").write_text(
        json.dumps({"train": [asdict(e) for e in ex] * 4, "heldout": [asdict(e) for e in ex]})
    )


@pytest.mark.parametrize("twin", [False, True])
def test_training_learns_resumes_and_exports(tmp_path, base_dir, aspd_tok, twin):
    _write_examples(tmp_path, aspd_tok)
    run, out = tmp_path / "run", tmp_path / "out"
    cfg = AspdTrainConfig(
        twin=twin, rank=8, alpha=8.0, epochs=3, batch_size=2, lr=3e-3, warmup_steps=2, eval_every=1000, save_every=2
    )
    first = train_aspd(base_dir, out, run, cfg)
    assert first["done"] and first["steps"] == 12
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert first["heldout_loss"] < log[0]["heldout_loss"] - 0.3  # it learns the windows
    more = train_aspd(base_dir, out, run, AspdTrainConfig(**{**asdict(cfg), "epochs": 4}))
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert more["steps"] == 16 and [r["step"] for r in log if "loss" in r][12] == 13  # resumed, not restarted
    meta = json.loads((out / "adapter.json").read_text())
    assert (out / meta["base"]).resolve() == base_dir.resolve() and not meta["base"].startswith("/")
    assert bool(meta["token_ids"]) != twin  # the twin never sees markup tokens
    engine = paradec.load(out, dtype="fp32")
    assert engine.tokenizer.hf.get_vocab() == aspd_tok.get_vocab()


def test_parse_check_drops_the_unfinished_unit():
    text = "def a():\n    return 1\n\n\ndef b(:\n    retu"
    assert complete_part(text) == "def a():\n    return 1\n\n"
    assert parses(text)
    assert not parses("def a(:\n    return 1\n\ndef b():\n    pass")
    assert parses("    def m(self):\n        return 1\n\n    def n(self")  # methods, dedented
    assert not parses("def b(:\n")  # nothing complete


def test_bench_aspd_vs_ar_vs_seq_twin(tmp_path, base_dir, aspd_tok):
    _write_examples(tmp_path, aspd_tok)
    cfg = AspdTrainConfig(rank=4, alpha=4.0, epochs=1, batch_size=4, warmup_steps=1, save_every=100)
    train_aspd(base_dir, tmp_path / "aspd", tmp_path / "r1", cfg)
    train_aspd(base_dir, tmp_path / "twin", tmp_path / "r2", AspdTrainConfig(**{**asdict(cfg), "twin": True}))
    prompts = tmp_path / "p.txt"
    prompts.write_text("import os\n\n\ndef left(a):\n")
    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paradec",
            "bench",
            "--model",
            str(tmp_path / "aspd"),
            "--twin",
            str(tmp_path / "twin"),
            "--methods",
            "ar,aspd,aspd-r0,seq-twin,base-ar,aspd+spec",
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "12",
            "--dtype",
            "fp32",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "results.json").read_text())
    recs = {r["method"]: r for r in result["records"]}
    assert set(recs) == {"ar", "aspd", "aspd-r0", "seq-twin", "base-ar", "aspd+spec"}
    for r in recs.values():
        assert r["nll_twin"] > 0 and r["nll_base"] > 0 and isinstance(r["parses"], bool) and r["tokens_per_s"] > 0
    assert recs["aspd+spec"]["identical_to_aspd"] is True and recs["aspd"]["well_formed"] in (0.0, 1.0)
    assert recs["aspd"]["ppd"] in (0.0, 1.0) and "ppd" not in recs["ar"]  # PPD: the answer has a parallel group
    assert recs["aspd"]["identical_to_ar"] is None and recs["ar"]["identical_to_ar"] is True
    overall = {r["method"]: r for r in result["summary"] if r["category"] == "all"}
    assert overall["seq-twin"]["speedup_vs_seq-twin"] == 1.0 and overall["aspd"]["speedup_vs_ar"] > 0
    assert "nll_twin" in (out / "results.md").read_text()
