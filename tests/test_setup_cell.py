"""Every chapter notebook starts with the set-up cell of tools/add_setup_cell.py.

The cell lets a notebook opened alone (Colab, a download) install the book's package (with the
committed results and stored models) and data, from `$ATTNBOOK_REPOSITORY` or the one address of
the repository, which the README's and the intro's clone commands share. A step that fails stops
it with one line that says how to fix it. In the repository it must do nothing and print nothing:
nbval compares its (empty) output. (make test runs every notebook through the cell's install
path: tools/as_a_reader.py.)
Also what the launch buttons install: Binder's environment (binder/) and the dependencies that
pyproject.toml declares (what the set-up cell installs on Colab) cover what the package imports.
"""
import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from attnbook.book import homework

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

_spec = importlib.util.spec_from_file_location("add_setup_cell", ROOT / "tools" / "add_setup_cell.py")
add_setup_cell = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(add_setup_cell)
SOURCE = add_setup_cell.setup_source()

# Runs before the cell in a fresh interpreter: every way of starting a program is replaced by a
# recorder, and the commands are written as JSON to the file named by $CALLS at exit. A command
# whose words include $FAIL "fails": exit status 1, with $FAIL_STDERR on its standard error.
RECORDER = textwrap.dedent("""\
    import atexit, json, os, subprocess
    _calls = []
    def _record(*args, **kwargs):
        cmd = args[0] if args else kwargs.get("args")
        _calls.append([str(a) for a in cmd] if isinstance(cmd, (list, tuple)) else [str(cmd)])
        failed = os.environ.get("FAIL") in _calls[-1]
        return subprocess.CompletedProcess(cmd, int(failed), "",
                                           os.environ.get("FAIL_STDERR", "") if failed else "")
    class _Popen:
        def __init__(self, *args, **kwargs):
            _record(*args, **kwargs)
            raise RuntimeError("the set-up cell must not start programs with Popen")
    subprocess.run = subprocess.call = subprocess.check_call = subprocess.check_output = _record
    subprocess.Popen = _Popen
    os.system = _record
    for _name in ("execv", "execve", "execvp", "spawnv", "spawnvp", "posix_spawn"):
        if hasattr(os, _name):
            setattr(os, _name, _record)
    atexit.register(lambda: open(os.environ["CALLS"], "w").write(json.dumps(_calls)))
    """)


