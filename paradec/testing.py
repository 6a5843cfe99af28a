"""Tiny random-weight Hugging Face checkpoints for tests and benchmarks (nothing downloaded).

``make_checkpoint(dir, family="llama", ...)`` writes config.json, model.safetensors and a
byte-level BPE tokenizer trained on a few standard-library files, using transformers' own model
classes, so the same directory is the oracle (transformers) and the subject (paradec).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

FAMILIES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}
EOS = "<|endoftext|>"


def stdlib_text(max_chars: int = 400_000) -> str:
    """Some Python standard-library source: a corpus every Python install has."""
    root = Path(os.__file__).parent
    out, total = [], 0
    for name in sorted(root.glob("*.py")):
        text = name.read_text(encoding="utf-8", errors="replace")
        out.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return "\n".join(out)


def make_tokenizer(vocab_size: int, text: str | None = None, special: tuple[str, ...] = ()):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with exactly ``vocab_size`` entries at most."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, *special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text if text is not None else stdlib_text()], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS)


def make_checkpoint(
    out_dir: str | Path,
    family: str = "llama",
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    init_std: float = 0.08,
    max_position_embeddings: int = 512,
    tokenizer=None,
    **config_kwargs,
) -> Path:
    """Write a random-init ``family`` checkpoint + tokenizer to ``out_dir`` and return it."""
    import transformers

    out_dir = Path(out_dir)
    tok = tokenizer or make_tokenizer(vocab_size)
    cfg_cls = getattr(transformers, FAMILIES[family])
    cfg = cfg_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        intermediate_size=intermediate_size or 3 * hidden_size,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=init_std,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **config_kwargs,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    if family == "qwen2":  # random biases, so a missing bias would show in parity tests
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=init_std)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


# ---- tiny GGUF files, written the way llama.cpp's converter writes them ----------------------
GGUF_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_chat_gguf(path: str | Path, seed: int = 0, **shapes) -> Path:
    """A tiny random chat GGUF (a BPE tokenizer with <|im_start|>/<|im_end|> and the chat template):
    what the chat recipes need of the default model, in a second."""
    tok = make_tokenizer(320, stdlib_text(40_000), special=("<|im_start|>", "<|im_end|>"))
    kw = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, seed=seed)
    write_gguf(path, tok, **{**kw, **shapes})
    return Path(path)


def llamacpp_permute(w, n_heads: int):
    """llama.cpp's q/k row order (convert_hf_to_gguf's ``LlamaModel.permute``), w [n_heads * head_dim, ...]."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_block(values, qtype):
    """values [rows, cols] float32 -> quantized bytes [rows, bytes] of ``qtype``. The K-quants,
    which gguf-py cannot quantize, get random blocks with small finite scales (any such block
    is a valid tensor to dequantize)."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    if qtype in (Q.F32, Q.F16):
        return values.astype(np.float32 if qtype == Q.F32 else np.float16)
    if qtype not in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        return quantize(values, qtype)
    size = {Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}[qtype]
    rng = np.random.default_rng(int(abs(values).sum() * 1000) % 2**32)
    rows, blocks = values.shape[0], values.shape[1] // 256
    raw = rng.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    if qtype == Q.Q6_K:  # ql, qh, int8 scales, then d
        raw[..., 208:210] = scale
    else:  # d, dmin first
        raw[..., 0:2] = scale
        raw[..., 2:4] = scale
    return raw.reshape(rows, blocks * size)


def write_gguf(
    path: str | Path,
    tokenizer,
    arch: str = "llama",
    hidden_size: int = 256,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    seed: int = 0,
    quant: dict | None = None,
    pre: str = "smollm",
    tie: bool = True,
    extra_tensor: str | None = None,
    std: float = 0.08,
):
    """A random-weight ``arch`` GGUF file with ``tokenizer``'s vocabulary (gpt2-style BPE).

    quant: GGUF tensor-name fragment -> GGMLQuantizationType (default: F32 everywhere). q/k rows
    are permuted as llama.cpp's converter does for llama. Returns the original (HF-order) fp32
    weights by HF name, before quantization.
    """
    import json

    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = sorted(vocab["vocab"], key=vocab["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in vocab["merges"]]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_block_count(num_layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden_size)
    w.add_feed_forward_length(intermediate_size)
    w.add_head_count(num_heads)
    w.add_head_count_kv(num_kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    _add_gguf_vocab(w, tokenizer, tokens, merges, pre)
    quant = quant or {}
    dims = (hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size)
    shapes = _gguf_shapes(arch, len(tokens), *dims, tie=tie)
    if extra_tensor:
        shapes[extra_tensor] = (hidden_size,)
    originals = _add_gguf_tensors(w, shapes, arch, quant, rng, std, num_heads, num_kv_heads)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return originals


def _add_gguf_tensors(w, shapes: dict, arch: str, quant: dict, rng, std: float, num_heads: int, num_kv_heads: int):
    """Random tensors of ``shapes`` (norms near 1), q/k rows permuted as llama.cpp's converter does
    for llama, each quantized as ``quant`` says -> the original fp32 arrays by GGUF name."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q

    originals = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            values = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            values = (std * rng.standard_normal(shape)).astype(np.float32)
        originals[name] = values
        stored = values
        if arch in ("llama", "mistral") and (".attn_q." in name or ".attn_k." in name):
            stored = llamacpp_permute(values, num_heads if ".attn_q." in name else num_kv_heads)
        qtype = next((q for frag, q in quant.items() if frag in name), Q.F32) if len(shape) == 2 else Q.F32
        data = _gguf_block(np.ascontiguousarray(stored), qtype)
        w.add_tensor(name, data, raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)
    return originals


def _add_gguf_vocab(w, tokenizer, tokens: list[str], merges: list[str], pre: str) -> None:
    """The gpt2-style BPE vocabulary, its special ids and a chat template, as GGUF metadata."""
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokenizer.bos_token_id)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_chat_template(GGUF_CHAT_TEMPLATE)


def _gguf_shapes(
    arch: str,
    vocab: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    tie: bool = True,
) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> shape of a ``arch`` model (llama.cpp's names; qwen2 adds q/k/v biases)."""
    head_dim = hidden_size // num_heads
    shapes = {"token_embd.weight": (vocab, hidden_size), "output_norm.weight": (hidden_size,)}
    if not tie:
        shapes["output.weight"] = (vocab, hidden_size)
    for i in range(num_layers):
        shapes.update(
            {
                f"blk.{i}.attn_norm.weight": (hidden_size,),
                f"blk.{i}.ffn_norm.weight": (hidden_size,),
                f"blk.{i}.attn_q.weight": (num_heads * head_dim, hidden_size),
                f"blk.{i}.attn_k.weight": (num_kv_heads * head_dim, hidden_size),
                f"blk.{i}.attn_v.weight": (num_kv_heads * head_dim, hidden_size),
                f"blk.{i}.attn_output.weight": (hidden_size, num_heads * head_dim),
                f"blk.{i}.ffn_gate.weight": (intermediate_size, hidden_size),
                f"blk.{i}.ffn_up.weight": (intermediate_size, hidden_size),
                f"blk.{i}.ffn_down.weight": (hidden_size, intermediate_size),
            }
        )
        if arch == "qwen2":
            shapes.update(
                {
                    f"blk.{i}.attn_q.bias": (num_heads * head_dim,),
                    f"blk.{i}.attn_k.bias": (num_kv_heads * head_dim,),
                    f"blk.{i}.attn_v.bias": (num_kv_heads * head_dim,),
                }
            )
    return shapes
