"""The reader sees the story, not the machinery: the checks that back a chapter's claims run in
cells of their own, tagged ``hide-input`` (the rendered book folds their code away; nbval still
runs them), and no `assert` line stays visible on a page.

VISIBLE caps the visible `assert` lines of every page, the exercises' solutions included (a
solution's checks run in a hidden cell inside the solution).
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest

from attnbook.book.exercises import find_exercises

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
HIDDEN = {"remove-input", "hide-input", "remove-cell", "hide-cell"}
VISIBLE = 0    # visible `assert` lines a page may show, its exercises' solutions included


def cells(path: Path):
    """(index, cell, whether it is part of an exercise's solution) of every code cell."""
    text = path.read_text(encoding="utf-8")
    solutions = {i for s in find_exercises(nbformat.reads(text, 4)) for i in range(s.start, s.end + 1)}
    for i, c in enumerate(json.loads(text)["cells"]):
        if c["cell_type"] == "code":
            yield i, c, i in solutions


def visible_asserts(path: Path) -> int:
    return sum(1 for _, c, _ in cells(path)
               if not set(c.get("metadata", {}).get("tags", [])) & HIDDEN
               for line in "".join(c["source"]).splitlines() if line.strip().startswith("assert"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_few_asserts_are_visible(path):
    n = visible_asserts(path)
    assert n <= VISIBLE, (f"{path.name}: {n} visible assert lines (at most {VISIBLE}); move "
                          "the checks into a cell tagged hide-input (inside the solution, for a "
                          "solution's checks)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_hidden_guard_cell_hides_only_checks(path):
    """A cell whose code the book folds away is machinery: it checks something (an assert) or
    reads something out (a provenance record); it is never the only place a computation the
    prose explains is shown."""
    for i, c, _ in cells(path):
        if "hide-input" not in c.get("metadata", {}).get("tags", []) or \
                "attnbook-setup" in c["metadata"]["tags"]:
            continue
        tree = ast.parse("".join(c["source"]))
        checks = any(isinstance(n, ast.Assert) for n in ast.walk(tree))
        assert checks or c.get("outputs"), f"{path.name}, cell {i}: hidden code that neither " \
            "checks nor reads out anything"