def run_cell(tmp_path, cwd, python_flags=(), status=0, **env):
    """Run the set-up cell after RECORDER, with the environment variables ``env`` added (None:
    removed); return (stdout, stderr, commands it tried to run)."""
    script = tmp_path / "cell.py"
    script.write_text(RECORDER + "\n" + SOURCE + "\n")
    calls = tmp_path / "calls.json"
    env = {k: v for k, v in {**os.environ, "CALLS": str(calls), **env}.items() if v is not None}
    proc = subprocess.run([sys.executable, *python_flags, str(script)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stderr
    return proc.stdout, proc.stderr, json.loads(calls.read_text())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_starts_with_the_current_setup_cell(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    fix = f"run: python tools/add_setup_cell.py {path.relative_to(ROOT)}"
    assert code and add_setup_cell.is_setup_cell(code[0]), f"no set-up cell first; {fix}"
    assert code[0].source == SOURCE, f"the set-up cell is out of date; {fix}"
    assert code[0].outputs == [] and "hide-input" in code[0].metadata["tags"]
    assert code[0].execution_count is not None   # else nbval would not compare its (empty) output
    assert sum(map(add_setup_cell.is_setup_cell, code)) == 1
    assert not add_setup_cell.update(path, SOURCE, write=False), f"{fix}"


def test_setup_cell_installs_from_the_repository_in_config():
    url, branch = add_setup_cell.repository()
    assert url.startswith("https://github.com/")
    assert f'BOOK = "{url}/archive/refs/heads/{branch}.zip"' in SOURCE
    assert 'os.environ.get("ATTNBOOK_REPOSITORY", BOOK)' in SOURCE
    compile(SOURCE, "setup-cell", "exec")


def test_the_repository_has_one_address():
    """_config.yml's repository (the launch buttons, the set-up cell) is what the README and the
    book's introduction tell a reader to clone."""
    url, _ = add_setup_cell.repository()
    folder = url.rsplit("/", 1)[1]
    for page in ("README.md", "book/intro.md"):
        clones = re.findall(r"git clone (\S+)(?: && cd (\S+))?", (ROOT / page).read_text())
        assert clones, f"{page} shows no clone command"
        assert all(c == (url, folder) for c in clones), \
            f"{page} clones {clones}, not {url} (the repository in _config.yml)"


def test_setup_cell_does_nothing_where_attnbook_is_installed(tmp_path):
    assert importlib.util.find_spec("attnbook") is not None
    out, err, calls = run_cell(tmp_path, cwd=ROOT / "notebooks")
    assert (out, err, calls) == ("", "", [])


def test_setup_cell_installs_package_and_data_where_attnbook_is_missing(tmp_path):
    """The recorder does see what the cell runs: without site-packages (-S) attnbook is missing.
    The package comes with its dependencies unpinned (an installed torch stays): no -U, no
    index of torch's own."""
    out, err, calls = run_cell(tmp_path, cwd=tmp_path, python_flags=("-S", "-I"))
    url, branch = add_setup_cell.repository()
    assert calls == [[sys.executable, "-m", "pip", "install", "-q",
                      f"attnbook @ {url}/archive/refs/heads/{branch}.zip"],
                     [sys.executable, "-m", "attnbook", "data", "download"]]
    assert out == (f"installed attnbook from {url}/archive/refs/heads/{branch}.zip; Multi30k "
                   "downloaded and checked\n")


def test_setup_cell_installs_from_attnbook_repository_when_set(tmp_path):
    """A fork, a mirror or a local clone: $ATTNBOOK_REPOSITORY, a pip URL. (-I would drop the
    environment variables; -S alone keeps them.)"""
    clone = (tmp_path / "clone").as_uri()
    _, _, calls = run_cell(tmp_path, cwd=tmp_path, python_flags=("-S",),
                           ATTNBOOK_REPOSITORY=f"git+{clone}")
    assert calls[0][-1] == f"attnbook @ git+{clone}"


@pytest.mark.parametrize("step, stderr, says", [
    ("pip", "  error: subprocess-exited-with-error\n  fatal: unable to access 'https://github.com/"
     "x/': Could not resolve host: github.com\nnote: This error originates from a subprocess",
     "pip install failed: fatal: unable to access 'https://github.com/x/': Could not resolve host:"
     " github.com; connect to the internet, or set ATTNBOOK_REPOSITORY to a pip URL of the book"),
    ("pip", "  WARNING: Retrying (...)\nerror: connection-failed\n\n× Failed to connect to github.com "
     "while fetching https://github.com/x.zip\n╰─> Failed to resolve IP address\n\nhint: Are you "
     "connected to the Internet?", "pip install failed: × Failed to connect to github.com while "
     "fetching https://github.com/x.zip; connect to the internet, or set ATTNBOOK_REPOSITORY to a "
     "pip URL of the book"),
    ("data", "error: could not download https://raw.githubusercontent.com/... (no network). "
     "Without network access, put the nine Multi30k files in a folder: export MULTI30K_DIR=...",
     "attnbook data failed: error: could not download https://raw.githubusercontent.com/... (no "
     "network). Without network access, put the nine Multi30k files in a folder: export "
     "MULTI30K_DIR=..."),
])
def test_a_step_that_fails_stops_the_cell_with_one_line_and_its_fix(tmp_path, step, stderr, says):
    _, err, calls = run_cell(tmp_path, cwd=tmp_path, python_flags=("-S",), status=1, FAIL=step,
                             FAIL_STDERR=stderr, ATTNBOOK_REPOSITORY=None)
    assert err == says + "\n"
    assert len(calls) == (1 if step == "pip" else 2)       # nothing runs after a failed step


def test_tool_is_idempotent_and_moves_the_cell_first(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Title"),
                                         nbformat.v4.new_code_cell("x = 1", outputs=[]),
                                         nbformat.v4.new_code_cell("old", metadata={"tags": [add_setup_cell.TAG]})])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    assert add_setup_cell.update(path, SOURCE)
    first = path.read_text()
    assert not add_setup_cell.update(path, SOURCE)
    assert path.read_text() == first
    cells = nbformat.read(path, as_version=4).cells
    assert [c.source for c in cells] == ["# Title", SOURCE, "x = 1"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_student_edition_keeps_the_setup_cell(path):
    student = homework.student_notebook(nbformat.read(path, as_version=4))
    first = next(c for c in student.cells if c.cell_type == "code")
    assert first.source == SOURCE and add_setup_cell.is_setup_cell(first)


# ---------------------------------------------------------------------------------------------
# What the launch buttons install: Colab runs the set-up cell, which pip-installs the package with
# the dependencies pyproject.toml declares (Colab's own torch satisfies `torch>=2.1` and stays);
# Binder installs binder/ (repo2docker reads it instead of the root's requirements.txt).

BINDER = ROOT / "binder"
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
# Imported by the package but brought by Jupyter itself (Colab, Binder, any notebook server):
# nbformat and nbclient, for the grading command and the student edition (attnbook.book.homework).
JUPYTER = {"nbformat", "nbclient"}
DISTRIBUTION = {"yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """{name: version} of the `name==version` lines of a requirements file."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)", line)
        if m:
            found[normalize(m.group(1))] = m.group(2)
    return found


def imported_distributions() -> set[str]:
    """The third-party distributions that src/attnbook imports anywhere (lazily too)."""
    names = set()
    for path in (ROOT / "src" / "attnbook").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    names -= set(sys.stdlib_module_names) | {"attnbook", "__future__"}
    return {normalize(DISTRIBUTION.get(n, n)) for n in names}


def test_binder_installs_what_the_notebooks_run_with_at_the_books_versions():
    binder = pins(BINDER / "requirements.txt")
    assert CPU_INDEX in (BINDER / "requirements.txt").read_text().splitlines(), \
        "binder/requirements.txt must take torch's CPU build (Binder has no GPU)"
    assert set(binder) == imported_distributions() - JUPYTER, \
        "binder/requirements.txt: the packages attnbook imports, no tools to build or test the book"
    book = pins(ROOT / "requirements.txt")
    assert {n: book.get(n) for n in binder} == binder, "binder/ pins differ from requirements.txt"


def test_binder_installs_the_package_and_uses_the_books_python():
    post = BINDER / "postBuild"
    assert os.access(post, os.X_OK), "binder/postBuild must be executable"
    assert re.search(r"pip install .*--no-deps -e \.", post.read_text()), \
        "postBuild installs the package without dependencies (torch's CPU build stays)"
    version = (BINDER / "runtime.txt").read_text().strip()
    for workflow in (ROOT / ".github" / "workflows").glob("*.yml"):
        for m in re.finditer(r'python-version:\s*"?([\d.]+)"?', workflow.read_text()):
            assert version == f"python-{m.group(1)}", f"binder/runtime.txt is {version}, " \
                f"{workflow.relative_to(ROOT)} uses Python {m.group(1)}"


def test_the_package_declares_what_it_imports():
    """Colab's set-up cell installs `attnbook` with the dependencies pyproject.toml declares."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {normalize(re.match(r"[A-Za-z0-9._-]+", d).group()) for d in project["dependencies"]}
    missing = imported_distributions() - JUPYTER - declared
    assert not missing, f"pyproject.toml's dependencies lack {sorted(missing)}"
