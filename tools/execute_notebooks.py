"""Execute notebooks in place, so that their committed outputs are fresh.

    python tools/execute_notebooks.py notebooks/01_bottleneck.ipynb [...]

Each notebook runs in a fresh kernel of the current Python environment with its own folder as the
working directory, exactly as nbval runs it in `make test`. A cell that raises stops the run
unless it is tagged `raises-exception`. Execution counts are renumbered from 1 so that a re-run
with the same outputs leaves the file unchanged. The notebook's metadata records the arithmetic
its outputs were made with ("attnbook": {"outputs_made_with": ...}, attnbook.utils.arithmetic):
there nbval compares every output exactly, elsewhere within the tolerances cells state.
"""
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from attnbook.utils import arithmetic


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=1800, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    n = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            n += 1
            cell.execution_count = n
            for out in cell.get("outputs", []):
                if "execution_count" in out:
                    out["execution_count"] = n
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    nb.metadata["attnbook"] = {"outputs_made_with": arithmetic()}
    nbformat.write(nb, path)
    return time.perf_counter() - start


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for arg in sys.argv[1:]:
        p = Path(arg)
        print(f"{p}: {execute(p):.1f} s", flush=True)
