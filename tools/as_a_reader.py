"""Run the book's notebooks as a reader who opened each one on its own (Colab, a download).

    python tools/as_a_reader.py PLACE      # prepare PLACE (outside the repository); print its parts

`make test` runs this, then nbval on the notebooks it copied. It builds what a Colab reader has:

1. an environment with PyTorch and Jupyter but not the book's package (`PLACE/env`: the
   distributions of torch, numpy, matplotlib, ipykernel, ipython and tqdm, with everything they
   need, linked from the book's own .venv, so that it takes a second instead of a fresh install);
2. a Jupyter kernel `attnbook-reader` that runs in it (`PLACE/jupyter`, for `JUPYTER_PATH`);
3. the book's package installed there as a reader installs it: the notebooks' own set-up cell,
   run in an empty folder with `ATTNBOOK_REPOSITORY` pointing at this repository (its working
   tree) and the pins of requirements.txt as pip's constraints (what the committed outputs were
   made with). Checked: PyTorch is the one the environment had (the cell never replaces it), and
   `attnbook` is the installed copy, outside the repository, with the committed results;
4. every notebook alone in an empty folder of its own, `PLACE/notebooks/NAME/NAME.ipynb`.

The data comes from `$MULTI30K_DIR` (CI's offline copy) or the reader's cache, as for a reader.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "attnbook-reader"
# What a Colab reader's Python has before the set-up cell runs (Colab has more; not the book's).
PREINSTALLED = ("torch", "numpy", "matplotlib", "ipykernel", "ipython", "tqdm", "pip",
                "setuptools")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(site: Path, wanted) -> list[metadata.Distribution]:
    """The distributions of ``site`` named in ``wanted`` and every one they require."""
    dists = {normalize(d.metadata["Name"]): d for d in metadata.distributions(path=[str(site)])}
    todo, seen = [normalize(n) for n in wanted], {}
    while todo:
        name = todo.pop()
        if name in seen or name not in dists:
            continue
        seen[name] = dists[name]
        for line in dists[name].requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(normalize(req.name))
    return list(seen.values())


def link_environment(env: Path) -> None:
    """A virtual environment at ``env`` holding the PREINSTALLED closure of the book's .venv,
    each file hard-linked (copied where links cannot be made)."""
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    source = Path(next(p for p in sys.path if p.endswith("site-packages")))
    target = next((env / "lib").glob("python*/site-packages"))
    for dist in closure(source, PREINSTALLED):
        for file in dist.files or []:
            src = (source / file).resolve()
            dest = target / file
            if not src.is_file() or not src.is_relative_to(source.resolve()):
                continue                    # scripts in bin/ and bytecode: not needed
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dest)
            except OSError:
                shutil.copy2(src, dest)


def kernel(env: Path, jupyter: Path) -> None:
    spec = jupyter / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(env / "bin" / "python"), "-m", "ipykernel_launcher", "-f",
                 "{connection_file}"],
        "display_name": "Python 3 (a reader's, without attnbook)", "language": "python"}))


def setup_cell() -> str:
    """The source of the notebooks' set-up cell (tools/add_setup_cell.py writes it)."""
    nb = json.loads((ROOT / "notebooks" / "00_setup.ipynb").read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if "attnbook-setup" in c["metadata"].get("tags", []))
    return "".join(cell["source"])


def install_as_a_reader(env: Path, place: Path) -> str:
    """Run the set-up cell with the environment's Python in an empty folder; check what it did.
    Returns what it printed."""
    python = str(env / "bin" / "python")
    probe = "import torch; print(torch.__version__, torch.__file__)"
    torch_before = subprocess.run([python, "-c", probe], capture_output=True, text=True,
                                  check=True).stdout
    pins = place / "pins.txt"            # requirements.txt's exact versions, as constraints
    pins.write_text("".join(line + "\n" for line in
                            (ROOT / "requirements.txt").read_text().splitlines()
                            if re.match(r"[A-Za-z0-9]", line) and "==" in line))
    empty = place / "empty"
    shutil.rmtree(empty, ignore_errors=True)
    empty.mkdir()
    shutil.rmtree(ROOT / "build", ignore_errors=True)        # no stale files from an older build
    env_vars = {**os.environ, "ATTNBOOK_REPOSITORY": ROOT.as_uri(), "PIP_CONSTRAINT": str(pins)}
    done = subprocess.run([python, "-c", setup_cell()], cwd=empty, env=env_vars,
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the set-up cell failed: {done.stdout}{done.stderr}")
    where = subprocess.run([python, "-c", probe + "; import attnbook.store as s; "
                            "print(s.find('cpu/board.json'))"], cwd=empty,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    if where[0] + "\n" != torch_before:
        raise SystemExit(f"the set-up cell changed PyTorch: {torch_before.strip()} -> {where[0]}")
    board = Path(where[1])
    if board.is_relative_to(ROOT) or not board.is_relative_to(env):
        raise SystemExit(f"results/cpu/board.json came from {board}, not the installed package")
    return done.stdout.strip()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit(__doc__.split("\n\n")[1])
    place = Path(argv[0]).resolve()
    if place.is_relative_to(ROOT):
        raise SystemExit(f"{place} is inside the repository: a reader's folder must be outside it")
    env, jupyter, notebooks = place / "env", place / "jupyter", place / "notebooks"
    link_environment(env)
    kernel(env, jupyter)
    said = install_as_a_reader(env, place)
    shutil.rmtree(notebooks, ignore_errors=True)
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        (notebooks / nb.stem).mkdir(parents=True)
        shutil.copy2(nb, notebooks / nb.stem / nb.name)
    print(f"{place}: the set-up cell said {said!r}; kernel {KERNEL}; "
          f"{len(list(notebooks.iterdir()))} notebooks, each alone in a folder")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
