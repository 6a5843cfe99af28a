"""The method registry: every registered lossless method is greedy-identical to `ar` on a tiny
model, and a method registered in a test reaches the engine, the CLI and the bench with no other
change. Library errors name parameters; the CLI shows them as flags."""

from __future__ import annotations

import json

import pytest
from conftest import PROMPTS

import paradec
from paradec import methods
from paradec.bench.harness import BenchConfig, bench_methods
from paradec.cli import build_parser, main
from paradec.cli.common import flag_message
from paradec.cpu import PassCost
from paradec.draft import DrafterHooks, DraftTree, merge
from paradec.draft.base import TreeOptions
from paradec.draft.datastore import Datastore
from paradec.draft.eagle import EagleOptions
from paradec.draft.heads import PruneOptions
from paradec.draft.ngram import LookupOptions
from paradec.errors import ParadecError

N_NEW = 20


@pytest.fixture(scope="module")
def engine(llama_dir, drafters, tmp_path_factory):
    import torch

    from paradec.models.eagle import EagleHead

    draft, heads = drafters
    engine = paradec.load(llama_dir, dtype="fp32", drafts=[draft], heads=heads, cost=PassCost.flat())  # drafts pay
    # every tree verified whole: with the batch budget, whether a method drafts at all would
    # depend on its drafting's measured time against the tiny model's pass (``policy.budget``)
    engine.budget = None
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("eagle") / "head"
    EagleHead(engine.model.config).save(path, {})
    engine.load_companion("eagle", path)
    # a datastore of the first halves of `ar`'s answers: rest's chains are right, then wrong
    ar = [g.token_ids for g in engine.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)]
    ids = engine.tokenizer.hf(PROMPTS).input_ids
    store = tmp_path_factory.mktemp("datastore")
    Datastore.build([p + a[: N_NEW // 2] for p, a in zip(ids, ar)]).save(store)
    engine.load_companion("datastore", store)
    return engine


TREE_METHODS = [m.name for m in methods.methods() if m.lossless and m.drafter is not None]


@pytest.mark.parametrize("name", TREE_METHODS)
def test_every_registered_lossless_method_is_greedy_ar(engine, name):
    ar = [g.token_ids for g in engine.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)]
    # auto: choices from the tokens alone, not from timings, so that it speculates on any CPU
    opts = {"deterministic": True} if name == "auto" else {}
    out = engine.generate(PROMPTS, method=name, max_new_tokens=N_NEW, ignore_eos=True, **opts)
    assert [g.token_ids for g in out] == ar
    if name != "ar":
        assert sum(g.stats.verified for g in out) > sum(g.stats.steps for g in out)  # it did speculate


def test_method_presets_are_defaults_the_caller_can_override(engine):
    assert engine.config(method="specinfer+ngram").option(LookupOptions).with_ngram
    assert not engine.config(method="specinfer+ngram", with_ngram=False).option(LookupOptions).with_ngram
    assert engine.config(method="medusa-63").option(TreeOptions).tree_nodes == 63
    gen = engine.config(method="propd")
    assert gen.option(PruneOptions).prune and gen.option(TreeOptions).dynamic
    assert not engine.config(method="medusa").option(PruneOptions).prune


def test_an_option_is_checked_against_its_method_and_its_type(engine):
    with pytest.raises(ParadecError, match="method pld has no option eagle_topk"):
        engine.config(method="pld", eagle_topk=3)
    with pytest.raises(ParadecError, match="eagle_topk must be an int"):
        engine.config(method="eagle", eagle_topk="3")
    with pytest.raises(ParadecError, match="eagle_topk and eagle_depth must be in"):
        engine.config(method="eagle", eagle_topk=0)
    with pytest.raises(TypeError, match="unexpected option 'eagle_top'"):
        engine.config(method="eagle", eagle_top=3)
    assert engine.config(method="eagle", eagle_topk=3).option(EagleOptions).eagle_topk == 3


class EchoDrafter(DrafterHooks):
    """Proposes the last 3 tokens again as a chain: a new method in a dozen lines."""

    max_nodes = 3

    def begin(self, prompts, max_len, features=None):
        pass

    def propose(self, sequences, generators):
        return [merge(seq[-1], [DraftTree([seq[-1], *seq[-4:-1]], [-1, 0, 1, 2], [None] * 4)]) for seq in sequences]

    def commit(self, row, accepted, bonus, hidden=None):
        pass


@pytest.fixture
def echo():
    methods.register(methods.Method("echo", "repeat the last tokens", drafter=lambda target, gen: EchoDrafter()))
    yield
    methods.unregister("echo")


def test_a_new_method_is_one_registration(engine, echo, llama_dir, tmp_path, capsys):
    ar = engine.generate(PROMPTS[0], max_new_tokens=N_NEW, ignore_eos=True)
    out = engine.generate(PROMPTS[0], method="echo", max_new_tokens=N_NEW, ignore_eos=True)
    assert out.token_ids == ar.token_ids and out.stats.verified > out.stats.steps
    assert (
        "echo"
        in build_parser()._subparsers._group_actions[0].choices["generate"]._option_string_actions["--method"].choices
    )
    assert "echo" in bench_methods()
    BenchConfig(model=str(llama_dir), methods=("ar", "echo"), prompts="p", out="o")  # accepted
    assert (
        main(
            [
                "generate",
                "--model",
                str(llama_dir),
                "--method",
                "echo",
                "--max-new-tokens",
                "8",
                "--ignore-eos",
                "--json",
                PROMPTS[0],
            ]
        )
        == 0
    )
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 8


def test_registry_rejects_duplicates_and_unknown_names():
    with pytest.raises(ValueError):
        methods.register(methods.Method("ar", "again", drafter=lambda t, g: None))
    with pytest.raises(ParadecError, match="unknown method 'warp'"):
        methods.get("warp")
    with pytest.raises(ValueError):
        methods.Method("both", "", drafter=lambda t, g: None, decode=lambda e, p, g: [])


def test_needs_are_checked_before_decoding(llama_dir):
    bare = paradec.load(llama_dir, dtype="fp32")
    for name in ("specinfer", "medusa", "propd"):
        with pytest.raises(ParadecError, match=f"method {name} needs"):
            bare.generate("x", method=name, max_new_tokens=2)
    with pytest.raises(ParadecError, match="decodes greedily"):
        bare.generate("x", method="aspd", temperature=0.5)


@pytest.mark.parametrize(
    "message, shown",
    [
        ("pass model=PATH to a directory", "pass --model PATH to a directory"),
        ("load them (drafts=PATH)", "load them (--draft PATH)"),
        ("set temperature=0", "set --temperature 0"),
        ("or drop chat=True)", "or drop --chat)"),
        ("(set prune=False)", "(set --no-prune)"),
        (
            "batch_size=, repeats=, max_new_tokens= and oracle_depth= must be >= 1",
            "--batch-size, --repeats, --max-new-tokens and --oracle-depth must be >= 1",
        ),
        ("rope_scaling=linear is not a flag", "rope_scaling=linear is not a flag"),
    ],
)
def test_cli_shows_parameters_as_flags(message, shown):
    assert flag_message(message, build_parser()) == shown
