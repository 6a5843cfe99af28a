"""The decode path's small ops in C (``models.native``): the same model as torch's path, and a
token's bits independent of the pass it is in (what greedy verification needs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import paradec
from paradec.models.native import _cpu_signature, library, pack_q4, pack_q8, q4_kernel, q8_kernel
from paradec.tree import ScratchTree, pass_tensors

pytestmark = pytest.mark.skipif(library() is None, reason="no C compiler here: the torch path runs")


def _pass(model, cache, ids: torch.Tensor, pos: torch.Tensor, mask, slots=None) -> torch.Tensor:
    """ids, pos [batch, n]; mask [batch, 1, n, span] bool or None -> logits [batch, n, vocab]."""
    with torch.inference_mode():
        return model.logits(model.hidden(ids, pos, mask, cache, slots=slots))


def _prefilled(model, prompt: torch.Tensor, room: int = 32):
    """A cache holding ``prompt`` [batch, n] (the prompt pass, which both paths share)."""
    cache = model.new_cache(prompt.shape[0], prompt.shape[1] + room)
    with torch.inference_mode():
        model.hidden(prompt, torch.arange(prompt.shape[1])[None].expand_as(prompt), None, cache, prefill=True)
    for row in range(prompt.shape[0]):
        cache.advance(row, prompt.shape[1])
    return cache


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_native_computes_the_torch_paths_model(checkpoints, dtype, monkeypatch):
    """A 6-token causal chain after a 9-token prompt: the C ops' logits are torch's up to rounding
    (in bf16 the tiny model's are even the same bits; fp32 shows the other attention's rounding)."""
    model = paradec.load(checkpoints["llama"], dtype=dtype).model
    assert model.runs_native()
    lib, calls = library(), []
    attend = lib.pd_attend
    monkeypatch.setattr(lib, "pd_attend", lambda *a: calls.append(1) or attend(*a))
    prompt, chain = torch.tensor([[5, 17, 33, 80, 2, 9, 41, 7, 11]]), torch.tensor([[3, 8, 13, 21, 34, 55]])
    pos = torch.arange(9, 15)[None]
    mask = torch.ones(1, 1, 6, 15, dtype=torch.bool)
    mask[..., 9:] = torch.ones(6, 6, dtype=torch.bool).tril()
    native = _pass(model, _prefilled(model, prompt), chain, pos, mask)
    assert len(calls) == model.config.num_layers  # one attention call a layer, in C
    model.set_native(False)
    assert not model.runs_native()
    torch_path = _pass(model, _prefilled(model, prompt), chain, pos, mask)
    tol = 2e-2 if dtype == "bf16" else 1e-4
    torch.testing.assert_close(native.float(), torch_path.float(), atol=tol * torch_path.abs().max().item(), rtol=0)
    if dtype == "fp32":
        assert not torch.equal(native, torch_path)


@pytest.mark.parametrize("dtype, quant", [("fp32", "int8"), ("bf16", "none"), ("fp32", "int4"), ("bf16", "int4")])
@pytest.mark.parametrize("length", [8, 45])
def test_a_tokens_bits_do_not_depend_on_the_pass(checkpoints, dtype, quant, length):
    """A token decoded alone (`ar` steps) == the same token inside a tree pass whose other
    nodes sit between it and its ancestors, at scattered slots, beside a second row of another
    length (the shapes a batched tree verification takes). fp32 activations show any 1-ulp
    difference (an attention score scaled by 1 + 2^-23 in passes of more than one token fails
    it), with int8 or int4 linears (their C kernels), whose rows do not depend on the row count
    (fp32 GEMMs' do); bf16 is the format whose rounding greedy verification depends on. A
    ``length``-token prompt: 45 puts the keys in every block size the attention scores at once
    (32 and 8 for one query, 16 and 8 for four) and in the tails after them."""
    model = paradec.load(checkpoints["llama"], dtype=dtype, quant=quant).model
    prompt = torch.tensor([[5, 17, 33, 80, 2, 9, 41, 7] * (length // 8) + [5, 17, 33, 80, 2, 9, 41][: length % 8]])
    path = [3, 8, 13]
    cache = _prefilled(model, prompt)
    alone = []
    for i, tok in enumerate(path):  # `ar`: one token a pass, each committed
        alone.append(_pass(model, cache, torch.tensor([[tok]]), torch.tensor([[length + i]]), None)[0, -1])
        cache.advance(0, 1)
    # a tree: node 0 = path[0]; nodes 1, 2 = a sibling branch; node 3 = path[1] (child of 0);
    # node 4 = path[2] (child of 3)
    tree_nodes = ScratchTree()
    for token, parent in ((path[0], -1), (99, 0), (98, 1), (path[1], 0), (path[2], 3)):
        tree_nodes.add(token, parent)
    nodes, pos, mask = pass_tensors([tree_nodes], 0, 5, [length])
    tree = _pass(model, _prefilled(model, prompt), nodes, pos, mask)[0]
    for got, want in zip((tree[0], tree[3], tree[4]), alone):
        assert torch.equal(got, want)
    # the same tree in row 1 of a batch whose row 0 has a longer prompt
    longer = length + 3
    long_prompt = torch.arange(1, longer + 1)[None]
    cache = model.new_cache(2, longer + 40)
    with cache.rows(0, 1) as sub, torch.inference_mode():
        model.hidden(long_prompt, torch.arange(longer)[None], None, sub, prefill=True)
        sub.advance(0, longer)
    with cache.rows(1, 1) as sub, torch.inference_mode():
        model.hidden(prompt, torch.arange(length)[None], None, sub, prefill=True)
        sub.advance(0, length)
    chain = ScratchTree()
    for i in range(5):
        chain.add(4, i - 1)
    ids, positions, both = pass_tensors([chain, tree_nodes], 0, 5, [longer, length])
    batched = _pass(model, cache, ids, positions, both)[1]
    for got, want in zip((batched[0], batched[3], batched[4]), alone):
        assert torch.equal(got, want)


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_quantized_linears_in_c(checkpoints, quant, monkeypatch):
    """The C kernels of int4/int8 layers (activations quantized to int8 in blocks of 32): the
    layer's product within the activations' rounding (a kernel that drops int4's block minimum or
    a block's scale is off by far more), each row's bits the same at every row count and tile
    position, and the ones a model's prompt and decode passes and LM head take."""
    model = paradec.load(checkpoints["qwen2"], dtype="fp32", quant=quant, prefill="kernel").model  # qkv: a bias
    assert model.runs_native()
    layers = [model.layers[0].attn.wqkv, model.layers[0].mlp.w_down, model.lm_head]
    g = torch.Generator().manual_seed(0)
    for layer in layers:
        kernel = layer.native_kernel()
        x = torch.randn(11, layer.in_features, generator=g)  # [rows, in]
        y = kernel(x)
        bias = 0 if layer.bias is None else layer.bias
        want = x @ layer.dequantized().T + bias
        assert ((y - want).norm() / want.norm()).item() < 2e-2
        alone = torch.cat([kernel(x[i : i + 1]) for i in range(len(x))])
        assert torch.equal(y, alone)
        for rows in (2, 3, 4, 5, 8):
            assert torch.equal(kernel(x[1 : 1 + rows]), alone[1 : 1 + rows])
    lib, calls = library(), []
    name = "pd_q4_linear" if quant == "int4" else "pd_q8_linear"
    for fn in (name, "pd_layers"):
        own = getattr(lib, fn)
        monkeypatch.setattr(lib, fn, lambda *a, fn=fn, own=own: calls.append(fn) or own(*a))
    cache = _prefilled(model, torch.tensor([[5, 17, 33]]))  # a prompt, no dense path asked for: C's too
    assert calls == [name] * 4 * model.config.num_layers
    _pass(model, cache, torch.tensor([[3]]), torch.tensor([[3]]), None)
    # the decode pass's layers in one call, then the head (int8 by default)
    assert calls[4 * model.config.num_layers :] == ["pd_layers"] + [name] * (quant == "int8")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_layout_groups_of_eight(dtype):
    """The kernels' layouts (``pack_q4``, ``pack_q8``: outputs in groups of 8, one a vector lane):
    each output the product with its own weights, at every row count, and int8's last group
    padded (13 outputs: a kernel that writes the padded lanes, or reads a group's bytes in
    another order, is off by far more than the activations' int8 rounding)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 96, generator=g)  # [rows, in]
    q8, s8 = torch.randint(-127, 128, (13, 96), generator=g, dtype=torch.int8), torch.rand(13, generator=g) / 50
    q4, d4 = torch.randint(0, 16, (16, 96), generator=g), torch.rand(16, 3, generator=g) / 50
    m4 = -8 * d4 + torch.rand(16, 3, generator=g) / 100
    cases = [
        (q8_kernel(*pack_q8(q8, s8), None, 13), q8.float() * s8[:, None]),
        (q4_kernel(*pack_q4(q4, d4, m4), None), q4.float() * d4.repeat_interleave(32, 1) + m4.repeat_interleave(32, 1)),
    ]
    for kernel, w in cases:
        y = kernel(x.to(dtype))
        assert y.dtype == dtype and y.shape == (6, len(w))
        want = x.to(dtype).float() @ w.T
        assert ((y.float() - want).norm() / want.norm()).item() < 2e-2
        assert torch.equal(y, torch.cat([kernel(x[i : i + 1].to(dtype)) for i in range(len(x))]))


@pytest.mark.skipif(
    not {"avx512_vnni", "avx_vnni"} & set(_cpu_signature().split()), reason="the CPU has no VNNI: one form only"
)
def test_vnni_kernels_equal_the_avx2_ones(monkeypatch):
    """Where the CPU has VNNI, the kernels add their byte products with vpdpbusd; the integer sums
    are the AVX2 form's, so every output is too, bit for bit (-DPD_NO_VNNI builds the AVX2 form)."""
    from paradec.models import native

    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 128, generator=g).to(torch.bfloat16)  # [rows, in]
    q8, s8 = torch.randint(-127, 128, (24, 128), generator=g, dtype=torch.int8), torch.rand(24, generator=g) / 50
    q4, d4 = torch.randint(0, 16, (24, 128), generator=g), torch.rand(24, 4, generator=g) / 50
    m4 = -8 * d4 + torch.rand(24, 4, generator=g) / 100

    def outputs():
        native.build_key.cache_clear()
        native.library.cache_clear()
        kernels = (q8_kernel(*pack_q8(q8, s8), None, 24), q4_kernel(*pack_q4(q4, d4, m4), None))
        return [k(x[:n]) for k in kernels for n in (1, 3, 5)]

    vnni = outputs()
    monkeypatch.setattr(native, "FLAGS", (*native.FLAGS, "-DPD_NO_VNNI"))
    avx2 = outputs()
    monkeypatch.undo()
    native.build_key.cache_clear()
    native.library.cache_clear()
    assert all(torch.equal(a, b) for a, b in zip(vnni, avx2))


@pytest.mark.parametrize(
    "dtype, quant, ckpt", [("fp32", "int4", "qwen2"), ("bf16", "int4", "llama"), ("bf16", "int8", "qwen2")]
)
def test_a_pass_in_one_call_is_the_pass_a_call_a_step(checkpoints, dtype, quant, ckpt, monkeypatch):
    """Where every linear is a quantized one in C, a decode pass runs its layers in one C call
    (``pd_layers``, one OpenMP region): the same bits as a C call a step, for a tree beside a
    second row of another length (Qwen2: the qkv bias added in C), and the K/V it writes."""
    from paradec.models import native

    def run(model):
        cache = model.new_cache(2, 40)
        for row, prompt in enumerate(([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [5, 17, 33, 80, 2, 9, 41, 7])):
            with cache.rows(row, 1) as sub, torch.inference_mode():
                model.hidden(torch.tensor([prompt]), torch.arange(len(prompt))[None], None, sub, prefill=True)
                sub.advance(0, len(prompt))
        tree, chain = ScratchTree(), ScratchTree()
        for token, parent in ((3, -1), (99, 0), (98, 1), (8, 0), (13, 3)):
            tree.add(token, parent)
        for i in range(5):
            chain.add(4 + i, i - 1)
        ids, positions, mask = pass_tensors([chain, tree], 0, 5, [11, 8])
        logits = _pass(model, cache, ids, positions, mask)
        return logits, cache.keys.clone(), cache.values.clone()

    model = paradec.load(checkpoints[ckpt], dtype=dtype, quant=quant, prefill="kernel").model
    lib, calls = library(), []
    layers = lib.pd_layers
    monkeypatch.setattr(lib, "pd_layers", lambda *a: calls.append(1) or layers(*a))
    one = run(model)
    assert len(calls) == 1
    monkeypatch.setattr(native, "ONE_CALL", False)
    model.set_native(None)  # the plan again, without the table
    steps = run(model)
    assert len(calls) == 1
    for a, b in zip(one, steps):
        assert torch.equal(a, b)


def test_the_library_is_built_once_and_reused(tmp_path):
    """Built into $PARADEC_HOME/native on first use; a second process finds it there."""
    env = {**os.environ, "PARADEC_HOME": str(tmp_path)}
    code = "from paradec.models.native import library; assert library() is not None"
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
    built = list((tmp_path / "native").glob("*.so"))
    assert len(built) == 1
    assert not [p for p in (tmp_path / "native").iterdir() if p.is_dir()]  # no half-built leftovers
