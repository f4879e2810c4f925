"""What a course needs to plan with: how long each page takes to read and to run, and what its
exercises are, measured on this machine (the teachers' page, book/teachers.md, shows it).

    python -m attnbook course --threads 1 --out results/cpu/course.json

Each notebook runs from the top in a fresh kernel (as ``make test`` runs it), with OMP and
PyTorch limited to ``--threads``; the time of every cell is what the kernel reports. For each
notebook it records the time to run it, the words of its prose (reading time at 200 words a
minute, a stated rule, not a measurement) and its exercises: label, whether a grader checks it
(a coding exercise) and the time its solution's cells and its grader call took.
"""
from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path

import nbformat

from .. import store
from ..graders import GRADERS
from .exercises import exercise_labels, find_exercises

WORDS_PER_MINUTE = 200           # the reading-time rule
NOTEBOOKS = store.ROOT / "notebooks"


def cell_seconds(cell) -> float:
    """The kernel's time for one executed cell (nbclient's timing metadata)."""
    t = cell.get("metadata", {}).get("execution", {})
    if "iopub.execute_input" not in t or "shell.execute_reply" not in t:
        return 0.0
    start, end = (datetime.fromisoformat(t[k].replace("Z", "+00:00"))
                  for k in ("iopub.execute_input", "shell.execute_reply"))
    return (end - start).total_seconds()


WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def prose_words(nb) -> int:
    """Words of the markdown cells outside the exercises' solutions: runs of letters, without
    the lines of directives (fences and their options) and HTML comments."""
    inside = {i for e in find_exercises(nb) for i in range(e.start, e.end + 1)}
    text = "\n".join(c.source for i, c in enumerate(nb.cells)
                     if c.cell_type == "markdown" and i not in inside)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    lines = [l for l in text.splitlines() if not l.lstrip().startswith(("```", ":"))]
    return len(WORD.findall("\n".join(lines)))


def exercises(nb) -> list[dict]:
    """Each exercise of an executed notebook: its label, whether a grader checks it, whether the
    book gives its solution, and the seconds of the solution's code cells and of the grader call
    after them."""
    solutions = {e.label: e for e in find_exercises(nb)}
    out = []
    for label in exercise_labels(nb):
        e, cells = solutions.get(label), []
        if e is not None:
            cells = list(e.solution_code)
            after = e.end + 1
            if after < len(nb.cells) and nb.cells[after].cell_type == "code" and \
                    "check_" in nb.cells[after].source:
                cells.append(after)
        out.append({"label": label, "graded": label in GRADERS, "solution": e is not None,
                    "seconds": round(sum(cell_seconds(nb.cells[i]) for i in cells), 2)})
    return out


def in_order(out: dict, old: dict | None) -> dict:
    """A course.json as :func:`attnbook.experiments.registry.save` merged it (a call's
    notebooks replace those of the same name), its notebooks in the book's order (by name).
    ``old``: the file before the call (None: there was none)."""
    return out | {"notebooks": sorted(out["notebooks"], key=lambda r: r["notebook"])}


def measure(path: Path, threads: int) -> dict:
    """Run one notebook in a fresh kernel and read its timings."""
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    env = {"OMP_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=1800, kernel_name="python3", record_timing=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    code = [c for c in nb.cells if c.cell_type == "code"]
    words = prose_words(nb)
    return {"notebook": path.stem, "cells": len(nb.cells), "code_cells": len(code),
            "run_seconds": round(sum(cell_seconds(c) for c in code), 1),
            "prose_words": words, "reading_minutes": round(words / WORDS_PER_MINUTE),
            "exercises": exercises(nb)}
