"""ASPD extraction: known inputs give known groups; dependent functions are rejected; the
markup is removable; the judge is asked and obeyed."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from conftest import THREE_FUNCTIONS

from paradec.parallel.extract import code_groups, find_groups, prose_groups
from paradec.parallel.markup import BRANCH, PARA, TITLE, mark_up, strip_markup
from paradec.parallel.pipeline import extract_file, make_judge

CODE = THREE_FUNCTIONS + "\n\nprint(describe(2))\n"


def test_independent_functions_group_and_caller_is_cut():
    groups = code_groups(CODE)
    assert [[b.title for b in g.branches] for g in groups] == [["area", "perimeter"]]
    marked = mark_up(CODE, groups)
    assert f"{TITLE}area" in marked and f"{BRANCH}perimeter: def perimeter" in marked
    assert strip_markup(marked) == CODE


def test_two_functions_where_one_calls_the_other_are_rejected():
    code = "def helper(x):\n    return x + 1\n\n\ndef main(x):\n    return helper(x) * 2\n"
    assert code_groups(code) == []


def test_methods_using_each_other_through_self_are_rejected():
    code = (
        "class A:\n    def a(self):\n        return 1\n\n    def b(self):\n        return 2\n\n"
        "    def c(self):\n        return self.a() + 1\n"
    )
    assert [[b.title for b in g.branches] for g in code_groups(code)] == [["a", "b"]]


def test_prose_list_items_and_references():
    ok = (
        "Tips:\n\n1. **Sleep** well every night, eight hours.\n2. **Exercise** three times a week.\n"
        "3. **Eat** more vegetables and fruit.\n\nDone."
    )
    groups = prose_groups(ok)
    assert len(groups) == 1 and [b.title for b in groups[0].branches] == ["1. Sleep", "2. Exercise", "3. Eat"]
    assert strip_markup(mark_up(ok, groups)) == ok
    steps = "1. Boil water in a kettle.\n2. Then pour it over the tea leaves.\n3. Wait four minutes before drinking."
    assert prose_groups(steps) == []


def test_code_in_markdown_fence_and_integrity():
    text = "Here you go:\n\n```python\n" + CODE + "```\n\nThat is all."
    groups = find_groups(text)
    assert len(groups) == 1 and groups[0].kind == "code"
    marked = mark_up(text, groups)
    assert PARA in marked and strip_markup(marked) == text


class _FakeJudge(BaseHTTPRequestHandler):
    verdicts: list[str] = []
    seen: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeJudge.seen.append(body)
        reply = _FakeJudge.verdicts.pop(0) if _FakeJudge.verdicts else "[PARALLEL] true"
        data = json.dumps({"choices": [{"message": {"content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def judge_url():
    server = HTTPServer(("127.0.0.1", 0), _FakeJudge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def test_judge_needs_three_unanimous_votes(judge_url):
    judge = make_judge(judge_url, "fake")
    _FakeJudge.seen.clear()
    _FakeJudge.verdicts = ["[PARALLEL] true", "[PARALLEL] true", "[PARALLEL] true"]
    assert len(find_groups(CODE, judge)) == 1 and len(_FakeJudge.seen) == 3
    assert "[Branch 2]" in _FakeJudge.seen[0]["messages"][1]["content"]
    _FakeJudge.verdicts = ["[PARALLEL] true", "[PARALLEL] false", "[PARALLEL] true"]
    assert find_groups(CODE, judge) == []


def test_extract_file_stats(tmp_path):
    inp = tmp_path / "answers.jsonl"
    recs = [{"question_id": 1, "choices": [{"turns": [CODE]}]}, {"question_id": 2, "choices": [{"turns": ["no"]}]}]
    inp.write_text("\n".join(json.dumps(r) for r in recs))
    stats = extract_file(inp, tmp_path / "out.jsonl")
    assert stats["answers"] == 2 and stats["ppd"] == 0.5 and stats["branches_per_group"] == 2
    assert 0 < stats["degree_of_parallelism"] < 1
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out[0]["parallel"] and strip_markup(out[0]["marked"]) == CODE


def test_strip_markup_of_a_cut_output():
    from paradec.parallel.markup import strip_markup

    cut = "a\n<|title|>x<|/title|><|title|>y<|/title|><|para|><|branch|>x: def x(): pass\n<|/branch|><|branch|>y:def y("
    assert strip_markup(cut) == "a\ndef x(): pass\ndef y("
    assert strip_markup("<|title|>x<|/title|><|para|><|branch|>x: 1<|branch|>y: 2") == "1\n2"
    # a branch the budget ended mid-line (end marker forced) does not run into the next one
    forced = "<|para|><|branch|>x: def x():\n    ret<|/branch|><|branch|>y: def y():\n    pass\n<|/branch|><|/para|>"
    assert strip_markup(forced) == "def x():\n    ret\ndef y():\n    pass\n"


def test_ceilings_count_the_longest_branch_and_the_markup(tmp_path):
    # 3 tips of 8, 7 and 8 words between 4 + 3 serial words (whitespace word counts):
    # in parallel the group costs its longest branch (8 passes), in ASPD's format also its
    # plan (4 "words": each title starts with its number, "<|title|>1. Sleep<|/title|>..."), the
    # longest branch's "<|branch|>3. Move: " prefix and its end marker (+3) and <|/para|> (+1)
    text = (
        "Here are three tips:\n\n1. **Sleep**: go to bed early every night.\n"
        "2. **Food**: eat fresh vegetables and fruit.\n3. **Move**: walk thirty minutes a day outside.\n\nThat is all."
    )
    inp = tmp_path / "answers.jsonl"
    inp.write_text(json.dumps({"text": text}) + "\n")
    stats = extract_file(inp, tmp_path / "out.jsonl")
    assert stats["branches_per_group"] == 3
    assert stats["ceiling_speedup"] == round(30 / (30 - 23 + 8), 3)
    assert stats["ceiling_speedup_marked"] == round(30 / (30 - 23 + 4 + 11 + 1), 3)
    assert (
        stats["ceiling_parallel_answers_marked"]
        == stats["ceiling_best_answer_marked"]
        == stats["ceiling_speedup_marked"]
    )


def test_well_formed_counts_a_renumbered_title_as_a_repeat():
    from paradec.parallel.quality import well_formed

    def answer(titles, branches=None):
        plan = "".join(f"<|title|>{t}<|/title|>" for t in titles) + "<|para|>"
        return (
            "Tips:\n"
            + plan
            + "".join(f"<|branch|>{t}: {t} text\n<|/branch|>" for t in branches or titles)
            + "<|/para|>"
        )

    assert well_formed(answer(["1. Sleep", "2. Food", "10. Move"]))
    assert not well_formed(answer(["3. Reviews", "4. Reviews"]))
    assert not well_formed(answer(["Sleep", "Sleep"]))
    assert not well_formed(answer(["1. Sleep", "2. Food"], ["1. Sleep"]))  # a planned branch is missing
    assert well_formed(answer(["2024", "2025"]))  # a title that is only a number stays itself
