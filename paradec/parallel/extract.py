"""Find independent segments in answers (ASPD's data pipeline, rule-based).

Code: runs of consecutive top-level functions (or consecutive methods of a class) form a
candidate group; a group is cut wherever a function uses a name another member defines (the
AST decides; for methods, ``self.<name>`` counts), or where non-whitespace text separates two
functions. Text after the group may use every member. Python inside Markdown fences is
searched too.

Prose (Markdown): consecutive items of one list, or consecutive sections of one heading
level, form a candidate group, kept when every item is long enough and none refers to
another (``above``, ``previous``, ``step 2``, ...). An optional judge (any OpenAI-compatible
chat endpoint) must then vote "independent" 3 times out of 3.

Every accepted group passes the integrity check: removing the markup restores the text.
"""

from __future__ import annotations

import ast
import re

from paradec.parallel.markup import Branch, Group, mark_up, strip_markup

MIN_BRANCH_CHARS = 10
MAX_BRANCHES = 10


# ---- code ------------------------------------------------------------------------------------
def _line_offsets(text: str) -> list[int]:
    offs, pos = [0], 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        offs.append(pos)
    return offs


def _used_names(node: ast.AST) -> set[str]:
    used = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            used.add(sub.id)
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"):
            used.add(sub.attr)
    return used


def _function_runs(body: list[ast.stmt]) -> list[list[ast.stmt]]:
    runs, cur = [], []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            cur.append(stmt)
        else:
            if len(cur) >= 2:
                runs.append(cur)
            cur = []
            if isinstance(stmt, ast.ClassDef):
                runs.extend(_function_runs(stmt.body))
    if len(cur) >= 2:
        runs.append(cur)
    return runs


