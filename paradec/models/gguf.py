"""GGUF files (llama.cpp, Ollama, LM Studio) -> a plain Hugging Face directory.

``convert_gguf(file, out_dir)`` reads the file with the ``gguf`` package (llama.cpp's own
reader), dequantizes every tensor with ``gguf.quants.dequantize``, undoes llama.cpp's row
permutation of the q/k projections, maps tensor names to the HF layout, builds config.json from
the metadata and the tokenizer (tokenizer.json, chat template, special tokens) through
transformers' GGUF tokenizer conversion, with llama.cpp's pre-tokenizer rule restored where
transformers drops it. The result loads in paradec and in transformers alike.

``resolve_model(path)`` is what every ``--model`` goes through: a directory is returned as it
is; a ``.gguf`` file is converted once and cached under ``$PARADEC_HOME/models`` (default
``~/.cache/paradec``), keyed by the file's SHA-256. A conversion is written into a temporary
directory and renamed into place only when complete, so an interrupted one leaves nothing that
later looks valid.

Example: ``paradec.load("SmolLM2-135M-Instruct.Q4_1.gguf")`` (converted on first use).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from paradec.errors import ParadecError

CONVERTER_VERSION = 1  # part of the cache key: bump when the output of a conversion changes
MARKER = "paradec_gguf.json"  # written last: a directory without it is not a finished conversion

# GGUF general.architecture -> HF architecture; llama.cpp writes Mistral models as "llama"
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# architectures whose q/k rows llama.cpp's converter permuted (its LlamaModel.permute)
PERMUTED = {"llama", "mistral"}
# quant types dequantized exactly by gguf.quants (the i-quants and ternary types are left out)
QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# llama.cpp pre-tokenizer names whose rule splits every digit before the byte-level regex
# (llama-vocab.cpp: "\p{N}" first); transformers' GGUF conversion leaves that step out
DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "codeshell", "command-r", "exaone", "minerva"}

# GGUF tensor name -> HF name ("{i}" = layer index)
TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def paradec_home() -> Path:
    """Where converted models are cached: ``$PARADEC_HOME`` or ``~/.cache/paradec``."""
    return Path(os.environ.get("PARADEC_HOME") or Path.home() / ".cache" / "paradec")


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf")


def resolve_model(path: str | Path) -> Path:
    """A model directory as it is; a ``.gguf`` file -> its cached HF conversion (made once)."""
    path = Path(path)
    if not is_gguf(path):
        return path
    if not path.is_file():
        raise ParadecError(
            f"GGUF file {str(path)!r} does not exist; pass model=PATH to a .gguf file or a Hugging Face model directory"
        )
    out = paradec_home() / "models" / f"{file_digest(path)}-v{CONVERTER_VERSION}"
    if not (out / MARKER).is_file():
        convert_gguf(path, out)
    return out


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the file's SHA-256."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


# ---- reading --------------------------------------------------------------------------------
def _reader(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError, IndexError, struct errors ... on bad bytes
        raise ParadecError(
            f"cannot read GGUF file {path} ({exc.__class__.__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'corrupt'}); the file is corrupt or "
            "truncated: download it again"
        ) from None


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def read_metadata(reader) -> dict:
    """The metadata keys a conversion needs (tokenizer arrays left out)."""
    skip = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
    return {k: _field(reader, k) for k in reader.fields if k not in skip and not k.startswith("GGUF.")}


def hf_config(meta: dict, n_tokens: int, has_output: bool) -> dict:
    """config.json for the metadata of a llama / mistral / qwen2 GGUF file."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ParadecError(f"unsupported GGUF architecture {arch!r}; paradec converts {', '.join(ARCHITECTURES)} files")
    hf_arch = ARCHITECTURES[arch]
    name = f"{meta.get('general.name', '')} {meta.get('general.basename', '')}".lower()
    if arch == "llama" and "mistral" in name:
        hf_arch = "MistralForCausalLM"

    def key(suffix, default=None):
        value = meta.get(f"{arch}.{suffix}", default)
        if value is None:
            raise ParadecError(f"GGUF metadata lacks {arch}.{suffix}; the file is incomplete: download it again")
        return value

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(
        meta.get(f"{arch}.attention.key_length") or meta.get(f"{arch}.rope.dimension_count") or hidden // heads
    )
    eos = meta.get("tokenizer.ggml.eos_token_id")
    out = {
        "architectures": [hf_arch],
        "model_type": {v: k for k, v in ARCHITECTURES.items()}[hf_arch],
        "vocab_size": int(meta.get(f"{arch}.vocab_size") or n_tokens),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv") or heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base") or 10000.0),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(key("context_length")),
        "tie_word_embeddings": not has_output,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }
    if hf_arch == "Qwen2ForCausalLM":
        out["use_sliding_window"] = False
    if hf_arch == "MistralForCausalLM":
        out["sliding_window"] = None
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise ParadecError(
                f"GGUF rope scaling {scaling!r} is not supported; paradec converts files without "
                "rope scaling or with linear scaling"
            )
        out["rope_scaling"] = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    return out


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (its ``permute``): per head, rows interleaved pairwise
    (0, d/2, 1, d/2+1, ...) back to the two halves HF's ``rotate_half`` expects.

    w: [n_heads * head_dim, ...] (a weight or a bias).
    """
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_names(num_layers: int) -> dict[str, str]:
    """GGUF tensor name -> HF name, for every layer."""
    return {
        ours.format(i=i): theirs.format(i=i)
        for ours, theirs in TENSOR_NAMES.items()
        for i in (range(num_layers) if "{i}" in ours else [None])
    }


def hf_tensors(reader, cfg: dict) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to fp32 under its HF name; q/k rows un-permuted."""
    import gguf

    arch = next(k for k, v in ARCHITECTURES.items() if v == cfg["architectures"][0])
    gguf_arch = _field(reader, "general.architecture")
    names = tensor_names(cfg["num_hidden_layers"])
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name not in names:
            raise ParadecError(
                f"GGUF tensor {t.name!r} has no place in a {arch} model; paradec converts plain "
                f"{', '.join(ARCHITECTURES)} files"
            )
        qtype = t.tensor_type.name
        if qtype not in QUANT_TYPES:
            raise ParadecError(
                f"GGUF tensor {t.name!r} is {qtype}, which paradec does not dequantize; supported: "
                f"{', '.join(QUANT_TYPES)} (re-quantize the file with llama-quantize)"
            )
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        except Exception as exc:
            raise ParadecError(
                f"cannot dequantize GGUF tensor {t.name!r} ({exc.__class__.__name__}); the file is "
                "corrupt or truncated: download it again"
            ) from None
        w = w.reshape([int(n) for n in reversed(t.shape)])
        if gguf_arch in PERMUTED and (".attn_q." in t.name or ".attn_k." in t.name):
            w = unpermute(w, cfg["num_attention_heads"] if ".attn_q." in t.name else cfg["num_key_value_heads"])
        out[names[t.name]] = torch.from_numpy(
            np.array(w, dtype=np.float32, order="C")
        )  # a copy: the reader's arrays are read-only maps
    if "model.embed_tokens.weight" not in out:
        raise ParadecError("GGUF file has no token_embd.weight; the file is incomplete: download it again")
    return out


