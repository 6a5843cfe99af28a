"""Hugging Face checkpoints <-> our Transformer, by a name-mapping table.

Our model fuses q/k/v into ``wqkv`` and gate/up into ``w_gate_up``; loading concatenates the HF
tensors, saving splits them again, so a checkpoint written here loads in transformers too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from paradec.config import ModelConfig
from paradec.errors import ParadecError
from paradec.models.adapter import copy_tokenizer, is_adapter, merge_into, read_adapter
from paradec.models.gguf import resolve_model
from paradec.models.llama import Transformer, rope_inv_freq

# our name -> HF names concatenated along dim 0 ("{i}" = layer index)
NAME_MAP: dict[str, tuple[str, ...]] = {
    "embed.weight": ("model.embed_tokens.weight",),
    "norm.weight": ("model.norm.weight",),
    "lm_head.weight": ("lm_head.weight",),
    "layers.{i}.attn_norm.weight": ("model.layers.{i}.input_layernorm.weight",),
    "layers.{i}.mlp_norm.weight": ("model.layers.{i}.post_attention_layernorm.weight",),
    "layers.{i}.attn.wqkv.weight": tuple(f"model.layers.{{i}}.self_attn.{p}_proj.weight" for p in "qkv"),
    "layers.{i}.attn.wqkv.bias": tuple(f"model.layers.{{i}}.self_attn.{p}_proj.bias" for p in "qkv"),
    "layers.{i}.attn.wo.weight": ("model.layers.{i}.self_attn.o_proj.weight",),
    "layers.{i}.attn.wo.bias": ("model.layers.{i}.self_attn.o_proj.bias",),
    "layers.{i}.mlp.w_gate_up.weight": ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"),
    "layers.{i}.mlp.w_gate_up.bias": ("model.layers.{i}.mlp.gate_proj.bias", "model.layers.{i}.mlp.up_proj.bias"),
    "layers.{i}.mlp.w_down.weight": ("model.layers.{i}.mlp.down_proj.weight",),
    "layers.{i}.mlp.w_down.bias": ("model.layers.{i}.mlp.down_proj.bias",),
}


def _expand(cfg: ModelConfig) -> dict[str, tuple[str, ...]]:
    out = {}
    for ours, theirs in NAME_MAP.items():
        for i in range(cfg.num_layers) if "{i}" in ours else [None]:
            out[ours.format(i=i)] = tuple(t.format(i=i) for t in theirs)
    return out


def _read_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
            if not all(isinstance(f, str) and "/" not in f for f in files):
                raise ValueError
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError, ValueError):
            raise ParadecError(
                f'{index} is malformed (expected {{"weight_map": {{tensor: file}}}}); re-save the checkpoint'
            ) from None
    elif (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        hint = (
            " (found PyTorch .bin weights: re-save with safe_serialization=True)"
            if list(model_dir.glob("*.bin"))
            else ""
        )
        raise ParadecError(
            f"no model.safetensors (or sharded index) in {model_dir}{hint}; pass a directory with safetensors weights"
        )
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        if (model_dir / name).is_file() and not os.access(model_dir / name, os.R_OK):  # not "No such file"
            raise ParadecError(
                f"cannot read weights {model_dir / name} (permission denied); make the file readable for this user"
            )
        try:
            tensors.update(load_file(str(model_dir / name)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ParadecError(
                f"cannot read weights {model_dir / name} ({str(exc).splitlines()[0]}); "
                "the file is corrupt or truncated: re-download or re-save it"
            ) from None
    return tensors


def load_model(
    model_dir: str | Path, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
) -> Transformer:
    """Build our Transformer from a local HF directory (config.json + safetensors) or a GGUF
    file (converted once and cached, ``paradec.models.gguf``)."""
    model_dir = resolve_model(model_dir)
    if not model_dir.is_dir():
        raise ParadecError(
            f"model directory {str(model_dir)!r} does not exist; pass model=PATH "
            "to a Hugging Face-format directory (config.json + *.safetensors)"
        )
    if is_adapter(model_dir):  # base + LoRA merged in fp32, then cast
        acfg, base, tensors = read_adapter(model_dir)
        model = load_model(base, torch.float32, "cpu")
        merge_into(model, acfg, tensors, str(model_dir))
        return model.to(device=device, dtype=dtype)
    cfg = ModelConfig.from_dir(model_dir)
    tensors = _read_tensors(model_dir)
    with torch.device("meta"):
        model = Transformer(cfg)
    state = {}
    expected = dict(model.named_parameters())
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    for ours, theirs in _expand(cfg).items():
        if ours not in expected:
            continue
        missing = [t for t in theirs if t not in tensors]
        if ours == "lm_head.weight" and missing:  # untied config without lm_head: HF ties then
            missing = [] if "model.embed_tokens.weight" in tensors else missing
            theirs = ("model.embed_tokens.weight",)
        if missing:
            raise ParadecError(
                f"weights in {model_dir} lack {missing[0]!r}; the checkpoint is incomplete "
                "or not a Llama/Qwen2/Mistral model"
            )
        parts = [tensors[t] for t in theirs]
        tensor = parts[0] if len(parts) == 1 else torch.cat(parts, 0)
        if tuple(tensor.shape) != tuple(expected[ours].shape):
            raise ParadecError(
                f"weight {theirs[0]!r} has shape {tuple(tensor.shape)}, config.json implies "
                f"{tuple(expected[ours].shape)}; config and weights do not match"
            )
        state[ours] = tensor.to(dtype)
    model.load_state_dict(state, strict=False, assign=True)
    model.inv_freq = rope_inv_freq(cfg)  # buffers built on the meta device hold no data
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    return model.to(device).eval().requires_grad_(False)


def hf_config_dict(cfg: ModelConfig) -> dict:
    """config.json content for ``cfg`` (transformers-loadable)."""
    model_type = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}[
        cfg.architecture
    ]
    out = {
        "architectures": [cfg.architecture],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_ids)
        if len(cfg.eos_token_ids) > 1
        else (cfg.eos_token_ids[0] if cfg.eos_token_ids else None),
        "torch_dtype": "bfloat16",
    }
    if model_type == "llama":
        out["attention_bias"] = cfg.qkv_bias
        out["mlp_bias"] = cfg.mlp_bias
    if cfg.rope_scaling:
        out["rope_scaling"] = dict(cfg.rope_scaling)
    return out


def save_model(model: Transformer, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write config.json + model.safetensors in HF layout; atomic (temp file, then rename)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    params = dict(model.state_dict())
    tensors: dict[str, torch.Tensor] = {}
    splits = {
        "wqkv": [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2,
        "w_gate_up": [cfg.intermediate_size] * 2,
    }
    for ours, theirs in _expand(cfg).items():
        if ours not in params or (ours == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        t = params[ours].detach().to(dtype).contiguous()
        key = next((k for k in splits if k in ours), None)
        chunks = t.split(splits[key], 0) if key else [t]
        for name, chunk in zip(theirs, chunks):
            tensors[name] = chunk.contiguous()
    tmp = out_dir / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out_dir / "model.safetensors")
    cfg_tmp = out_dir / "config.json.tmp"
    cfg_tmp.write_text(json.dumps(hf_config_dict(cfg), indent=2) + "\n")
    cfg_tmp.replace(out_dir / "config.json")


def merge_to_hf(adapter_dir: str | Path, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write base + adapter, merged, as a plain HF checkpoint (config, ``dtype`` safetensors, tokenizer)."""
    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    model = load_model(adapter_dir, torch.float32)
    save_model(model, out_dir, dtype)
    copy_tokenizer(adapter_dir, out_dir)
    return out_dir
