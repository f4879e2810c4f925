"""Re-express the result files written before :mod:`attnbook.experiments.store` in its one format, without
retraining: the data keys stay as they were, the provenance each writer kept in its own shape
(``command``, ``date``, ``hardware`` or ``environment``, ``threads_per_run``, ``merged``, ``calls``,
a part's ``call``, ...) moves into the file's ``calls`` (:class:`attnbook.experiments.store.Provenance`).

No old writer but the benchmarks' recorded the git commit. For the others it is recovered with git:
the parent of the commit that added the call's numbers to the file (the work tree they were made
in had at least that commit; its record says so in ``recovered``).

``python -m attnbook run --convert`` applies :func:`convert_file` to every file under results/;
a file already in the format is left as it is.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

from .store import FORMAT, Provenance, ROOT

# Provenance keys of the old writers, at the top of a file (or of an exercise, or a part's call).
PROVENANCE = ("command", "note", "date", "hardware", "environment", "threads", "threads_per_run",
              "processes", "processes_at_once", "load_average_before", "load_average_after",
              "wall_time_s", "cpu_time_s", "this_call_train_wall_time_s", "score_wall_time_s")
VERSION_KEYS = ("python", "torch", "numpy", "matplotlib", "sentencepiece", "platform", "cpu",
                "cpu_count", "cpu_threads", "cuda", "gpu", "sacrebleu")

# result file (under results/) -> experiment name; head_ablation_cpu_tiny has one file per seed
EXPERIMENT_OF = {
    "cpu/toy_seeds.json": "toy_seeds", "cpu/exercises.json": "exercises",
    "cpu/beyond.json": "beyond", "cpu/ablations.json": "ablations", "cpu/sweep.json": "sweep",
    "cpu/board.json": "board", "cpu/cpu_base.json": "base",
    "cpu/cpu_tiny_transformer_2threads.json": "timing_2threads",
    "cpu/head_ablation.json": "head_ablation", "cpu/score_scales.json": "score_scales",
    "bench/cpu/attention.json": "bench", "bench/cpu/decoding.json": "bench",
    "bench/cpu/recurrence.json": "bench", "bench/cpu/training.json": "bench",
}
for _seed in (0, 1, 2):
    EXPERIMENT_OF[f"cpu/head_ablation_cpu_tiny/seed{_seed}.json"] = "head_ablation_cpu_tiny"


def _call(old: dict, rows=None) -> Provenance:
    """The Provenance record of one old call's keys (``old``: a file, an exercise or a call)."""
    env = dict(old.get("hardware") or old.get("environment") or {})
    hardware = {k: env.pop(k) for k in list(env) if k in VERSION_KEYS}
    extra = {k: old[k] for k in ("this_call_train_wall_time_s", "score_wall_time_s")
             if k in old}
    load = env.pop("load_average", None) or ([old["load_average_before"]]
                                             if "load_average_before" in old else None)
    load_end = env.pop("load_average_end", None) or ([old["load_average_after"]]
                                                     if "load_average_after" in old else None)
    threads = old.get("threads", old.get("threads_per_run", env.pop("threads", None)))
    threads = threads if threads is not None else hardware.get("cpu_threads")
    call = Provenance(command=old["command"], git_commit=env.pop("git_commit", ""),
                      date=env.pop("date", old.get("date", "")), hardware=hardware,
                      threads=threads, processes=old.get("processes",
                                                         old.get("processes_at_once", 1)),
                      load_before=load, load_after=load_end, wall_s=old.get("wall_time_s"),
                      cpu_s=old.get("cpu_time_s"), note=old.get("note", ""), rows=rows,
                      extra={**extra, **env})
    return call


def _strip(d: dict, keep=()) -> dict:
    return {k: v for k, v in d.items() if k not in PROVENANCE or k in keep}


