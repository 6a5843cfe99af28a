"""What ``paradec bench`` measures: paradec's registered methods (``paradec.methods``) and the
peers beside them, on the same token ids.

A peer is a ``Peer`` record in ``PEERS``: its name, what it needs loaded, whether it runs at
batch 1 only or greedy only, whether its tokens should equal the target's `ar`, and which runner
(``bench.runners``) decodes it: transformers' ``generate`` (plain, assisted by a draft model,
prompt lookup: ``HFPeer``), llama.cpp on the same GGUF file (llama-cpp-python, an optional extra:
plain and its prompt-lookup decoding: ``LlamaCppPeer``), an oracle drafter (the reference
continuation: the acceptance ceiling of a deep chain), the ASPD model's Seq twin and its base.
A method may carry a runtime after "@" (``ar@int4``, ``ar@llamacpp``): it then runs on the model
loaded that way, next to the others in one interleaved run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from paradec import methods
from paradec.errors import ParadecError
from paradec.models.quant import QUANTS

LLAMACPP_PLD_TOKENS = 10  # llama-cpp-python's LlamaPromptLookupDecoding default
HF_PLD_TOKENS = 10  # transformers' prompt_lookup_num_tokens default
CONTEXT = 4096  # llama.cpp's context for a bench prompt and its answer


@dataclass(frozen=True)
class Peer:
    name: str
    runner: str  # which runner decodes it: "hf" | "llamacpp" | "oracle" | "twin" | "base" (bench.runners)
    needs: tuple[str, ...] = ()  # what must be loaded: methods.NEEDS, "twin", "gguf"
    batch1_only: bool = False  # left out of a batched run
    greedy_only: bool = False  # left out of a sampled run
    lossless: bool = True  # its tokens should equal the target's `ar` (a twin or a base decodes another model)


PEERS = {
    p.name: p
    for p in (
        Peer("oracle", "oracle", greedy_only=True),
        Peer("hf", "hf"),
        Peer("hf-assisted", "hf", needs=("drafts",), batch1_only=True),
        Peer("hf-pld", "hf", batch1_only=True),
        Peer("seq-twin", "twin", needs=("aspd_model", "twin"), lossless=False),
        Peer("base-ar", "base", needs=("aspd_model",), lossless=False),
        Peer("llamacpp", "llamacpp", needs=("gguf",)),
        Peer("llamacpp-pld", "llamacpp", needs=("gguf",)),
    )
}
# what may follow a method's "@": a weight format of paradec's torch runtime (a quant, or bf16 / fp32
# weights as they are), or llama.cpp as the runtime of the target's passes (models.llamacpp: ar@llamacpp)
RUNTIMES = ("auto", *QUANTS, "bf16", "fp32", "llamacpp")


def bench_methods() -> tuple[str, ...]:
    """Every name ``--methods`` takes: the registered methods, then the peers."""
    return (*methods.names(), *PEERS)


def split_method(name: str, default_quant: str = "none") -> tuple[str, str]:
    """ "ar@int4" -> ("ar", "int4"); "ar" -> ("ar", default_quant)."""
    base, _, quant = name.partition("@")
    return base, quant or default_quant


def lossless(name: str) -> bool:
    """Whether its tokens should equal the target's `ar`."""
    base = split_method(name)[0]
    return PEERS[base].lossless if base in PEERS else methods.get(base).lossless


def own_loop(name: str) -> bool:
    """A registered method with a decode loop of its own (ASPD)."""
    base = split_method(name)[0]
    return base not in PEERS and methods.get(base).decode is not None


def same_tokens_as(name: str) -> str | None:
    """The method whose tokens this one must equal, where that is not `ar`."""
    base = split_method(name)[0]
    return None if base in PEERS else methods.get(base).same_tokens_as


def method_needs(name: str) -> set[str]:
    base = split_method(name)[0]
    return set(PEERS[base].needs) if base in PEERS else methods.get(base).loads


class HFPeer:
    """transformers' ``generate``: methods hf, hf-assisted (draft model) and hf-pld."""

    def __init__(
        self,
        model_dir: Path,
        draft: str | None,
        dtype: torch.dtype,
        device: str,
        *,
        temperature: float,
        max_new_tokens: int,
        stop_at_eos: bool,
    ) -> None:
        import transformers
        from transformers import AutoModelForCausalLM

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
        self.draft = (
            None if draft is None else AutoModelForCausalLM.from_pretrained(draft, dtype=dtype).to(device).eval()
        )
        self.device, self.temperature = device, temperature
        self.max_new_tokens, self.stop_at_eos = max_new_tokens, stop_at_eos

    def run(self, method: str, batch: list[list[int]]) -> list[list[int]]:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=self.device)  # left pad
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=self.device)
        kw = dict(
            max_new_tokens=self.max_new_tokens, pad_token_id=0, attention_mask=mask, do_sample=self.temperature > 0
        )
        if self.temperature > 0:
            kw.update(temperature=self.temperature, top_k=0)
        if not self.stop_at_eos:
            kw["min_new_tokens"] = self.max_new_tokens
        if method == "hf-assisted":
            kw["assistant_model"] = self.draft
        elif method == "hf-pld":
            kw["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
        with torch.inference_mode():
            out = self.model.generate(ids, **kw)
        return [row[width:].tolist() for row in out]


class LlamaCppPeer:
    """Greedy llama.cpp on each prompt's token ids (the same GGUF file, so the same vocabulary),
    from an empty cache each time, so it pays for its prefill as paradec does."""

    def __init__(
        self,
        gguf: str,
        methods: list[str],
        threads: int,
        seed: int,
        *,
        eos: frozenset,
        max_new_tokens: int,
        stop_at_eos: bool,
    ) -> None:
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError:
            raise ParadecError(
                "llamacpp needs llama-cpp-python; pip install -e '.[llamacpp]' (it builds "
                "llama.cpp from source, ~10 minutes on 2 cores)"
            ) from None
        self.llms = {}
        for name in methods:
            draft = LlamaPromptLookupDecoding(num_pred_tokens=LLAMACPP_PLD_TOKENS) if name == "llamacpp-pld" else None
            # with a draft model, llama-cpp-python keeps the scores of one batch only: a prompt longer than
            # n_batch fails in its eval (0.3.36), so the batch holds the whole context there
            batch = CONTEXT if draft is not None else 512
            self.llms[name] = Llama(
                gguf,
                n_ctx=CONTEXT,
                n_batch=batch,
                n_threads=threads,
                n_threads_batch=threads,
                draft_model=draft,
                verbose=False,
                seed=seed,
            )
        self.eos, self.max_new_tokens, self.stop_at_eos = eos, max_new_tokens, stop_at_eos

    def run(self, method: str, batch: list[list[int]]) -> list[list[int]]:
        llm = self.llms[method]
        out = []
        for ids in batch:
            llm.reset()
            tokens: list[int] = []
            for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
                tokens.append(int(tok))
                if len(tokens) >= self.max_new_tokens or (self.stop_at_eos and tok in self.eos):
                    break
            out.append(tokens)
        return out
