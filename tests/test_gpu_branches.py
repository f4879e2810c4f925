"""The cells that only a GPU reader runs, run here on the CPU with the device choice overridden.

A notebook branches on the reader's device only for what the reader trains or measures live
(`if device.type == "cuda":`); the committed evidence it shows is the same everywhere. make test
has no GPU, so each such branch would go untested: here every code cell that tests for CUDA is
run in a kernel with that test replaced by True, the tensors staying on the CPU, and the branch's
sizes shrunk (the GPU preset to a few steps of a tiny model, the attention lengths to a few
hundred tokens) by a cell the test adds. A cell of a notebook that tests for CUDA and is not
listed here fails the first test, so that a new branch cannot go unseen.
"""
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
CUDA_TEST = 'device.type == "cuda"'
DEVICE_TEST = re.compile(r"""device\.type\s*[!=]=|cuda\.is_available|get_device\(\)\.type""")

# notebook: (the cells it needs, by id, in order, "shrink" where the test's cell goes; the cell)
SHRINK_ATTENTION = '''\
_attention_cost = attention_cost
def attention_cost(functions, lengths, **kw):      # a few short lengths, one repeat
    return _attention_cost(functions, [T for T in lengths if T <= 256][:2] or [64],
                           **{**kw, "repeats": 1})
'''
SHRINK_GPU_BASE = '''\
from attnbook.training import recipe
g = recipe.PRESETS["gpu-base"]                       # the same recipe, a tiny model, four steps
recipe.PRESETS["gpu-base"] = replace(
    g, arch=replace(g.arch, vocab_size=recipe.PRESETS["cpu-tiny"].arch.vocab_size, d_model=32,
                    h=2, d_ff=64, n_layers=1), max_tokens=600, max_steps=4, eval_every=2,
    eval_sentences=8)
'''
BRANCHES = {
    "04_scaled_dot_product": (["35d8c6c6", "shrink", "1c53ccf8", "8303f896"], SHRINK_ATTENTION),
    "11_full_size": (["c10a53c1", "44597d34", "shrink", "c7906645", "f6cdc279", "d63bc14b"],
                     SHRINK_GPU_BASE),
}


def notebook(name: str):
    return nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)


def test_every_cell_that_tests_for_cuda_is_run_here():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        branching = [c.id for c in nb.cells if c.cell_type == "code" and DEVICE_TEST.search(c.source)]
        listed = BRANCHES.get(path.stem, ([], ""))[0]
        missing = [i for i in branching if i not in listed]
        assert not missing, (f"{path.name}: cells {missing} test for CUDA; add them (and the cells "
                             "they need) to BRANCHES in tests/test_gpu_branches.py")


@pytest.mark.parametrize("name", sorted(BRANCHES))
def test_the_gpu_branch_runs(name, tmp_path):
    ids, shrink = BRANCHES[name]
    nb = notebook(name)
    by_id = {c.id: c for c in nb.cells}
    cells, overridden = [], 0
    for i in ids:
        if i == "shrink":
            cells.append(nbformat.v4.new_code_cell(shrink))
            continue
        assert i in by_id, f"{name}: no cell {i}; update BRANCHES in tests/test_gpu_branches.py"
        source = by_id[i].source
        overridden += source.count(CUDA_TEST)
        cells.append(nbformat.v4.new_code_cell(source.replace(CUDA_TEST, "True")))
    assert overridden, f"{name}: none of the listed cells tests {CUDA_TEST}"
    run = nbformat.v4.new_notebook(cells=cells, metadata=nb.metadata)
    NotebookClient(run, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in run.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    printed = "".join(o.get("text", "") for c in run.cells for o in c.get("outputs", []))
    if name == "11_full_size":
        assert "on cpu: training gpu-base, the real recipe" in printed and "4 steps" in printed
    else:
        assert "no CUDA GPU here" not in printed and "T =    64: " in printed
