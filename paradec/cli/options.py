"""The generation flags of ``paradec generate``, ``chat``, ``serve`` and ``bench``: sampling, and
the ``SpecConfig`` options of the registered methods, with their defaults from the config records."""

from __future__ import annotations

import argparse

from paradec import methods
from paradec.config import (
    ACCEPTORS,
    DEFAULT_TREE_NODES,
    EAGLE_TREE_NODES,
    PLD_DRAFT,
    GenerationConfig,
    SamplingConfig,
    SpecConfig,
)


def add_sampling(p: argparse.ArgumentParser) -> None:
    gen, sampling = GenerationConfig(), SamplingConfig()  # defaults come from the config records
    p.add_argument("--max-new-tokens", type=int, default=gen.max_new_tokens)
    p.add_argument("--temperature", type=float, default=sampling.temperature, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=sampling.top_p)
    p.add_argument("--top-k", type=int, default=sampling.top_k)
    p.add_argument("--seed", type=int, default=sampling.seed)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep going past EOS (benchmarks)")


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


# --flag -> SpecConfig field (and the value a bare switch sets). Only flags given on the command
# line reach the engine, so a method's own options (medusa-63's tree size, specinfer+ngram's
# lookup) hold unless a flag overrides them; the defaults shown in --help are SpecConfig's.
SPEC_FLAGS = {
    "expansion": "expansion",
    "with_ngram": "with_ngram",
    "ngram": "max_ngram",
    "num_draft": "num_draft",
    "ngram_branches": "ngram_branches",
    "acceptor": "acceptor",
    "tree_nodes": "tree_nodes",
    "no_prune": "prune",
    "static_tree": "dynamic",
    "step_scores": "step_scores",
    "prune_topk": "prune_topk",
    "title_retries": "title_retries",
    "deterministic": "deterministic",
    "eagle_topk": "eagle_topk",
    "eagle_depth": "eagle_depth",
    "aspd_draft": "aspd_draft",
}


def add_spec(p: argparse.ArgumentParser) -> None:
    d = SpecConfig()
    quiet = dict(default=argparse.SUPPRESS)
    p.add_argument(
        "--expansion",
        type=int_list,
        **quiet,
        help=f"SSM children per tree level (default {','.join(map(str, d.expansion))})",
    )
    p.add_argument("--with-ngram", action="store_true", **quiet, help="specinfer: merge prompt lookup into the tree")
    p.add_argument("--ngram", type=int, **quiet, help=f"prompt lookup: longest suffix to match (default {d.max_ngram})")
    p.add_argument(
        "--num-draft",
        type=int,
        **quiet,
        help="prompt lookup: exactly this many tokens per branch "
        "(default: by the matched suffix's length, "
        + ", ".join(f"{per} a matched token up to {most} for {q}" for q, (per, most) in PLD_DRAFT.items())
        + ")",
    )
    p.add_argument(
        "--ngram-branches",
        type=int,
        **quiet,
        help=f"prompt lookup: distinct continuations (default {d.ngram_branches})",
    )
    p.add_argument(
        "--acceptor",
        choices=ACCEPTORS,
        **quiet,
        help=f"sampling acceptance (default {d.acceptor}; typical is LOSSY: medusa's typical acceptance)",
    )
    p.add_argument(
        "--tree-nodes",
        type=int,
        **quiet,
        help=f"medusa: static tree size (default: the heads' own, else {DEFAULT_TREE_NODES}); eagle: nodes "
        f"verified (default {EAGLE_TREE_NODES})",
    )
    _add_method_specific(p, d, quiet)


def _add_method_specific(p: argparse.ArgumentParser, d: SpecConfig, quiet: dict) -> None:
    """EAGLE's, ASPD's and ProPD's own flags."""
    p.add_argument(
        "--eagle-topk",
        type=int,
        **quiet,
        help=f"eagle: children per expanded node and nodes expanded per depth (default {d.eagle_topk})",
    )
    p.add_argument(
        "--eagle-depth", type=int, **quiet, help=f"eagle: depth of the drafted tree (default {d.eagle_depth})"
    )
    p.add_argument(
        "--aspd-draft",
        type=int,
        **quiet,
        help="aspd: prompt-lookup tokens drafted after every branch and serial token (aspd+spec: 4)",
    )
    p.add_argument("--no-prune", action="store_false", **quiet, help="propd: switch early pruning off (ablation)")
    p.add_argument("--static-tree", action="store_false", **quiet, help="propd: fixed tree size (ablation)")
    p.add_argument(
        "--step-scores",
        action="store_true",
        **quiet,
        help="propd: score tree nodes by this step's head probabilities (calibrated online), not average "
        "rank acceptance; a tree per row",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        **quiet,
        help="medusa/propd: a fixed-size tree from this call's statistics, never from measured time, so "
        "--seed fixes sampled text (propd then prunes every pass)",
    )
    p.add_argument(
        "--prune-topk",
        type=int,
        **quiet,
        help=f"propd: keep nodes in the parent's early top-k (default {d.prune_topk})",
    )
    p.add_argument(
        "--title-retries",
        type=int,
        **quiet,
        help=f"aspd: decode a title that repeats the plan again this often (0: a repeat ends the plan; "
        f"default {d.title_retries})",
    )


def spec_options(args: argparse.Namespace) -> dict:
    """The SpecConfig options given on the command line (and only those)."""
    return {field: getattr(args, flag) for flag, field in SPEC_FLAGS.items() if hasattr(args, flag)}


def method_help() -> str:
    return "; ".join(f"{m.name}: {m.summary}" for m in methods.methods()) + " (default: ar)"


def generation_options(args: argparse.Namespace) -> dict:
    return dict(
        method=args.method,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
        **spec_options(args),
    )
