"""`paradec bench` smoke test: every method on a tiny model, schema and losslessness."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_cli

from paradec.bench.harness import BenchConfig, bench_methods, method_needs
from paradec.bench.prompts import load_prompts
from paradec.draft.datastore import Datastore
from paradec.errors import ParadecError
from paradec.models.heads import EarlyHead, Heads, MedusaHeads, save_heads
from paradec.testing import make_checkpoint


def _short(tokens: int) -> list[str]:
    """A bench run's length and format flags: ``tokens`` new tokens in fp32 (tiny models)."""
    return ["--max-new-tokens", str(tokens), "--dtype", "fp32"]


def test_bench_every_method(tmp_path, llama_dir, tokenizer):  # aspd: tests/test_aspd_train.py
    # (aspd: tests/test_aspd_train.py; llama.cpp, an optional extra: test_bench_llamacpp_peer)
    methods = [m for m in bench_methods() if not {"aspd_model", "gguf"} & method_needs(m)]
    draft = make_checkpoint(tmp_path / "draft", tokenizer=tokenizer, seed=21, num_layers=1)
    torch.manual_seed(0)
    medusa, early = MedusaHeads(64, 2), EarlyHead(64, 1e-6)
    for p in list(medusa.parameters()) + list(early.block.parameters()):
        torch.nn.init.normal_(p, std=0.3)
    save_heads(
        Heads(medusa, early, 1, {"rank_accuracy": [[0.4, 0.2], [0.2, 0.1]], "tree_nodes": 4}), tmp_path / "heads"
    )
    from paradec.models import load_model
    from paradec.models.eagle import EagleHead

    EagleHead(load_model(llama_dir).config).save(tmp_path / "eagle", {})
    Datastore.build([tokenizer("def add(a, b):\n    return a + b\n").input_ids]).save(tmp_path / "datastore")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps({"question_id": i, "category": c, "turns": [t]})
            for i, (c, t) in enumerate([("code", "def add(a, b):"), ("prose", "The quick brown fox")])
        )
    )
    out = tmp_path / "out"
    proc = run_cli(
        "bench",
        "--model",
        str(llama_dir),
        "--draft",
        str(draft),
        "--heads",
        str(tmp_path / "heads"),
        "--eagle",
        str(tmp_path / "eagle"),
        "--datastore",
        str(tmp_path / "datastore"),
        "--methods",
        ",".join(methods),
        "--prompts",
        str(prompts),
        *_short(16),
        "--out",
        str(out),
        # fixed trees, no draft budget: what is verified must not depend on this CPU's speed
        "--tree-nodes",
        "4",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "results.json").read_text())
    assert {"config", "machine", "records", "summary", "peak_rss_mb"} <= set(result)
    assert len(result["records"]) == 2 * len(methods)
    for rec in result["records"]:
        assert rec["new_tokens"] == 16 and rec["tokens_per_s"] > 0 and rec["identical_to_ar"] is True
    overall = {r["method"]: r for r in result["summary"] if r["category"] == "all"}
    assert set(overall) == set(methods)
    for m in (
        "ar",
        "specinfer",
        "specinfer+ngram",
        "pld",
        "oracle",
        "medusa",
        "medusa+prune",
        "medusa+dynamic",
        "propd",
        "eagle",
        "eagle+propd",
        "rest",
    ):
        assert overall[m]["identical_to_ar"] == 1.0 and overall[m]["tau"] >= 1.0
    assert overall["oracle"]["tau"] > 4  # a perfect 8-deep chain commits ~9 tokens per pass
    assert {"code", "prose"} <= {r["category"] for r in result["summary"]}
    assert (out / "results.md").read_text().startswith("| category")
    assert (out / "speedup.png").stat().st_size > 1000 and (out / "tau_step_time.png").stat().st_size > 1000


