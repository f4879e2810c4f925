"""The teachers' page's measurements (attnbook.book.course): a notebook's run time, its prose and
its exercises, read from a fresh kernel's timings."""
import json

import nbformat
import pytest

from attnbook import store
from attnbook.book import course
from attnbook.commands import course as course_command
from twice import merged_again, recording


def synthetic(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# A page\n\none two three four five six seven eight"),
        nbformat.v4.new_code_cell("import time\ntime.sleep(0.3)"),
        nbformat.v4.new_markdown_cell("```{exercise} Pad\n:label: ex-00-pad\n\nWrite it.\n```"),
        nbformat.v4.new_markdown_cell("```{solution-start} ex-00-pad\n:class: dropdown\n```"),
        nbformat.v4.new_code_cell("time.sleep(0.2)"),
        nbformat.v4.new_markdown_cell("```{solution-end}\n```"),
        nbformat.v4.new_code_cell("print('check_pad_batch: stands in for the grader call')"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "99_page.ipynb"
    nbformat.write(nb, path)
    return path


def test_the_command_reads_the_kernels_times_and_the_exercises(tmp_path, monkeypatch):
    """`python -m attnbook course` on a folder of one notebook: its row, through the one way
    results are written (a second identical call leaves the file as it was)."""
    saves = recording(monkeypatch)
    synthetic(tmp_path)
    out = tmp_path / "course.json"
    assert course_command.main(["--notebooks", str(tmp_path), "--out", str(out)]) == 0
    [row] = store.read(out)["notebooks"]
    assert row["notebook"] == "99_page" and row["cells"] == 7 and row["code_cells"] == 3
    assert 0.45 < row["run_seconds"] < 5                       # the two sleeps, and little else
    assert row["prose_words"] == 12       # "A page one ... eight", "Write it.": no markup
    [ex] = row["exercises"]
    assert ex["label"] == "ex-00-pad" and ex["graded"] is True and ex["solution"] is True
    assert 0.18 < ex["seconds"] < 2                           # its solution and the grader call
    assert merged_again(saves) == ["course"]


def test_only_merges_by_notebook_and_refuses_an_unknown_one(tmp_path, capsys):
    from attnbook.experiments.registry import ROWS
    old = {"experiment": "course", "format": store.FORMAT, "calls": [{"rows": None}],
           "words_per_minute": 200, "notebooks": [{"notebook": "01_a", "run_seconds": 1},
                                                  {"notebook": "02_b", "run_seconds": 2}]}
    new = {"experiment": "course", "format": store.FORMAT, "calls": [{"rows": None}],
           "words_per_minute": 200, "notebooks": [{"notebook": "00_z", "run_seconds": 3},
                                                  {"notebook": "02_b", "run_seconds": 4}]}
    out = course.in_order(ROWS["course"].merge(old, new), old)
    assert [(r["notebook"], r["run_seconds"]) for r in out["notebooks"]] == \
        [("00_z", 3), ("01_a", 1), ("02_b", 4)]
    assert course_command.main(["--only", "99_nothing", "--out", str(tmp_path / "new.json")]) == 2
    assert "no notebook 99_nothing" in capsys.readouterr().err


def test_the_committed_times_back_the_teachers_page():
    """book/teachers.md: chapter 9 runs in two and a half minutes on one thread, within the three
    minutes a training chapter may take; chapters 2 and 3, which train recurrent toy models, in
    about a minute (the shared machine's times vary by up to a quarter between runs: 41 to 89 s
    in two runs of the same day); every other page in under 45 s; every notebook of the book is
    measured, with its exercises."""
    from attnbook.book.exercises import exercise_labels
    from attnbook.store import ROOT, load
    res = load("cpu/course.json")
    rows = {r["notebook"]: r for r in res["notebooks"]}
    assert set(rows) == {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    toys = ("02_additive_attention", "03_dot_product_attention")
    assert all(r["run_seconds"] < 45 for n, r in rows.items() if n not in ("09_training", *toys))
    assert all(35 < rows[n]["run_seconds"] < 95 for n in toys)    # "about a minute"
    assert 130 < rows["09_training"]["run_seconds"] < 175          # "about two and a half"
    for name, r in rows.items():
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        assert [e["label"] for e in r["exercises"]] == exercise_labels(nb), name
    assert res.calls[0].threads == 1


def test_the_teachers_page_reads_the_prose_as_it_is():
    """The reading times of course.json are within a minute of the notebooks' prose as it is
    now (a larger edit asks for `python -m attnbook run course` again), and book/teachers.md
    shows course.json's reading and running times."""
    from attnbook.book.course import WORDS_PER_MINUTE, prose_words
    from attnbook.store import ROOT, load
    rows = {r["notebook"]: r for r in load("cpu/course.json")["notebooks"]}
    page = (ROOT / "book" / "teachers.md").read_text(encoding="utf-8")
    for name, r in rows.items():
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        now = prose_words(nb) / WORDS_PER_MINUTE
        assert abs(now - r["reading_minutes"]) <= 1, (name, round(now, 1), r["reading_minutes"])
        line = next(l for l in page.splitlines() if f"<../notebooks/{name}>" in l)
        cells = [c.strip() for c in line.strip("|").split("|")]
        seconds = r["run_seconds"]
        shown = f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
        assert cells[1:3] == [f"{r['reading_minutes']} min", shown], (name, cells)
