"""The package's shape, read from its source with ``ast`` (nothing is imported): short functions,
no import cycle, and the commands kept apart from the library.

A *command module* is one whose ``main()`` runs under ``if __name__ == "__main__"`` (``python -m
attnbook.X``; for the package ``attnbook.data``, its ``__main__.py``). Commands may import the
library; no module imports a command module."""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attnbook"
MAX_LINES = 80     # of code, from the first statement after the docstring to the last line


def module_name(path: Path) -> str:
    parts = ("attnbook", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}
TREES = {name: ast.parse(p.read_text(), str(p)) for name, p in MODULES.items()}


def is_command(tree: ast.Module) -> bool:
    """Whether the module defines main() and runs it under ``if __name__ == "__main__"``."""
    has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
    runs = any(isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
               and isinstance(n.test.left, ast.Name) and n.test.left.id == "__name__"
               for n in tree.body)
    return has_main and runs


COMMANDS = {name for name, tree in TREES.items() if is_command(tree)}


def imported(name: str, nodes) -> set[str]:
    """The package's modules that the import statements among ``nodes`` of module ``name``
    bring in (``from . import x`` counts module x, ``from .x import y`` module x)."""
    package = name.split(".") if MODULES[name].name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for n in nodes:
        if isinstance(n, ast.ImportFrom):
            if n.level == 0:
                base = n.module or ""
            else:                               # from . / from .x / from ..x
                base = ".".join(package[:len(package) - n.level + 1] + [n.module or ""]).rstrip(".")
            for alias in n.names:
                if f"{base}.{alias.name}" in MODULES:
                    out.add(f"{base}.{alias.name}")
                elif base in MODULES:
                    out.add(base)
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name in MODULES}
    out.discard(name)
    return out


def test_the_rules_see_the_package():
    assert {"attnbook.commands.train", "attnbook.commands.evaluate", "attnbook.commands.data",
            "attnbook.commands.toy_seeds", "attnbook.__main__"} <= COMMANDS
    assert not {"attnbook.training.loop", "attnbook.data", "attnbook.experiments.toy_seeds",
                "attnbook.commands"} & COMMANDS


def test_commands_live_only_in_the_commands_package():
    """Every module run as a command is attnbook.commands.NAME (or the dispatcher,
    ``python -m attnbook``): an experiment's or the book's work sits in its own module, and its
    command line here."""
    elsewhere = sorted(c for c in COMMANDS if not c.startswith("attnbook.commands.")
                       and c != "attnbook.__main__")
    assert not elsewhere, f"{elsewhere}: move the command's main into attnbook/commands/"
    assert "attnbook.mha" in imported("attnbook.transformer", TREES["attnbook.transformer"].body)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_is_longer_than_80_lines_of_code(name):
    long = []
    for node in ast.walk(TREES[name]):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str) and len(body) > 1:
                body = body[1:]                                       # the docstring aside
            lines = node.end_lineno - body[0].lineno + 1
            if lines > MAX_LINES:
                long.append(f"{node.name} (line {node.lineno}): {lines} lines")
    assert not long, f"{name}: split {', '.join(long)} into functions of at most {MAX_LINES}"


def test_batches_are_defined_in_one_place():
    """Every batch of the book is a batching.Batch (a pair per example) or a batching.SeqBatch
    (one sequence per example): no other module defines a class named ...Batch (as
    beyond.ReversalBatch and recall.RecallBatch once were)."""
    elsewhere = sorted(f"{name}.{node.name}" for name, tree in TREES.items()
                       if name != "attnbook.batching" for node in ast.walk(tree)
                       if isinstance(node, ast.ClassDef) and node.name.endswith("Batch"))
    assert not elsewhere, f"{elsewhere}: use attnbook.batching.Batch or SeqBatch"


def test_no_import_cycle():
    """Between the modules' imports, those inside functions included (an import put in a
    function to dodge a cycle is still a cycle in the design)."""
    graph = {name: imported(name, ast.walk(tree)) for name, tree in TREES.items()}
    state = {}

    def visit(name, path):
        state[name] = "open"
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                pytest.fail("import cycle: " + " -> ".join(path[path.index(dep):] + [dep]))
            if dep not in state:
                visit(dep, path + [dep])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_a_command_module(name):
    """Anywhere in the module, inside functions too."""
    bad = imported(name, ast.walk(TREES[name])) & COMMANDS
    assert not bad, (f"{name} imports the command module(s) {sorted(bad)}; move what it needs "
                     "into a library module")


NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
# Notebooks that still import a command module, and what from (none: the list may only shrink,
# and a notebook that imports a command should import the library module it re-exports instead).
STILL_IMPORTING_COMMANDS: dict = {}


def test_notebooks_import_no_new_command_module():
    import json
    found = {}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
        names = set()
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        if names & COMMANDS:
            found[path.name] = names & COMMANDS
    assert found == STILL_IMPORTING_COMMANDS


# The floors of the package, bottom first (README, "How the package is built"). A module imports
# only from its own floor or the floors below; so no folder imports a folder that imports it back.
# A unit is a top-level module (attnbook/x.py) or a sub-package (attnbook/x/).
FLOORS = [
    ("foundation", {"attnbook", "utils", "cli", "record", "store", "plotting", "tables", "bench"}),
    ("library", {"data", "tokenizer", "batching", "loop", "schedules", "attention", "rnn",
                 "reproduce", "toy", "tasks", "mha", "positional", "transformer", "conv", "lm",
                 "beyond", "ssm", "recall", "decoding", "bleu", "torch_twins"}),
    ("training", {"training"}),
    ("benchmarks", {"benchmarks"}),
    ("experiments", {"experiments"}),
    ("book tooling", {"graders", "book"}),
    ("commands", {"commands", "__main__"}),
]


def unit(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "attnbook"


def floor(name: str) -> int:
    found = [i for i, (_, units) in enumerate(FLOORS) if unit(name) in units]
    assert found, (f"{name} is on no floor: add attnbook.{unit(name)} to FLOORS in "
                   "tests/test_package_structure.py and to the README's drawing")
    return found[0]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_imports_only_from_its_floor_and_below(name):
    up = sorted(dep for dep in imported(name, ast.walk(TREES[name])) if floor(dep) > floor(name))
    assert not up, (f"{name} (floor {FLOORS[floor(name)][0]}) imports {up} from a higher floor; "
                    "move what it needs down, or the module up")


def test_no_folder_imports_a_folder_that_imports_it_back():
    """Between the units of the package (a sub-package, or a top-level module), imports inside
    functions included: no cycle, so the floors above hold for folders on one floor too."""
    graph = {}
    for name, tree in TREES.items():
        graph.setdefault(unit(name), set()).update(
            unit(d) for d in imported(name, ast.walk(tree)) if unit(d) != unit(name))
    graph.pop("attnbook", None)                   # the package's __init__ and top-level modules
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            u = todo.pop()
            assert u != start, f"attnbook.{start} imports a folder that imports it back"
            if u not in seen:
                seen.add(u)
                todo += graph.get(u, ())


def test_the_foundation_imports_nothing_of_the_book_but_itself():
    for name in MODULES:
        if floor(name) == 0:
            deps = imported(name, ast.walk(TREES[name]))
            assert all(floor(d) == 0 for d in deps), (name, deps)
    assert imported("attnbook.cli", ast.walk(TREES["attnbook.cli"])) == set()
    assert imported("attnbook.record", ast.walk(TREES["attnbook.record"])) == {"attnbook.utils"}
