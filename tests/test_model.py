"""Our runtime against transformers' own classes: logits and greedy tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, VARIANTS
from transformers import AutoModelForCausalLM, AutoTokenizer

import paradec


@pytest.fixture(scope="module")
def pairs(checkpoints):
    out = {}
    for name, path in checkpoints.items():
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        out[name] = (hf, paradec.load(path, dtype="fp32"), AutoTokenizer.from_pretrained(path))
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers(pairs, name):
    hf, engine, _ = pairs[name]
    tokens = torch.randint(0, hf.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = hf(tokens).logits
        ours = engine.model(tokens)
    assert (ref - ours).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_matches_hf_generate(pairs, name):
    hf, engine, tok = pairs[name]
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            ref = hf.generate(
                ids, do_sample=False, max_new_tokens=24, min_new_tokens=24, pad_token_id=tok.eos_token_id
            )[0, ids.shape[1] :].tolist()
        ours = engine.generate(prompt, max_new_tokens=24, ignore_eos=True)
        assert ours.token_ids == ref
        assert ours.stats.steps == 24 and ours.stats.tau == 1.0


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_batch_equals_solo(pairs, name):
    _, engine, _ = pairs[name]
    solo = [engine.generate(p, max_new_tokens=20, ignore_eos=True).token_ids for p in PROMPTS]
    batch = engine.generate(PROMPTS, max_new_tokens=20, ignore_eos=True)
    assert [g.token_ids for g in batch] == solo


def test_bf16_runs_and_mostly_agrees(checkpoints):
    fp32 = paradec.load(checkpoints["llama"], dtype="fp32")
    bf16 = paradec.load(checkpoints["llama"], dtype="bf16")
    tokens = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        a, b = fp32.model(tokens), bf16.model(tokens).float()
    assert b.dtype == torch.float32 and (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.75


def test_stop_string_and_eos(pairs):
    _, engine, _ = pairs["llama"]
    full = engine.generate(PROMPTS[0], max_new_tokens=24, ignore_eos=True)
    stop = full.text[5:8]
    cut = engine.generate(PROMPTS[0], max_new_tokens=24, stop=[stop], ignore_eos=True)
    assert cut.finish_reason == "stop" and full.text.startswith(cut.text) and stop not in cut.text
    # make the first generated token an EOS: generation ends right there, EOS included
    eos = full.token_ids[0]
    engine.tokenizer.eos_ids = frozenset({eos})
    try:
        ended = engine.generate(PROMPTS[0], max_new_tokens=24)
    finally:
        engine.tokenizer.eos_ids = frozenset({engine.tokenizer.hf.eos_token_id})
    assert ended.token_ids == [eos] and ended.finish_reason == "eos"


def test_stream_concatenates_to_generate(pairs):
    _, engine, _ = pairs["llama"]
    full = engine.generate(PROMPTS[1], max_new_tokens=30, ignore_eos=True)
    pieces = list(engine.stream(PROMPTS[1], max_new_tokens=30, ignore_eos=True))
    assert len(pieces) > 1 and "".join(pieces) == full.text


def _cached_step(model, ids: torch.Tensor, through_blocks: bool = False) -> torch.Tensor:
    """A prompt pass, then one decode step of 3 tokens: ids [1, n + 3] -> the step's logits
    [1, 3, vocab]. The step runs the model's decode plan, or (``through_blocks``) each layer's
    ``Block.forward``, which captures the layer's kernels afresh on every call."""
    n = ids.shape[1] - 3
    cache = model.new_cache(1, ids.shape[1])
    with torch.inference_mode():
        model.hidden(ids[:, :n], torch.arange(n)[None], None, cache, prefill=True)
        cache.advance(0, n)
        mask = torch.ones(1, 1, 3, n + 3, dtype=torch.bool)
        mask[..., n:] = torch.ones(3, 3, dtype=torch.bool).tril()
        pos = torch.arange(n, n + 3)[None]
        if not through_blocks:
            return model.logits(model.hidden(ids[:, n:], pos, mask, cache))
        x, (cos, sin) = model.embed(ids[:, n:]), model.rope(pos, model.embed.weight.dtype)
        for block in model.layers:
            x = block(x, cos, sin, mask, cache)
        return model.logits(x)


@pytest.mark.parametrize("native", [False, True])
def test_decode_plan_follows_the_model(checkpoints, native):
    """The decode path runs from weights captured once (``Transformer.plan``); after a layer is
    quantized, the whole model cast, or ``set_exact`` called, the next pass must compute what
    the layers now are: on torch's path their own ``Block.forward``, bit for bit; on the C path
    (``models.native``, whose quantized linears differ from torch's kernels) a model given the
    same changes before its first pass, bit for bit."""
    from paradec.models.native import library
    from paradec.models.quant import quantize_linears

    if native and library() is None:
        pytest.skip("no C compiler here")
    ids = torch.tensor([[5, 17, 33, 80, 2, 9, 41, 7]])

    def loaded(*changes):
        model = paradec.load(checkpoints["llama"], dtype="fp32").model
        model.set_native(native)
        for change in changes:
            change(model)
        return model

    def want(*changes) -> torch.Tensor:
        """What the changed model computes: its blocks (torch's path) or a fresh plan (C)."""
        if not native:
            return _cached_step(model, ids, through_blocks=True)
        return _cached_step(loaded(*changes), ids)

    def quantized(m):
        quantize_linears(m, "int8")

    model = loaded()
    before = _cached_step(model, ids)  # the plan exists from here on
    assert model.runs_native() == native
    quantize_linears(model, "int8")
    after = want(quantized)
    assert not torch.equal(after, before)  # the change is visible at all
    assert torch.equal(_cached_step(model, ids), after)
    model.bfloat16()
    assert torch.equal(_cached_step(model, ids), want(quantized, lambda m: m.bfloat16()))
    assert model.runs_native() == native
    model.set_exact(False)
    assert torch.equal(_cached_step(model, ids), _cached_step(model, ids, through_blocks=True))
    assert not model.runs_native()
