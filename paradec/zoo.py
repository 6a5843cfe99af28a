"""Where the bundled models live: ``zoo/`` at the root of the source checkout.

The zoo is trained by ``paradec train ...`` and committed with the code; an editable install
(``pip install -e .``, the Quickstart) finds it next to the package.
"""

from __future__ import annotations

from pathlib import Path

from paradec.errors import ParadecError

ZOO = Path(__file__).resolve().parent.parent / "zoo"


def bundled(name: str = "target", marker: str = "config.json") -> Path:
    path = ZOO / name
    if not (path / marker).is_file():
        raise ParadecError(f"the bundled model {name!r} is not at {path}; install paradec from its source "
                           "checkout (pip install -e .) or pass --model PATH")
    return path


def bundled_drafts() -> list[Path]:
    """The boost-tuned SSM pool, in training order (ssm1 first)."""
    return sorted(p for p in ZOO.glob("ssm*") if (p / "config.json").is_file())


def bundled_or_none(name: str, marker: str = "config.json") -> Path | None:
    path = ZOO / name
    return path if (path / marker).is_file() else None
