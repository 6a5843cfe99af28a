"""Byte-level BPE tokenizer for the zoo, with every special token later methods need reserved."""

from __future__ import annotations

from pathlib import Path

from paradec.train.corpus import read_split

EOS = "<|endoftext|>"
ASPD_TOKENS = ("<|title|>", "<|/title|>", "<|para|>", "<|/para|>", "<|branch|>", "<|/branch|>")
SPECIAL_TOKENS = (EOS, *ASPD_TOKENS)


def train_tokenizer(out_dir: str | Path, vocab_size: int = 8192):
    """Train on the stdlib's training split; save tokenizer.json + config to ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(read_split(held_out=False), trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, additional_special_tokens=list(ASPD_TOKENS)
    )
    hf.save_pretrained(str(out_dir))
    return hf
