"""Quantized weights: the int8 / int4 layers against their dequantized weights, row invariance
(what makes verification exact), GGUF Q4_1 blocks recovered as they are, bf16 weights packed for
oneDNN only where rows stay invariant, and every lossless method greedy-identical to `ar` on a
quantized or packed model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import PROMPTS
from torch import nn

import paradec
from paradec.errors import ParadecError
from paradec.models import quant as quant_mod
from paradec.models.eagle import EagleHead
from paradec.models.quant import Int4Linear, Int8Linear, PackedLinear, pack_linears, quantize_linears
from paradec.testing import make_tokenizer, stdlib_text, write_gguf

LAYERS = {"int8": Int8Linear, "int4": Int4Linear}


def _linear(out: int, inp: int, seed: int = 0, bias: bool = False) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(inp, out, bias=bias)
    nn.init.normal_(layer.weight, std=0.05)
    return layer


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_matmul_equals_dequantized_weights(kind, dtype, rtol):
    """y == x @ dequantized.T up to the activations' rounding (fp32: 1e-5 of |y|max; bf16: 1e-2)."""
    layer = LAYERS[kind].from_linear(_linear(96, 128, bias=True).to(dtype))
    x = torch.randn(5, 128)
    y = layer(x.to(dtype)).float()
    ref = x.to(dtype).float() @ layer.dequantized().T + layer.bias.float()
    assert (y - ref).abs().max() <= rtol * ref.abs().max()


@pytest.mark.parametrize("kind", LAYERS)
def test_quantization_error_is_what_the_format_allows(kind):
    """int8: |w - w'| <= scale / 2 per channel; int4: <= scale / 2 per group of 32 (+ bf16 storage)."""
    w = _linear(64, 256).weight.detach()
    deq = LAYERS[kind].from_linear(_linear(64, 256)).dequantized()
    if kind == "int8":
        bound = w.abs().amax(1, keepdim=True) / 127 / 2
    else:
        g = w.view(64, 8, 32)
        bound = ((g.amax(-1) - g.amin(-1)) / 15 / 2 * 1.02 + 1e-3 * g.abs().amax(-1)).repeat_interleave(32, 1)
    assert ((w - deq).abs() <= bound + 1e-7).all()


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_do_not_depend_on_the_row_count(kind, dtype):
    layer = LAYERS[kind].from_linear(_linear(576 if kind == "int4" else 200, 1536).to(dtype))
    x = torch.randn(16, 1536).to(dtype)
    full = layer(x)
    for m in (1, 2, 3, 4, 8):
        assert torch.equal(layer(x[:m]), full[:m]), m


