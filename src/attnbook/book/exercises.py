"""The exercises of a notebook, as the book writes them (sphinx-exercise's gated solutions):
where each solution starts and ends, and the labels of every exercise. The student edition,
the grading command (:mod:`attnbook.book.homework`) and the teachers' page
(:mod:`attnbook.book.course`) read them here."""
from __future__ import annotations

import re
from dataclasses import dataclass

SOLUTION_START = re.compile(r"```\{solution-start\}\s+(\S+)")
SOLUTION_END = re.compile(r"```\{solution-end\}")
EXERCISE_LABEL = re.compile(r"```\{exercise\}[^\n]*\n(?:\s*:[\w-]+:.*\n)*?\s*:label:\s*(\S+)")


@dataclass
class Exercise:
    label: str
    solution_code: list[int]      # indices of the solution's code cells
    solution_markdown: list[int]  # indices of the solution's markdown cells (written answers)
    start: int                    # index of the solution-start cell
    end: int                      # index of the solution-end cell


def find_exercises(nb) -> list[Exercise]:
    """The gated solutions of a notebook, in order; raises ValueError if the markers are unbalanced."""
    found, current = [], None
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            if current is not None:
                current.solution_code.append(i)
            continue
        start, end = SOLUTION_START.search(cell.source), SOLUTION_END.search(cell.source)
        if start:
            if current is not None:
                raise ValueError(f"cell {i}: solution-start of {start.group(1)} inside the "
                                 f"solution of {current.label}; close it with solution-end first")
            current = Exercise(start.group(1), [], [], i, -1)
        elif end:
            if current is None:
                raise ValueError(f"cell {i}: solution-end without a solution-start")
            current.end = i
            found.append(current)
            current = None
        elif current is not None:
            current.solution_markdown.append(i)
    if current is not None:
        raise ValueError(f"the solution of {current.label} has no solution-end")
    return found


def exercise_labels(nb) -> list[str]:
    """Labels of every ``{exercise}`` directive in the notebook (coding or not)."""
    return [m.group(1) for c in nb.cells if c.cell_type == "markdown"
            for m in EXERCISE_LABEL.finditer(c.source)]
