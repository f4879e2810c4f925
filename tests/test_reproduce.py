"""attnbook.reproduce: a run checked against a committed one, exactly on the arithmetic that made
it and within its seeds' spread elsewhere; printed numbers within a cell's stated tolerance; and
nbval, through conftest.py, applying both to a notebook."""
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from attnbook.reproduce import (K_RANGE, NotReproduced, Tolerance, band, compare, exact,
                                from_seeds, kind, notebook_made_here, outputs_made_here,
                                printed_numbers_agree)
from attnbook.utils import arithmetic

ROOT = Path(__file__).resolve().parents[1]
ELSEWHERE = arithmetic() | {"cpu_capability": "SOMETHING-ELSE"}


def test_kinds_share_one_tolerance():
    assert [kind(q) for q in ("exact@20", "token@2", "final_loss", "align.band", "bleu")] == \
        ["exact", "token", "final_loss", "align", "bleu"]
    seeds = [{"exact@2": 1.0, "exact@4": 0.5, "final_loss": 0.30},
             {"exact@2": 0.9, "exact@4": 0.7, "final_loss": 0.31},
             {"exact@2": 1.0, "exact@4": 0.6, "final_loss": 0.33}]
    tol = from_seeds(seeds, seeds=[0, 1, 2])
    assert tol["exact@2"] is tol["exact@4"] and tol["exact@2"].value == pytest.approx(K_RANGE * 0.2)
    assert tol["final_loss"].value == pytest.approx(K_RANGE * 0.03)
    assert "largest difference between two of its seeds in exact, 0.2 (seeds 0, 1, 2)" in \
        tol["exact@4"].rule
    assert from_seeds(seeds[:2], floor=0.5)["final_loss"].value == 0.5     # the floor
    with pytest.raises(ValueError, match="at least two seeds"):
        from_seeds(seeds[:1])


def test_exact_on_the_same_arithmetic_whatever_the_tolerance():
    loose = band(10.0, "wide")
    same = compare("run", {"bleu": 21.06}, {"bleu": 21.06}, loose, made_on=arithmetic(),
                   source="board.json")
    assert same.distance == 0 and str(same) == "identical, bit for bit"
    assert same.tolerance.rule.startswith("exact")
    with pytest.raises(NotReproduced, match=r"bleu is 21.07 here and 21.06 in board.json.*"
                                            r"exact.*changed since: remake it with `make it`"):
        compare("run", {"bleu": 21.07}, {"bleu": 21.06}, loose, made_on=arithmetic(),
                source="board.json", remake="make it")


def test_exact_finds_the_one_quantity_that_differs_among_many():
    committed = {f"exact@{L}": 1.0 for L in range(2, 22, 2)} | {"final_loss": 0.0125}
    fresh = committed | {"final_loss": 0.1125}
    with pytest.raises(NotReproduced, match="final_loss is 0.1125 here and 0.0125"):
        compare("seed 0", fresh, committed, band(1.0, "wide"), made_on=arithmetic(), source="f")


def test_elsewhere_within_the_tolerance_and_beyond_it():
    tol = Tolerance(0.5, "3 x the largest difference between two of its seeds, 0.167")
    ok = compare("run", {"bleu": 21.4}, {"bleu": 21.06}, tol, made_on=ELSEWHERE, source="f")
    assert ok.quantity == "bleu" and ok.distance == pytest.approx(0.34) and ok.tolerance is tol
    with pytest.raises(NotReproduced) as e:
        compare("run", {"bleu": 22.0}, {"bleu": 21.06}, tol, made_on=ELSEWHERE, source="f",
                remake="python -m attnbook run board")
    message = str(e.value)
    assert "0.94 apart, beyond the tolerance 0.5" in message
    assert "SOMETHING-ELSE" in message and arithmetic()["cpu_capability"] in message
    assert "or the code, the data or the settings changed" in message
    assert "`python -m attnbook run board`" in message
    with pytest.raises(NotReproduced, match="not the same experiment"):
        compare("run", {"bleu": 1.0}, {"loss": 1.0}, tol, made_on=ELSEWHERE, source="f")


def test_the_quantity_furthest_beyond_its_own_tolerance_is_named():
    tols = {"exact@2": Tolerance(0.3, "a"), "final_loss": Tolerance(0.01, "b")}
    fresh, committed = {"exact@2": 0.5, "final_loss": 0.32}, {"exact@2": 0.7, "final_loss": 0.3}
    with pytest.raises(NotReproduced, match="final_loss is 0.32 here"):
        compare("run", fresh, committed, tols, made_on=ELSEWHERE, source="f")
    assert exact().value == 0.0


