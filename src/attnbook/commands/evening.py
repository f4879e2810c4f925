"""``python -m attnbook evening``: the cpu-base preset with several seeds (chapter 11).

The command line only: the work is :mod:`attnbook.experiments.evening`."""
from __future__ import annotations

import sys
import time

from ..cli import Parser
from ..experiments.evening import evening_jobs, merged, score
from ..experiments.registry import SEEDS, write_result
from ..experiments.sweeps import add_run_options, results_file, train_all
from ..record import command_line, record
from ..training.recipe import ALL_MODELS


def parser() -> Parser:
    p = Parser(prog="python -m attnbook evening",
               description="The cpu-base preset with several seeds (and other models at it), "
                           "one run at a time: chapter 11's evening scale.")
    p.add_argument("--models", nargs="+", choices=ALL_MODELS, default=["transformer"])
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    add_run_options(p, "evening")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args = p.parse_args(argv)
    target = results_file(p, args, "evening")
    jobs = evening_jobs(args.models, args.seeds, args.out, args.max_steps)
    with record(command_line("evening", argv),
                      threads=args.threads, note=args.note) as call:
        start = time.perf_counter()
        train_all(jobs, 1, args.threads, args.data_dir, args.device)
        call.extra["this_call_train_wall_time_s"] = round(time.perf_counter() - start, 1)
        print(f"trained {len(jobs)} runs in {call.extra['this_call_train_wall_time_s']:.0f} s")
        if not target:
            return 0
        start = time.perf_counter()
        result = score(args, jobs)
        call.extra["score_wall_time_s"] = round(time.perf_counter() - start, 1)
    call.hardware["cpu_threads"] = args.threads
    return write_result("evening", target, result, call, derive=merged)


if __name__ == "__main__":
    raise SystemExit(main())
