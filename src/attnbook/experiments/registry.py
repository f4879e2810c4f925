"""One registry of named experiments: each committed result file under ``results/`` is made by
exactly one of them, and ``python -m attnbook run NAME`` runs any of them.

An :class:`Experiment` names the command module that does the work (run by name, as ``python -m``
would: the library imports no command), the arguments of the full run that made the committed
file, those of a tiny run (seconds; the tests), how ``--seeds`` and ``--only KEY`` are passed on,
and the chapters that show it. Its cost is read from the committed file's provenance record
(:mod:`attnbook.store`): the CPU time of its calls (their wall time where none was recorded).
An experiment whose calls add rows to its file names its :class:`Rows` (``ROWS``): the rows'
key, written down here once, through which its command merges a call into the file.
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from .. import store
from ..record import Provenance, command_line, record
from ..store import ResultError, find, read

SEEDS = (0, 1, 2)        # every experiment's seeds, unless it says otherwise


@dataclass(frozen=True)
class Rows:
    """The rows of an experiment's result file, and how a call's rows merge into it
    (:func:`attnbook.store.merge`): ``data`` is the data key that holds them, ``key`` the fields
    that identify a row (no key: ``data`` is a dict keyed by name; ``data`` "": the rows are the
    top-level parts named in ``key``), and ``same`` the settings that the file and a call must
    share (else a one-line error, nothing written)."""
    data: str
    key: tuple = ()
    same: tuple = ()

    def merge(self, old: dict, new: dict) -> dict:
        """``new`` (one call's result) merged into ``old`` by this key: the writers' one merge."""
        return store.merge(old, new, self.data, by=self.key, same=self.same)

    def describe(self) -> str:
        if not self.data:
            rows = f"the parts {', '.join(self.key)}"
        elif not self.key:
            rows = f"{self.data}, one per name"
        else:
            rows = f"{self.data}, one per ({', '.join(self.key)})"
        return rows + (f"; a merge keeps {', '.join(self.same)}" if self.same else "")


# The rows of each family of result files: the one place a row's key is written down.
ROWS = {
    "toy_seeds": Rows("runs", ("name", "seed"), ("seeds", "scale")),
    "exercises": Rows("exercises"),
    "beyond": Rows("", ("reversal", "lm", "variants"), ("seeds",)),
    "recall": Rows("runs", ("part", "mixer", "T", "n_pairs", "h", "d_state", "seed"),
                   ("settings", "generation_settings")),
    "ablations": Rows("variants", ("variant",), ("preset", "test_set")),
    "translators": Rows("runs", ("model", "peak_lr", "seed"), ("preset", "selection")),
    "evening": Rows("runs", ("model", "seed"), ("preset", "selection")),
    "speedrun": Rows("runs", ("row", "seed"), ("minutes",)),
}


@dataclass(frozen=True)
class Experiment:
    name: str
    module: str                 # the command that runs it: attnbook.<module>.main(argv)
    result: tuple               # the file(s) it owns under results/
    shown_in: str
    args: tuple                 # the full run's arguments (as the committed file was made)
    tiny: tuple = ()            # a tiny run's arguments; "{out}" is the folder it writes into
    seeds: tuple = SEEDS
    seeds_flag: str = "--seeds"   # "" if it takes no seeds
    only: tuple = ()            # arguments of --only KEY ("{key}" replaced)
    needs: str = ""             # what must exist before it runs
    collect: str = ""           # for a command that writes no result: the run folder whose
    #                             metrics.json becomes the result (collect_metrics)
    rows: Rows | None = None    # its rows and their key, for one that merges (--only)

    def argv(self, tiny_out: str | None = None, seeds=None, only=None) -> list[str]:
        """The command's arguments: the full run's, or (``tiny_out``) a tiny run's into that
        folder; ``seeds`` and ``only`` passed on as the command takes them."""
        args = [a.replace("{out}", tiny_out or "") for a in (self.tiny if tiny_out else self.args)]
        if seeds is not None and "{seed}" not in " ".join(args):    # else: one call a seed
            if not self.seeds_flag:
                raise ResultError(f"{self.name} takes no seeds; run it without --seeds")
            args += [self.seeds_flag, *map(str, seeds)]
        if only is not None:
            if not self.only:
                raise ResultError(f"{self.name} has no parts to run alone; run it without --only")
            args += [a.replace("{key}", only) for a in self.only]
        return args

    def cost(self) -> str:
        """What the committed file(s) cost, from their provenance: the CPU time of the calls
        (their wall time where none was recorded), or, for a file of training runs made in
        earlier calls and reused, the training time its runs record."""
        seconds, trained, calls, wall = 0.0, 0.0, 0, False
        for relative in self.result:
            path = find(relative)
            if path is None:
                continue
            res = read(path)
            trained += res.get("train_time_s_sum", res.get("train_time_s", 0.0))
            for call in res.get("calls", []):
                calls += 1
                seconds += call.get("cpu_s") or call.get("wall_s") or 0.0
                wall |= not call.get("cpu_s")
        if not calls:
            return "not made yet"
        if trained > seconds:
            return (f"{trained / 60:.0f} min of training (the training time its runs record), "
                    f"{calls} call(s)")
        kind = "min (wall time; no CPU time recorded)" if wall else "CPU-min"
        return f"{seconds / 60:.1f} {kind}, {calls} call(s)"


def _exp(*a, **kw) -> Experiment:
    return Experiment(*a, **kw)


EXPERIMENTS = {e.name: e for e in [
    _exp("toy_seeds", "experiments.toy_seeds", ("cpu/toy_seeds.json",), "chapters 1-3",
         ("--results", "results/cpu"), tiny=("--results", "{out}", "--tiny", "--no-timing"),
         only=("--runs", "{key}", "--no-timing", "--merge"),
         rows=ROWS["toy_seeds"]),
    _exp("arithmetics", "experiments.arithmetics", ("cpu/arithmetics.json",),
         "the page 'Numbers on your machine'", ("--results", "results/cpu"), seeds_flag="",
         tiny=("--results", "{out}", "--tiny")),
    _exp("exercises", "experiments.exercise_runs", ("cpu/exercises.json",), "chapters 5-9 and 12",
         ("--results", "results/cpu"), seeds_flag="",
         tiny=("--results", "{out}", "--tiny", "--only", "ex-06-too-good"),
         only=("--only", "{key}"),
         rows=ROWS["exercises"]),
    _exp("beyond", "experiments.beyond_runs", ("cpu/beyond.json",), "chapter 13",
         ("--out", "results/cpu/beyond.json"),
         tiny=("--out", "{out}/beyond.json", "--steps", "2", "--only", "reversal"),
         only=("--only", "{key}"),
         rows=ROWS["beyond"]),
    _exp("recall", "experiments.recall_runs", ("cpu/recall.json",), "chapter 13",
         ("--out", "results/cpu/recall.json"),
         tiny=("--out", "{out}/recall.json", "--steps", "2", "--jobs", "1", "--lengths", "8",
               "16"),
         only=("--only", "{key}"), needs="a quiet machine for --only generation (its times are "
                                         "the result)",
         rows=ROWS["recall"]),
    _exp("ablations", "experiments.ablations", ("cpu/ablations.json",),
         "chapters 5, 7 and 9, the ablations appendix",
         ("--out", "runs/ablations", "--results", "results/cpu", "--jobs", "2", "--threads", "1"),
         tiny=("--out", "{out}/runs", "--results", "{out}", "--variants", "base", "--steps", "2",
               "--sentences", "8", "--jobs", "1"),
         only=("--variants", "{key}", "--merge"), needs="Multi30k",
         rows=ROWS["ablations"]),
    _exp("sweep", "experiments.translators", ("cpu/sweep.json",), "chapter 10",
         ("sweep", "--preset", "cpu-tiny", "--out", "runs/sweep", "--results", "results/cpu"),
         seeds_flag="", tiny=("sweep", "--preset", "smoke", "--models", "transformer",
                              "--max-steps", "2", "--jobs", "1",
                              "--sentences", "8", "--out", "{out}/runs", "--results", "{out}"),
         only=("--models", "{key}", "--merge"), needs="Multi30k", rows=ROWS["translators"]),
    # the tiny runs train in one process (--jobs 1), but this one: the tests' run of the pool
    _exp("sweep_base", "experiments.translators", ("cpu/sweep_base.json",), "chapter 11",
         ("sweep", "--preset", "cpu-base", "--models", "gru-additive", "--peak-lrs", "2e-3",
          "4e-3", "8e-3", "1.6e-2", "--out", "runs/sweep-base", "--jobs", "2", "--results", "results/cpu",
          "--name", "sweep_base"),
         seeds_flag="", tiny=("sweep", "--preset", "smoke", "--models", "gru-additive",
                              "--peak-lrs", "2e-3", "4e-3", "--max-steps", "2", "--sentences",
                              "8", "--out", "{out}/runs", "--results", "{out}", "--name",
                              "sweep_base"),
         needs="Multi30k; about half an hour of 2 cores",
         rows=ROWS["translators"]),
    _exp("board", "experiments.translators", ("cpu/board.json",), "chapters 8-12",
         ("board", "--preset", "cpu-tiny", "--out", "runs/board", "--reuse", "runs/sweep",
          "--results", "results/cpu"),
         tiny=("board", "--preset", "smoke", "--models", "transformer", "--seeds", "0",
               "--sentences", "8", "--jobs", "1",
               "--out", "{out}/runs", "--results", "{out}"),
         only=("--models", "{key}", "--merge"), needs="Multi30k; the sweep's runs",
         rows=ROWS["translators"]),
    _exp("board_long", "experiments.translators", ("cpu/board_long.json",), "chapter 10",
         ("board", "--preset", "cpu-tiny", "--max-steps", "2400", "--models", "transformer",
          "gru-additive", "conv", "gru-additive-wide", "--out", "runs/board", "--reuse", "runs/board", "--name",
          "board_long", "--results", "results/cpu"),
         tiny=("board", "--preset", "smoke", "--max-steps", "24", "--models", "transformer",
               "conv", "--seeds", "0", "--sentences", "8", "--name", "board_long", "--jobs", "1",
               "--out", "{out}/runs", "--results", "{out}"),
         needs="Multi30k; the board's runs (continued where they exist)",
         rows=ROWS["translators"]),
    _exp("base", "experiments.translators", ("cpu/cpu_base.json",), "chapter 11, the attention-map pages of the book",
         ("base", "--out", "runs/cpu-base", "--results", "results/cpu", "--jobs", "1",
          "--threads", "2"), seeds_flag="", needs="Multi30k",
         tiny=("base", "--max-steps", "2", "--sentences", "8", "--jobs", "1", "--out",
               "{out}/runs", "--results", "{out}"),
         rows=ROWS["translators"]),
    _exp("evening", "experiments.evening", ("cpu/evening.json",), "chapter 11",
         ("--models", "transformer", "--out", "runs/evening", "--results", "results/cpu"),
         tiny=("--models", "transformer", "gru-additive", "--seeds", "0", "--max-steps", "2",
               "--sentences", "8", "--out", "{out}/runs", "--results", "{out}"),
         only=("--models", "{key}", "--merge"),
         needs="Multi30k; a quiet machine (the runs' minutes are the result's)",
         rows=ROWS["evening"]),
    _exp("speedrun", "experiments.speedrun", ("cpu/speedrun.json",), "chapter 11",
         ("--out", "runs/speedrun", "--results", "results/cpu", "--evening", "runs/evening"),
         tiny=("--rows", "vocab4000", "steps1600", "--seeds", "0", "--max-steps", "2",
               "--sentences", "8", "--out", "{out}/runs", "--results", "{out}"),
         only=("--rows", "{key}", "--merge", "--no-bench"),
         needs="Multi30k; the evening runs (runs/evening); a quiet machine (the runs' minutes "
               "are the result's)",
         rows=ROWS["speedrun"]),
    _exp("timing_2threads", "commands.train", ("cpu/cpu_tiny_transformer_2threads.json",), "chapters 10 and 11",
         ("--preset", "cpu-tiny", "--out", "runs/timing", "--threads", "2"), seeds_flag="",
         tiny=("--preset", "smoke", "--out", "{out}/timing", "--threads", "1", "--max-steps",
               "2"),
         needs="Multi30k; its run's metrics.json is the result", collect="--out"),
    _exp("head_ablation", "experiments.head_ablation", ("cpu/head_ablation.json",),
         "chapter 9, the attention-map pages of the book",
         ("--run", "runs/cpu-base/medium", "--average", "5", "--out",
          "results/cpu/head_ablation.json", "--figure", "results/cpu/head_ablation.svg"),
         seeds_flag="", tiny=("--run", "{out}/timing", "--every", "0", "--out",
                              "{out}/head_ablation.json"),
         needs="the run folder runs/cpu-base/medium (experiment base; tiny: the tiny run of "
               "timing_2threads in the same folder)"),
    _exp("head_ablation_cpu_tiny", "experiments.head_ablation",
         tuple(f"cpu/head_ablation_cpu_tiny/seed{s}.json" for s in SEEDS), "the attention-map pages of the book",
         ("--run", "runs/ablations/base/transformer_lr0.006_seed{seed}_steps1200", "--out",
          "results/cpu/head_ablation_cpu_tiny/seed{seed}.json"), seeds_flag="",
         tiny=("--run", "{out}/timing", "--every", "0", "--out",
               "{out}/head_ablation_cpu_tiny/seed{seed}.json"),
         needs="the ablations' base runs (experiment ablations; tiny: as head_ablation)"),
    _exp("score_scales", "experiments.score_scales", ("cpu/score_scales.json",), "chapter 4",
         ("--run", "runs/cpu-base/medium", "--average", "5", "--out",
          "results/cpu/score_scales.json"), seeds_flag="",
         tiny=("--run", "{out}/timing", "--average", "1", "--sentences", "16", "--out",
               "{out}/score_scales.json"),
         needs="the run folder runs/cpu-base/medium (experiment base; tiny: as head_ablation)"),
    _exp("bench", "benchmarks",
         tuple(f"bench/{kind}/{s}.json" for kind in ("cpu", "cuda")
               for s in ("attention", "decoding", "recurrence", "training", "loop")),
         "the performance appendix, chapters 11 and 13 (cuda: run by the GPU call)",
         ("--threads", "1", "--out", "results/bench"),
         seeds_flag="", tiny=("--quick", "--device", "cpu", "--threads", "1", "--only",
                              "decoding", "--out", "{out}"),
         only=("--only", "{key}")),
    _exp("gpu_run", "experiments.gpu_run", ("gpu/gpu_run.json",), "chapter 11, the performance appendix",
         ("--out", "OUT"), seeds_flag="", tiny=("--dry-run", "--out", "{out}"),
         needs="a GPU machine: make gpu-data, then make gpu-run (tools/gpu_run.sh; its "
               "--dry-run is tested by tests/test_gpu_run.py), then --collect"),
    _exp("live", "book.live", ("cpu/live.json",), "the translator page",
         ("score", "--out", "runs/live", "--results", "results/cpu"), seeds_flag="",
         tiny=("score", "--out", "{out}/work", "--results", "{out}", "--sentences", "8"),
         needs="Multi30k; a few minutes of one core"),
    _exp("course", "book.course", ("cpu/course.json",), "the teachers' page",
         ("--threads", "1", "--out", "results/cpu/course.json"), seeds_flag="",
         tiny=("--only", "00_setup", "--out", "{out}/course.json")),
    _exp("gpu_run_eager", "experiments.gpu_run", ("gpu/gpu_run_eager.json",), "chapter 11",
         ("--plan", "eager", "--out", "OUT"), seeds_flag="", tiny=("--dry-run", "--out", "{out}"),
         needs="a GPU machine: make gpu-data, then bash tools/gpu_run.sh --plan eager, then "
               "--collect"),
    _exp("gpu_run_seeds", "experiments.gpu_run", ("gpu/gpu_run_seeds.json",), "chapter 11",
         ("--plan", "seeds", "--out", "OUT"), seeds_flag="",
         tiny=("--dry-run", "--plan", "seeds", "--out", "{out}"),
         needs="a GPU machine: make gpu-data, then bash tools/gpu_run.sh --plan seeds, then "
               "--collect"),
    _exp("recall_gpu", "experiments.gpu_run", ("gpu/recall_generation.json",),
         "nothing yet (chapter 13 will, once a GPU has measured it)",
         ("--plan", "recall", "--out", "OUT"), seeds_flag="",
         tiny=("--dry-run", "--plan", "recall", "--out", "{out}"),
         needs="a GPU machine: make gpu-data, then bash tools/gpu_run.sh --plan recall, then "
               "--collect"),
]}


# The provenance keys of a run's metrics.json (attnbook.training.loop), moved into the record.
METRICS_PROVENANCE = ("hardware", "date", "threads", "processes")


def collect_metrics(run_folder: Path, target: Path, call: Provenance) -> Path:
    """Write the metrics.json of a run folder as the result ``target`` of the call that trained
    it: the run's own record of threads, processes, hardware and date moves into the call."""
    metrics = json.loads((Path(run_folder) / "metrics.json").read_text())
    call.threads, call.processes = metrics.get("threads"), metrics.get("processes", 1)
    call.hardware = metrics.get("hardware", call.hardware)
    data = {k: v for k, v in metrics.items() if k not in METRICS_PROVENANCE}
    return store.write(target, store.result("timing_2threads", data, call))


def run(name: str, argv: list[str], tiny_out: str | None = None) -> int:
    """Run experiment ``name``'s command with ``argv``: its ``main``, found by name (as ``python
    -m`` finds it). An experiment with ``collect`` is recorded here, around the command, and its
    run folder's metrics become its result (under ``tiny_out`` for a tiny run)."""
    e = EXPERIMENTS[name]
    module = importlib.import_module(f"attnbook.{e.module}")
    if not hasattr(module, "main"):                            # a package: attnbook.benchmarks
        module = importlib.import_module(f"attnbook.{e.module}.__main__")
    if not e.collect:
        return module.main(argv)
    with record(command_line(f"attnbook.{e.module}", argv)) as call:
        status = module.main(argv)
    if status:
        return status
    folder = argv[argv.index(e.collect) + 1]
    target = Path(tiny_out) / Path(e.result[0]).name if tiny_out else \
        store.ROOT / "results" / e.result[0]
    print(f"wrote {collect_metrics(folder, target, call)}")
    return 0
