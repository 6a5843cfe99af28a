"""What a method loads beside the target: draft models, Medusa heads, an EAGLE head.

A ``Companion`` record names its ``paradec.load`` keyword (also its key in ``Engine.companions``
and in ``Method.needs``), its flag, its loader, the zoo's default for a model and how to tell it
is there; load, the CLI, bench, the server and the demo iterate over the registry, so a new one is
one ``register`` call. A need that is no file of its own (the heads' early head, a model
fine-tuned for ASPD) is a record with a presence check and no flag.

    register(Companion("mine", "my drafter's table", flag="--mine", load=lambda engine, path: read(path)))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paradec.errors import ParadecError


@dataclass(frozen=True)
class Companion:
    name: str  # paradec.load's keyword, Engine.companions' key, what Method.needs names
    summary: str  # what it is, as errors say it: "Medusa heads"
    flag: str | None = None  # the CLI flag that loads it (None: not a file of its own)
    help: str = ""  # the flag's help
    # (the engine, a path, or a list of paths when ``many``) -> what Engine.companions holds
    load: Callable[[Any, Any], Any] | None = None
    zoo: Callable[[Path], Any] | None = None  # the zoo's default for a model file (None: none shipped)
    many: bool = False  # several paths (the flag repeats); the zoo's pool, of which a command takes the first
    present: Callable[[Any], bool] | None = None  # (the engine) -> is it there (None: loaded under its name)
    fix: str = ""  # how to get it, where it is no file of its own
    backends: tuple[str, ...] = ("torch",)  # the target runtimes it loads beside (a token table: any)

    def there(self, target) -> bool:
        if self.present is not None:
            return self.present(target)
        return bool(target.companions.get(self.name))

    def error(self, method: str) -> ParadecError:
        """What ``method`` says when this is not loaded: what it is and how to get it."""
        fix = self.fix or f"load {'them' if self.summary.endswith('s') else 'it'} ({self.name}=PATH)"
        return ParadecError(f"method {method} needs {self.summary}; {fix}")


_REGISTRY: dict[str, Companion] = {}


def register(companion: Companion) -> Companion:
    """Add ``companion`` (a name already taken is an error: unregister it first)."""
    if companion.name in _REGISTRY:
        raise ValueError(f"companion {companion.name!r} is already registered")
    if (companion.flag is None) != (companion.load is None):
        raise ValueError(f"companion {companion.name}: a flag and a loader go together")
    _REGISTRY[companion.name] = companion
    return companion


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get(name: str) -> Companion:
    return _REGISTRY[name]


def companions() -> tuple[Companion, ...]:
    return tuple(_REGISTRY.values())


def loadable() -> tuple[Companion, ...]:
    """The ones a flag loads, in registration order."""
    return tuple(c for c in _REGISTRY.values() if c.load is not None)