def test_bench_tree_nodes_sets_fixed_trees_only(tmp_path, llama_dir):
    """--tree-nodes N: medusa and eagle verify N nodes a step (one budget to compare drafters
    at); a method whose cost model sizes its tree keeps doing so; N out of range exits 2."""
    from paradec.models import load_model
    from paradec.models.eagle import EagleHead

    torch.manual_seed(0)
    save_heads(
        Heads(MedusaHeads(64, 2), EarlyHead(64, 1e-6), 1, {"rank_accuracy": [[0.4, 0.2], [0.2, 0.1]], "tree_nodes": 8}),
        tmp_path / "heads",
    )
    EagleHead(load_model(llama_dir).config).save(tmp_path / "eagle", {})
    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\n\nThe quick brown fox\n")
    base = [
        "bench",
        "--model",
        str(llama_dir),
        "--heads",
        str(tmp_path / "heads"),
        "--eagle",
        str(tmp_path / "eagle"),
        "--prompts",
        str(prompts),
        *_short(12),
    ]
    proc = run_cli(
        *base, "--methods", "ar,medusa,eagle,eagle+propd", "--tree-nodes", "3", "--out", str(tmp_path / "out")
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    nodes = {r["method"]: r["nodes_per_step"] for r in result["summary"] if r["category"] == "all"}
    assert nodes["eagle"] == 4 and 1 < nodes["medusa"] <= 4  # 3 drafted nodes + the root (heads' own size: 8)
    assert result["config"]["options"] == {"tree_nodes": 3} and result["config"]["full_trees"]
    bad = run_cli(*base, "--methods", "medusa", "--tree-nodes", "65", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "tree" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_bench_resumes_after_the_last_finished_group(tmp_path, llama_dir):
    """An interrupted run leaves OUT/partial.json; the same command keeps its finished groups
    (not re-timed) and runs the rest; a checkpoint of another configuration is refused (exit 2)
    and left as it was."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\n\nThe quick brown fox\n\nclass Stack:\n")
    out = tmp_path / "out"
    cmd = [
        "bench",
        "--model",
        str(llama_dir),
        "--methods",
        "ar,pld",
        "--prompts",
        str(prompts),
        *_short(8),
        "--out",
        str(out),
    ]
    assert run_cli(*cmd).returncode == 0
    full = json.loads((out / "results.json").read_text())
    assert not (out / "partial.json").exists() and len(full["records"]) == 6
    first = [dict(r, wall_s=999.0) for r in full["records"] if r["prompt_id"] == full["records"][0]["prompt_id"]]
    (out / "partial.json").write_text(json.dumps({"config": full["config"], "groups_done": 1, "records": first}))
    proc = run_cli(*cmd)
    assert proc.returncode == 0, proc.stderr
    resumed = json.loads((out / "results.json").read_text())
    assert [r["prompt_id"] for r in resumed["records"]] == [r["prompt_id"] for r in full["records"]]
    assert [r["wall_s"] == 999.0 for r in resumed["records"]] == [True, True, False, False, False, False]
    assert all(r["identical_to_ar"] for r in resumed["records"]) and not (out / "partial.json").exists()
    other = json.dumps({"config": {**full["config"], "max_new_tokens": 9}, "groups_done": 1, "records": first})
    (out / "partial.json").write_text(other)
    bad = run_cli(*cmd)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "partial.json" in bad.stderr
    assert (out / "partial.json").read_text() == other


def test_bench_lockstep_steps_the_engines_methods_in_turn(tmp_path, llama_dir, monkeypatch):
    """--lockstep: the default engine's methods (ar, pld) are decoded together by the demo's
    lockstep (one step of each in turn: tests/test_scheduler.py), once per prompt and repeat,
    each timed on its own and identical to `ar`; a peer (the oracle) runs whole beside them;
    with a batch of 2 it is a clear error."""
    from paradec.bench import runners
    from paradec.bench.harness import run_bench

    prompts = tmp_path / "p.txt"
    prompts.write_text("a b c d e f g a b c d e f g a b c\nx = 1; y = 2; x = 1; y = 2\n")
    calls = []
    lockstep = runners.lockstep

    def spy(engine, ids, methods, max_new_tokens, budgets):
        calls.append((list(methods), {m: o["method"] for m, o in methods.items()}, id(budgets)))
        return lockstep(engine, ids, methods, max_new_tokens, budgets)

    monkeypatch.setattr(runners, "lockstep", spy)
    cfg = dict(model=str(llama_dir), prompts=str(prompts), max_new_tokens=10, dtype="fp32", repeats=2)
    result = run_bench(
        BenchConfig(methods=("ar", "pld", "oracle"), out=str(tmp_path / "o"), lockstep=True, **cfg), progress=False
    )
    assert len(calls) == 4 and all(sorted(c[0]) == ["ar", "pld"] and c[1] == {"ar": "ar", "pld": "pld"} for c in calls)
    assert len({c[2] for c in calls}) == 1  # every call: the same budgets (one per method, as bench keeps them)
    records = {(r["prompt_id"], r["method"]): r for r in result["records"]}
    assert len(records) == 6 and all(r["identical_to_ar"] for r in records.values())
    assert all(r["wall_s"] > 0 and r["new_tokens"] == 10 for r in records.values())
    with pytest.raises(ParadecError, match="lockstep"):
        BenchConfig(methods=("ar", "pld"), out=str(tmp_path / "b"), lockstep=True, batch_size=2, **cfg)


def test_prompt_formats(tmp_path):
    plain = tmp_path / "p.txt"
    plain.write_text("first prompt\n\nsecond prompt\n")
    assert [p.text for p in load_prompts(plain)] == ["first prompt", "second prompt"]
    he = tmp_path / "he.jsonl"
    he.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    assert load_prompts(he)[0].text == "def f():\n" and load_prompts(he)[0].id == "HumanEval/0"


def test_bench_bad_input_exit_2(tmp_path, llama_dir):
    proc = run_cli(
        "bench",
        "--model",
        str(llama_dir),
        "--methods",
        "ar,warp",
        "--prompts",
        str(tmp_path / "none.txt"),
        "--out",
        str(tmp_path / "o"),
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_bench_quant_suffix_and_llamacpp_peer(tmp_path):
    """`ar@int4` runs next to `ar` and is compared with `ar` in its own format (`oracle@fp32`
    follows fp32's own `ar`); llama.cpp (when llama-cpp-python is installed) decodes the same
    GGUF file greedily."""
    from paradec.testing import make_tokenizer, stdlib_text, write_gguf

    methods = ["ar", "ar@int4", "pld@int4", "ar@fp32", "oracle@fp32"]
    try:
        import llama_cpp  # noqa: F401

        methods += ["llamacpp", "llamacpp-pld"]
    except ImportError:
        pass
    tok = make_tokenizer(320, stdlib_text(40_000), special=("<|im_start|>", "<|im_end|>"))
    model = tmp_path / "tiny.gguf"
    write_gguf(model, tok, num_layers=1)
    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\n\nimport os\n")
    out = tmp_path / "out"
    proc = run_cli(
        "bench",
        "--model",
        str(model),
        "--methods",
        ",".join(methods),
        "--prompts",
        str(prompts),
        *_short(12),
        "--tree-nodes",  # drafters compared at one size: the draft budget, which follows this CPU's speed, cuts nothing
        "8",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    records = json.loads((out / "results.json").read_text())["records"]
    assert {r["method"] for r in records} == set(methods)
    for r in records:
        assert r["new_tokens"] == 12
        if "@" in r["method"]:
            assert r["identical_to_ar"] is True  # vs ar@int4, ar@fp32
    assert next(r for r in records if r["method"] == "oracle@fp32")["tau"] > 3  # it knew fp32's text
    for bad in ("hf@llamacpp", "eagle@llamacpp", "hf@int4"):  # a peer, or a method that runs on torch only
        with pytest.raises(ParadecError, match=bad.replace("+", "[+]")):
            BenchConfig(model=str(model), prompts=str(prompts), methods=(bad,), out=str(tmp_path / "bad"))


def test_bench_serve_methods_take_turns_and_every_request_counts(monkeypatch):
    from paradec.bench import serve as bs

    calls = []

    def fake(client, model, prompts, method, concurrency, span, max_tokens, every=0):
        calls.append((method, len(span)))
        return [bs._Sample(ttft=0.01, tokens=4) for _ in span], 0.5

    monkeypatch.setattr(bs, "_requests", fake)
    rows = bs.run_interleaved(None, "m", [], ["ar", "auto", "pld"], concurrency=2, requests=9, max_tokens=8, rounds=3)
    assert [m for m, _ in calls] == ["ar", "auto", "pld", "auto", "pld", "ar", "pld", "ar", "auto"]
    assert [r["requests"] for r in rows] == [9, 9, 9] and [r["method"] for r in rows] == ["ar", "auto", "pld"]
    assert rows[0]["tokens_per_s"] == round(9 * 4 / 1.5, 2)  # every round's tokens over every round's wall
