"""The peers ``paradec bench`` measures paradec against, on the same token ids: transformers'
``generate`` (plain, assisted by a draft model, prompt lookup) and llama.cpp on the same GGUF
file (llama-cpp-python, an optional extra: plain and its prompt-lookup decoding)."""

from __future__ import annotations

from pathlib import Path

import torch

from paradec.errors import ParadecError

LLAMACPP_PLD_TOKENS = 10  # llama-cpp-python's LlamaPromptLookupDecoding default
HF_PLD_TOKENS = 10  # transformers' prompt_lookup_num_tokens default
CONTEXT = 4096  # llama.cpp's context for a bench prompt and its answer


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
