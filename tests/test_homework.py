"""The homework system: graders for every coding exercise, student edition, grading command."""
import ast
from pathlib import Path

import nbformat
import pytest

from attnbook.book import homework
from attnbook.commands import homework as homework_command
from attnbook.graders import GRADERS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BOOK = {p.name: nbformat.read(p, as_version=4) for p in NOTEBOOKS}
STUDENT = {name: homework.student_notebook(nb) for name, nb in BOOK.items()}
CODING = [(name, ex) for name, nb in BOOK.items() for ex in homework.coding_exercises(nb)]
IDS = [ex.label for _, ex in CODING]


def defined_names(source: str) -> set[str]:
    return {n.name for n in ast.parse(source).body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}


def imports_before(nb, index: int) -> str:
    """Every top-level import of the code cells before cell ``index``: what a solution may use."""
    lines = []
    for cell in nb.cells[:index]:
        if cell.cell_type == "code":
            tree = ast.parse(cell.source)
            src = cell.source.splitlines()
            for node in tree.body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    lines += src[node.lineno - 1:node.end_lineno]
    return "\n".join(lines)


def defining_cells(nb, ex) -> list[int]:
    """The solution's cells that define code (a coding solution may also run a measurement
    with what it defined: the student edition drops that cell, as it drops written answers)."""
    return [i for i in ex.solution_code if homework.defines_code(nb.cells[i].source)]


def run_cell(nb, index: int, source: str) -> dict:
    namespace = {}
    exec(imports_before(nb, index), namespace)
    exec(source, namespace)
    return namespace


def test_there_are_coding_exercises():
    assert len(CODING) >= 1


@pytest.mark.parametrize("name,ex", CODING, ids=IDS)
def test_every_coding_exercise_has_a_grader_for_what_it_defines(name, ex):
    assert ex.label in GRADERS, f"{name}: no grader registered for {ex.label}"
    source = "\n".join(BOOK[name].cells[i].source for i in ex.solution_code)
    assert GRADERS[ex.label].target in defined_names(source)
    assert ex.label in homework.exercise_labels(BOOK[name]), "solution without an exercise"


def test_every_grader_belongs_to_an_exercise_of_the_book():
    labels = {ex.label for _, ex in CODING}
    assert set(GRADERS) <= labels, f"graders without an exercise: {set(GRADERS) - labels}"


@pytest.mark.parametrize("name,ex", CODING, ids=IDS)
def test_reference_solution_passes_its_grader(name, ex):
    nb = BOOK[name]
    source = "\n".join(nb.cells[i].source for i in defining_cells(nb, ex))
    namespace = run_cell(nb, ex.solution_code[0], source)
    g = GRADERS[ex.label]
    result = g.grade(namespace[g.target])
    assert result.passed, result.message
    assert "passed" in result.message


@pytest.mark.parametrize("name,ex", CODING, ids=IDS)
def test_student_stub_fails_its_grader_with_a_hint(name, ex):
    g = GRADERS[ex.label]
    stub_cells = [c for c in STUDENT[name].cells
                  if c.cell_type == "code" and c.source.startswith(f"# Exercise {ex.label}:")]
    assert len(stub_cells) == len(defining_cells(BOOK[name], ex))
    source = "\n".join(c.source for c in stub_cells)
    assert "raise NotImplementedError" in source and g.target in defined_names(source)
    namespace = run_cell(BOOK[name], ex.solution_code[0], source)
    result = g.grade(namespace[g.target])
    assert not result.passed
    assert "not implemented yet" in result.message and g.target in result.message


@pytest.mark.parametrize("name", sorted(BOOK))
def test_student_edition_removes_solutions_and_keeps_everything_else(name):
    book, student = BOOK[name], STUDENT[name]
    solutions = homework.find_exercises(book)
    in_solution = {i for ex in solutions for i in [ex.start, ex.end, *ex.solution_code,
                                                   *ex.solution_markdown]}
    kept = [c.source for i, c in enumerate(book.cells) if i not in in_solution]
    text = "\n".join(c.source for c in student.cells)
    assert "solution-start" not in text and "solution-end" not in text
    for ex in solutions:           # written solutions are gone ...
        for i in ex.solution_markdown:
            assert book.cells[i].source not in text
        for i in ex.solution_code:  # ... and so are the bodies of the coding solutions
            if not homework.defines_code(book.cells[i].source):   # and the measurements
                assert book.cells[i].source not in text
                continue
            body = ast.parse(book.cells[i].source).body
            for fn in (n for n in body if isinstance(n, ast.FunctionDef)):
                last = ast.unparse(fn.body[-1])
                if not isinstance(fn.body[-1], ast.Expr):  # a docstring-only body stays
                    assert last not in text
    student_sources = [c.source for c in student.cells]
    for source in kept:            # every other cell is there, unchanged and in order
        assert source in student_sources
    assert [s for s in student_sources if s in kept] == kept
    assert all(c.outputs == [] for c in student.cells if c.cell_type == "code")
    nbformat.validate(student)


@pytest.mark.parametrize("name", sorted(BOOK))
def test_student_notebook_uses_stubs_only_in_grader_cells(name):
    """The student edition runs up to the stubs without other errors: the cells that are not
    stubs are the book's own (which nbval runs), and after a stub only grader cells call it."""
    student = STUDENT[name]
    stubbed = set()
    for cell in student.cells:
        if cell.cell_type != "code":
            continue
        if cell.source.startswith("# Exercise "):
            stubbed |= defined_names(cell.source)
            continue
        used = {n.id for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Name)}
        calls_grader = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                           and n.func.id.startswith("check_") for n in ast.walk(ast.parse(cell.source)))
        assert not (used & stubbed) or calls_grader, \
            f"{name}: a cell uses {used & stubbed} after it was stubbed:\n{cell.source}"


