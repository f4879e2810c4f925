"""``python -m attnbook translators``: chapter 10's learning-rate sweep and leaderboard.

The command line only: the work is :mod:`attnbook.experiments.translators`."""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from .. import store
from ..cli import Parser, fail
from ..experiments.registry import SEEDS, refuse_other_settings, write_result
from ..experiments.sweeps import train_all
from ..experiments.translators import (base_jobs, board_jobs, merged, score_base, score_board,
                                       score_sweep, sweep_jobs)
from ..record import command_line, record
from ..training.options import add_common
from ..training.recipe import ALL_MODELS, MODELS


def parser() -> Parser:
    """The command's options."""
    p = Parser(prog="python -m attnbook translators",
               description="Chapter 10's learning-rate sweep and seeded leaderboard.")
    p.add_argument("what", choices=("sweep", "board", "base", "train-only"))
    add_common(p, "preset", "device", "data-dir")
    p.add_argument("--out", type=Path, required=True, help="folder for the runs")
    p.add_argument("--results", type=Path, help="folder for sweep.json / board.json")
    p.add_argument("--models", nargs="+", choices=ALL_MODELS, default=list(MODELS))
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p.add_argument("--max-steps", type=int, help="sweep: steps per run (default 600); board: "
                                                 "steps per run instead of the preset's; base: "
                                                 "steps of each candidate instead of its own "
                                                 "(the tests' tiny run)")
    p.add_argument("--jobs", type=int, default=2, help="runs trained at once (1 on a GPU)")
    p.add_argument("--threads", type=int, default=1, help="PyTorch threads per run")
    p.add_argument("--reuse", type=Path, help="board: the sweep's runs folder, to continue its runs")
    p.add_argument("--sentences", type=int, default=0,
                   help="score and validate on the first N sentences only (0 = all; the "
                        "tests use a few)")
    p.add_argument("--note", default="", help="recorded in the results (e.g. the machine's load)")
    p.add_argument("--peak-lrs", nargs="+", type=float, help="sweep: these peak learning rates "
                   "instead of each model's SWEEP_LRS (a sweep at another preset)")
    p.add_argument("--name", help="sweep, board: the result's name (NAME.json and its experiment; "
                   "default sweep or board; board_long for the longer budget, sweep_base for "
                   "the cpu-base sweep)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args = p.parse_args(argv)
    args.name = args.name or {"sweep": "sweep", "base": "cpu_base"}.get(args.what, "board")
    if args.peak_lrs and args.what != "sweep":
        p.error("--peak-lrs is for sweep: a board trains each model at its preset's rate")
    if any(Path(a).is_absolute() for a in (args.out, args.results or ".", args.reuse or ".")):
        p.error("give --out, --results and --reuse relative to the repository (they are recorded "
                "in the results, which must not name folders of the machine that made them)")
    experiment = args.what if args.what == "base" else args.name
    target = args.results / f"{args.name}.json" if args.results else None
    if target and args.what != "train-only":     # the file's preset, before any training
        try:
            refuse_other_settings(experiment, target, {
                "preset": "cpu-base" if args.what == "base" else args.preset})
        except store.ResultError as e:
            return fail(e)
    if args.what == "sweep":
        jobs = sweep_jobs(args.preset, args.models, args.max_steps or 600, args.out, args.peak_lrs)
    elif args.what == "base":
        jobs = base_jobs(args.out, args.max_steps)
    else:
        jobs = board_jobs(args.preset, args.models, args.seeds, args.out, args.reuse,
                          args.max_steps)
    if args.sentences:        # the training's validation loss too (the tests' tiny runs)
        jobs = [(replace(cfg, val_sentences=args.sentences), folder) for cfg, folder in jobs]
    # the call's provenance (attnbook.store); each run's own threads are the call's threads
    with record(command_line("translators", argv), threads=args.threads,
                      processes=args.jobs, note=args.note) as call:
        start = time.perf_counter()
        train_all(jobs, args.jobs, args.threads, args.data_dir, args.device)
        call.extra["this_call_train_wall_time_s"] = round(time.perf_counter() - start, 1)
        print(f"trained {len(jobs)} runs in {call.extra['this_call_train_wall_time_s']:.0f} s")
        if args.what == "train-only" or not args.results:
            return 0
        start = time.perf_counter()
        score = {"sweep": score_sweep, "base": score_base, "board": score_board}[args.what]
        result = {"preset": "cpu-base" if args.what == "base" else args.preset,   # base: its own
                  **score(args, [folder for _, folder in jobs])}
        call.extra["score_wall_time_s"] = round(time.perf_counter() - start, 1)
    call.hardware["cpu_threads"] = args.threads
    return write_result(experiment, target, result, call, derive=merged)


if __name__ == "__main__":
    raise SystemExit(main())
