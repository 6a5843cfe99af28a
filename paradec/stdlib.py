"""The text every Python install has: the standard library's own source, split into train and
held-out files by a hash of their relative path (about 2 % held out), so a held-out file is
never trained on and the split is the same on every machine with the same Python. Training
(``train.corpus``) and the bench's code prompts (``bench.prompts``) both read it."""

from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path

HELD_OUT_EVERY = 50  # crc32(path) % 50 == 0 -> held out


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative path, path) of every .py file of the stdlib, site-packages excluded, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel or "dist-packages" in rel:
            continue
        out.append((rel, path))
    return out


def is_held_out(rel: str) -> bool:
    return zlib.crc32(rel.encode()) % HELD_OUT_EVERY == 0