# ---- the tokenizer --------------------------------------------------------------------------
def save_tokenizer(path: Path, meta: dict, out_dir: Path) -> None:
    """tokenizer.json (+ its config and the chat template) through transformers' GGUF tokenizer
    conversion, with llama.cpp's digit-splitting pre-tokenizer step restored where the GGUF's
    ``tokenizer.ggml.pre`` uses it."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as exc:
        raise ParadecError(
            f"cannot build a tokenizer from the GGUF metadata of {path} ({exc.__class__.__name__}); "
            "the file lacks tokenizer.ggml.* keys or uses an unsupported tokenizer model"
        ) from None
    if meta.get("tokenizer.ggml.pre") in DIGIT_SPLIT_PRE:
        from tokenizers import pre_tokenizers

        backend = tok.backend_tokenizer
        current = backend.pre_tokenizer
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), current])
    if meta.get("tokenizer.chat_template") and not getattr(tok, "chat_template", None):
        tok.chat_template = meta["tokenizer.chat_template"]
    tok.save_pretrained(str(out_dir))


# ---- the conversion -------------------------------------------------------------------------
def convert_gguf(path: str | Path, out_dir: str | Path) -> Path:
    """Write the HF directory of the GGUF ``path`` to ``out_dir`` (atomically: a temporary
    directory beside it, renamed when complete). Returns ``out_dir``."""
    from safetensors.torch import save_file

    path, out_dir = Path(path), Path(out_dir)
    if not path.is_file():
        raise ParadecError(f"GGUF file {str(path)!r} does not exist; pass the path of a .gguf file")
    reader = _reader(path)
    meta = read_metadata(reader)
    n_tokens = len(reader.fields["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in reader.fields else 0
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    cfg = hf_config(meta, n_tokens, has_output)
    tensors = hf_tensors(reader, cfg)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
    try:
        save_tokenizer(path, meta, tmp)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        info = {
            "source": path.name,
            "converter_version": CONVERTER_VERSION,
            "quant_types": sorted({t.tensor_type.name for t in reader.tensors}),
            "architecture": meta.get("general.architecture"),
            "name": meta.get("general.name"),
        }
        (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
