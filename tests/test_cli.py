"""The CLI: the --json contract, and one-line errors with exit status 2 for bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paradec", *args], capture_output=True, text=True,
                          timeout=300)


def test_generate_json_contract(llama_dir):
    out = run("generate", "--model", str(llama_dir), "--max-new-tokens", "12", "--ignore-eos",
              "--dtype", "fp32", "--json", "def f(x):")
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("method", "text", "token_ids", "new_tokens", "steps", "tau", "wall_s", "tokens_per_s"):
        assert key in rec
    assert rec["method"] == "ar" and rec["new_tokens"] == len(rec["token_ids"]) == 12
    assert rec["steps"] == 12 and rec["tau"] == 1.0 and rec["tokens_per_s"] > 0


def test_generate_streams_text(llama_dir):
    import paradec

    out = run("generate", "--model", str(llama_dir), "--max-new-tokens", "12", "--ignore-eos",
              "--dtype", "fp32", "def f(x):")
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
    return {"arch": arch, "noweights": noweights, "corrupt": corrupt, "missing": tmp_path / "nope"}


@pytest.mark.parametrize("case, extra, needle", [
    ("missing", [], "does not exist"),
    ("arch", [], "unsupported architecture"),
    ("noweights", [], "no model.safetensors"),
    ("corrupt", [], "corrupt"),
    ("ok", ["--temperature", "-1"], "temperature"),
    ("ok", ["--top-p", "0"], "top_p"),
    ("ok", ["--top-k", "-3"], "top_k"),
    ("ok", ["--max-new-tokens", "0"], "max_new_tokens"),
    ("ok", ["--method", "magic"], "unknown method"),
    ("ok", ["--dtype", "int3"], "invalid choice"),
    ("long", [], "context"),
    ("ok", ["--method", "specinfer", "--draft", "/no/such/draft"], "draft directory"),
    ("ok", ["--method", "specinfer"], "needs draft models"),
    ("ok", ["--method", "pld", "--expansion", "1,0"], "expansion"),
])
def test_bad_input_is_one_line_exit_2(broken_dirs, llama_dir, case, extra, needle):
    prompt = "def f(x):"
    if case == "long":
        prompt = "x = 1\n" * 2000
    out = run("generate", "--model", str(broken_dirs.get(case, llama_dir)), *extra, prompt)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out.stderr, out.stderr
