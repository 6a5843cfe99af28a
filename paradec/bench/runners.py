"""One runner per name ``paradec bench`` times: token-id prompts -> (tokens, stats) per prompt.

The engines are loaded once per weight format or runtime a method names (``ar@int4``,
``ar@llamacpp``); a peer (``bench.peers.PEERS``) is decoded by the runner its record names.
"""

from __future__ import annotations

import torch

from paradec import companions, methods
from paradec.bench.lockstep import lockstep
from paradec.bench.peers import PEERS, HFPeer, LlamaCppPeer, method_needs, own_loop, split_method
from paradec.config import AcceptConfig
from paradec.draft.oracle import OracleDrafter
from paradec.engine import load
from paradec.errors import ParadecError
from paradec.models.adapter import is_adapter, read_adapter
from paradec.models.gguf import resolve_model
from paradec.options import options_of
from paradec.policy.budget import BatchBudget

ACCEPT = {o.name for o in options_of(AcceptConfig)}


def method_options(name: str, options: dict) -> dict:
    """The ``options`` that registered method ``name`` has (a bench run's options go to the methods
    that have them: ``--expansion`` to the SSM methods, ``--tree-nodes`` to the tree ones)."""
    own = {o.name for kind in methods.get(name).options for o in options_of(kind)} | set(ACCEPT)
    return {k: v for k, v in options.items() if k in own}


def _engines(cfg, model_dir) -> dict:
    """One engine per weight format or runtime the methods name (``ar@int4``, ``ar@bf16``, ``ar@llamacpp``).
    ``full_trees``: drafters compared at one tree size, which the draft budget must not cut."""
    quants = dict.fromkeys([cfg.quant, *(split_method(m, cfg.quant)[1] for m in cfg.methods)])
    budget = not cfg.full_trees
    loaded = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.companions.items()}
    same = dict(dtype=cfg.dtype, device=cfg.device, **loaded)
    same |= dict(exact=cfg.exact, quant_head=cfg.quant_head, threads=cfg.threads, batch_budget=budget)
    engines = {}
    for q in (q for q in quants if q != "llamacpp"):
        dtype, quant = (q, "none") if q in ("bf16", "fp32") else (cfg.dtype, q)  # bf16/fp32: the weights as they are
        engines[q] = load(model_dir, backend="torch", **{**same, "dtype": dtype}, quant=quant)
    if "llamacpp" in quants:  # llama.cpp's kernels on the GGUF file as it is, with what loads beside them
        there = {k: v for k, v in loaded.items() if "llamacpp" in companions.get(k).backends}
        engines["llamacpp"] = load(cfg.model, threads=cfg.threads, batch_budget=budget, backend="llamacpp", **there)
    return engines


