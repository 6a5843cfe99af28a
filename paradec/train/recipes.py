"""The zoo's recipes: exact configs and steps, so ``paradec train ...`` reproduces zoo/."""

from __future__ import annotations

import json
from pathlib import Path

from paradec.config import ModelConfig
from paradec.errors import ParadecError
from paradec.train.corpus import load_or_encode
from paradec.train.lm import StreamBatches, TrainConfig, export, train_lm


def target_config(vocab_size: int, eos_id: int) -> ModelConfig:
    """~23M-parameter Llama: d448, 8 layers, 7 heads of 64, SwiGLU 1216, tied embeddings."""
    return ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=vocab_size,
        hidden_size=448,
        intermediate_size=1216,
        num_layers=8,
        num_heads=7,
        num_kv_heads=7,
        head_dim=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_ids=(eos_id,),
    )


def load_zoo_tokenizer(tokenizer_dir: str | Path):
    from transformers import AutoTokenizer

    if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        raise ParadecError(f"no tokenizer.json in {tokenizer_dir}; run `paradec train tokenizer` first")
    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


def train_target(tokenizer_dir: str | Path, out_dir: str | Path, run_dir: str | Path, cfg: TrainConfig) -> dict:
    tok = load_zoo_tokenizer(tokenizer_dir)
    train, heldout = load_or_encode(tok, Path(run_dir) / "data", tok.eos_token_id)
    held = StreamBatches(heldout).fixed(cfg.eval_batches, cfg.batch_size, cfg.seq_len)
    model_cfg = target_config(len(tok), tok.eos_token_id)
    summary = train_lm(model_cfg, StreamBatches(train), held, Path(run_dir) / "target", cfg)
    model = summary.pop("model")
    summary.update(train_tokens=int(len(train)), heldout_tokens=int(len(heldout)))
    export(model, tok, out_dir)
    (Path(out_dir) / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
