"""EAGLE's draft head: predicts the target's next feature from its features and the next token.

The feature of position t is the target's final normed hidden state there (what its LM head
reads; EAGLE-1/2's choice, see docs/ARCHITECTURE.md). The head reads pairs (f_t, x_{t+1}):

    f^_{t+1} = Block(fc([embed(x_{t+1}); f_t]))       one decoder layer of this runtime
    q(x_{t+2}) = softmax(lm_head(f^_{t+1}))            the target's own LM head, frozen

``embed`` and ``lm_head`` are the target's modules, shared (passed in, never saved). A head may
carry a draft vocabulary (EAGLE-3's idea): ``vocab`` [K], the K tokens the target emits most
often; the drafter then reads only those K rows of the LM head (K = 8192 of SmolLM2's 49,152
cuts the largest matmul of a draft step 6x), and q is zero outside them. That changes what is
proposed, never what is verified. The head keeps its own one-layer KV cache (``new_cache``), which the drafter keeps in
step with what the target commits. Saved as ``eagle.safetensors`` + ``eagle.json`` (the
layer's shape, the training summary).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from paradec.config import ModelConfig
from paradec.errors import ParadecError
from paradec.kv import KVCache
from paradec.models import native as native_mod
from paradec.models.decode import LayerKernels, linear_kernel
from paradec.models.llama import Block, modules_generation, rope_inv_freq, rope_tables
from paradec.models.quant import Int4Linear, Int8Linear, PackedLinear

EAGLE_JSON = "eagle.json"
EAGLE_WEIGHTS = "eagle.safetensors"


class EagleHead(nn.Module):
    def __init__(self, target: ModelConfig, draft_vocab: int | None = None) -> None:
        super().__init__()
        self.config = replace(target, num_layers=1)
        h = target.hidden_size
        self.fc = nn.Linear(2 * h, h)
        self.block = Block(self.config, 0)
        self.block.attn.exact = self.block.mlp.exact = False  # a draft needs no bit-exact path
        self.register_buffer("inv_freq", rope_inv_freq(target), persistent=False)
        # [K] token ids of the draft vocabulary (None: all; a None buffer is not saved)
        self.register_buffer("vocab", None if draft_vocab is None else torch.arange(draft_vocab))
        self._lm_rows: tuple[tuple, torch.Tensor] | None = None  # (lm head, dtype, device) -> lm_rows' answer
        self._draft_logits: tuple[tuple, Callable] | None = None  # (lm head, dtype, device) -> draft_logits'
        self._plan: tuple | None = None  # (modules_generation(), ``_native``'s answer)

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the linears may hold int8 weights: ``quantize_linears``)."""
        return self.block.attn_norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.block.attn_norm.weight.device

    def set_vocab(self, tokens: torch.Tensor) -> None:
        """tokens [K]: the draft vocabulary (distinct ids, most frequent first)."""
        self.vocab = tokens.to(device=self.device, dtype=torch.long).clone()
        self._lm_rows = self._draft_logits = None

    def lm_rows(self, lm_head: nn.Module) -> torch.Tensor:
        """The LM head's rows that the draft reads: [K or vocab, hidden], in the head's dtype. A
        quantized head (``--quant``) gives its dequantized rows: the draft's logits read the
        weights the target's do. Kept for the next request (dequantizing costs ~130 ms a call for
        SmolLM2's 49k rows); a new vocabulary or head drops it."""
        key = (id(lm_head), self.dtype, self.device)
        if self._lm_rows is not None and self._lm_rows[0] == key:
            return self._lm_rows[1]
        if isinstance(lm_head, (Int8Linear, Int4Linear, PackedLinear)):
            w = lm_head.dequantized().to(self.dtype)
        else:
            w = lm_head.weight
        rows = w if self.vocab is None else w[self.vocab.to(w.device)]
        if not rows.requires_grad:  # training reads them through autograd: never kept
            self._lm_rows = (key, rows)
        return rows

    def draft_logits(self, lm_head: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        """How drafting reads the LM head: predicted features [..., hidden] -> logits [..., K or
        vocab] fp32. An int8 head (every quantized format's, ``quantize_linears``) where its C kernel
        runs: that kernel over the draft vocabulary's int8 rows (4.7 MB for SmolLM2's 8k), not a
        product with their dequantized bf16 form (on 2 AVX2 cores 2.2 ms a depth of 4 frontier
        nodes, ~12 ms an EAGLE tree). Else the product with ``lm_rows``. Kept like ``lm_rows``."""
        key = (id(lm_head), self.dtype, self.device)
        if self._draft_logits is not None and self._draft_logits[0] == key:
            return self._draft_logits[1]
        if isinstance(lm_head, Int8Linear) and lm_head.native_kernel() is not None:
            w, s = lm_head.weight, lm_head.scales
            if self.vocab is not None:
                at = self.vocab.to(w.device)
                w, s = w[at], s[at]
            mm, dtype = native_mod.q8_kernel(*native_mod.pack_q8(w, s.float()), None, len(w)), self.dtype

            def logits(f: torch.Tensor) -> torch.Tensor:
                return mm(f.to(dtype)).float()

        else:
            rows = self.lm_rows(lm_head)  # [K or vocab, hidden]

            def logits(f: torch.Tensor) -> torch.Tensor:
                return (f @ rows.T).float()

        self._draft_logits = (key, logits)
        return logits

    def forward(
        self,
        feats: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        embed: nn.Embedding,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """feats [b, n, hidden] (f_t), tokens [b, n] (x_{t+1}), positions [b, n], mask
        [b, 1, n, span] | None (None without a cache: causal) -> predicted features [b, n, hidden]."""
        pair = torch.cat([embed(tokens).to(feats.dtype), feats], -1)  # [b, n, 2 hidden]
        native = self._native() if cache is not None and not pair.requires_grad else None
        x = (self.fc if native is None else native[0])(pair)
        cos, sin = rope_tables(self.inv_freq, positions, x.dtype)
        if native is None:
            return self.block(x, cos, sin, mask, cache)
        _, plan, table = native
        return native_mod.native_layers(plan, x, cos, sin, mask, cache, None, None if table is None else (table, 0))

    def _native(self) -> tuple[Callable, list[LayerKernels], native_mod.LayerTable | None] | None:
        """The drafting passes in C (``models.native``) where every linear has a C kernel (an int8
        head, ``quantize_linears``) and the layer fits: (fc's kernel, the block's ``LayerKernels``,
        its ``LayerTable`` for one call or None). A draft pass is exact there at no cost; on 2 AVX2
        cores it is ~3x faster than torch's ops with int8 weights. Rebuilt after the process
        registers a module, parameter or buffer, or the head is moved or cast (``_apply``)."""
        gen = modules_generation()
        if self._plan is None or self._plan[0] != gen:
            fc = linear_kernel(self.fc, False, native=True)
            block = self.block.kernels(native=True)
            kernels = (fc, block.qkv, block.wo, block.gate_up, block.down)
            ok = native_mod.supports(self.dtype, self.device, self.config.head_dim)
            ok = ok and all(getattr(k, "parts", None) is not None for k in kernels)
            built = (fc, [block], native_mod.LayerTable.of([block], self.dtype)) if ok else None
            self._plan = (gen, built)
        return self._plan[1]

    def _apply(self, fn, recurse=True):
        self._plan = None
        return super()._apply(fn, recurse)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        cfg = self.config
        return KVCache(1, batch, cfg.num_kv_heads, cfg.head_dim, max_len, self.dtype, self.device)

    def save(self, out_dir: str | Path, meta: dict) -> None:
        """eagle.safetensors (bf16) + eagle.json, written atomically."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / (EAGLE_WEIGHTS + ".tmp")
        save_file(
            {
                k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                for k, v in self.state_dict().items()
            },
            str(tmp),
        )
        tmp.replace(out_dir / EAGLE_WEIGHTS)
        meta = {
            **meta,
            "target": asdict(self.config) | {"num_layers": None},
            "draft_vocab": None if self.vocab is None else len(self.vocab),
        }
        (out_dir / (EAGLE_JSON + ".tmp")).write_text(json.dumps(meta, indent=2, default=list) + "\n")
        (out_dir / (EAGLE_JSON + ".tmp")).replace(out_dir / EAGLE_JSON)


def load_eagle(path: str | Path, target: ModelConfig, dtype: torch.dtype, device) -> EagleHead:
    """The head in ``path`` for a model of shape ``target``."""
    path = Path(path)
    if not (path / EAGLE_JSON).is_file():
        raise ParadecError(f"no EAGLE head at {path} (eagle.json missing); train one with `paradec train eagle`")
    try:
        tensors = load_file(str(path / EAGLE_WEIGHTS))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ParadecError(
            f"cannot read {path / EAGLE_WEIGHTS} ({str(exc).splitlines()[0]}); retrain or re-copy the head"
        ) from None
    try:
        meta = json.loads((path / EAGLE_JSON).read_text())
    except ValueError:
        raise ParadecError(f"{path / EAGLE_JSON} is not valid JSON; retrain or re-copy the head") from None
    head = EagleHead(target, meta.get("draft_vocab"))
    want = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if want != got:
        raise ParadecError(
            f"the EAGLE head at {path} was trained for another model (its shapes differ from this "
            "model's); pass the head trained for this model"
        )
    head.load_state_dict(tensors)
    if head.vocab is not None and int(head.vocab.max()) >= target.vocab_size:
        raise ParadecError(
            f"the EAGLE head at {path} drafts tokens this model lacks (its draft vocabulary was built "
            "for another tokenizer); pass the head trained for this model"
        )
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)
