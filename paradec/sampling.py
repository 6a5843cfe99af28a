"""Pure functions from logits to a next-token distribution and a token.

``probs(logits, cfg)`` applies temperature, then top-k, then top-p (the order transformers'
``generate`` uses) and returns the distribution the token is drawn from. Speculative
acceptors call the same function on the target p and the draft q, so both are warped alike.
"""

from __future__ import annotations

import torch

from paradec.config import SamplingConfig


def warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, top-k and top-p applied to ``logits`` [..., vocab] (fp32 out; removed = -inf).

    Example: logits [2., 1., 0.] with top_k=2 -> [2., 1., -inf] / temperature.
    """
    x = logits.float() / cfg.temperature
    vocab = x.shape[-1]
    if 0 < cfg.top_k < vocab:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        cum = sorted_x.softmax(-1).cumsum(-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token)
        drop_sorted = (cum - sorted_x.softmax(-1)) >= cfg.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The first maximal index along the last axis: [..., vocab] -> [...] (int64).

    Same result as ``argmax`` (both return the first maximum on ties), but ``max`` is ~5x
    faster on bf16 CPU tensors (0.05 vs 0.28 ms for a 17-node tree over 8k tokens), which is
    3-5 % of a decoding step here.
    """
    return logits.max(-1).indices


def probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution tokens are drawn from: [..., vocab] -> [..., vocab] (fp32, rows sum to 1).

    Greedy configs give the one-hot of the argmax, so greedy and sampling share code paths.
    """
    if cfg.greedy:
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return out.scatter_(-1, greedy(logits)[..., None], 1.0)
    return warp(logits, cfg).softmax(-1)


def sample(p: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``p`` [rows, vocab] -> [rows] (int64)."""
    return torch.multinomial(p, 1, generator=generator).squeeze(-1)


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """Argmax when greedy, else a draw from ``probs``: [rows, vocab] -> [rows]."""
    if cfg.greedy:
        return greedy(logits)
    return sample(probs(logits, cfg), generator)
