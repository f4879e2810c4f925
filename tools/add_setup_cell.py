"""Insert or update the set-up cell that lets a chapter notebook run on its own.

    python tools/add_setup_cell.py notebooks/*.ipynb          # insert or update, in place
    python tools/add_setup_cell.py --check notebooks/*.ipynb  # exit 1 if a notebook is not current

A notebook opened alone (on Colab, or downloaded from the book) has no `attnbook` package, no
results and no data. Its first code cell, written by this script, brings them, but only when
`attnbook` cannot be imported:

1. `pip install "attnbook @ REPOSITORY"`: the package with its stored models and the committed
   results of the same commit (setup.py puts `results/` into the wheel), and the dependencies
   that pyproject.toml declares, unpinned, so that a PyTorch already installed (Colab's CUDA
   build) satisfies `torch>=2.1` and stays. REPOSITORY is `$ATTNBOOK_REPOSITORY` when set (a
   fork, a mirror, a local clone: any pip URL, `git+file:///path/to/clone`), else the archive
   of the book's branch on GitHub (no git needed), from `_config.yml` (`repository: url` and
   `branch`, the one place the address lives; the README's clone command uses it too,
   tests/test_setup_cell.py checks).
2. `python -m attnbook data download`: Multi30k, checked against its pinned sums (or the folder
   `$MULTI30K_DIR` names, checked).

Either step that fails stops the cell with one line: what could not be had, and how to fix it.
In the repository (after `make install`) and on Binder the package is installed, so the cell does
nothing and prints nothing, and nbval's comparison of outputs is unchanged.

The cell is tagged `attnbook-setup` (how this script and the tests find it) and `hide-input` (the
HTML book shows it collapsed; Colab and Jupyter show it as a normal cell). It goes right before
the first other code cell, with no outputs and execution count 1 (nbval compares its empty
output); the notebook is not re-executed. Running the script again changes nothing unless the
cell's text or the repository changed.
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
# Set-up, for a notebook opened on its own (Colab, a download): install the book's package with
# its committed results and stored models, and Multi30k. Where `attnbook` is installed: nothing.
import importlib.util, os, subprocess, sys

BOOK = "{url}/archive/refs/heads/{branch}.zip"
if importlib.util.find_spec("attnbook") is None:
    REPOSITORY = os.environ.get("ATTNBOOK_REPOSITORY", BOOK)      # or a fork, a mirror, a clone
    for step in (["pip", "install", "-q", f"attnbook @ {{REPOSITORY}}"],  # an installed torch stays
                 ["attnbook", "data", "download"]):                 # Multi30k, checked
        done = subprocess.run([sys.executable, "-m", *step], capture_output=True, text=True)
        if done.returncode:
            lines = [x.strip() for x in done.stderr.splitlines() if x.strip()] or ["no message"]
            why = next((x for w in ("fatal:", "ERROR:", "×") for x in lines if x.startswith(w)),
                       lines[-1])                               # git's or pip's own words
            sys.exit(f"{{' '.join(step[:2])}} failed: {{why}}" + ("; connect to the internet, or set "
                     "ATTNBOOK_REPOSITORY to a pip URL of the book" if step[0] == "pip" else ""))
        importlib.invalidate_caches()
    print(f"installed attnbook from {{REPOSITORY}}; Multi30k downloaded and checked")'''


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
