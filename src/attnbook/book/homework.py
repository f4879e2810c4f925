"""Homework: the student edition of the notebooks and the grading command.

    python -m attnbook homework student notebooks/ student/     # what `make student` runs
    python -m attnbook homework grade student/01_bottleneck.ipynb
    python -m attnbook homework grade submissions/              # a teacher: every notebook in a folder

How exercises are written in a notebook (sphinx-exercise's gated solutions)::

    [markdown]  ```{exercise} Title           <- the exercise, kept in every edition
                :label: ex-01-gru-step
                ...```
    [markdown]  ```{solution-start} ex-01-gru-step
                :class: dropdown```
    [code]      def gru_step(...): ...          <- the reference solution
    [markdown]  written solution, if any
    [markdown]  ```{solution-end}```
    [code]      check_gru_step(gru_step)        <- the grader call, kept in every edition

An experimental exercise's solution may hold code cells that *run* the experiment (no def or
class), and so may a coding exercise's, after the cell that defines the answer (a measurement
made with it): the book shows the measured result its written solution quotes, and the student
edition removes them with the written solution. Many show a committed result
(``results/cpu/exercises.json``, ``python -m attnbook exercise_runs``).

The **student edition** replaces every solution code cell by a stub — each function and class
keeps its signature and docstring, and its body becomes ``raise NotImplementedError(hint)`` —
removes the written solutions and the solution markers, and clears all outputs.

The **grading command** runs a notebook in a fresh kernel (errors do not stop it), then calls the
grader of every coding exercise in the notebook on the object the reader defined, prints a table
(exercise, PASS or FAIL, hint) and exits with status 1 if anything failed.
"""
from __future__ import annotations

import ast
import copy
import json
import textwrap
from pathlib import Path

import nbformat

from ..graders import GRADERS, GradeResult
from .exercises import Exercise, exercise_labels, find_exercises

RESULT_MARKER = "@@attnbook-grades@@"


def defines_code(source: str) -> bool:
    """Whether a solution cell defines a function or class (the student writes it) rather than
    running a measurement (an experimental exercise's result, shown with its written solution)."""
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               for n in ast.parse(source).body)


def coding_exercises(nb) -> list[Exercise]:
    """The exercises whose solution defines code: each must have a registered grader."""
    return [ex for ex in find_exercises(nb)
            if any(defines_code(nb.cells[i].source) for i in ex.solution_code)]


# ---------------------------------------------------------------------------------------------
# Student edition

def _stub_body(node, indent: str, message: str, src_lines: list[str]) -> str:
    """Signature + docstring of a function, body replaced by ``raise NotImplementedError``."""
    first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    header = "\n".join(src_lines[first - 1:node.body[0].lineno - 1])
    doc = ast.get_docstring(node, clean=False)
    out = [header.rstrip()]
    if doc is not None:
        body0 = node.body[0]
        out.append("\n".join(src_lines[body0.lineno - 1:body0.end_lineno]))
    out.append(f"{indent}    raise NotImplementedError({message!r})")
    return "\n".join(out)


