"""The reader sees the story, not the machinery: the checks that back a chapter's claims run in
cells of their own, tagged ``hide-input`` (the rendered book folds their code away; nbval still
runs them), and few `assert` lines stay visible on a page.

VISIBLE caps the visible `assert` lines of each page outside the exercises' solutions (which the
book folds into dropdowns); it only ever goes down: lower an entry when a page loses some.
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
VISIBLE = {  # notebook -> the most visible `assert` lines it may show (outside solutions)
    "00_setup": 2, "01_bottleneck": 6, "02_additive_attention": 4,
    "03_dot_product_attention": 16, "04_scaled_dot_product": 9, "05_multi_head_attention": 0,
    "06_masking_cross_attention": 0, "07_positional_encoding": 0, "08_transformer": 0,
    "09_training": 23, "10_decoder_only": 7, "11_beyond_attention": 2, "12_workshop": 6,
    "appendix_ablations": 9, "appendix_performance": 2,
}


def cells(path: Path):
    """(index, cell, whether it is part of an exercise's solution) of every code cell."""
    text = path.read_text(encoding="utf-8")
    solutions = {i for s in find_exercises(nbformat.reads(text, 4)) for i in range(s.start, s.end + 1)}
    for i, c in enumerate(json.loads(text)["cells"]):
        if c["cell_type"] == "code":
            yield i, c, i in solutions


def visible_asserts(path: Path) -> int:
    return sum(1 for _, c, sol in cells(path)
               if not sol and not set(c.get("metadata", {}).get("tags", [])) & HIDDEN
               for line in "".join(c["source"]).splitlines() if line.strip().startswith("assert"))


def test_every_notebook_has_a_cap():
    assert set(VISIBLE) == {p.stem for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_few_asserts_are_visible(path):
    n = visible_asserts(path)
    assert n <= VISIBLE[path.stem], (f"{path.name}: {n} visible assert lines (cap "
                                     f"{VISIBLE[path.stem]}); move checks into a cell tagged "
                                     "hide-input")


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
