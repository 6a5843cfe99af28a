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

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, chat: bool = False) -> list[int]:
        """Token ids of ``text``; with ``chat``, of a one-message user conversation."""
        if chat:
            return self.encode_messages([{"role": "user", "content": text}])
        return list(self.hf(text).input_ids)

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation (``[{"role": "user", "content": "..."}, ...]``) through the
        model's chat template, ending with the assistant's turn opened."""
        if not self.has_chat_template:
            raise ParadecError("this model's tokenizer has no chat template; pass plain text instead of messages "
                               "(or drop chat=True)")
        if not messages or any(not isinstance(m, dict) or not isinstance(m.get("content"), str)
                               or m.get("role") not in ("system", "user", "assistant") for m in messages):
            raise ParadecError("messages must be a non-empty list of {'role': 'system'|'user'|'assistant', "
                               "'content': str} records")
        text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.hf(text, add_special_tokens=False).input_ids)

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
        try:
            val = json.loads(gen_cfg.read_text()).get("eos_token_id")
            ids = val if isinstance(val, list) else [val] if val is not None else []
            eos.update(int(i) for i in ids)
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError, ValueError):
            raise ParadecError(f"{gen_cfg} is malformed (expected an object whose eos_token_id is an id or a "
                               "list of ids); fix or delete it") from None
    if hf.eos_token_id is not None:
        eos.add(hf.eos_token_id)
    return Tokenizer(hf, frozenset(eos))