class Runners:
    """One callable per method: token-id prompts -> (token ids per prompt, stats per prompt)."""

    def __init__(self, cfg) -> None:  # cfg: bench.harness.BenchConfig
        self.cfg = cfg
        model_dir = resolve_model(cfg.model)  # a .gguf file: its cached HF conversion (transformers loads that)
        self.engines = _engines(cfg, model_dir)
        self.engine = self.engines[cfg.quant]
        self.twin = load(cfg.twin, dtype=cfg.dtype, device=cfg.device) if cfg.twin else None
        self.base = None  # an ASPD adapter's base model: `base-ar`, and the NLL reference nll_base
        if is_adapter(model_dir) and any("aspd_model" in method_needs(m) for m in cfg.methods):
            self.base = load(read_adapter(model_dir)[1], dtype=cfg.dtype, device=cfg.device)
        limits = dict(max_new_tokens=cfg.max_new_tokens, stop_at_eos=cfg.stop_at_eos)
        by_runner = {
            kind: [m for m in cfg.methods if m in PEERS and PEERS[m].runner == kind] for kind in ("hf", "llamacpp")
        }
        self.llamacpp = None
        if by_runner["llamacpp"]:
            self.llamacpp = LlamaCppPeer(
                cfg.model,
                by_runner["llamacpp"],
                cfg.threads or torch.get_num_threads(),
                cfg.seed,
                eos=self.engine.tokenizer.eos_ids,
                **limits,
            )
        self.hf = None
        if by_runner["hf"]:
            self.hf = HFPeer(
                model_dir,
                cfg.companions["drafts"][0]
                if "drafts" in set().union(*(PEERS[m].needs for m in by_runner["hf"]))
                else None,
                self.engine.format.dtype,
                cfg.device,
                temperature=cfg.temperature,
                **limits,
            )
        self._budgets: dict[str, BatchBudget | None] = {}  # method -> its draft budget (``_method``)
        # a peer's name -> how it is decoded (a registered method: ``_method``)
        self._peer_runners = {
            "oracle": self._oracle,
            "hf": lambda name, batch, _: (self.hf.run(name, batch), [None] * len(batch)),
            "llamacpp": lambda name, batch, _: (self.llamacpp.run(name, batch), [None] * len(batch)),
            "twin": lambda name, batch, _: self._generate(self.twin, batch, {}),
            "base": self._base,
        }

    def options(self) -> dict:
        c = self.cfg
        return dict(
            max_new_tokens=c.max_new_tokens, temperature=c.temperature, seed=c.seed, ignore_eos=not c.stop_at_eos
        )

    def run(self, method: str, batch: list[list[int]], reference: list[list[int]] | None):
        """``method``'s tokens and stats per prompt of ``batch`` (``reference``: `ar`'s tokens, which
        the oracle follows)."""
        base = split_method(method)[0]
        if base in PEERS:  # the oracle may name a weight format: oracle@bf16
            return self._peer_runners[PEERS[base].runner](method, batch, reference)
        return self._method(method, batch)

    def _method(self, method: str, batch: list[list[int]]):
        base, quant = split_method(method, self.cfg.quant)
        engine = self.engines[quant]
        opts = method_options(base, self.cfg.options)
        if method not in self._budgets:  # a draft budget per method, as it has when a user runs it alone
            self._budgets[method] = engine.own_budget()
        engine.budget = self._budgets[method]
        out = engine.generate(batch, method=base, **opts, **self.options())
        if own_loop(method):  # its own text (ASPD: markup is overhead, not output)
            return [engine.tokenizer.encode(g.text) for g in out], [g.stats for g in out]
        return [g.token_ids for g in out], [g.stats for g in out]

    def steppable(self, method: str) -> bool:
        """Whether ``method`` decodes on the default engine's scheduler (``lockstep`` can step it)."""
        base, quant = split_method(method, self.cfg.quant)
        return base not in PEERS and quant == self.cfg.quant and not own_loop(method)

    def lockstep(self, names: list[str], batch: list[list[int]]) -> dict[str, tuple]:
        """``names`` (``steppable``) on the one prompt of ``batch``, one step of each in turn, each
        with its own draft budget -> name -> (its own seconds, [tokens], [stats])."""
        opts = {k: v for k, v in self.options().items() if k != "max_new_tokens"}
        methods = {}
        for name in names:
            base = split_method(name)[0]
            methods[name] = {"method": base, **method_options(base, self.cfg.options), **opts}
            self._budgets.setdefault(name, self.engine.own_budget())
        outs = lockstep(self.engine, batch[0], methods, self.cfg.max_new_tokens, self._budgets)
        return {name: (o.stats.wall_s, [o.token_ids], [o.stats]) for name, o in outs.items()}

    def _generate(self, engine, batch: list[list[int]], opts: dict):
        out = engine.generate(batch, **opts, **self.options())
        return [g.token_ids for g in out], [g.stats for g in out]

    def _oracle(self, name: str, batch: list[list[int]], reference: list[list[int]]):
        engine = self.engines[split_method(name, self.cfg.quant)[1]]
        vocab = engine.model.config.vocab_size
        drafter = OracleDrafter([p + r for p, r in zip(batch, reference)], (1,) * self.cfg.oracle_depth, 1.0, vocab)
        return self._generate(engine, batch, {"drafter": drafter})

    def _base(self, name: str, batch: list[list[int]], _):
        if self.base is None:
            raise ParadecError("base-ar runs an ASPD adapter's base model; pass model=ADAPTER_DIR")
        return self._generate(self.base, batch, {})
