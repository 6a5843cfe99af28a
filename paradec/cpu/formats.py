"""Weight formats by name: which a model's file allows, and how a name splits into the
activation dtype and the decoder linears' quantization."""

from __future__ import annotations

import json
from pathlib import Path

# the weight formats measured for every model: name -> (activation dtype, the decoder linears' weights);
# any other pair is named "int4-fp32" and the like, and measured only when asked for
FORMATS = {"bf16": ("bf16", "none"), "fp32": ("fp32", "none"), "int8": ("bf16", "int8"), "int4": ("bf16", "int4")}


def source_formats(model_dir: Path) -> tuple[str, ...]:
    """The formats a model's weights may run in without a new quantization of their own:
    bf16 and fp32 always; int8 when the file is quantized to 8 bits or fewer (GGUF Q8_0 ..);
    int4 when to 4 bits or fewer (GGUF Q4_0, Q4_1, Q4_K ..: the int4 kernel keeps their levels)."""
    from paradec.models.adapter import is_adapter

    marker = Path(model_dir) / "paradec_gguf.json"
    allowed = ["bf16", "fp32"]
    if is_adapter(model_dir):  # merged weights sit on no quantization grid
        return tuple(allowed)
    if marker.is_file():
        try:
            types = set(json.loads(marker.read_text()).get("quant_types", ()))
        except ValueError:
            types = set()
        if types & {"Q8_0", "Q6_K", "Q5_0", "Q5_1", "Q5_K", "Q4_0", "Q4_1", "Q4_K", "Q3_K", "Q2_K"}:
            allowed.append("int8")
        if types & {"Q4_0", "Q4_1", "Q4_K", "Q3_K", "Q2_K"}:
            allowed.append("int4")
    return tuple(allowed)


def format_name(dtype: str, quant: str) -> str:
    """("bf16", "int4") -> "int4"; ("fp32", "none") -> "fp32"; ("fp32", "int4") -> "int4-fp32"."""
    if quant == "none":
        return dtype
    return quant if dtype == "bf16" else f"{quant}-{dtype}"


def format_parts(name: str) -> tuple[str, str]:
    """The inverse of ``format_name``: -> (activation dtype, quant)."""
    if name in FORMATS:
        return FORMATS[name]
    quant, _, dtype = name.partition("-")
    return (dtype, quant) if dtype else (name, "none")
