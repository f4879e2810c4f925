"""``python -m attnbook exercise_runs``: the measurements the exercises' solutions quote.

The command line only: the work is :mod:`attnbook.experiments.exercise_runs`."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from .. import store
from ..cli import Parser, fail
from ..data import DataError
from ..experiments.exercise_runs import EXPERIMENTS, in_order, run
from ..experiments.registry import write_result
from ..record import command_line, record
from ..tokenizer import TokenizerError
from ..training.options import add_common


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m attnbook exercise_runs",
               description="Run the experiments of the exercises whose solutions quote a "
                           "measurement, and write RESULTS/exercises.json.")
    p.add_argument("--results", type=Path, required=True,
                   help="folder of the results file exercises.json (the book's: results/cpu)")
    p.add_argument("--only", action="append", choices=sorted(EXPERIMENTS), metavar="NAME",
                   help="run only this exercise (repeatable; the file keeps the others' "
                        "entries); one of " + ", ".join(sorted(EXPERIMENTS)))
    p.add_argument("--tiny", action="store_true",
                   help="a few steps of each experiment, to check the command (the tests)")
    add_common(p, "data-dir")
    args = p.parse_args(argv)
    if args.data_dir:
        os.environ["MULTI30K_DIR"] = args.data_dir        # where load_multi30k looks first
    torch.set_num_threads(1)
    out = args.results / "exercises.json"
    try:
        old = store.read(out) if out.is_file() else None
    except store.ResultError as e:
        return fail(e)
    scale = "tiny" if args.tiny else "full"
    other = {ex.get("scale") for ex in (old or {}).get("exercises", {}).values()} - {scale}
    if other:                                        # refused before anything runs
        return fail(f"{out} holds {', '.join(sorted(map(str, other)))}-scale entries, this call "
                    f"is {scale}; give the file's scale (--tiny or not), or another --results")
    command = command_line("exercise_runs", sys.argv[1:] if argv is None else argv)
    names = args.only or list(EXPERIMENTS)
    entries = {}
    try:
        with record(command, threads=1) as call:
            for name in names:
                print(f"{name} ...", flush=True)
                entries[name] = run(name, args.tiny)
                print(f"{name}: {entries[name]['wall_time_s']:.0f} s", flush=True)
    except (DataError, TokenizerError) as e:
        return fail(e)
    data = {"about": "measured answers of the book's experimental exercises "
                     "(python -m attnbook exercise_runs); each entry names the call that made it",
            "exercises": entries}
    return write_result("exercises", out, data, call, derive=in_order,
                        said=f" ({', '.join(names)}) in {call.wall_s:.0f} s")


if __name__ == "__main__":
    raise SystemExit(main())
