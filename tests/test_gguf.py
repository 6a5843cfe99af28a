"""GGUF import: tiny GGUF files written here with gguf.GGUFWriter (llama.cpp's own writer).

The converted weights equal the gguf package's dequantization (q/k rows un-permuted), paradec's
logits equal transformers' own GGUF loader on the same file, greedy tokens are identical, the
tokenizer follows llama.cpp's pre-tokenizer rule, and bad files exit 2 leaving no cache entry.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import run_cli
from gguf import GGMLQuantizationType as Q

import paradec
from paradec.errors import ParadecError
from paradec.models import gguf as pgguf
from paradec.testing import make_tokenizer, stdlib_text, write_gguf

QUANT = {
    "token_embd": Q.Q8_0,
    "attn_q": Q.Q4_1,
    "attn_k": Q.F16,
    "attn_v": Q.Q4_0,
    "attn_output": Q.Q8_0,
    "ffn_gate": Q.Q4_K,
    "ffn_up": Q.Q6_K,
    "ffn_down": Q.Q4_1,
}


@pytest.fixture(scope="module")
def chat_tokenizer():
    return make_tokenizer(320, stdlib_text(40_000), special=("<|im_start|>", "<|im_end|>"))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, chat_tokenizer):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    originals = write_gguf(path, chat_tokenizer, quant=QUANT)
    return path, originals


@pytest.fixture(autouse=True)
def paradec_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PARADEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def hf_gguf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def logits_of(engine, ids):
    x = torch.tensor([ids])
    with torch.inference_mode():
        h = engine.model.hidden(x, torch.arange(len(ids))[None], None, None)
        return engine.model.lm_head(engine.model.norm(h))


def test_weights_equal_gguf_dequantization(tiny_gguf, tmp_path):
    import gguf
    from safetensors.torch import load_file

    path, originals = tiny_gguf
    out = pgguf.convert_gguf(path, tmp_path / "conv")
    ours = load_file(str(out / "model.safetensors"))
    reader = gguf.GGUFReader(str(path))
    names = pgguf.tensor_names(2)
    for t in reader.tensors:
        ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(n) for n in reversed(t.shape)])
        if ".attn_q." in t.name or ".attn_k." in t.name:
            ref = pgguf.unpermute(ref, 4 if ".attn_q." in t.name else 2)
        assert torch.equal(ours[names[t.name]], torch.from_numpy(np.array(ref, dtype=np.float32))), t.name
    # un-permuting gives back the HF row order exactly (an F32 tensor and an F16 one round-trip)
    assert torch.equal(
        ours["model.layers.0.input_layernorm.weight"], torch.from_numpy(originals["blk.0.attn_norm.weight"])
    )
    k = originals["blk.1.attn_k.weight"].astype(np.float16).astype(np.float32)
    assert torch.equal(ours["model.layers.1.self_attn.k_proj.weight"], torch.from_numpy(k))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_and_greedy_equal_transformers_gguf_loader(arch, chat_tokenizer, tmp_path):
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, chat_tokenizer, arch=arch, quant=QUANT, seed=3, tie=arch == "llama")
    engine = paradec.load(path, dtype="fp32")
    hf = hf_gguf_model(path)
    ids = engine.tokenizer.encode("def add(a, b):\n    return a + b\n")
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits
    assert torch.allclose(logits_of(engine, ids), ref, atol=1e-4, rtol=1e-4)
    ours = engine.generate(ids, max_new_tokens=16, ignore_eos=True).token_ids
    with torch.inference_mode():
        theirs = hf.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False)
    assert ours == theirs[0, len(ids) :].tolist()


def test_tokenizer_splits_digits_and_has_chat_template(tiny_gguf, chat_tokenizer):
    path, _ = tiny_gguf
    tok = paradec.load(path, dtype="fp32").tokenizer
    ids = tok.encode("x = 12345")
    digits = [tok.hf.decode([i]) for i in ids if tok.hf.decode([i]).strip().isdigit()]
    assert digits == list("12345")  # llama.cpp's smollm rule: every digit its own piece
    conv = tok.encode_messages([{"role": "user", "content": "hi"}])
    text = tok.hf.decode(conv)
    assert text.startswith("<|im_start|>user\nhi<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    assert tok.eos_ids == {chat_tokenizer.eos_token_id}


def test_cache_is_keyed_by_hash_and_converted_once(tiny_gguf, paradec_home):
    path, _ = tiny_gguf
    first = pgguf.resolve_model(path)
    assert first.parent == paradec_home / "models" and (first / pgguf.MARKER).is_file()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert pgguf.resolve_model(path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp


def test_interrupted_conversion_leaves_nothing(tiny_gguf, paradec_home, monkeypatch):
    path, _ = tiny_gguf

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("safetensors.torch.save_file", boom)
    with pytest.raises(KeyboardInterrupt):
        pgguf.resolve_model(path)
    assert not any((paradec_home / "models").iterdir())
    monkeypatch.undo()
    assert (pgguf.resolve_model(path) / pgguf.MARKER).is_file()  # and the next call converts


def _run(*args, env_home):
    import os

    env = {**os.environ, "PARADEC_HOME": str(env_home)}
    return subprocess.run(
        [sys.executable, "-m", "paradec", *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture(scope="module")
def bad_ggufs(tmp_path_factory, chat_tokenizer):
    root = tmp_path_factory.mktemp("bad")
    good = root / "good.gguf"
    write_gguf(good, chat_tokenizer, num_layers=1, hidden_size=256)
    data = good.read_bytes()
    (root / "corrupt.gguf").write_bytes(b"GGUF" + bytes(np.random.default_rng(0).integers(0, 256, 4000, np.uint8)))
    (root / "truncated.gguf").write_bytes(data[: len(data) // 2])
    (root / "notgguf.gguf").write_text("hello")
    write_gguf(root / "arch.gguf", chat_tokenizer, arch="gpt2", num_layers=1)
    write_gguf(root / "quant.gguf", chat_tokenizer, num_layers=1, quant={"ffn_up": Q.TQ2_0})
    write_gguf(root / "tensor.gguf", chat_tokenizer, num_layers=1, extra_tensor="rope_freqs.weight")
    return root


@pytest.mark.parametrize(
    "name,words",
    [
        ("corrupt.gguf", "corrupt or truncated"),
        ("truncated.gguf", "corrupt or truncated"),
        ("notgguf.gguf", "corrupt or truncated"),
        ("arch.gguf", "unsupported GGUF architecture 'gpt2'"),
        ("quant.gguf", "TQ2_0"),
        ("tensor.gguf", "rope_freqs.weight"),
        ("missing.gguf", "does not exist"),
    ],
)
def test_bad_gguf_exits_2_with_one_line_and_no_cache(bad_ggufs, tmp_path, name, words):
    home = tmp_path / "home"
    for args in (
        ["generate", "--model", str(bad_ggufs / name), "hi"],
        ["convert", "gguf", str(bad_ggufs / name), str(tmp_path / "out")],
    ):
        out = run_cli(*args, env={"PARADEC_HOME": str(home)})
        assert out.returncode == 2, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
        assert words in out.stderr
        assert not (home / "models").exists() or not any((home / "models").iterdir())
        assert not (tmp_path / "out").exists()


def test_convert_cli_writes_a_directory_transformers_loads(tiny_gguf, tmp_path):
    from transformers import AutoModelForCausalLM

    path, _ = tiny_gguf
    out = _run("convert", "gguf", str(path), str(tmp_path / "conv"), env_home=tmp_path / "home")
    assert out.returncode == 0, out.stderr
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "conv"), dtype=torch.float32).eval()
    engine = paradec.load(tmp_path / "conv", dtype="fp32")
    ids = engine.tokenizer.encode("import os")
    with torch.inference_mode():
        assert torch.allclose(logits_of(engine, ids), hf(torch.tensor([ids])).logits, atol=1e-4, rtol=1e-4)
    again = _run("convert", "gguf", str(path), str(tmp_path / "conv"), env_home=tmp_path / "home")
    assert again.returncode == 2 and "not empty" in again.stderr


def test_unpermute_inverts_llamacpp_permute():
    from paradec.testing import llamacpp_permute

    w = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)  # 64 rows: 1, 2 or 4 heads
    for heads in (1, 2, 4):
        assert np.array_equal(pgguf.unpermute(llamacpp_permute(w, heads), heads), w)
    with pytest.raises(ParadecError):
        pgguf.hf_config({"general.architecture": "falcon"}, 10, False)


def test_chat_is_multi_turn_through_the_template(tiny_gguf, tmp_path):
    """`paradec chat` streams each answer and feeds it back as the assistant's turn; the API takes
    the same messages; `generate --chat` is the one-turn case."""
    import os

    path, _ = tiny_gguf
    env = {**os.environ, "PARADEC_HOME": str(tmp_path / "home")}
    opts = ["--model", str(path), "--dtype", "fp32", "--max-new-tokens", "8", "--ignore-eos"]
    # a line that is not UTF-8 is one error line, and the conversation goes on without it
    out = subprocess.run(
        [sys.executable, "-m", "paradec", "chat", *opts],
        input=b"hello\n/reset\ncaf\xe9 \xff\nhi\nagain\n/exit\n",
        capture_output=True,
        timeout=300,
        env=env,
    )
    out.stdout, out.stderr = out.stdout.decode(), out.stderr.decode()
    assert out.returncode == 0 and "not valid UTF-8" in out.stderr and "Traceback" not in out.stderr, out.stderr
    engine = paradec.load(path, dtype="fp32")
    first = engine.generate([{"role": "user", "content": "hello"}], max_new_tokens=8, ignore_eos=True).text
    second = engine.generate([{"role": "user", "content": "hi"}], max_new_tokens=8, ignore_eos=True).text
    third = engine.generate(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": second},
            {"role": "user", "content": "again"},
        ],
        max_new_tokens=8,
        ignore_eos=True,
    ).text
    assert out.stdout == f"{first}\n{second}\n{third}\n"
    one = subprocess.run(
        [sys.executable, "-m", "paradec", "generate", "--chat", *opts, "hello"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert one.returncode == 0 and one.stdout == first + "\n"
    with pytest.raises(ParadecError, match="messages must be"):
        engine.generate([{"role": "robot", "content": "x"}])


def test_bench_feeds_the_second_turn_after_the_models_own_answer(tiny_gguf, tmp_path):
    from paradec.bench.harness import BenchConfig, encode_prompts
    from paradec.bench.prompts import load_prompts

    path, _ = tiny_gguf
    qfile = tmp_path / "question.jsonl"
    qfile.write_text(
        '{"question_id": 7, "category": "writing", "turns": ["first question", "second question"]}\n'
        '{"question_id": 8, "category": "math", "turns": ["only one"]}\n'
    )
    engine = paradec.load(path, dtype="fp32")
    cfg = BenchConfig(model=str(path), methods=("ar",), prompts=str(qfile), out=str(tmp_path / "o"), max_new_tokens=6)
    encoded = encode_prompts(engine, load_prompts(qfile), cfg)
    assert [p.id for p, _ in encoded] == ["7", "7/turn2", "8"]
    u1 = [{"role": "user", "content": "first question"}]
    answer = engine.generate(u1, max_new_tokens=6).text
    assert encoded[0][1] == engine.tokenizer.encode_messages(u1)
    assert encoded[1][1] == engine.tokenizer.encode_messages(
        u1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "second question"}]
    )
    plain = encode_prompts(engine, load_prompts(qfile), BenchConfig(**{**cfg.__dict__, "chat": False}))
    assert [p.id for p, _ in plain] == ["7", "8"] and plain[0][1] == engine.tokenizer.encode("first question")


def test_a_llamacpp_build_that_kills_its_process_is_refused_with_the_fix(tiny_gguf, paradec_home, monkeypatch):
    """llama.cpp's kernels are tried once in a child process before paradec runs them: a build that
    dies there (SIGILL, as a native build did on an AMX Xeon VM) is refused with the rebuild to do
    (backend=llamacpp) or passed over with a warning (auto), and the verdict is cached."""
    from paradec import engine as engine_mod
    from paradec.cpu import ParadecWarning
    from paradec.models import llamacpp

    path, _ = tiny_gguf
    monkeypatch.setattr(llamacpp, "PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    monkeypatch.setattr(llamacpp, "build_id", lambda: "test")
    monkeypatch.setattr(engine_mod, "llamacpp_available", lambda: True)
    with pytest.raises(ParadecError, match="SIGILL.*CMAKE_ARGS.*backend=torch"):
        paradec.load(path, backend="llamacpp")
    with pytest.warns(ParadecWarning, match="SIGILL"):
        engine = paradec.load(path, backend="auto", methods_used=("ar",), warmup=False)
    assert engine.model.backend == "torch"
    monkeypatch.setattr(llamacpp, "PROBE", "pass")  # cached per CPU and build: not tried again
    assert "SIGILL" in llamacpp.crashes(path, 1, paradec_home)
    assert llamacpp.crashes(path, 1, paradec_home / "elsewhere") is None