def split(old: dict) -> tuple[dict, list[Provenance]]:
    """(the data, the calls) of a file in an old writer's shape."""
    if "exercises" in old:                                   # exercise_runs: a call per exercise
        groups: dict = {}
        for name, ex in old["exercises"].items():
            key = (ex["command"], ex["date"], json.dumps(ex["environment"], sort_keys=True))
            groups.setdefault(key, []).append(name)
        calls = []
        for names in groups.values():
            first = old["exercises"][names[0]]
            call = _call(first, rows=names)
            call.wall_s = round(sum(old["exercises"][n]["wall_time_s"] for n in names), 1)
            call.cpu_s = round(sum(old["exercises"][n]["cpu_time_s"] for n in names), 1)
            call.extra["per_row"] = {n: {"wall_time_s": old["exercises"][n]["wall_time_s"],
                                         "cpu_time_s": old["exercises"][n]["cpu_time_s"]}
                                     for n in names}
            calls.append(call)
        data = {**old, "exercises": {n: _strip(ex, keep=("wall_time_s", "cpu_time_s"))
                                     for n, ex in old["exercises"].items()}}
        return data, calls
    if "calls" in old:                                       # ablations: its own calls list
        made = {}
        for v in old["variants"]:
            made.setdefault(v["call"], []).append(v["variant"])
        return ({k: v for k, v in old.items() if k != "calls"},
                [_call(c, rows=made.get(i, [])) for i, c in enumerate(old["calls"])])
    data = _strip(old)
    calls = [_call(old)]
    if "merged" in old:                                      # toy_seeds --merge
        data.pop("merged")
        calls += [_call(c, rows=[f"{name}/{seed}" for name in c["runs"] for seed in old["seeds"]])
                  for c in old["merged"]]                # --merge kept the file's seeds
    for part, value in old.items():                          # beyond_runs --only PART
        if isinstance(value, dict) and "call" in value:
            data[part] = {k: v for k, v in value.items() if k != "call"}
            calls.append(_call(value["call"], rows=[part]))
    return data, calls


def _git(*args) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout


def recover_commits(path: Path, calls: list[Provenance]) -> None:
    """Fill in the git commit of each call that recorded none: the parent of the first commit
    whose version of ``path`` holds the call (same command and date)."""
    rel = Path(path).resolve().relative_to(ROOT).as_posix()
    history = _git("log", "--reverse", "--format=%H", "--", rel).split()
    for call in calls:
        if call.git_commit:
            continue
        for commit in history:
            try:
                old = json.loads(_git("show", f"{commit}:{rel}"))
            except (subprocess.CalledProcessError, ValueError):
                continue
            if old.get("format") == FORMAT:
                break
            if any((c.command, c.date) == (call.command, call.date) for c in split(old)[1]):
                call.git_commit = _git("rev-parse", f"{commit}^").strip()
                call.recovered = (f"the call recorded no commit: this is the parent of "
                                  f"{commit[:10]}, the commit that added its numbers to {rel}")
                if not call.date:
                    call.date = _git("log", "-1", "--format=%cs", commit).strip()
                    call.recovered += "; it recorded no date either: the date is that commit's"
                break


def convert(old: dict, relative: str) -> dict:
    """The file ``results/<relative>``'s content ``old`` in the format (no git look-up)."""
    if old.get("format") == FORMAT:
        return old
    data, calls = split(old)
    return {"experiment": EXPERIMENT_OF[relative], "format": FORMAT,
            "calls": [asdict(c) for c in calls], **data}


def convert_file(path: Path, relative: str) -> bool:
    """Convert the file in place, its commits recovered with git; False if it was converted."""
    from .store import read, write

    old = read(path)
    if old.get("format") == FORMAT:
        return False
    data, calls = split(old)
    recover_commits(path, calls)
    write(path, {"experiment": EXPERIMENT_OF[relative], "format": FORMAT,
                 "calls": [asdict(c) for c in calls], **data})
    return True
