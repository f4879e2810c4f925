"""What a course needs to plan with: how long each page takes to read and to run, and what its
exercises are, measured on this machine (the teachers' page, book/teachers.md, shows it).

    python -m attnbook.book.course --threads 1 --out results/cpu/course.json

Each notebook runs from the top in a fresh kernel (as ``make test`` runs it), with OMP and
PyTorch limited to ``--threads``; the time of every cell is what the kernel reports. For each
notebook it records the time to run it, the words of its prose (reading time at 200 words a
minute, a stated rule, not a measurement) and its exercises: label, whether a grader checks it
(a coding exercise) and the time its solution's cells and its grader call took.
"""
from __future__ import annotations

import os
import re
import sys
from datetime import datetime
from pathlib import Path

import nbformat

from ..cli import Parser, fail
from .. import store
from ..record import command_line, record
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="python -m attnbook.book.course",
               description="Time every notebook and its exercises (the teachers' page).")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    p.add_argument("--out", type=Path, default=store.ROOT / "results" / "cpu" / "course.json")
    p.add_argument("--only", nargs="+", metavar="NOTEBOOK", help="these notebooks (stems)")
    args = p.parse_args(argv)
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if args.only and args.out.exists():
        return fail(f"--only would replace {args.out} with a part of it; give another --out")
    if args.only:
        unknown = set(args.only) - {q.stem for q in paths}
        if unknown:
            return fail(f"no notebook {', '.join(sorted(unknown))}; give stems such as 01_bottleneck")
        paths = [q for q in paths if q.stem in args.only]
    with record(command_line("attnbook.book.course", argv), threads=args.threads,
                      note="each notebook alone, in a fresh kernel") as call:
        rows = []
        for q in paths:
            rows.append(measure(q, args.threads))
            print(f"{q.stem}: {rows[-1]['run_seconds']} s", flush=True)
    res = store.result("course", {"words_per_minute": WORDS_PER_MINUTE, "notebooks": rows}, call)
    store.write(args.out, res)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
