"""The CLI: the --json contract, and one-line errors with exit status 2 for bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import run_cli


def run(*args: str) -> subprocess.CompletedProcess:
    """The installed entry point, in an interpreter of its own."""
    return subprocess.run([sys.executable, "-m", "paradec", *args], capture_output=True, text=True, timeout=300)


def test_generate_json_contract(llama_dir):
    out = run(
        "generate",
        "--model",
        str(llama_dir),
        "--max-new-tokens",
        "12",
        "--ignore-eos",
        "--dtype",
        "fp32",
        "--json",
        "def f(x):",
    )
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("method", "text", "token_ids", "new_tokens", "steps", "tau", "wall_s", "tokens_per_s"):
        assert key in rec
    assert rec["method"] == "auto" and rec["new_tokens"] == len(rec["token_ids"]) == 12  # the default
    assert sum(rec["drafters"].values()) == rec["steps"] and rec["tokens_per_s"] > 0  # it says what drafted
    import paradec

    ar = paradec.load(llama_dir, dtype="fp32").generate("def f(x):", max_new_tokens=12, ignore_eos=True)
    assert rec["token_ids"] == ar.token_ids


def test_generate_streams_text(llama_dir):
    import paradec

    out = run(
        "generate", "--model", str(llama_dir), "--max-new-tokens", "12", "--ignore-eos", "--dtype", "fp32", "def f(x):"
    )
    expected = paradec.load(llama_dir, dtype="fp32").generate("def f(x):", max_new_tokens=12, ignore_eos=True)
    assert out.returncode == 0 and out.stdout == expected.text + "\n"


@pytest.fixture
def broken_dirs(tmp_path, llama_dir):
    """Directories with one thing wrong each."""

    def copy(name):
        d = tmp_path / name
        shutil.copytree(llama_dir, d)
        return d

    arch = copy("arch")
    cfg = json.loads((arch / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (arch / "config.json").write_text(json.dumps(cfg))
    noweights = copy("noweights")
    (noweights / "model.safetensors").unlink()
    corrupt = copy("corrupt")
    data = (corrupt / "model.safetensors").read_bytes()
    (corrupt / "model.safetensors").write_bytes(data[: len(data) // 2])
    dirs = {"arch": arch, "noweights": noweights, "corrupt": corrupt, "missing": tmp_path / "nope"}

    def edit(name, change):
        d = copy(name)
        raw = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(change(raw)))
        dirs[name] = d

    edit("cfg_list", lambda c: [c])
    edit("rope_str", lambda c: {**c, "rope_scaling": "linear"})
    edit("neg_vocab", lambda c: {**c, "vocab_size": -5})
    edit("zero_heads", lambda c: {**c, "num_attention_heads": 0})
    index = copy("bad_index")
    (index / "model.safetensors.index.json").write_text("[1, 2]")
    dirs["bad_index"] = index
    gen = copy("bad_gen")
    (gen / "generation_config.json").write_text('"eos"')
    dirs["bad_gen"] = gen
    return dirs


def _bad_heads(root, kind, llama_dir):
    """A heads directory with one thing wrong: its json, its weights, or their head count."""
    from safetensors.torch import save_file

    from paradec.config import ModelConfig
    from paradec.models.heads import MedusaHeads

    hidden = ModelConfig.from_dir(llama_dir).hidden_size
    d = root / f"heads_{kind}"
    d.mkdir()
    weights = {f"medusa.{k}": v.contiguous() for k, v in MedusaHeads(hidden, 2).state_dict().items()}
    save_file(weights, str(d / "heads.safetensors"))
    meta = {"hidden_size": hidden, "num_heads": 7 if kind == "count" else 2}
    (d / "heads.json").write_text("[oops" if kind == "json" else json.dumps(meta))
    if kind == "weights":
        (d / "heads.safetensors").write_bytes(b"\x00" * 10)
    return d


@pytest.mark.parametrize(
    "case, extra, needle",
    [
        ("missing", [], "does not exist"),
        ("arch", [], "unsupported architecture"),
        ("noweights", [], "no model.safetensors"),
        ("corrupt", [], "corrupt"),
        ("ok", ["--temperature", "-1"], "temperature"),
        ("ok", ["--top-p", "0"], "top_p"),
        ("ok", ["--top-k", "-3"], "top_k"),
        ("ok", ["--max-new-tokens", "0"], "max_new_tokens"),
        ("ok", ["--method", "magic"], "invalid choice: 'magic'"),
        ("ok", ["--dtype", "int3"], "invalid choice"),
        ("long", [], "context"),
        ("ok", ["--method", "specinfer", "--draft", "/no/such/draft"], "draft directory"),
        ("ok", ["--method", "specinfer", "--draft", "ROOTDIR"], "has no config.json; pass --draft"),  # not --model
        ("ok", ["--method", "specinfer"], "needs draft models"),
        ("ok", ["--method", "pld", "--expansion", "1,0"], "expansion"),
        ("ok", ["--method", "specinfer", "--draft", "SELF", "--expansion=100,100,100"], "the limit is 64"),
        ("ok", ["--temperature", "1", "--seed", "99999999999999999999999"], "seed must be in"),
        ("ok", ["--stop", ""], "stop string is empty"),
        ("bad_utf8", [], "not valid UTF-8"),
        ("cfg_list", [], "not a JSON object"),
        ("rope_str", [], "rope_scaling"),
        ("neg_vocab", [], "vocab_size = -5"),
        ("zero_heads", [], "num_attention_heads = 0"),
        ("bad_index", [], "malformed"),
        ("bad_gen", [], "generation_config.json is malformed"),
        ("ok", ["--method", "medusa", "--heads", "BADHEADS_json"], "heads.json"),
        ("ok", ["--method", "medusa", "--heads", "BADHEADS_weights"], "corrupt"),
        ("ok", ["--method", "medusa", "--heads", "BADHEADS_count"], "says 7 heads"),
    ],
)
def test_bad_input_is_one_line_exit_2(broken_dirs, llama_dir, case, extra, needle):
    prompt = "def f(x):"
    if case == "long":
        prompt = "x = 1\n" * 2000
    if case == "bad_utf8":
        prompt = os.fsdecode(b"caf\xe9 \xff")  # raw bytes in argv, as a shell passes them
    extra = [
        str(llama_dir) if a == "SELF" else str(broken_dirs["missing"].parent) if a == "ROOTDIR" else a for a in extra
    ]
    if any(a.startswith("BADHEADS") for a in extra):
        extra = [
            str(_bad_heads(broken_dirs["missing"].parent, a.split("_")[1], llama_dir))
            if a.startswith("BADHEADS")
            else a
            for a in extra
        ]
    out = run_cli("generate", "--model", str(broken_dirs.get(case, llama_dir)), *extra, prompt)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out.stderr, out.stderr


def test_bench_out_under_a_file_fails_before_the_run(tmp_path, llama_dir):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    prompts = tmp_path / "p.txt"
    prompts.write_text("def f(x):\n")
    out = run_cli(
        "bench",
        "--model",
        str(llama_dir),
        "--methods",
        "ar",
        "--prompts",
        str(prompts),
        "--out",
        str(blocker / "res"),
        "--max-new-tokens",
        "4",
    )
    assert out.returncode == 2 and "is a file" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_broken_pipe_is_quiet(llama_dir):
    cmd = (
        f"{sys.executable} -m paradec generate --model {llama_dir} --dtype fp32 --max-new-tokens 64 --ignore-eos "
        f"'def f(x):' | head -c 1"
    )
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_api_takes_one_stop_string_and_one_draft(llama_dir):
    import paradec

    engine = paradec.load(llama_dir, dtype="fp32", drafts=str(llama_dir))  # a path, not its characters
    assert len(engine.companions["drafts"]) == 1
    full = engine.generate("def f(x):", max_new_tokens=24, ignore_eos=True).text
    stop = full[5:7]
    assert (
        stop
        and engine.generate("def f(x):", max_new_tokens=24, ignore_eos=True, stop=stop).text == full[: full.find(stop)]
    )


def test_huge_max_new_tokens_is_capped_at_the_context(llama_dir):
    import paradec

    engine = paradec.load(llama_dir, dtype="fp32")
    out = engine.generate("def f(x):", max_new_tokens=10**12, ignore_eos=True)
    assert len(out.token_ids) + len(engine.tokenizer.encode("def f(x):")) == engine.model.config.context_length


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"\xff\xfe\x00binary", "not UTF-8"),
        (b"[1, 2]\n", "not a JSON object"),
        (b'{"question_id": 1, "choices": []}\n', "choices"),
        (b'{"text": "a"}\n', "is a file"),
    ],
)
def test_aspd_extract_bad_input(tmp_path, content, needle):
    inp = tmp_path / "answers.jsonl"
    inp.write_bytes(content)
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    out = run_cli(
        "aspd",
        "extract",
        str(inp),
        str(blocker / "out.jsonl") if needle == "is a file" else str(tmp_path / "out.jsonl"),
    )
    assert out.returncode == 2 and needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["generate", "--temperature", "1e-300", "x"], "too small to sample"),
        (["generate", "--method", "pld", "--temperature", "1e-45", "x"], "too small to sample"),
        (["generate", "--method", "ar", "--acceptor", "typical", "--temperature", "0.8", "x"], "acceptor 'typical'"),
        (["chat", "--system", os.fsdecode(b"caf\xe9 \xff")], "--system is not valid UTF-8"),
        (["convert", "gguf", "x.gguf", "FILE"], "is a file, not a directory"),
        (["bench", "--methods", "", "--prompts", "FILE", "--out", "OUT"], "--methods is empty"),
        (
            ["bench", "--methods", "ar", "--per-category", "0", "--prompts", "FILE", "--out", "OUT"],
            "--per-category must be >= 1",
        ),
        (["train", "heads", "--target", "MODEL", "--out", "OUT", "--early-layer", "99"], "--early-layer 99"),
        (["train", "target", "--tokenizer", "MODEL", "--out", "OUT", "--lr", "nan"], "--lr must be > 0"),
        (["serve", "--model", "MODEL", "--max-batch", "100000000"], "GB of KV cache"),
    ],
)
def test_bad_flags_fail_before_any_model_is_loaded(tmp_path, llama_dir, args, needle):
    """Each of these once gave a traceback, ran on, or failed only after a model load."""
    blocker = tmp_path / "file"
    blocker.write_text("x\n")
    args = [{"FILE": str(blocker), "MODEL": str(llama_dir), "OUT": str(tmp_path / "out")}.get(a, a) for a in args]
    if args[0] == "generate":
        args[1:1] = ["--model", str(llama_dir)]
    out = run_cli(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written
