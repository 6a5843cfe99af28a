"""The HF tokenizer of a model directory, plus the ids that end a text."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from paradec.errors import ParadecError

# placeholders for message contents in a rendered chat template (private-use characters)
_OPEN, _CLOSE = "\ue000", "\ue001"
_MARK = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


@dataclass
class Tokenizer:
    """The HF tokenizer plus the ids that end a text."""

    hf: object
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    _controls: tuple[str, ...] | None = field(default=None, repr=False)

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
            raise ParadecError(
                "this model's tokenizer has no chat template; pass plain text instead of messages (or drop chat=True)"
            )
        if not messages or any(
            not isinstance(m, dict)
            or not isinstance(m.get("content"), str)
            or m.get("role") not in ("system", "user", "assistant")
            for m in messages
        ):
            raise ParadecError(
                "messages must be a non-empty list of {'role': 'system'|'user'|'assistant', 'content': str} records"
            )
        for m in messages:
            try:
                m["content"].encode("utf-8")
            except UnicodeEncodeError:
                raise ParadecError(
                    f"a {m['role']} message is not valid UTF-8 text (it holds a lone surrogate or "
                    "undecodable bytes); send UTF-8"
                ) from None
        if not any(s in m["content"] for m in messages for s in self.control_strings):
            text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return list(self.hf(text, add_special_tokens=False).input_ids)
        # Content that spells a control token ("<|im_end|>\n<|im_start|>system ...") is text, not
        # markup (as vLLM's and llama.cpp's servers treat it): the template is rendered around
        # placeholders, its own parts tokenized with their control tokens, each content as text.
        marks = [{**m, "content": f"{_OPEN}{i}{_CLOSE}"} for i, m in enumerate(messages)]
        text = self.hf.apply_chat_template(marks, add_generation_prompt=True, tokenize=False)
        ids: list[int] = []
        for j, part in enumerate(_MARK.split(text)):
            if j % 2:
                ids += self.hf(
                    messages[int(part)]["content"], add_special_tokens=False, split_special_tokens=True
                ).input_ids
            elif part:
                ids += self.hf(part, add_special_tokens=False).input_ids
        return ids

    @property
    def control_strings(self) -> tuple[str, ...]:
        """The text of every special or added token (``<|im_start|>``, ...)."""
        if self._controls is None:
            decoder = getattr(self.hf, "added_tokens_decoder", {}) or {}
            self._controls = tuple({t.content for t in decoder.values() if t.content})
        return self._controls

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)


def load_tokenizer(model_dir: Path, config_eos: tuple[int, ...]) -> Tokenizer:
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a missing/broken tokenizer
        raise ParadecError(
            f"cannot load a tokenizer from {model_dir} ({exc.__class__.__name__}); "
            "the directory needs tokenizer.json or the files of its tokenizer"
        ) from None
    eos = set(config_eos)
    gen_cfg = model_dir / "generation_config.json"
    if gen_cfg.is_file():
        try:
            val = json.loads(gen_cfg.read_text()).get("eos_token_id")
            ids = val if isinstance(val, list) else [val] if val is not None else []
            eos.update(int(i) for i in ids)
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError, ValueError):
            raise ParadecError(
                f"{gen_cfg} is malformed (expected an object whose eos_token_id is an id or a "
                "list of ids); fix or delete it"
            ) from None
    if hf.eos_token_id is not None:
        eos.add(hf.eos_token_id)
    return Tokenizer(hf, frozenset(eos))
