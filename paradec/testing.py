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
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, *special],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([text if text is not None else stdlib_text()], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS)


def make_checkpoint(out_dir: str | Path, family: str = "llama", vocab_size: int = 512,
                    hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                    num_kv_heads: int | None = None, intermediate_size: int | None = None,
                    tie_word_embeddings: bool = False, seed: int = 0, init_std: float = 0.08,
                    max_position_embeddings: int = 512, tokenizer=None, **config_kwargs) -> Path:
    """Write a random-init ``family`` checkpoint + tokenizer to ``out_dir`` and return it."""
    import transformers

    out_dir = Path(out_dir)
    tok = tokenizer or make_tokenizer(vocab_size)
    cfg_cls = getattr(transformers, FAMILIES[family])
    cfg = cfg_cls(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads or num_heads,
                  intermediate_size=intermediate_size or 3 * hidden_size,
                  tie_word_embeddings=tie_word_embeddings, initializer_range=init_std,
                  max_position_embeddings=max_position_embeddings,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **config_kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    if family == "qwen2":  # random biases, so a missing bias would show in parity tests
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=init_std)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir
