"""A method's options are frozen dataclasses whose fields are declared with ``option()``. Every
edge is generated from them: the CLI's flags (``cli.options``), the server's request fields, the
Python API's keywords (``engine.generate(..., eagle_topk=3)``) and their checks
(``methods.generation_config``). A method names the kinds it reads (``Method.options``). A record
may say what its values need loaded besides the method's own needs (``needs() -> companion
names``: ``PruneOptions`` with ``prune`` on needs the heads' early head).

    @dataclass(frozen=True)
    class MyOptions:
        width: int = option(4, "mine: how wide to draft")
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any

from paradec.errors import ParadecError


def option(
    default: Any, help: str, flag: str | None = None, choices: tuple[str, ...] | None = None, sets: bool = True
) -> Any:
    """A field of an options record: its default, its help, and the flag that sets it where that
    is not ``--its-name``; a bool's flag is a switch that sets ``sets`` (``--no-prune``: False)."""
    meta = {"help": help, "flag": flag, "choices": choices, "sets": sets}
    return dataclasses.field(default=default, metadata=meta)


# the value types an option may have, as the edges parse them
TYPES = {
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "int | None": int | None,
    "tuple[int, ...]": tuple[int, ...],
}


@dataclass(frozen=True)
class Option:
    """One option as the edges see it."""

    kind: type  # the options record it belongs to
    name: str  # its keyword (and request field)
    default: Any
    type: str  # one of TYPES
    help: str
    flag: str  # --its-name, or the record's own flag
    choices: tuple[str, ...] | None
    sets: bool = True  # what a bool's switch sets

    @property
    def switch(self) -> bool:
        return self.type == "bool"

    def parse(self, value: Any) -> Any:
        """``value`` as this option's type, or a ParadecError naming the option and the type."""
        if self.type == "int | None" and value is None:
            return None
        kind = int if self.type == "int | None" else TYPES[self.type]
        if self.type == "tuple[int, ...]":
            if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                return tuple(value)
            raise ParadecError(f"{self.name} must be a list of integers, got {value!r}")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ParadecError(f"{self.name} must be {'a' if kind is not int else 'an'} {kind.__name__}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ParadecError(f"unknown {self.name} {value!r}; choose one of {', '.join(self.choices)}")
        return value


@functools.cache
def options_of(kind: type) -> tuple[Option, ...]:
    """The options of record ``kind``, in field order (read once per record: every request asks)."""
    hints = typing.get_type_hints(kind)
    out = []
    for f in dataclasses.fields(kind):
        type_name = next((name for name, t in TYPES.items() if t == hints[f.name]), None)
        if type_name is None:
            raise TypeError(f"option {kind.__name__}.{f.name}: type {hints[f.name]} is not one of {', '.join(TYPES)}")
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        meta = f.metadata
        out.append(
            Option(
                kind,
                f.name,
                f.default,
                type_name,
                meta.get("help", ""),
                flag,
                meta.get("choices"),
                meta.get("sets", True),
            )
        )
    return tuple(out)


def build(kind: type, values: dict[str, Any]) -> Any:
    """The ``kind`` record of ``values`` (its defaults for the rest), each value checked against
    its type; the record's own checks (``__post_init__``) run too."""
    return kind(**{o.name: o.parse(values[o.name]) for o in options_of(kind) if o.name in values})
