"""The training corpus every Python install has: the standard library's own source.

Files are split into train / held-out by a hash of their relative path (about 2 % held out),
so a held-out file is never seen in training and the split is the same on every machine with
the same Python.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from paradec.stdlib import is_held_out, stdlib_files


def read_split(held_out: bool) -> list[str]:
    texts = []
    for rel, path in stdlib_files():
        if is_held_out(rel) == held_out:
            try:
                texts.append(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, OSError):
                continue
    return texts


def encode_split(tokenizer, held_out: bool, eos_id: int) -> np.ndarray:
    """All files of one split as one uint16 token stream, files separated by EOS."""
    texts = read_split(held_out)
    enc = tokenizer.backend_tokenizer.encode_batch(texts)
    out = []
    for e in enc:
        out.extend(e.ids)
        out.append(eos_id)
    return np.asarray(out, dtype=np.uint16)


def load_or_encode(tokenizer, cache_dir: Path, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) token streams, cached as .npy under ``cache_dir``."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    arrays = []
    for name, held in (("train", False), ("heldout", True)):
        path = cache_dir / f"{name}.npy"
        if not path.exists():
            arr = encode_split(tokenizer, held, eos_id)
            tmp = cache_dir / f"{name}.tmp.npy"
            np.save(tmp, arr)
            tmp.replace(path)
        arrays.append(np.load(path))
    return arrays[0], arrays[1]
