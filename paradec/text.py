"""``TextStream``: one answer's tokens -> the text a user reads, as they are committed.

One output processor for every consumer (``Engine.generate`` / ``Engine.stream``, the
server's worker, ASPD's stream). It decodes incrementally, in time linear in the output: each
``add`` decodes a small window of tokens, not the answer so far. A window starts a step back
(``prefix``), so a tokenizer that drops a leading space at the start of a decode drops it on
both sides of the subtraction, and it ends on a whole character: a window whose text ends in
an unfinished UTF-8 sequence ("\\ufffd") waits for the next tokens. A stop string ends the text
where it begins; what a stop string or an unfinished character may still change is held back
from ``piece`` until the end.

    stream = TextStream(tokenizer.decode, stop=("\\n\\n",))
    for ids in committed_per_step:
        if stream.add(ids):  # a stop string appeared: the row ends here
            break
        print(stream.piece(), end="")
    print(stream.close())  # stream.text is the whole answer
"""

from __future__ import annotations

from collections.abc import Callable

# An unfinished character at the end of a window is waited for this many tokens at most (a
# UTF-8 character is <= 4 bytes); after that the bytes are taken as they decode ("\ufffd").
MAX_PENDING_TOKENS = 64


class TextStream:
    """One answer's text: ``add`` (or ``show``) as tokens are committed, ``piece`` for what is
    final, ``close`` at the end; ``text`` is every piece handed out."""

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...] | list[str] = ()) -> None:
        self._decode = decode
        self.stop = tuple(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1  # a stop string may be mid-way
        self.ids: list[int] = []
        self._prefix = self._read = 0  # the window: ids[_prefix:_read] already decoded, ids[_read:] new
        self._sent: list[str] = []  # pieces handed out
        self._sent_len = 0
        self._pending = ""  # decoded, whole characters, not handed out yet
        self._tail = ""  # the text of ids[_read:]: may end in an unfinished character; redone next add
        self.stopped = False  # a stop string appeared; the text ends before it
        self.closed = False

    def add(self, ids: list[int]) -> bool:
        """Take a step's committed tokens. True when a stop string has appeared (the row should end)."""
        if self.stopped or self.closed:
            return self.stopped
        self.ids.extend(ids)
        searched = len(self._pending)  # whole characters: searched by the last add
        before = self._decode(self.ids[self._prefix : self._read])
        tail = self._decode(self.ids[self._prefix :])[len(before) :]
        if tail.endswith("\ufffd") and len(self.ids) - self._read < MAX_PENDING_TOKENS:
            self._tail = tail  # wait for the rest of the character
        else:
            self._pending += tail
            self._tail = ""
            self._prefix, self._read = self._read, len(self.ids)
        return self._find_stop(max(0, searched - self._hold))

    def show(self, text: str) -> bool:
        """Take the whole text so far, for a producer that renders it anew each step (ASPD's
        plan-order view); what was handed out must stay its prefix. True when a stop string appeared."""
        if self.stopped or self.closed:
            return self.stopped
        self._pending, self._tail = text[self._sent_len :], ""
        return self._find_stop(0)

    def _find_stop(self, start: int) -> bool:
        """Search the text not handed out from ``start`` on: nothing handed out can hold a stop
        string's start (``piece`` holds back len - 1 characters), nor the text before ``start``."""
        if not self.stop:
            return False
        unsent = self._pending + self._tail
        cut = min((i for i in (unsent.find(s, start) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self._pending, self._tail, self.stopped = unsent[:cut], "", True
        return self.stopped

    def piece(self) -> str:
        """The text that is final and not yet handed out ("" when nothing is)."""
        if self.closed:
            return ""
        if self.stopped:
            return self.close()
        safe = max(0, len(self._pending) - self._hold)
        while safe > 0 and self._pending[safe - 1] == "\ufffd":  # bytes that may yet join a character
            safe -= 1
        out, self._pending = self._pending[:safe], self._pending[safe:]
        self._hand_out(out)
        return out

    def close(self) -> str:
        """The answer has ended: everything not handed out yet."""
        if self.closed:
            return ""
        out = self._pending + self._tail
        self._pending = self._tail = ""
        self.closed = True
        self._hand_out(out)
        return out

    def _hand_out(self, out: str) -> None:
        if out:
            self._sent.append(out)
            self._sent_len += len(out)

    @property
    def text(self) -> str:
        """What was handed out so far; after ``close``, the whole answer."""
        return "".join(self._sent)
