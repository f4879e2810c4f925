"""One registry of named experiments, and the one way their results are written.

Each committed result file under ``results/`` is made by exactly one :class:`Experiment`, a value
that says everything about it: the command that runs it (``attnbook.commands``' table), the
arguments of the full run that made the committed file and of a tiny run (seconds; the tests),
its variants (seeds, and the parts ``--only KEY`` runs), the rows its file holds and the key that
identifies a row (:class:`Rows`), what it needs, the chapters that show it, and its cost, read
from the committed file's provenance. ``python -m attnbook run NAME`` runs it;
``python -m attnbook run --list`` prints these values.

Every command writes its result through :func:`save`: one call's data with its provenance,
merged by the experiment's key into the file that is there (a row with the same key replaced,
the others kept, other settings refused in one line), the derived fields recomputed, written
atomically. Running a call twice leaves the file's data as the first left it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import store
from ..cli import fail
from ..record import Provenance
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
    "course": Rows("notebooks", ("notebook",), ("words_per_minute",)),
}


@dataclass(frozen=True)
class Experiment:
    name: str                   # also the "experiment" its result files carry
    command: str                # the command that runs it: python -m attnbook COMMAND ...
    result: tuple               # the file(s) it owns under results/
    shown_in: str
    args: tuple                 # the full run's arguments (as the committed file was made)
    tiny: tuple = ()            # a tiny run's arguments; "{out}" is the folder it writes into
    seeds: tuple = SEEDS
    seeds_flag: str = "--seeds"   # "" if it takes no seeds
    only: tuple = ()            # arguments of --only KEY ("{key}" replaced)
    needs: str = ""             # what must exist before it runs
    rows: Rows | None = None    # its rows and their key; None: a call makes the whole file

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
    _exp("toy_seeds", "toy_seeds", ("cpu/toy_seeds.json",), "chapters 1-3",
         ("--results", "results/cpu"), tiny=("--results", "{out}", "--tiny", "--no-timing"),
         only=("--runs", "{key}", "--no-timing"),
         rows=ROWS["toy_seeds"]),
    _exp("arithmetics", "arithmetics", ("cpu/arithmetics.json",),
         "the page 'Numbers on your machine'", ("--results", "results/cpu"), seeds_flag="",
         tiny=("--results", "{out}", "--tiny")),
    _exp("exercises", "exercise_runs", ("cpu/exercises.json",), "chapters 5-9 and 12",
         ("--results", "results/cpu"), seeds_flag="",
         tiny=("--results", "{out}", "--tiny", "--only", "ex-06-too-good"),
         only=("--only", "{key}"),
         rows=ROWS["exercises"]),
    _exp("beyond", "beyond_runs", ("cpu/beyond.json",), "chapter 13",
         ("--out", "results/cpu/beyond.json"),
         tiny=("--out", "{out}/beyond.json", "--steps", "2", "--only", "reversal"),
         only=("--only", "{key}"),
         rows=ROWS["beyond"]),
    _exp("recall", "recall_runs", ("cpu/recall.json",), "chapter 13",
         ("--out", "results/cpu/recall.json"),
         tiny=("--out", "{out}/recall.json", "--steps", "2", "--jobs", "1", "--lengths", "8",
               "16"),
         only=("--only", "{key}"), needs="a quiet machine for --only generation (its times are "
                                         "the result)",
         rows=ROWS["recall"]),
    _exp("ablations", "ablations", ("cpu/ablations.json",),
         "chapters 5, 7 and 9, the ablations appendix",
         ("--out", "runs/ablations", "--results", "results/cpu", "--jobs", "2", "--threads", "1"),
         tiny=("--out", "{out}/runs", "--results", "{out}", "--variants", "base", "--steps", "2",
               "--sentences", "8", "--jobs", "1"),
         only=("--variants", "{key}"), needs="Multi30k",
         rows=ROWS["ablations"]),
    _exp("sweep", "translators", ("cpu/sweep.json",), "chapter 10",
         ("sweep", "--preset", "cpu-tiny", "--out", "runs/sweep", "--results", "results/cpu"),
         seeds_flag="", tiny=("sweep", "--preset", "smoke", "--models", "transformer",
                              "--max-steps", "2", "--jobs", "1",
                              "--sentences", "8", "--out", "{out}/runs", "--results", "{out}"),
         only=("--models", "{key}"), needs="Multi30k", rows=ROWS["translators"]),
    # the tiny runs train in one process (--jobs 1), but this one: the tests' run of the pool
    _exp("sweep_base", "translators", ("cpu/sweep_base.json",), "chapter 11",
         ("sweep", "--preset", "cpu-base", "--models", "gru-additive", "--peak-lrs", "2e-3",
          "4e-3", "8e-3", "1.6e-2", "--out", "runs/sweep-base", "--jobs", "2", "--results", "results/cpu",
          "--name", "sweep_base"),
         seeds_flag="", tiny=("sweep", "--preset", "smoke", "--models", "gru-additive",
                              "--peak-lrs", "2e-3", "4e-3", "--max-steps", "2", "--sentences",
                              "8", "--out", "{out}/runs", "--results", "{out}", "--name",
                              "sweep_base"),
         needs="Multi30k; about half an hour of 2 cores",
         rows=ROWS["translators"]),
    _exp("board", "translators", ("cpu/board.json",), "chapters 8-12",
         ("board", "--preset", "cpu-tiny", "--out", "runs/board", "--reuse", "runs/sweep",
          "--results", "results/cpu"),
         tiny=("board", "--preset", "smoke", "--models", "transformer", "--seeds", "0",
               "--sentences", "8", "--jobs", "1",
               "--out", "{out}/runs", "--results", "{out}"),
         only=("--models", "{key}"), needs="Multi30k; the sweep's runs",
         rows=ROWS["translators"]),
    _exp("board_long", "translators", ("cpu/board_long.json",), "chapter 10",
         ("board", "--preset", "cpu-tiny", "--max-steps", "2400", "--models", "transformer",
          "gru-additive", "conv", "gru-additive-wide", "--out", "runs/board", "--reuse", "runs/board", "--name",
          "board_long", "--results", "results/cpu"),
         tiny=("board", "--preset", "smoke", "--max-steps", "24", "--models", "transformer",
               "conv", "--seeds", "0", "--sentences", "8", "--name", "board_long", "--jobs", "1",
               "--out", "{out}/runs", "--results", "{out}"),
         needs="Multi30k; the board's runs (continued where they exist)",
         rows=ROWS["translators"]),
    _exp("base", "translators", ("cpu/cpu_base.json",), "chapter 11, the attention-map pages of the book",
         ("base", "--out", "runs/cpu-base", "--results", "results/cpu", "--jobs", "1",
          "--threads", "2"), seeds_flag="", needs="Multi30k",
         tiny=("base", "--max-steps", "2", "--sentences", "8", "--jobs", "1", "--out",
               "{out}/runs", "--results", "{out}")),
    _exp("evening", "evening", ("cpu/evening.json",), "chapter 11",
         ("--models", "transformer", "--out", "runs/evening", "--results", "results/cpu"),
         tiny=("--models", "transformer", "gru-additive", "--seeds", "0", "--max-steps", "2",
               "--sentences", "8", "--out", "{out}/runs", "--results", "{out}"),
         only=("--models", "{key}"),
         needs="Multi30k; a quiet machine (the runs' minutes are the result's)",
         rows=ROWS["evening"]),
    _exp("speedrun", "speedrun", ("cpu/speedrun.json",), "chapter 11",
         ("--out", "runs/speedrun", "--results", "results/cpu", "--evening", "runs/evening"),
         tiny=("--rows", "vocab4000", "steps1600", "--seeds", "0", "--max-steps", "2",
               "--sentences", "8", "--out", "{out}/runs", "--results", "{out}"),
         only=("--rows", "{key}", "--no-bench"),
         needs="Multi30k; the evening runs (runs/evening); a quiet machine (the runs' minutes "
               "are the result's)",
         rows=ROWS["speedrun"]),
    _exp("timing_2threads", "train", ("cpu/cpu_tiny_transformer_2threads.json",), "chapters 10 and 11",
         ("--preset", "cpu-tiny", "--out", "runs/timing", "--threads", "2", "--result",
          "results/cpu/cpu_tiny_transformer_2threads.json", "--name", "timing_2threads"),
         seeds_flag="",
         tiny=("--preset", "smoke", "--out", "{out}/timing", "--threads", "1", "--max-steps",
               "2", "--result", "{out}/cpu_tiny_transformer_2threads.json", "--name",
               "timing_2threads"),
         needs="Multi30k"),
    _exp("head_ablation", "head_ablation", ("cpu/head_ablation.json",),
         "chapter 9, the attention-map pages of the book",
         ("--run", "runs/cpu-base/medium", "--average", "5", "--out",
          "results/cpu/head_ablation.json", "--figure", "results/cpu/head_ablation.svg"),
         seeds_flag="", tiny=("--run", "{out}/timing", "--every", "0", "--out",
                              "{out}/head_ablation.json"),
         needs="the run folder runs/cpu-base/medium (experiment base; tiny: the tiny run of "
               "timing_2threads in the same folder)"),
    _exp("head_ablation_cpu_tiny", "head_ablation",
         tuple(f"cpu/head_ablation_cpu_tiny/seed{s}.json" for s in SEEDS), "the attention-map pages of the book",
         ("--run", "runs/ablations/base/transformer_lr0.006_seed{seed}_steps1200", "--out",
          "results/cpu/head_ablation_cpu_tiny/seed{seed}.json"), seeds_flag="",
         tiny=("--run", "{out}/timing", "--every", "0", "--out",
               "{out}/head_ablation_cpu_tiny/seed{seed}.json"),
         needs="the ablations' base runs (experiment ablations; tiny: as head_ablation)"),
    _exp("score_scales", "score_scales", ("cpu/score_scales.json",), "chapter 4",
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
    _exp("gpu_run", "gpu_run", ("gpu/gpu_run.json",), "chapter 11, the performance appendix",
         ("--out", "OUT"), seeds_flag="", tiny=("--dry-run", "--out", "{out}"),
         needs="a GPU machine: make gpu-data, then make gpu-run (tools/gpu_run.sh; its "
               "--dry-run is tested by tests/test_gpu_run.py), then --collect"),
    _exp("live", "live", ("cpu/live.json",), "the translator page",
         ("score", "--out", "runs/live", "--results", "results/cpu"), seeds_flag="",
         tiny=("score", "--out", "{out}/work", "--results", "{out}", "--sentences", "8"),
         needs="Multi30k; a few minutes of one core"),
    _exp("course", "course", ("cpu/course.json",), "the teachers' page",
         ("--threads", "1", "--out", "results/cpu/course.json"), seeds_flag="",
         tiny=("--only", "00_setup", "--out", "{out}/course.json"), only=("--only", "{key}"),
         rows=ROWS["course"]),
    _exp("gpu_run_eager", "gpu_run", ("gpu/gpu_run_eager.json",), "chapter 11",
         ("--plan", "eager", "--out", "OUT"), seeds_flag="", tiny=("--dry-run", "--out", "{out}"),
         needs="a GPU machine: make gpu-data, then bash tools/gpu_run.sh --plan eager, then "
               "--collect"),
    _exp("gpu_run_seeds", "gpu_run", ("gpu/gpu_run_seeds.json",), "chapter 11",
         ("--plan", "seeds", "--out", "OUT"), seeds_flag="",
         tiny=("--dry-run", "--plan", "seeds", "--out", "{out}"),
         needs="a GPU machine: make gpu-data, then bash tools/gpu_run.sh --plan seeds, then "
               "--collect"),
    _exp("gpu_run_select", "gpu_run", ("gpu/gpu_run_select.json",),
         "nothing yet (chapter 11 will, once a GPU has measured it)",
         ("--plan", "select", "--out", "OUT"), seeds_flag="",
         needs="a GPU machine: make gpu-data, then bash tools/gpu_run.sh --plan select, then "
               "--collect"),
    _exp("gpu_run_families", "gpu_run",
         tuple(f"gpu/gpu_run_families{s}.json" for s in SEEDS),
         "nothing yet (chapter 11 will, once a GPU has measured it)",
         ("--plan", "families{seed}", "--out", "OUT"), seeds_flag="",
         needs="a GPU machine, one call a seed: make gpu-data, then bash tools/gpu_run.sh "
               "--plan familiesK, then --collect"),
    _exp("recall_gpu", "gpu_run", ("gpu/recall_generation.json", "gpu/gpu_run_recall.json"),
         "nothing yet (chapter 13 will, once a GPU has measured it)",
         ("--plan", "recall", "--out", "OUT"), seeds_flag="",
         tiny=("--dry-run", "--plan", "recall", "--out", "{out}"),
         needs="a GPU machine: make gpu-data, then bash tools/gpu_run.sh --plan recall, then "
               "--collect"),
]}


def save(name: str, target: Path, data: dict, call: Provenance, derive=None) -> Path:
    """Write one call of experiment ``name`` into its result file ``target``: ``data`` with the
    call's provenance (:func:`attnbook.store.result`), merged by the experiment's :class:`Rows`
    into the file already there (an experiment without rows: the call makes the whole file),
    then ``derive(result, old)`` (the fields computed from all the rows, such as a summary,
    and those merged in the experiment's own way; ``old`` is the file before, or None), written
    atomically. ResultError (one line, nothing written) if the file's settings differ."""
    rows, target = experiment(name).rows, Path(target)
    new, old = store.result(name, data, call), None
    if rows and target.is_file():
        old = read(target)
        new = rows.merge(old, new)
    if derive is not None:
        new = derive(new, old)
    return store.write(target, new)


def write_result(name: str, target: Path, data: dict, call: Provenance, derive=None,
                 said: str = "") -> int:
    """An experiment command's last step: :func:`save`, then ``wrote TARGET`` and ``said`` on
    standard output, exit status 0; or the ResultError as one line (:func:`attnbook.cli.fail`),
    exit status 2."""
    try:
        path = save(name, target, data, call, derive)
    except store.ResultError as e:
        return fail(e)
    print(f"wrote {path}{said}")
    return 0


def refuse_other_settings(name: str, target: Path, settings: dict) -> None:
    """Before a call measures anything: ResultError (one line) if the file ``target`` is there
    and holds other ``settings`` than this call's, among those its rows must share."""
    rows, target = experiment(name).rows, Path(target)
    if rows and target.is_file():
        store.check_same(read(target), settings, [k for k in rows.same if k in settings])


def experiment(name: str) -> Experiment:
    """The experiment ``name``; ResultError if the registry has none."""
    if name not in EXPERIMENTS:
        raise ResultError(f"no experiment {name!r} in the registry; add it to "
                          "attnbook.experiments.registry.EXPERIMENTS")
    return EXPERIMENTS[name]
