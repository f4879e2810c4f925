"""The book's diagrams (attnbook.book.diagrams): they draw, the committed SVGs are up to date, the
names of code they show exist in the package, and every figure a notebook shows exists and has
alt text."""
from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from attnbook.book import diagrams

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "book" / "figures"
REGENERATE = "regenerate them with `python -m attnbook diagrams` and commit book/figures/"

# ![alt](path) and the MyST figure directive (``` or ::: fence) with its options
MD_IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<path>[^)\s]+)[^)]*\)")
FIGURE = re.compile(r"^(?:```|:::)\{figure\}\s+(?P<path>\S+)\s*\n(?P<options>(?:[ \t]*:[^\n]*\n)*)",
                    re.MULTILINE)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("figures")
    diagrams.write_all(out)
    return out


@pytest.mark.parametrize("name", sorted(diagrams.DIAGRAMS))
def test_each_diagram_is_an_svg(generated, name):
    text = (generated / f"{name}.svg").read_text(encoding="utf-8")
    assert text.startswith("<?xml") and "<svg" in text and text.rstrip().endswith("</svg>")
    assert "<dc:date>" not in text, "the SVG must not record the date (not reproducible)"


@pytest.mark.parametrize("name", sorted(diagrams.DIAGRAMS))
def test_committed_figure_is_up_to_date(generated, name):
    committed = FIGURES / f"{name}.svg"
    assert committed.exists(), f"book/figures/{name}.svg is missing: {REGENERATE}"
    assert committed.read_bytes() == (generated / f"{name}.svg").read_bytes(), \
        f"book/figures/{name}.svg differs from what attnbook.book.diagrams draws: {REGENERATE}"


def test_no_stray_figures():
    stray = {p.stem for p in FIGURES.glob("*.svg")} - set(diagrams.DIAGRAMS)
    assert not stray, f"book/figures has SVGs that no diagram draws: {sorted(stray)}"


def test_regenerating_twice_is_byte_identical(tmp_path):
    a, b = tmp_path / "a.svg", tmp_path / "b.svg"
    diagrams.save(diagrams.masks(), a)
    diagrams.save(diagrams.masks(), b)
    assert a.read_bytes() == b.read_bytes()


def test_code_names_exist_in_the_package():
    """Every name drawn through _code("module.Name[.attr]") or _attr(...) is a real object of the
    package: a function, a class, a method, or a layer that the class's __init__ sets."""
    source = Path(diagrams.__file__).read_text(encoding="utf-8")
    names = re.findall(r'_(?:code|attr)\("([\w.]+)"\)', source)
    assert len(names) > 15
    for dotted in names:
        module, *attrs = dotted.split(".")
        obj = importlib.import_module(f"attnbook.{module}")
        for attr in attrs:
            if not hasattr(obj, attr) and inspect.isclass(obj):  # a layer made in __init__
                assert re.search(rf"self\.{attr}\b[^=\n]*=", inspect.getsource(obj)), \
                    f"diagrams show {dotted}, which attnbook does not have"
                break
            assert hasattr(obj, attr), f"diagrams show {dotted}, which attnbook does not have"
            obj = getattr(obj, attr)


def test_the_library_does_not_import_diagrams():
    pattern = re.compile(r"^\s*(from\s+(\.|attnbook\.?)\s*(import\s+)?diagrams|"
                         r"import\s+attnbook\.diagrams)", re.MULTILINE)
    for path in sorted((ROOT / "src" / "attnbook").glob("*.py")):
        if path.name != "diagrams.py":
            assert not pattern.search(path.read_text(encoding="utf-8")), \
                f"{path.name} imports attnbook.book.diagrams; the library must not depend on it"


def _figure_references():
    """(where, path, alt) for every image that a notebook's markdown cell shows."""
    refs = []
    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "markdown":
                continue
            text = "".join(cell["source"])
            where = f"{nb_path.name}, cell {i}"
            for m in MD_IMAGE.finditer(text):
                refs.append((where, nb_path.parent / m["path"], m["alt"]))
            for m in FIGURE.finditer(text):
                alt = re.search(r"^[ \t]*:alt:[ \t]*(.*)$", m["options"], re.MULTILINE)
                refs.append((where, nb_path.parent / m["path"], alt[1] if alt else ""))
    return refs


def test_notebook_figures_exist_and_have_alt_text():
    refs = [r for r in _figure_references() if "book/figures" in r[1].as_posix()]
    assert refs, "no notebook shows a figure from book/figures"
    for where, path, alt in refs:
        assert path.resolve().is_file(), f"{where}: {path} does not exist"
        assert alt.strip() and not re.fullmatch(r"\S+\.(svg|png)", alt.strip()), \
            f"{where}: the figure {path.name} has no alt text"


def test_every_diagram_is_shown_in_a_notebook():
    shown = {r[1].resolve() for r in _figure_references()}
    missing = [n for n in diagrams.DIAGRAMS if (FIGURES / f"{n}.svg").resolve() not in shown]
    assert not missing, f"diagrams that no notebook shows: {missing}"