def test_stub_source_keeps_signatures_docstrings_and_classes():
    source = '''
import torch

def f(x, y=2, *, z: int = 3) -> int:
    """Add things.

    More text."""
    return x + y + z

class M(torch.nn.Module):
    """A module."""
    def __init__(self, d):
        super().__init__()
        self.d = d

    def forward(self, x):
        return x * self.d

print("stray statement")
'''
    stub = homework.stub_source(source, "ex-99-demo")
    ns = {}
    exec(stub, ns)
    assert "stray statement" not in stub and "return x + y + z" not in stub
    assert ns["f"].__doc__.startswith("Add things.")
    with pytest.raises(NotImplementedError, match="ex-99-demo"):
        ns["f"](1)
    with pytest.raises(NotImplementedError, match=r"M\.__init__"):
        ns["M"](3)
    assert issubclass(ns["M"], __import__("torch").nn.Module) and ns["M"].__doc__ == "A module."
    with pytest.raises(ValueError, match="defines no function"):
        homework.stub_source("x = 1", "ex-99-demo")


def test_unbalanced_solution_markers_are_reported():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("```{solution-start} ex-1\n:class: dropdown\n```"),
        nbformat.v4.new_code_cell("def f(): pass")])
    with pytest.raises(ValueError, match="ex-1 has no solution-end"):
        homework.find_exercises(nb)
    nb.cells = [nbformat.v4.new_markdown_cell("```{solution-end}\n```")]
    with pytest.raises(ValueError, match="without a solution-start"):
        homework.find_exercises(nb)


# --- the grading command, end to end on small notebooks in fresh kernels -------------------

EXERCISE = """```{exercise} Pad a batch
:label: ex-00-pad

Write `pad_batch`.
```"""


def tiny_notebook(path: Path, solution: str | None) -> Path:
    cells = [nbformat.v4.new_code_cell("import torch"),
             nbformat.v4.new_markdown_cell(EXERCISE)]
    if solution is not None:
        cells.append(nbformat.v4.new_code_cell(solution))
    cells.append(nbformat.v4.new_code_cell(
        "from attnbook.graders import check_pad_batch\ncheck_pad_batch(pad_batch)"))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


RIGHT = '''def pad_batch(seqs, pad_id=0):
    from attnbook.batching import pad
    return pad(seqs, pad_id)'''
WRONG = '''def pad_batch(seqs, pad_id=0):
    from attnbook.batching import pad
    ids, mask = pad(seqs, pad_id)
    return ids, ~mask'''


def test_grade_command_table_and_exit_code(tmp_path, capsys):
    solved = tiny_notebook(tmp_path / "solved.ipynb", RIGHT)
    assert homework_command.main(["grade", str(solved)]) == 0
    out = capsys.readouterr().out
    assert "solved.ipynb" in out and "ex-00-pad" in out and "PASS" in out
    assert "1 passed, 0 failed" in out

    (tmp_path / "class").mkdir()
    tiny_notebook(tmp_path / "class" / "a_wrong.ipynb", WRONG)
    tiny_notebook(tmp_path / "class" / "b_missing.ipynb", None)
    tiny_notebook(tmp_path / "class" / "c_right.ipynb", RIGHT)
    assert homework_command.main(["grade", str(tmp_path / "class")]) == 1
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "ex-00-pad" in line]
    assert len(rows) == 3
    assert "FAIL" in rows[0] and "True at real tokens" in rows[0] and "row 0" in rows[0]
    assert "FAIL" in rows[1] and "`pad_batch` is not defined" in rows[1]
    assert "PASS" in rows[2]
    assert "1 passed, 2 failed" in out


def test_the_student_edition_of_chapter_0_runs_and_its_stub_fails_with_the_hint(tmp_path, capsys):
    """The student edition of chapter 0 runs to the end, as grading runs it (once: the grade
    command's table is tests above), and its stub fails with the hint."""
    assert homework_command.main(["student", str(ROOT / "notebooks" / "00_setup.ipynb"), str(tmp_path)]) == 0
    capsys.readouterr()
    student = tmp_path / "00_setup.ipynb"
    nb = homework.run_for_grading(student, timeout=600)
    errors = [o for c in nb.cells[:-1] if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error" and "raises-exception" not in c.metadata.get("tags", [])]
    assert errors == []
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "[FAIL] ex-00-pad: `pad_batch` is not implemented yet" in printed
    (result,) = homework.grades(nb, student)
    assert result.label == "ex-00-pad" and not result.passed and "not implemented" in result.message


def test_a_measured_solution_is_removed_and_needs_no_grader():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("```{exercise} How low?\n:label: ex-99-floor\n\nMeasure.\n```"),
                nbformat.v4.new_markdown_cell("```{solution-start} ex-99-floor\n:class: dropdown\n```"),
                nbformat.v4.new_code_cell("floor = min([3.5, 0.4])\nprint(floor)"),
                nbformat.v4.new_markdown_cell("It stays below 4."),
                nbformat.v4.new_markdown_cell("```{solution-end}\n```")]
    assert homework.coding_exercises(nb) == []                   # no grader needed
    student = homework.student_notebook(nb)
    text = "\n".join(c.source for c in student.cells)
    assert "min([3.5" not in text and "below 4" not in text and "Your answer to ex-99-floor" in text
    nb.cells[2].source = "def floor(xs):\n    return min(xs)"   # a function is stubbed instead
    assert [ex.label for ex in homework.coding_exercises(nb)] == ["ex-99-floor"]
    assert "raise NotImplementedError" in homework.student_notebook(nb).cells[-1].source
