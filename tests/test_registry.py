"""A method brings everything it needs: registered in a test with an options record of its own
and a companion of its own (a file loaded beside the target), it is reachable through the Python
API, `paradec generate --its-flag`, `paradec bench`, the server's request body and the demo,
with no other change anywhere."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import PROMPTS

import paradec
from paradec import companions, methods
from paradec.cli import build_parser, main
from paradec.cli.common import flag_message
from paradec.draft import DrafterHooks, DraftTree, merge
from paradec.errors import ParadecError
from paradec.options import option

N_NEW = 12
SHIPPED: dict[str, Path] = {}  # model path -> its echo table: the "zoo" of this test's companion


@dataclass(frozen=True)
class EchoOptions:
    echo_back: int = option(3, "echo: how many of the last tokens to propose again")

    def __post_init__(self) -> None:
        if self.echo_back < 1:
            raise ParadecError(f"echo_back must be >= 1, got {self.echo_back}")


class EchoDrafter(DrafterHooks):
    """Proposes the ``back`` tokens before the root again, as a chain; ``table`` is its companion."""

    def __init__(self, back: int, table: dict) -> None:
        self.max_nodes, self.table = back, table

    def begin(self, prompts, max_len, features=None):
        pass

    def propose(self, sequences, generators):
        n = self.max_nodes
        return [
            merge(s[-1], [DraftTree([s[-1], *s[-n - 1 : -1]], list(range(-1, n)), [None] * (n + 1))]) for s in sequences
        ]

    def commit(self, row, accepted, bonus, hidden=None):
        pass


def _load_table(engine, path) -> dict:
    table = json.loads(Path(path).read_text())
    if "echo" not in table:
        raise ParadecError(f"{path} is not an echo table; pass echo_table=PATH to one")
    return table


@pytest.fixture
def echo(tmp_path, llama_dir):
    table = tmp_path / "echo.json"
    table.write_text(json.dumps({"echo": True}))
    SHIPPED[str(llama_dir)] = table
    companions.register(
        companions.Companion(
            "echo_table",
            "an echo table",
            "--echo-table",
            "echo's table",
            _load_table,
            lambda model: SHIPPED.get(str(model)),
        )
    )
    methods.register(
        methods.Method(
            "echo",
            "repeat the last tokens",
            drafter=lambda target, gen: EchoDrafter(gen.option(EchoOptions).echo_back, target.companions["echo_table"]),
            needs=("echo_table",),
            options=(EchoOptions,),
            demo={},
        )
    )
    yield table
    methods.unregister("echo")
    companions.unregister("echo_table")
    SHIPPED.clear()


def _nodes_per_step(stats: dict) -> float:
    return stats["nodes_per_step"]


def test_python_api_and_its_errors(echo, llama_dir):
    bare = paradec.load(llama_dir, dtype="fp32", warmup=False)
    with pytest.raises(ParadecError, match="method echo needs an echo table; load it") as err:
        bare.generate(PROMPTS[0], method="echo")
    assert "--echo-table PATH" in flag_message(str(err.value), build_parser())  # the CLI says the flag
    engine = paradec.load(llama_dir, dtype="fp32", warmup=False, echo_table=echo)
    assert engine.companions["echo_table"] == {"echo": True}
    ar = engine.generate(PROMPTS[0], max_new_tokens=N_NEW, ignore_eos=True)
    out = engine.generate(PROMPTS[0], method="echo", echo_back=2, max_new_tokens=N_NEW, ignore_eos=True)
    assert out.token_ids == ar.token_ids and _nodes_per_step(out.stats.as_dict()) == 3  # root + 2
    with pytest.raises(ParadecError, match="echo_back must be >= 1"):
        engine.config(method="echo", echo_back=0)
    with pytest.raises(ParadecError, match="method pld has no option echo_back"):
        engine.config(method="pld", echo_back=2)


def test_cli_generate_takes_its_flags(echo, llama_dir, capsys):
    args = ["generate", "--model", str(llama_dir), "--method", "echo", "--max-new-tokens", "8", "--ignore-eos"]
    assert main([*args, "--echo-table", str(echo), "--echo-back", "4", "--json", PROMPTS[0]]) == 0
    assert _nodes_per_step(json.loads(capsys.readouterr().out)) == 5
    assert main([*args, "--echo-back", "0", PROMPTS[0]]) == 2  # before any model loads
    assert "echo_back must be >= 1" in capsys.readouterr().err
    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    assert "--echo-back" in generate.format_help() and "--echo-table" in generate.format_help()


def test_bench_runs_it_with_its_option(echo, llama_dir, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("def fibonacci(n):\n")
    out = tmp_path / "bench"
    common = ["--model", str(llama_dir), "--prompts", str(prompts), "--max-new-tokens", "8", "--out", str(out)]
    assert main(["bench", "--methods", "ar,echo", "--echo-back", "2", "--dtype", "fp32", *common]) == 0
    records = json.loads((out / "results.json").read_text())["records"]
    echo_rec = next(r for r in records if r["method"] == "echo")
    assert echo_rec["identical_to_ar"] is True  # the zoo's table was loaded for it
    assert echo_rec["nodes_per_step"] == 3  # --echo-back 2 reached it: root + 2 per step


def test_the_server_takes_its_option_in_the_request_body(echo, llama_dir):
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_serve import _Server

    from paradec.serve import build_app

    engine = paradec.load(llama_dir, dtype="fp32", warmup=False, echo_table=echo)
    server = _Server(build_app(engine, "tiny", max_batch=2))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
        want = engine.generate(PROMPTS[0], max_new_tokens=N_NEW).text
        ok = client.completions.create(
            model="tiny",
            prompt=PROMPTS[0],
            max_tokens=N_NEW,
            temperature=0,
            extra_body={"method": "echo", "echo_back": 2},
        )
        assert ok.usage.paradec["method"] == "echo"
        with pytest.raises(openai.BadRequestError, match="echo_back must be >= 1"):
            client.completions.create(
                model="tiny", prompt=PROMPTS[0], max_tokens=4, extra_body={"method": "echo", "echo_back": 0}
            )
    finally:
        server.stop()
    assert ok.choices[0].text == want


def test_the_demo_shows_it_with_the_zoos_companion(echo, llama_dir, capsys):
    from paradec.demo import run_demo

    summary = run_demo(max_new_tokens=6, dtype="fp32", model=str(llama_dir), quant="none")
    row = next(r for r in summary if r["method"] == "echo")
    assert row["identical"].split("/")[0] == row["identical"].split("/")[1]
    assert "an echo table" in capsys.readouterr().out
