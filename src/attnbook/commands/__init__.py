"""Every command of the package, in one table: ``python -m attnbook NAME ...`` runs the ``main``
of the module that :data:`COMMANDS` names (``python -m MODULE ...`` runs it too).

The translator's own command lines live here (``train``, ``evaluate``, ``translate``: thin; the
work is in :mod:`attnbook.training` and the library); the others sit beside the code they run
(an experiment's in :mod:`attnbook.experiments`, the book's tooling in :mod:`attnbook.book`).
A module with a ``__main__`` guard that is not in the table fails
``tests/test_package_structure.py``, so a new command is added here, with one line of help.
"""
from __future__ import annotations

# name -> (module, one line of help); grouped as `python -m attnbook --help` prints them
COMMANDS = {
    # the translator (chapters 9 to 11)
    "train": ("attnbook.commands.train", "train a translator on Multi30k from a preset"),
    "evaluate": ("attnbook.commands.evaluate", "BLEU of a trained run on a split or any pair of files"),
    "translate": ("attnbook.commands.translate", "translate sentences with a trained run"),
    "data": ("attnbook.data", "download, check and inspect Multi30k"),
    # the experiments behind the committed results (`python -m attnbook run NAME` runs them)
    "toy_seeds": ("attnbook.experiments.toy_seeds", "Part I's reversal runs with several seeds (chapters 1-3)"),
    "score_scales": ("attnbook.experiments.score_scales", "how large the models' attention scores are (chapter 4)"),
    "translators": ("attnbook.experiments.translators", "chapter 10's learning-rate sweep and leaderboard"),
    "ablations": ("attnbook.experiments.ablations", "the paper's Table 3 in miniature (appendix)"),
    "evening": ("attnbook.experiments.evening", "the cpu-base preset with several seeds (chapter 11)"),
    "speedrun": ("attnbook.experiments.speedrun", "cpu-base in under ten minutes (chapter 11)"),
    "gpu_run": ("attnbook.experiments.gpu_run", "the GPU call: one prepared plan of at most nine minutes"),
    "exercise_runs": ("attnbook.experiments.exercise_runs", "the measurements the exercises' solutions quote"),
    "head_ablation": ("attnbook.experiments.head_ablation", "the explorer's head knock-outs"),
    "beyond_runs": ("attnbook.experiments.beyond_runs", "chapter 13's measurements"),
    "recall_runs": ("attnbook.experiments.recall_runs", "chapter 13's recall and generation costs"),
    "arithmetics": ("attnbook.experiments.arithmetics", "the same runs with three of PyTorch's kernel sets"),
    "benchmarks": ("attnbook.benchmarks", "the benchmark suite (appendix Performance)"),
    # the book's tooling
    "diagrams": ("attnbook.book.diagrams", "draw the book's diagrams as SVG files"),
    "explorer": ("attnbook.book.explorer", "the attention explorer pages' data"),
    "live": ("attnbook.book.live", "the translator page's model: export and score it"),
    "homework": ("attnbook.book.homework", "the student edition, and grading"),
    "course": ("attnbook.book.course", "time every notebook and its exercises (teachers' page)"),
}


def table() -> str:
    """The commands, one line each: name and help."""
    return "\n".join(f"  {name:<14} {help}" for name, (_, help) in COMMANDS.items())
