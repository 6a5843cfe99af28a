"""The tree stays ruff-clean: lint (pyproject's rules) and format (line length 120)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [["check", "--no-cache", "."], ["format", "--check", "--no-cache", "."]])
def test_ruff(args):
    run = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
    assert "No module named ruff" not in run.stderr, "ruff is a test extra: pip install -e '.[test]'"
    assert run.returncode == 0, f"ruff {args[0]}: run `ruff format . && ruff check --fix .`\n{run.stdout[-3000:]}"
