"""Insert or update the set-up cell that lets a chapter notebook run on its own.

    python tools/add_setup_cell.py notebooks/*.ipynb          # insert or update, in place
    python tools/add_setup_cell.py --check notebooks/*.ipynb  # exit 1 if a notebook is not current

A notebook opened alone (on Colab, or downloaded from the book) has no `attnbook` package and no
data. Its first code cell, written by this script, installs the package from the book's
repository (`repository: url` and `branch` in _config.yml, the one place the address lives) and
downloads Multi30k (`python -m attnbook data download`), but only when `attnbook` cannot be
imported. In the repository (after `make install`) and on Binder the package is installed, so the
cell does nothing and prints nothing, and nbval's comparison of outputs is unchanged.

The cell is tagged `attnbook-setup` (how this script and tests/test_setup_cell.py find it) and
`hide-input` (the HTML book shows it collapsed; Colab and Jupyter show it as a normal cell). It
goes right before the first other code cell, with no outputs and execution count 1 (nbval skips
the comparison for a cell that was never run); the notebook is not re-executed.
Running the script again changes nothing unless the cell's text or the repository changed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
TAG = "attnbook-setup"
TAGS = [TAG, "hide-input"]
CELL_ID = "attnbook-setup"

TEMPLATE = '''\
# Set-up for running this notebook on its own (on Colab, or a downloaded copy): if the book's
# package `attnbook` is missing, install it from the book's repository and download the data.
# Where the book is installed (its repository after `make install`, Binder) this does nothing.
import importlib.util
import subprocess
import sys

BOOK_REPOSITORY = "{url}"
if importlib.util.find_spec("attnbook") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    f"attnbook @ git+{{BOOK_REPOSITORY}}@{branch}"], check=True)
    importlib.invalidate_caches()
    subprocess.run([sys.executable, "-m", "attnbook", "data", "download"], check=True)'''


def repository(config: Path = ROOT / "_config.yml") -> tuple[str, str]:
    """The book's repository URL (without a trailing .git or /) and branch, from _config.yml."""
    repo = yaml.safe_load(config.read_text(encoding="utf-8"))["repository"]
    url = str(repo["url"]).rstrip("/").removesuffix(".git")
    return url, str(repo.get("branch") or "main")


def setup_source(config: Path = ROOT / "_config.yml") -> str:
    """The text of the set-up cell for the repository named in ``config``."""
    url, branch = repository(config)
    return TEMPLATE.format(url=url, branch=branch)


def is_setup_cell(cell) -> bool:
    return cell.cell_type == "code" and TAG in cell.get("metadata", {}).get("tags", [])


def with_setup_cell(nb, source: str):
    """``nb`` with exactly one set-up cell, holding ``source``, before its first other code cell."""
    nb = nbformat.from_dict(nb)  # a copy
    old = [c for c in nb.cells if is_setup_cell(c)]
    cells = [c for c in nb.cells if not is_setup_cell(c)]
    metadata = dict(old[0].metadata) if old else {}
    tags = [t for t in metadata.get("tags", []) if t not in TAGS]
    metadata["tags"] = TAGS + tags
    # Marked as run (execution count 1, the first code cell): nbval compares the outputs of run
    # cells only, so its empty output is checked, and a cell that printed would fail the tests.
    cell = nbformat.v4.new_code_cell(source, metadata=metadata, execution_count=1)
    if (nb.nbformat, nb.nbformat_minor) >= (4, 5):
        cell["id"] = CELL_ID
    else:
        cell.pop("id", None)
    first_code = next((i for i, c in enumerate(cells) if c.cell_type == "code"), len(cells))
    cells.insert(first_code, cell)
    nb.cells = cells
    return nb


def update(path: Path, source: str, write: bool = True) -> bool:
    """Insert or update the set-up cell of the notebook at ``path``; True if it changed."""
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    new = nbformat.writes(with_setup_cell(nb, source)) + "\n"
    if new == text:
        return False
    if write:
        nbformat.validate(nbformat.reads(new, as_version=4))
        path.write_text(new, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", type=Path, nargs="+")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a notebook lacks the current set-up cell")
    args = parser.parse_args(argv)
    source = setup_source()
    stale = []
    for path in args.notebooks:
        changed = update(path, source, write=not args.check)
        if changed:
            stale.append(path)
        print(f"{path}: {('needs the set-up cell' if args.check else 'updated') if changed else 'ok'}")
    if args.check and stale:
        print(f"run: python tools/add_setup_cell.py {' '.join(map(str, stale))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
