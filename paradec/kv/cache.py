"""The preallocated key/value cache: the only code that decides which positions are real.

Layout per layer: keys ``[batch, kv_heads, head_dim, max_len]`` (transposed: the score GEMM's
operand as it is, so a decode step never copies and transposes the whole prefix) and values
``[batch, kv_heads, max_len, head_dim]``, both in the model's dtype. Row ``b`` has
``lengths[b]`` committed slots ``[0, lengths[b])`` followed by ``scratch[b]`` uncommitted
ones. A forward pass writes the K/V of its n new tokens (tree nodes) after those,
``[lengths[b] + scratch[b], ... + n)``. The caller then either commits the accepted nodes (by
their scratch index: scratch slot j is ``lengths[b] + j``), which moves their rows onto the end of
the prefix and clears the scratch, or calls ``keep_scratch(n)`` so the next pass (a drafter
growing its tree level by level) sees them.

Example: lengths=[5]; a 4-node tree is written to slots 5..8; ``commit(0, [0, 2])`` copies
slot 7 to slot 6 and sets lengths=[7]. Slots past ``lengths`` are garbage and never attended:
the attention mask of every pass allows only ``[0, lengths[b])`` plus the new tokens.

Rows come and go (continuous batching): the tensors hold ``capacity`` rows, of which the first
``batch`` are live; ``add_rows`` appends rows, ``remove_rows`` drops some and moves the later
rows down, and ``rows(start, n)`` is a view of some rows for a pass over them alone (a prefill).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class KVCache:
    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        live: int | None = None,
    ) -> None:
        self.keys = torch.zeros(
            (num_layers, batch, kv_heads, head_dim, max_len), dtype=dtype, device=device
        )  # [layers, capacity, kv_heads, head_dim, max_len]
        self.values = torch.zeros(
            (num_layers, batch, kv_heads, max_len, head_dim), dtype=dtype, device=device
        )  # [layers, capacity, kv_heads, max_len, head_dim]
        self.max_len = max_len
        # Committed length per row, kept on the host: every step needs it to build positions and
        # masks, and a device tensor would cost a sync per step.
        self.lengths: list[int] = [0] * (batch if live is None else live)
        self.scratch: list[int] = [0] * len(self.lengths)  # uncommitted rows already written, per row
        self._index_memo: tuple | None = None  # ``_write_index``'s last answer and what it was for

    @property
    def batch(self) -> int:
        """Live rows: the first ``batch`` of ``capacity``."""
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    def add_rows(self, n: int) -> int:
        """n empty rows after the live ones; returns the first one's index."""
        first = self.batch
        if first + n > self.capacity:
            raise RuntimeError(f"KV cache has room for {self.capacity} rows, {first} are in use, {n} more asked")
        self.lengths += [0] * n
        self.scratch += [0] * n
        return first

    def remove_rows(self, start: int, n: int) -> None:
        """Drop rows [start, start + n); the later rows move down n places (their used slots only)."""
        end, batch = start + n, self.batch
        used = max(self.lengths[end:], default=0)
        if end < batch and used:
            self.keys[:, start : batch - n, ..., :used] = self.keys[:, end:batch, ..., :used].clone()
            self.values[:, start : batch - n, :, :used] = self.values[:, end:batch, :, :used].clone()
        del self.lengths[start:end], self.scratch[start:end]

    @contextmanager
    def rows(self, start: int, n: int) -> Iterator[KVCache]:
        """A cache of rows [start, start + n) only, sharing this one's storage, for a pass over
        them alone; their lengths are written back on exit."""
        sub = KVCache.__new__(KVCache)
        sub.keys, sub.values = self.keys[:, start : start + n], self.values[:, start : start + n]
        sub.max_len = self.max_len
        sub.lengths, sub.scratch = self.lengths[start : start + n], self.scratch[start : start + n]
        sub._index_memo = None
        yield sub
        self.lengths[start : start + n], self.scratch[start : start + n] = sub.lengths, sub.scratch

    def starts(self) -> list[int]:
        """Where the next pass writes, per row: committed length + scratch rows."""
        return [length + s for length, s in zip(self.lengths, self.scratch)]

    def span(self, n_new: int) -> int:
        """Number of key slots a pass with ``n_new`` tokens per row attends over."""
        return max(self.starts()) + n_new

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new rows k, v [batch, kv_heads, n, head_dim] after each row's prefix.

        By default they go to the next n scratch slots; ``slots`` [batch, n] (scratch indices)
        places them anywhere in the scratch instead (a pass over a pruned subset of a tree).
        Returns the keys, transposed, and the values to attend over: [batch, kv_heads, head_dim,
        span] and [batch, kv_heads, span, head_dim]. Which of those slots a query may see is the
        mask's business (``paradec.tree.pass_tensors``).
        """
        n, batch = k.shape[2], self.batch
        ks, vs = self.keys[layer, :batch], self.values[layer, :batch]  # keys transposed, as in the store
        end = self._end(n, slots)
        if slots is None:
            first = self.starts()[0]
            if all(start == first for start in self.starts()):
                ks[..., first : first + n] = k.transpose(-1, -2)
                vs[:, :, first : first + n] = v
                return ks[..., :end], vs[:, :, :end]
        rows, idx = self._write_index(n, slots)
        # one scatter per tensor, through [batch, slots, kv_heads, head_dim] views of the store
        ks.permute(0, 3, 1, 2)[rows, idx] = k.permute(0, 2, 1, 3)
        vs.permute(0, 2, 1, 3)[rows, idx] = v.permute(0, 2, 1, 3)
        return ks[..., :end], vs[:, :, :end]

    def write_slots(self, n: int, slots: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """Where a pass of n new tokens per row writes their K/V (``write``'s places), for a
        kernel that writes them itself (``models.native``): slot [batch, n] int64, and the
        number of slots the pass attends over."""
        return self._write_index(n, slots)[1].contiguous(), self._end(n, slots)

    def _end(self, n: int, slots: torch.Tensor | None) -> int:
        """The slots a pass of n new tokens per row attends over (``slots``: at scratch indices)."""
        if slots is not None:
            return max(self.lengths) + int(slots.max()) + 1 if slots.numel() else max(self.lengths)
        end = self.span(n)
        if end > self.max_len:
            raise RuntimeError(f"KV cache overflow: need {end} slots, have {self.max_len}")
        return end

    def _write_index(self, n: int, slots: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(row [batch, n], slot [batch, n]) of each new token, built once per pass: every layer
        writes to the same places (``slots``: scratch indices, else the next n per row)."""
        key = (n, tuple(self.lengths), tuple(self.scratch))
        memo = self._index_memo
        if memo is not None and memo[0] == key and memo[1] is slots:
            return memo[2]
        device = self.keys.device
        base = torch.tensor(self.lengths if slots is not None else self.starts(), device=device)[:, None]
        idx = base + (slots if slots is not None else torch.arange(n, device=device))  # [batch, n]
        rows = torch.arange(len(base), device=device)[:, None].expand_as(idx)
        self._index_memo = (key, slots, (rows, idx))  # holds slots, so its identity stays its own
        return rows, idx

    def keep_scratch(self, n: int) -> None:
        """The n rows each row just wrote stay visible (uncommitted) to the next pass."""
        self.scratch = [s + n for s in self.scratch]

    def commit(self, row: int, nodes: list[int]) -> None:
        """Keep the scratch rows ``nodes`` (scratch indices, root-to-leaf order) of ``row``.

        Their K/V move to consecutive slots after the prefix, the prefix grows by
        ``len(nodes)`` and the rest of the scratch is dropped. A leading run 0, 1, 2, ... is
        already in place and is not copied.
        """
        start = self.lengths[row]
        if start + len(nodes) > self.max_len:
            raise RuntimeError("KV cache overflow on commit")
        moved = [(i, node) for i, node in enumerate(nodes) if node != i]
        if moved:
            dst = torch.tensor([start + i for i, _ in moved], device=self.keys.device)
            src = torch.tensor([start + node for _, node in moved], device=self.keys.device)
            self.keys[:, row, ..., dst] = self.keys[:, row, ..., src]
            self.values[:, row, :, dst] = self.values[:, row, :, src]
        self.lengths[row] = start + len(nodes)
        self.scratch[row] = 0

    def drop_scratch(self, row: int) -> None:
        """Forget the uncommitted rows of ``row``."""
        self.scratch[row] = 0

    def advance(self, row: int, n: int) -> None:
        """Commit the first ``n`` scratch rows as they are (a chain, or a prefill)."""
        self.commit(row, list(range(n)))

    def truncate(self, row: int, length: int) -> None:
        """Forget everything after the first ``length`` committed slots of ``row``."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"cannot truncate row {row} of length {self.lengths[row]} to {length}")
        self.lengths[row] = length
        self.scratch[row] = 0
