"""The HF tokenizer of a model directory, plus the ids that end a text."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from paradec.errors import ParadecError


@dataclass
class Tokenizer:
    """The HF tokenizer plus the ids that end a text."""

    hf: object
    eos_ids: frozenset[int] = field(default_factory=frozenset)

    def encode(self, text: str, chat: bool = False) -> list[int]:
        if chat:
            if not getattr(self.hf, "chat_template", None):
                raise ParadecError("this model's tokenizer has no chat template; drop --chat")
            text = self.hf.apply_chat_template([{"role": "user", "content": text}],
                                               add_generation_prompt=True, tokenize=False)
            return list(self.hf(text, add_special_tokens=False).input_ids)
        return list(self.hf(text).input_ids)

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)


def load_tokenizer(model_dir: Path, config_eos: tuple[int, ...]) -> Tokenizer:
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a missing/broken tokenizer
        raise ParadecError(f"cannot load a tokenizer from {model_dir} ({exc.__class__.__name__}); "
                           "the directory needs tokenizer.json or the files of its tokenizer") from None
    eos = set(config_eos)
    gen_cfg = model_dir / "generation_config.json"
    if gen_cfg.is_file():
        val = json.loads(gen_cfg.read_text()).get("eos_token_id")
        eos.update(val if isinstance(val, list) else [val] if val is not None else [])
    if hf.eos_token_id is not None:
        eos.add(hf.eos_token_id)
    return Tokenizer(hf, frozenset(eos))
