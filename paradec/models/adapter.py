"""Low-rank adapters (LoRA) + trained token rows: a fine-tune shipped as a few MB next to its base.

An adapter directory holds ``adapter.json`` (base directory, relative to the adapter; rank;
scale; the token ids whose embedding rows were trained), ``adapter.safetensors`` and the
tokenizer files. ``paradec.load(adapter_dir)`` builds the base model and merges:

    W <- W + scale * B @ A        for every adapted linear (A [rank, in], B [out, rank])
    E[ids] <- E[ids] + rows       embedding rows (tied models: the LM head rows move too;
                                  untied ones train their LM-head rows too, ``head_rows``)

Tokens the base lacks (ASPD's six markers on a model that never reserved them) are appended to
its vocabulary (``new_tokens``): their embedding and LM-head rows start as the mean row of the
base's, and the trained deltas are added on top, the usual way of adding tokens to a model.

so decoding runs at the base model's speed. ``checkpoint.merge_to_hf`` writes the merged model as a plain
HF checkpoint (transformers loads it) for users who want one file set.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from paradec.errors import ParadecError

ADAPTER_JSON = "adapter.json"
ADAPTER_WEIGHTS = "adapter.safetensors"
DEFAULT_BASE = "default"  # adapter.json's base for paradec's default model (SmolLM2's GGUF file)
TARGETS = ("attn.wqkv", "attn.wo", "mlp.w_gate_up", "mlp.w_down")


@dataclass(frozen=True)
class AdapterConfig:
    base: str  # base model directory, relative to the adapter directory (or absolute)
    rank: int = 32
    alpha: float = 32.0
    token_ids: tuple[int, ...] = ()  # embedding rows trained as a delta
    targets: tuple[str, ...] = TARGETS
    new_tokens: tuple[str, ...] = ()  # appended to the base's vocabulary, in this order

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@torch.no_grad()
def extend_vocab(model: nn.Module, n: int) -> None:
    """Append ``n`` rows to ``model``'s embedding (and untied LM head), each the mean of the
    existing rows, and grow ``model.config.vocab_size`` to match."""
    if n <= 0:
        return
    from dataclasses import replace

    cfg = model.config
    embed = model.embed.weight
    rows = embed.float().mean(0, keepdim=True).expand(n, -1).to(embed.dtype)
    model.embed = nn.Embedding.from_pretrained(torch.cat([embed, rows]), freeze=not embed.requires_grad)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    else:
        head = model.lm_head.weight
        rows = head.float().mean(0, keepdim=True).expand(n, -1).to(head.dtype)
        model.lm_head.weight = nn.Parameter(torch.cat([head, rows]), requires_grad=head.requires_grad)
    model.lm_head.out_features += n
    model.config = replace(cfg, vocab_size=cfg.vocab_size + n)


class Adapter(nn.Module):
    """Trainable LoRA factors for every target linear of ``model`` + embedding-row deltas."""

    def __init__(self, model: nn.Module, cfg: AdapterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.names: list[str] = []  # parameter names of the adapted weights, e.g. layers.0.attn.wqkv.weight
        self.a = nn.ParameterList()
        self.b = nn.ParameterList()
        for name, p in model.named_parameters():
            if name.endswith(".weight") and name.removesuffix(".weight").split(".", 2)[-1] in cfg.targets:
                out_f, in_f = p.shape
                a = torch.empty(cfg.rank, in_f)
                nn.init.kaiming_uniform_(a, a=math.sqrt(5))
                self.names.append(name)
                self.a.append(nn.Parameter(a))
                self.b.append(nn.Parameter(torch.zeros(out_f, cfg.rank)))  # starts as the identity edit
        self.register_buffer("token_ids", torch.tensor(cfg.token_ids, dtype=torch.long), persistent=False)
        self.rows = nn.Parameter(torch.zeros(len(cfg.token_ids), model.config.hidden_size))
        tied = model.config.tie_word_embeddings
        self.head_rows = nn.Parameter(torch.zeros(0 if tied else len(cfg.token_ids), model.config.hidden_size))

    def merged(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Adapted weights {name: W + scale * B @ A} (differentiable in A, B, rows), for
        ``torch.func.functional_call(model, merged, ...)``."""
        out = {}
        for name, a, b in zip(self.names, self.a, self.b):
            w = model.get_parameter(name)
            out[name] = w + self.cfg.scale * (b @ a).to(w.dtype)
        if len(self.cfg.token_ids):
            embed = model.embed.weight
            out["embed.weight"] = embed.index_add(0, self.token_ids, self.rows.to(embed.dtype))
            if len(self.head_rows):
                head = model.lm_head.weight
                out["lm_head.weight"] = head.index_add(0, self.token_ids, self.head_rows.to(head.dtype))
        return out

    def save(self, out_dir: str | Path) -> None:
        """adapter.json + adapter.safetensors (bf16), written atomically."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for name, a, b in zip(self.names, self.a, self.b):
            stem = name.removesuffix(".weight")
            tensors[f"{stem}.lora_a"] = a.detach().to(torch.bfloat16).contiguous()
            tensors[f"{stem}.lora_b"] = b.detach().to(torch.bfloat16).contiguous()
        tensors["embed.rows"] = self.rows.detach().to(torch.bfloat16).contiguous()
        if len(self.head_rows):
            tensors["lm_head.rows"] = self.head_rows.detach().to(torch.bfloat16).contiguous()
        tmp = out_dir / (ADAPTER_WEIGHTS + ".tmp")
        save_file(tensors, str(tmp))
        tmp.replace(out_dir / ADAPTER_WEIGHTS)
        meta = asdict(self.cfg)
        (out_dir / (ADAPTER_JSON + ".tmp")).write_text(json.dumps(meta, indent=2) + "\n")
        (out_dir / (ADAPTER_JSON + ".tmp")).replace(out_dir / ADAPTER_JSON)


def is_adapter(model_dir: str | Path) -> bool:
    return (Path(model_dir) / ADAPTER_JSON).is_file()


def read_adapter(adapter_dir: str | Path) -> tuple[AdapterConfig, Path, dict[str, torch.Tensor]]:
    """-> config, resolved base directory, tensors."""
    adapter_dir = Path(adapter_dir)
    try:
        raw = json.loads((adapter_dir / ADAPTER_JSON).read_text())
        cfg = AdapterConfig(
            base=raw["base"],
            rank=int(raw["rank"]),
            alpha=float(raw["alpha"]),
            token_ids=tuple(raw.get("token_ids", ())),
            targets=tuple(raw.get("targets", TARGETS)),
            new_tokens=tuple(raw.get("new_tokens", ())),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ParadecError(
            f"{adapter_dir / ADAPTER_JSON} is not a valid adapter config ({exc.__class__.__name__}); "
            "re-export it with `paradec train aspd`"
        ) from None
    if cfg.base == DEFAULT_BASE:
        from paradec.zoo import default_gguf

        base = default_gguf()
    else:
        base = (adapter_dir / cfg.base).resolve() if not Path(cfg.base).is_absolute() else Path(cfg.base)
    if not base.exists():
        raise ParadecError(
            f"adapter {adapter_dir} needs its base model at {base}, which does not exist; "
            "keep the adapter next to its base or edit 'base' in adapter.json"
        )
    try:
        tensors = load_file(str(adapter_dir / ADAPTER_WEIGHTS))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ParadecError(
            f"cannot read {adapter_dir / ADAPTER_WEIGHTS} ({str(exc).splitlines()[0]}); "
            "the adapter is missing or corrupt: re-export it"
        ) from None
    return cfg, base, tensors


@torch.no_grad()
def merge_into(model: nn.Module, cfg: AdapterConfig, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Add the adapter's low-rank products and embedding rows to ``model``'s weights in place
    (after appending ``cfg.new_tokens`` to its vocabulary)."""
    extend_vocab(model, len(cfg.new_tokens))
    params = dict(model.named_parameters())
    for key, a in tensors.items():
        if not key.endswith(".lora_a"):
            continue
        stem = key.removesuffix(".lora_a")
        name, b = f"{stem}.weight", tensors.get(f"{stem}.lora_b")
        if name not in params or b is None:
            raise ParadecError(
                f"adapter {where} has {key!r}, which the base model lacks; "
                "the adapter was trained for another base model"
            )
        w = params[name]
        delta = cfg.scale * (b.float() @ a.float())
        if delta.shape != w.shape:
            raise ParadecError(
                f"adapter {where}: {key!r} gives shape {tuple(delta.shape)}, base has "
                f"{tuple(w.shape)}; the adapter was trained for another base model"
            )
        w.copy_((w.float() + delta.to(w.device)).to(w.dtype))
    if cfg.token_ids:
        rows = tensors["embed.rows"]
        ids = torch.tensor(cfg.token_ids, dtype=torch.long, device=model.embed.weight.device)
        if int(ids.max()) >= model.embed.weight.shape[0] or rows.shape[0] != len(ids):
            raise ParadecError(
                f"adapter {where}: its token rows do not fit the base's vocabulary; "
                "the adapter was trained for another base model"
            )
        model.embed.weight.index_add_(0, ids, rows.to(model.embed.weight))
        if "lm_head.rows" in tensors and not model.config.tie_word_embeddings:
            model.lm_head.weight.index_add_(0, ids, tensors["lm_head.rows"].to(model.lm_head.weight))


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)


def copy_tokenizer(src: Path, dst: Path) -> None:
    """The tokenizer (and generation config) files ``src`` has, into ``dst``."""
    import shutil

    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
