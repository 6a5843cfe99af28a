"""A quantized model's dense prompt path (``cpu.prefill``, ``models.quant.dense_linear``): its
weights are the quantized layer's own, prompts take it and decode passes never do, every lossless
method stays token-identical to `ar` with it, a prompt gets the same text alone or batched, and the
verdict is measured once per CPU and kept."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS
from torch import nn

import paradec
from paradec.cpu import prefill as prefill_mod
from paradec.errors import ParadecError
from paradec.models import quant as quant_mod
from paradec.models.quant import DenseLinear, Int4Linear, Int8Linear


def _linear(out: int, inp: int) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(inp, out)
    nn.init.normal_(layer.weight, std=0.05)
    return layer


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
def test_the_dense_path_holds_the_weights_the_kernel_multiplies_by(kind):
    layer = kind.from_linear(_linear(64, 96), prefill="fp32")
    dense = layer.prefill_linear
    assert isinstance(dense, DenseLinear)
    torch.testing.assert_close(dense.weight, layer.dequantized(), rtol=0, atol=1e-6)
    x = torch.randn(40, 96)
    torch.testing.assert_close(dense(x), layer(x), rtol=1e-5, atol=1e-5)  # the same weights, another GEMM
    assert kind.from_linear(_linear(64, 96)).prefill_linear is None  # asked for only


@pytest.fixture(scope="module")
def dense_engine(llama_dir, drafters):
    """An int4 engine whose prompts take fp32 dense weights (every CPU has that path)."""
    draft, heads = drafters
    return paradec.load(llama_dir, dtype="bf16", quant="int4", prefill="fp32", drafts=[draft], heads=heads)


def test_the_prompt_path_can_be_named(llama_dir):
    kernel = paradec.load(llama_dir, dtype="bf16", quant="int4", prefill="kernel", warmup=False).model
    assert kernel.prefill_path is None and kernel.layers[0].mlp.w_down.prefill_linear is None
    with pytest.raises(ParadecError, match="unknown prefill 'dense'; use auto, kernel, bf16, fp32"):
        paradec.load(llama_dir, quant="int4", prefill="dense")
    with pytest.raises(ParadecError, match="prefill=bf16 cannot run here"):  # fp32 activations
        paradec.load(llama_dir, dtype="fp32", quant="int4", prefill="bf16", warmup=False)


def test_prompts_take_the_dense_path_and_decode_steps_the_kernel(dense_engine, monkeypatch):
    model = dense_engine.model
    assert model.prefill_path == "fp32" and model.layers[0].mlp.w_down.prefill_linear is not None
    calls = {"dense": 0, "kernel": 0}
    dense_fwd = DenseLinear.forward

    def dense(self, x):
        calls["dense"] += 1
        return dense_fwd(self, x)

    def counting(own):  # decode passes call the closure the decode plan captured (C's or torch's)
        def kernel(self):
            mm = own(self)

            def counted(x):
                calls["kernel"] += 1
                return mm(x)

            return None if mm is None else counted

        return kernel

    monkeypatch.setattr(DenseLinear, "forward", dense)
    monkeypatch.setattr(Int4Linear, "kernel", counting(Int4Linear.kernel))
    monkeypatch.setattr(Int4Linear, "native_kernel", counting(Int4Linear.native_kernel))
    model.set_exact(model.exact)  # the decode plan is captured again, with the counting kernels
    layers = len(model.layers)
    dense_engine.generate(PROMPTS[0], max_new_tokens=3, ignore_eos=True)
    assert calls["dense"] == 4 * layers  # one prompt pass: qkv, o, gate_up, down per layer
    assert calls["kernel"] == 3 * 4 * layers  # three decode steps


@pytest.mark.parametrize("method", ["pld", "specinfer", "medusa", "auto"])
def test_methods_stay_lossless_with_the_dense_prompt_path(dense_engine, method):
    ar = dense_engine.generate(PROMPTS, max_new_tokens=20, ignore_eos=True)
    out = dense_engine.generate(PROMPTS, method=method, max_new_tokens=20, ignore_eos=True)
    assert [g.token_ids for g in out] == [g.token_ids for g in ar]


def test_a_prompt_is_prefilled_alone_and_gets_the_same_text_batched(dense_engine, monkeypatch):
    """The dense products' bits depend on the row count, so each prompt of a batch takes passes of
    its own: the same shapes, and so the same K/V, as alone."""
    shapes = []
    forward = DenseLinear.forward

    def spy(self, x):
        shapes.append(tuple(x.shape[:-1]))
        return forward(self, x)

    monkeypatch.setattr(DenseLinear, "forward", spy)
    together = dense_engine.generate(PROMPTS, max_new_tokens=16, ignore_eos=True)
    lengths = [len(dense_engine.encode(p)) - 1 for p in PROMPTS]  # the prompt but its last token
    assert sorted(set(shapes)) == sorted({(1, n) for n in lengths if n})
    alone = [dense_engine.generate(p, max_new_tokens=16, ignore_eos=True) for p in PROMPTS]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]


def test_the_verdict_is_measured_once_per_cpu_and_bounded_by_memory(llama_dir, tmp_path, monkeypatch):
    model = paradec.load(llama_dir, dtype="bf16", quant="none", pack=False, warmup=False).model  # as load has it
    profile = tmp_path / "cpu-model.json"
    measured = []

    def fake(shapes, quant, dtype):
        measured.append(quant)
        return {"seconds": {"kernel": 3.0, "fp32": 1.0}, "usable": ["fp32"]}

    monkeypatch.setattr(prefill_mod, "measure", fake)
    monkeypatch.setattr(prefill_mod, "OthersWatch", lambda: type("W", (), {"share": lambda self: 0.0})())
    assert prefill_mod.prefill_path(model, "int4", profile) == "fp32"
    assert prefill_mod.prefill_path(model, "int4", profile) == "fp32"
    assert measured == ["int4"]  # the second load read it back
    assert prefill_mod.prefill_path(model, "none", profile) is None  # nothing quantized: nothing to do
    monkeypatch.setattr(prefill_mod, "_memory_bytes", lambda: 1000)
    assert prefill_mod.prefill_path(model, "int4", profile) is None  # no room for a dense copy


def test_the_measurement_times_what_this_cpu_can_run():
    """bf16 weights only for bf16 activations; each path timed on the shapes it is given."""
    out = prefill_mod.measure([(64, 96, False)], "int4", torch.float32, reps=1)
    assert set(out["seconds"]) == {"kernel", "fp32"} and set(out["usable"]) <= {"fp32"}
    if quant_mod.packs_invariantly(64, 96):  # oneDNN packs bf16 on this CPU
        assert "bf16" in prefill_mod.measure([(64, 96, False)], "int8", torch.bfloat16, reps=1)["seconds"]
