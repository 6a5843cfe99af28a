"""``paradec chat``: a multi-turn conversation through the model's chat template, streamed.

Each answer is fed back as the assistant's turn; ``/reset`` forgets the conversation (keeping
the system message), ``/exit`` or end of input quits.
"""

from __future__ import annotations

import sys

from paradec.errors import ParadecError


def chat_loop(engine, options: dict, system: str | None = None, stdin=None, stdout=None, prompt_to=None) -> list[dict]:
    """Read user lines from ``stdin`` until /exit or EOF, stream each answer to ``stdout``;
    returns the conversation."""
    stdin, stdout, prompt_to = stdin or sys.stdin, stdout or sys.stdout, prompt_to or sys.stderr
    if not engine.tokenizer.has_chat_template:
        raise ParadecError("this model has no chat template; use `paradec generate` for plain text")
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    while True:
        prompt_to.write("> ")
        prompt_to.flush()
        line = stdin.readline()
        if not line or line.strip() in ("/exit", "/quit"):
            return messages
        if line.strip() == "/reset":
            messages = list(start)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        pieces = []
        try:
            for piece in engine.stream(messages, **options):
                pieces.append(piece)
                stdout.write(piece)
                stdout.flush()
        except ParadecError as exc:  # this line (not UTF-8, too long, ...): say so, keep the conversation
            messages.pop()
            prompt_to.write(f"paradec: {exc}\n")
            continue
        stdout.write("\n")
        stdout.flush()
        messages.append({"role": "assistant", "content": "".join(pieces)})
