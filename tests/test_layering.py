"""The import layering written in docs/ARCHITECTURE.md: a module imports only from its own layer
or the layers under it, and no two files import each other (directly or around a circle),
function-level imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import paradec

ROOT = Path(paradec.__file__).parent
LAYERS = [
    {"errors", "options", "config", "zoo", "stdlib"},  # records and locations
    {"sampling", "tokenizer", "text", "state", "kv", "tree"},  # pure functions and typed state
    {"models", "cpu", "policy"},  # the runtime; what a pass costs on this CPU; ProPD's cost model
    {"draft", "verify", "parallel", "passes"},  # proposing, accepting, ASPD's decoder, the target's passes
    {"companions", "factories", "methods"},  # what methods load beside the target; the factories; the registry
    {"scheduler"},  # the loop: groups of rows on one KV cache
    {"engine"},  # loading, generate/stream
    {"train", "testing"},  # recipes and test fixtures use the engine as users do
    {"bench", "serve"},  # users of the engine: benchmarks, the OpenAI-compatible server
    {"demo", "doctor", "chat", "cli", "__init__", "__main__"},  # entry points
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "paradec":  # from paradec import methods
            out.update(
                f"paradec.{a.name}" if (ROOT / a.name).exists() or (ROOT / f"{a.name}.py").exists() else "paradec"
                for a in node.names
            )
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "paradec":
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "paradec")
    return out


def _unit(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _files() -> dict[str, Path]:
    return {
        ".".join(("paradec", *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__"): p
        for p in ROOT.rglob("*.py")
    }


def test_every_unit_has_a_layer():
    assert {_unit(m) for m in _files()} <= set(LAYER)


def test_imports_point_down():
    bad = []
    for module, path in _files().items():
        for target in _imports(path):
            if LAYER[_unit(target)] > LAYER[_unit(module)]:
                bad.append(f"{module} imports {target}")
    assert not bad, bad


def test_no_import_cycles_between_files():
    files = _files()
    graph = {
        m: {t for t in _imports(p) if t in files and t != m and not m.startswith(t + ".")} for m, p in files.items()
    }
    # a package's __init__ re-exporting its own modules is not a cycle
    graph = {m: {t for t in ts if not (files[t].name == "__init__.py" and m.startswith(t))} for m, ts in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in graph[m]:
            if state.get(t) == 1:
                raise AssertionError(" -> ".join(stack[stack.index(t) :] + [t]) if t in stack else f"{m} -> {t}")
            if t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])