def code_groups(code: str, base: int = 0) -> list[Group]:
    """Independent function groups in Python source ``code`` (offsets shifted by ``base``)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    offs = _line_offsets(code)
    groups = []
    for run in _function_runs(tree.body):
        spans = []
        for fn in run:
            first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
            spans.append((offs[first - 1], offs[fn.end_lineno], fn.name, _used_names(fn)))
        members: list[tuple] = []

        def close(members=members):
            if len(members) >= 2:
                groups.append(_code_group(code, members, base))
            members.clear()

        for span in spans:
            start, _, name, used = span
            gap_ok = not members or code[members[-1][1] : start].strip() == ""
            independent = all(name not in m[3] and m[2] not in used for m in members)
            if not (gap_ok and independent) or len(members) == MAX_BRANCHES:
                close()
            members.append(span)
        close()
    return groups


def _code_group(code: str, members: list[tuple], base: int) -> Group:
    branches = []
    for i, (start, end, name, _) in enumerate(members):
        end = members[i + 1][0] if i + 1 < len(members) else end  # keep the separating blank lines
        branches.append(Branch(name, base + start, base + end))
    return Group(tuple(branches), "code")


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def _is_python(text: str) -> bool:
    try:
        ast.parse(text)
        return "def " in text
    except (SyntaxError, ValueError):
        return False


# ---- prose -----------------------------------------------------------------------------------
_ITEM = re.compile(r"^(?P<indent>[ \t]*)(?P<marker>(?:\d+[.)])|[-*+])[ \t]+(?P<body>.*)$")
_HEADING = re.compile(r"^(?P<hashes>#{1,6})[ \t]+(?P<title>.+)$")
_REFERS = re.compile(
    r"\b(above|previous(ly)?|aforementioned|below|following|preceding|earlier|later|"
    r"as mentioned|step \d+|then|next|afterwards?|finally|this step)\b",
    re.I,
)


def _title(body: str) -> str:
    bold = re.match(r"\*\*(.+?)\*\*", body.strip())
    words = re.sub(r"[*_`#:]", "", bold.group(1) if bold else body).split()
    title = words[0][:10] if words else "item"
    for w in words[1:]:  # whole words while the title stays within 10 characters
        if len(title) + 1 + len(w) > 10:
            break
        title += " " + w
    return title


def prose_groups(text: str) -> list[Group]:
    """Lists and sections whose items are long enough and do not refer to one another."""
    lines = text.splitlines(keepends=True)
    offs = _line_offsets(text)
    blocks: list[tuple[str, str, list[tuple[int, int, str, str]]]] = []  # (kind, key, [(start, end, body, number)])
    i = 0
    while i < len(lines):
        m, h = _ITEM.match(lines[i].rstrip("\n")), _HEADING.match(lines[i].rstrip("\n"))
        if m or h:
            kind = "list" if m else "section"
            key = (m.group("indent") + ("1." if m.group("marker")[0].isdigit() else "-")) if m else h.group("hashes")
            items = []
            while i < len(lines):
                mm, hh = _ITEM.match(lines[i].rstrip("\n")), _HEADING.match(lines[i].rstrip("\n"))
                k = (
                    (mm.group("indent") + ("1." if mm.group("marker")[0].isdigit() else "-"))
                    if mm and kind == "list"
                    else hh.group("hashes")
                    if hh and kind == "section"
                    else None
                )
                if k != key:
                    break
                start = offs[i]
                i += 1
                while i < len(lines):  # an item runs until the next item/heading of its level
                    nm, nh = _ITEM.match(lines[i].rstrip("\n")), _HEADING.match(lines[i].rstrip("\n"))
                    if kind == "list" and (
                        (nm and len(nm.group("indent")) <= len(key) - 2)
                        or nh
                        or (lines[i].strip() and not lines[i].startswith((" ", "\t")) and not nm)
                    ):
                        break
                    if kind == "section" and nh and len(nh.group("hashes")) <= len(key):
                        break
                    i += 1
                body = (mm or hh).group("body" if mm else "title")
                number = mm.group("marker") if mm and mm.group("marker")[0].isdigit() else ""
                items.append((start, offs[i], body, number))
            blocks.append((kind, key, items))
        else:
            i += 1
    groups = []
    for kind, _, items in blocks:
        if not 2 <= len(items) <= MAX_BRANCHES:
            continue
        texts = [text[s:e] for s, e, _, _ in items]
        if any(len(t.strip()) < MIN_BRANCH_CHARS or _REFERS.search(t) for t in texts):
            continue
        titles = [_title(body) for _, _, body, _ in items]
        if len(set(titles)) != len(titles):
            titles = [f"{t[:7]} {n + 1}" for n, t in enumerate(titles)]
        # A numbered item's title starts with its number: a branch sees its own title but not its
        # index among its siblings, so without it every branch wrote "1." (session 9's answers).
        titles = [f"{number} {t}" if number else t for t, (_, _, _, number) in zip(titles, items)]
        groups.append(Group(tuple(Branch(t, s, e) for t, (s, e, _, _) in zip(titles, items)), kind))
    return groups


# ---- one answer ------------------------------------------------------------------------------
def find_groups(text: str, judge=None, question: str = "") -> list[Group]:
    """All accepted groups of an answer, in order, non-overlapping, each passing the judge
    (when given: ``judge(question, precondition, branches) -> bool``) and integrity."""
    if _is_python(text):
        candidates = code_groups(text)
    else:
        candidates = [g for m in _FENCE.finditer(text) for g in code_groups(m.group(1), m.start(1))]
        fenced = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
        candidates += [g for g in prose_groups(text) if not any(a <= g.branches[0].start < b for a, b in fenced)]
    accepted, last_end = [], -1
    for g in sorted(candidates, key=lambda g: g.branches[0].start):
        if g.branches[0].start < last_end:
            continue
        if judge is not None and not judge(
            question, text[: g.branches[0].start], [text[b.start : b.end] for b in g.branches]
        ):
            continue
        if strip_markup(mark_up(text, accepted + [g])) != text:
            continue  # integrity: the markup must be removable
        accepted.append(g)
        last_end = g.branches[-1].end
    return accepted