def stub_source(source: str, label: str) -> str:
    """The student version of a solution cell: every def and class kept as a stub.

    Functions keep their signature and docstring and raise NotImplementedError with a hint.
    Classes keep their bases, docstring and the signatures of their methods. Anything else in the
    cell (a stray statement) is dropped: the solution cell should hold definitions only.
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    grader = GRADERS.get(label)
    check = f"; check it with the grader of {label}" if grader is None else \
        f"; then run the grader cell below ({label})"
    parts = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(_stub_body(node, "", f"write `{node.name}` (exercise {label}){check}",
                                    lines))
        elif isinstance(node, ast.ClassDef):
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            body_start = node.body[0].lineno
            out = ["\n".join(lines[first - 1:body_start - 1]).rstrip()]
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append("\n".join(lines[node.body[0].lineno - 1:node.body[0].end_lineno]))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append("")
                    out.append(_stub_body(item, "    ", f"write `{node.name}.{item.name}` "
                                          f"(exercise {label}){check}", lines))
            if len(out) == 1 or (doc is not None and len(out) == 2):
                out.append(f"    pass  # write `{node.name}` (exercise {label})")
            parts.append("\n".join(out))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            parts.append("\n".join(lines[node.lineno - 1:node.end_lineno]))
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body):
        raise ValueError(f"the solution of {label} defines no function or class to stub")
    return "# Exercise " + label + ": replace each `raise NotImplementedError` with your code.\n" + \
        "\n\n\n".join(parts) + "\n"


def student_notebook(nb):
    """A copy of ``nb`` with solutions stubbed or removed and all outputs cleared."""
    nb = copy.deepcopy(nb)
    drop = set()
    for ex in find_exercises(nb):
        drop.update([ex.start, ex.end, *ex.solution_markdown])
        defining = [i for i in ex.solution_code if defines_code(nb.cells[i].source)]
        drop.update(set(ex.solution_code) - set(defining))  # measurements: part of the answer
        for i in defining:
            nb.cells[i].source = stub_source(nb.cells[i].source, ex.label)
        if not defining:  # a written (or measured) solution: leave a place for the answer
            nb.cells[ex.start] = nbformat.v4.new_markdown_cell(
                f"*Your answer to {ex.label}:*\n\n...")
            drop.discard(ex.start)
    nb.cells = [c for i, c in enumerate(nb.cells) if i not in drop]
    nb.nbformat_minor = max(nb.nbformat_minor, 5)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"  # stable ids: regenerating the edition changes nothing
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def write_student_edition(src: Path, dest: Path) -> list[Path]:
    """Write the student edition of every notebook in ``src`` (a folder or one file) to ``dest``."""
    paths = sorted(src.glob("*.ipynb")) if src.is_dir() else [src]
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        out = dest / path.name
        nbformat.write(student_notebook(nb), out)
        written.append(out)
    return written


# ---------------------------------------------------------------------------------------------
# Grading

def _grading_cell(labels: list[str]) -> str:
    return textwrap.dedent(f"""\
        import json as _json
        from attnbook.graders import GRADERS as _GRADERS
        _results = []
        for _label in {labels!r}:
            _g = _GRADERS[_label]
            if _g.target not in globals():
                _results.append([_label, False, f"`{{_g.target}}` is not defined: run the "
                                 "exercise's cell, and keep the name the exercise asks for"])
                continue
            _r = _g.grade(globals()[_g.target])
            _results.append([_label, _r.passed, _r.message])
        print({RESULT_MARKER!r} + _json.dumps(_results))
        """)


def grade_notebook(path: Path, timeout: int = 1800) -> list[GradeResult]:
    """Run a notebook in a fresh kernel, then grade every coding exercise in it."""
    return grades(run_for_grading(path, timeout), path)


def run_for_grading(path: Path, timeout: int = 1800):
    """The notebook at ``path`` with a grading cell appended, executed in a fresh kernel (errors
    are kept as outputs); None if it has no graded exercise."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # Graded exercises are found by their labels, which both editions keep (the student edition
    # has no solution markers); a book notebook must also have a grader for each coding solution.
    missing = [ex.label for ex in coding_exercises(nb) if ex.label not in GRADERS]
    if missing:
        raise ValueError(f"{path}: no grader registered for {', '.join(missing)}")
    labels = [label for label in exercise_labels(nb) if label in GRADERS]
    if not labels:
        return None
    nb.cells.append(nbformat.v4.new_code_cell(_grading_cell(labels)))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def grades(nb, path: Path) -> list[GradeResult]:
    """The grades that the grading cell of :func:`run_for_grading`'s notebook (from ``path``)
    printed ([] for None)."""
    if nb is None:
        return []
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    if RESULT_MARKER not in text:
        errors = [o for o in nb.cells[-1].outputs if o.output_type == "error"]
        detail = f"{errors[0].ename}: {errors[0].evalue}" if errors else text[-500:]
        raise RuntimeError(f"{path}: the grading cell did not run ({detail})")
    line = text[text.index(RESULT_MARKER) + len(RESULT_MARKER):].splitlines()[0]
    return [GradeResult(label, passed, message) for label, passed, message in json.loads(line)]


def format_table(rows: list[tuple[str, GradeResult]]) -> str:
    """A plain-text table: notebook, exercise, result, hint."""
    header = ("notebook", "exercise", "result", "hint")
    body = [(nb, r.label, "PASS" if r.passed else "FAIL", "" if r.passed else r.message)
            for nb, r in rows]
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(3)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header[:3], widths)) + "  " + header[3]]
    lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 4)
    for row in body:
        lines.append("  ".join(x.ljust(w) for x, w in zip(row[:3], widths)) + "  " + row[3])
    return "\n".join(lines)