@pytest.mark.parametrize("here,then,tolerance,problem", [
    ("trained:   0.64\n", "trained:   0.55\n", 0.36, ""),
    ("trained:   0.95\n", "trained:   0.55\n", 0.36, "0.95 here and 0.55 committed"),
    ("BLEU 21.22; stored 21.06", "BLEU 21.06; stored 21.06", 6.8, ""),
    ("1,174,528 parameters", "1,174,528 parameters", 0.1, ""),
    ("[0.   0.86 1.  ]", "[0.   0.87 1.  ]", 0.05, ""),
    ("at most 8.9e-08", "at most 6.0e-08", 1e-6, ""),
    ("identical: True", "identical: False", 1.0, "the text differs beyond its numbers"),
    ("seed 1: 0.5", "seed 0: 0.5", 0.5, "1 here and 0 committed"),
])
def test_printed_numbers_agree_within_a_tolerance(here, then, tolerance, problem):
    found = printed_numbers_agree(here, then, tolerance)
    assert (found == "") if not problem else problem in found


def test_a_notebook_records_the_arithmetic_of_its_outputs(tmp_path, monkeypatch):
    nb = nbformat.v4.new_notebook()
    nb.metadata["attnbook"] = {"outputs_made_with": arithmetic()}
    assert notebook_made_here(nb.metadata) and not notebook_made_here({})
    nbformat.write(nb, tmp_path / "chapter.ipynb")
    monkeypatch.chdir(tmp_path)
    assert outputs_made_here("chapter") and not outputs_made_here("no-such-chapter")
    nb.metadata["attnbook"]["outputs_made_with"] = ELSEWHERE
    nbformat.write(nb, tmp_path / "chapter.ipynb")
    assert not outputs_made_here("chapter")


def test_every_committed_notebook_says_what_made_its_outputs():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        made = nbformat.read(path, as_version=4).metadata["attnbook"]["outputs_made_with"]
        assert set(made) >= {"cpu", "cpu_capability", "torch"}, path.name


def test_a_cell_with_a_tolerance_states_it_and_why():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            spec = cell.metadata.get("attnbook", {}).get("numbers")
            if spec is not None:
                assert spec["abs"] > 0 and len(spec["why"]) > 20, (path.name, cell.source[:60])
                assert "NBVAL_IGNORE_OUTPUT" not in cell.source, (path.name, cell.source[:60])


def planted(path: Path, printed: str, made_with: dict) -> Path:
    """A one-cell notebook that prints 0.55, committed as printing ``printed``, with the
    tolerance 0.1, its outputs made with ``made_with``."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('print(f"probability of the right token: {0.55:.2f}")')
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    cell.execution_count = 1
    cell.metadata["attnbook"] = {"numbers": {"abs": 0.1, "why": "a test's stated band"}}
    nb.cells = [cell]
    nb.metadata["attnbook"] = {"outputs_made_with": made_with}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


PLANTED = [  # (committed output, the arithmetic that made it, whether nbval passes it here)
    ("probability of the right token: 0.55\n", arithmetic(), True),     # the same output
    ("probability of the right token: 0.60\n", arithmetic(), False),    # here: exact
    ("probability of the right token: 0.60\n", ELSEWHERE, True),        # elsewhere: within 0.1
    ("probability of the right token: 0.70\n", ELSEWHERE, False),       # beyond it: a change
    ("chance of the right token: 0.55\n", ELSEWHERE, False),            # other text
]


def test_nbval_compares_printed_numbers_by_the_arithmetic_that_made_them(tmp_path):
    """conftest.py, through nbval, on planted notebooks whose committed outputs differ: one
    pytest run over all of them, each notebook's verdict read from its report line."""
    paths = [planted(tmp_path / f"planted{i}.ipynb", printed, made_with)
             for i, (printed, made_with, _) in enumerate(PLANTED)]
    done = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
                           "-p", "conftest", "-q", "-rA", "-c", str(ROOT / "pyproject.toml"),
                           "--rootdir", str(tmp_path), *map(str, paths)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)     # conftest.py: ROOT's, as a plugin
    verdicts = {name: verdict for verdict, name in
                re.findall(r"^(PASSED|FAILED) \S*?(planted\d)\.ipynb::", done.stdout, re.M)}
    for i, (printed, made_with, passes) in enumerate(PLANTED):
        assert verdicts.get(f"planted{i}") == ("PASSED" if passes else "FAILED"), \
            (printed, made_with, done.stdout[-3000:])
    report = done.stdout                        # the failures' reports come in the planted order
    beyond = report[report.index("planted3.ipynb::"):report.index("planted4.ipynb::")]  # 0.70
    assert "differ by more than the tolerance 0.1" in beyond and "a test's stated band" in beyond
