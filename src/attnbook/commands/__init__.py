"""Every command of the package, in one table: ``python -m attnbook NAME ...`` runs the ``main``
of the module that :data:`COMMANDS` names, ``attnbook.commands.NAME`` (``python -m
attnbook.commands.NAME ...`` runs it too).

A command is its command line only: it parses the options, measures inside
:func:`attnbook.record.record`, and hands the work to the library, :mod:`attnbook.training`, an
experiment's module in :mod:`attnbook.experiments` or the book's tooling in :mod:`attnbook.book`.
Every command lives in this package, and only here (``tests/test_package_structure.py``): a new
one is a module here and one line in :data:`COMMANDS`, with its help.

Commands that once lived beside their work are in :data:`FORMERLY`, so that the command lines
recorded in committed results (``python -m attnbook toy_seeds ...``) still name a
command: :func:`resolve` turns one into today's.
"""
from __future__ import annotations


# name -> (module, one line of help); grouped as `python -m attnbook --help` prints them
COMMANDS = {
    # the translator (chapters 9 to 11)
    "train": ("attnbook.commands.train", "train a translator on Multi30k from a preset"),
    "evaluate": ("attnbook.commands.evaluate", "BLEU of a trained run on a split or any pair of files"),
    "translate": ("attnbook.commands.translate", "translate sentences with a trained run"),
    "data": ("attnbook.commands.data", "download, check and inspect Multi30k"),
    # the experiments behind the committed results (`python -m attnbook run NAME` runs them)
    "toy_seeds": ("attnbook.commands.toy_seeds", "Part I's reversal runs with several seeds (chapters 1-3)"),
    "score_scales": ("attnbook.commands.score_scales", "how large the models' attention scores are (chapter 4)"),
    "translators": ("attnbook.commands.translators", "chapter 10's learning-rate sweep and leaderboard"),
    "ablations": ("attnbook.commands.ablations", "the paper's Table 3 in miniature (appendix)"),
    "evening": ("attnbook.commands.evening", "the cpu-base preset with several seeds (chapter 11)"),
    "speedrun": ("attnbook.commands.speedrun", "cpu-base in under ten minutes (chapter 11)"),
    "gpu_run": ("attnbook.commands.gpu_run", "the GPU call: one prepared plan of at most nine minutes"),
    "exercise_runs": ("attnbook.commands.exercise_runs", "the measurements the exercises' solutions quote"),
    "head_ablation": ("attnbook.commands.head_ablation", "knock out each head of a trained translator (attention-map pages)"),
    "beyond_runs": ("attnbook.commands.beyond_runs", "chapter 13's measurements"),
    "recall_runs": ("attnbook.commands.recall_runs", "chapter 13's recall and generation costs"),
    "arithmetics": ("attnbook.commands.arithmetics", "the same runs with three of PyTorch's kernel sets"),
    "benchmarks": ("attnbook.commands.benchmarks", "the benchmark suite (appendix Performance)"),
    # the book's tooling
    "diagrams": ("attnbook.commands.diagrams", "draw the book's diagrams as SVG files"),
    "explorer": ("attnbook.commands.explorer", "the attention explorer pages' data"),
    "live": ("attnbook.commands.live", "the translator page's model: export and score it"),
    "homework": ("attnbook.commands.homework", "the student edition, and grading"),
    "course": ("attnbook.commands.course", "time every notebook and its exercises (teachers' page)"),
}

# where each command lived before this package held them all (the earliest layout had them at
# the package's top), as committed results record them: module -> command (and its first words)
FORMERLY = {
    "attnbook.data": "data",
    "attnbook.benchmarks": "benchmarks",
    "attnbook.train": "train",
    "attnbook.experiments": "translators",       # `python -m attnbook.experiments sweep ...`
    **{f"attnbook.{floor}{name}": name
       for floor in ("", "experiments.")
       for name in ("toy_seeds", "score_scales", "translators", "ablations", "evening", "speedrun",
                    "gpu_run", "exercise_runs", "head_ablation", "beyond_runs", "recall_runs",
                    "arithmetics")},
    **{f"attnbook.book.{name}": name
       for name in ("diagrams", "explorer", "live", "homework", "course")},
}


def resolve(command: str) -> str:
    """A command line as recorded, in today's form: ``python -m attnbook toy_seeds
    --tiny`` -> ``python -m attnbook toy_seeds --tiny``; ``python -m attnbook train ...``
    -> ``python -m attnbook train ...``. The rest of the line is kept as recorded. ValueError if
    it names no command of the table."""
    words = command.split(maxsplit=3)
    if len(words) < 3 or words[1] != "-m" or not words[0].startswith("python"):
        raise ValueError(f"{command[:80]!r} is not a `python -m attnbook ...` command line")
    module, rest = words[2], words[3:]
    if module in FORMERLY:
        rest = [FORMERLY[module], *rest]
    elif module.startswith("attnbook.commands."):
        rest = [module.removeprefix("attnbook.commands."), *rest]
    elif module != "attnbook":
        raise ValueError(f"{command[:80]!r}: {module} is no command of attnbook")
    if not rest or rest[0].split()[0] not in (*COMMANDS, "run"):
        raise ValueError(f"{command[:80]!r} names no command in attnbook.commands.COMMANDS")
    return " ".join(["python -m attnbook", *rest])


def table() -> str:
    """The commands, one line each: name and help."""
    return "\n".join(f"  {name:<14} {help}" for name, (_, help) in COMMANDS.items())
