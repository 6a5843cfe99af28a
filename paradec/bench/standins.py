"""Random-init Llama stand-ins of the sizes the feasibility study measured (vocab 16384, tied)."""

from __future__ import annotations

from pathlib import Path

from paradec.testing import make_checkpoint, make_tokenizer, stdlib_text

SIZES = {  # name: hidden, layers, heads, ffn
    "5M": (192, 4, 3, 512),
    "20M": (384, 8, 6, 1024),
    "60M": (640, 10, 10, 1728),
    "150M": (896, 14, 14, 2432),
}


def standin(root: str | Path, size: str, vocab_size: int = 16384, tokenizer=None) -> Path:
    """Build (once) and return a random-init Llama checkpoint of ``size`` under ``root``."""
    out = Path(root) / f"llama-{size}"
    if (out / "model.safetensors").is_file():
        return out
    hidden, layers, heads, ffn = SIZES[size]
    tok = tokenizer or make_tokenizer(vocab_size, stdlib_text(2_000_000))
    return make_checkpoint(
        out,
        "llama",
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=ffn,
        tie_word_embeddings=True,
        init_std=0.02,
        max_position_embeddings=2048,
        tokenizer=tok,
    )