def test_q4_1_blocks_are_recovered_as_they_are(tmp_path):
    """A GGUF Q4_1 tensor loaded with quant=int4 holds the file's own 4-bit values, and its
    weights equal gguf-py's dequantization up to the bf16 storage of each group's scale/zero."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    tok = make_tokenizer(320, stdlib_text(40_000), special=("<|im_start|>", "<|im_end|>"))
    path = tmp_path / "q41.gguf"
    write_gguf(path, tok, hidden_size=128, intermediate_size=256, quant={"ffn_down": Q.Q4_1, "ffn_up": Q.Q4_1})
    engine = paradec.load(path, dtype="fp32", quant="int4")
    down = engine.model.layers[0].mlp.w_down
    assert isinstance(down, Int4Linear)
    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_down.weight")
    ref = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
    blocks = np.frombuffer(np.asarray(t.data).tobytes(), dtype=np.uint8).reshape(-1, 20)  # d, m (f16), 16 bytes
    nibbles = blocks[:, 4:]
    file_q = np.concatenate([nibbles & 0x0F, nibbles >> 4], 1).reshape(ref.shape)  # low nibbles first
    q, _, _ = Int4Linear.quantize(ref)
    assert np.array_equal(q.numpy(), file_q)
    deq = down.dequantized()
    d = torch.from_numpy(blocks[:, 0:2].copy().view(np.float16).astype(np.float32)).view(ref.shape[0], -1)
    tol = (d.abs() * 2**-7 * 17).repeat_interleave(32, 1)  # scale and zero rounded to bf16 (8 bits)
    assert ((deq - ref).abs() <= tol).all()


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K"])
def test_other_4_bit_gguf_blocks_keep_their_levels(tmp_path, qtype):
    """Q4_0 (symmetric, d * (q - 8)) and Q4_K (sub-blocks of 32, d * sc * q - dmin * m) blocks do
    not span min..max in 15 steps, yet load with quant=int4 onto their own 16 levels: weights equal
    gguf-py's dequantization up to the bf16 storage of scale and zero; the min/max grid re-rounds
    most of them by up to half a step."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    tok = make_tokenizer(320, stdlib_text(40_000), special=("<|im_start|>", "<|im_end|>"))
    path = tmp_path / f"{qtype}.gguf"
    write_gguf(path, tok, hidden_size=256, intermediate_size=256, quant={"ffn_down": Q[qtype]})
    down = paradec.load(path, dtype="fp32", quant="int4").model.layers[0].mlp.w_down
    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_down.weight")
    ref = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
    q, scale, zero = Int4Linear.quantize(ref)
    exact = ((q.float() - 8) * scale.repeat_interleave(32, 1) + zero.repeat_interleave(32, 1) - ref).abs()
    assert exact.max() <= 1e-5 * ref.abs().max()  # every block back on its own levels
    step, offset = scale.repeat_interleave(32, 1), zero.repeat_interleave(32, 1)
    bf16 = 2**-8 * (8 * step + offset.abs()) + 1e-7  # scale and zero each rounded to bf16
    assert ((down.dequantized() - ref).abs() <= bf16).all()
    span = ref.reshape(ref.shape[0], -1, 32)
    minmax = (span.amax(-1) - span.amin(-1)) / 15  # what a min..max grid would use
    assert (minmax.repeat_interleave(32, 1) < step * 0.999).float().mean() > 0.2  # it would differ


needs_onednn = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and quant_mod.packs_invariantly(1536, 576)),
    reason="this torch or CPU has no row-invariant oneDNN bf16 product (then nothing is packed: tested below)",
)


@needs_onednn
def test_packed_bf16_layer_multiplies_by_its_own_weights():
    """A packed layer computes x @ W.T + b up to bf16 rounding, and reads W back bit for bit."""
    plain = _linear(96, 128, bias=True).to(torch.bfloat16)
    layer = PackedLinear(plain)
    x = torch.randn(5, 128).to(torch.bfloat16)
    ref = x.float() @ plain.weight.float().T + plain.bias.float()
    assert (layer(x).float() - ref).abs().max() <= 1e-2 * ref.abs().max()
    assert torch.equal(layer.dequantized(), plain.weight.float())


def test_bf16_linears_are_packed_only_where_rows_stay_invariant(monkeypatch):
    """pack_linears packs bf16 layers the probe finds row-invariant, and whatever it packed gives a
    row the same bits at any row count; fp32 and quantized layers stay as they are; a CPU whose
    probe fails keeps plain layers."""
    model = nn.Sequential(_linear(576, 1536), _linear(200, 576, bias=True)).to(torch.bfloat16)
    model.append(Int8Linear.from_linear(_linear(64, 200).to(torch.bfloat16)))
    model.append(_linear(64, 64))  # fp32
    packed = pack_linears(model)
    assert set(packed) <= {"0", "1"} and isinstance(model[2], Int8Linear) and isinstance(model[3], nn.Linear)
    for name in ("0", "1"):
        layer = model[int(name)]
        assert (name in packed) == quant_mod.packs_invariantly(layer.in_features, layer.out_features, name == "1")
        assert isinstance(layer, PackedLinear) == (name in packed)
        if name not in packed:  # a plain bf16 product need not be row-invariant (models.decode.linear)
            continue
        x = torch.randn(40, layer.in_features).to(torch.bfloat16)
        full = layer(x)
        for m in (1, 2, 3, 4, 8, 17, 33):
            assert torch.equal(layer(x[:m]), full[:m]), (name, m)
    monkeypatch.setattr(quant_mod, "_INVARIANT", {})
    monkeypatch.setattr(quant_mod, "_probe", lambda *shape: False)
    plain = nn.Sequential(_linear(576, 1536)).to(torch.bfloat16)
    assert pack_linears(plain) == {} and isinstance(plain[0], nn.Linear)


@pytest.fixture(scope="module")
def quant_engines(llama_dir, drafters, tmp_path_factory):
    draft, heads = drafters
    eagle = tmp_path_factory.mktemp("eagle")
    torch.manual_seed(0)
    EagleHead(paradec.load(llama_dir).model.config).save(eagle, {})  # a random head: its trees vary
    kinds = [("int8", "fp32"), ("int8", "bf16"), ("int4", "fp32"), ("int4", "bf16"), ("packed", "bf16")]
    return {
        (q, dt): paradec.load(
            llama_dir, dtype=dt, drafts=[draft], heads=heads, eagle=eagle, quant="none" if q == "packed" else q
        )
        for q, dt in kinds
    }


@pytest.mark.parametrize(
    "quant, dtype", [("int8", "fp32"), ("int8", "bf16"), ("int4", "fp32"), ("int4", "bf16"), ("packed", "bf16")]
)
@pytest.mark.parametrize("method", ["pld", "specinfer", "medusa", "propd", "eagle", "eagle+ngram"])
def test_methods_are_lossless_against_the_quantized_model(quant_engines, quant, dtype, method):
    """... and against bf16 weights packed for oneDNN (plain ``nn.Linear``s where this CPU's
    probe says its packed product is not row-invariant)."""
    engine = quant_engines[(quant, dtype)]
    w_down = engine.model.layers[0].mlp.w_down
    if quant == "packed":
        cfg = engine.model.config
        expect = PackedLinear if quant_mod.packs_invariantly(cfg.intermediate_size, cfg.hidden_size) else nn.Linear
        assert type(w_down) is expect
    else:
        assert isinstance(w_down, Int8Linear if quant == "int8" else Int4Linear)
    ar = engine.generate(PROMPTS, max_new_tokens=20, ignore_eos=True)
    out = engine.generate(PROMPTS, method=method, max_new_tokens=20, ignore_eos=True)
    assert [g.token_ids for g in out] == [g.token_ids for g in ar]


def test_quantized_model_stays_close_to_the_original(llama_dir):
    """Logits' cosine similarity to the fp32 model: int8 > 0.999, int4 > 0.95 on random tiny
    weights (measured 0.9998 and 0.967; flipping one layer's int4 zeros gives 0.83)."""
    ids = torch.tensor([[5, 17, 33, 80, 2, 9]])
    pos = torch.arange(6)[None]
    base = paradec.load(llama_dir, dtype="fp32").model
    with torch.inference_mode():
        ref = base(ids, pos).flatten()
        for quant, least in (("int8", 0.999), ("int4", 0.95)):
            out = paradec.load(llama_dir, dtype="fp32", quant=quant).model(ids, pos).flatten()
            assert torch.nn.functional.cosine_similarity(out, ref, 0) > least, quant


def test_layers_that_do_not_fit_int4_fall_back_to_int8():
    model = nn.Sequential(nn.Linear(64, 40), nn.Linear(40, 64))  # out 40 is not a multiple of 16; in 40 not of 32
    formats = quantize_linears(model, "int4")
    assert formats == {"0": "int8", "1": "int8"}


def test_bad_quant_is_one_clear_error(llama_dir):
    with pytest.raises(ParadecError, match="unknown quant"):
        paradec.load(llama_dir, quant="int3")
