"""``python -m attnbook toy_seeds``: Part I's reversal runs with several seeds (chapters 1-3).

The command line only: the work is :mod:`attnbook.experiments.toy_seeds`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .. import store
from ..cli import Parser, fail
from ..experiments.registry import SEEDS, refuse_other_settings, save
from ..experiments.toy_seeds import RUNS, TINY, merged, runs_of
from ..record import command_line, record


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="python -m attnbook toy_seeds",
               description="Part I's reversal experiments (chapters 1-3) with several seeds.")
    p.add_argument("--results", type=Path, required=True,
                   help="folder for toy_seeds.json, relative to the repository (results/cpu)")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), metavar="SEED",
                   help="seeds (default: 0 1 2)")
    p.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS), metavar="RUN",
                   help="which runs (default: all of " + ", ".join(RUNS) + ")")
    p.add_argument("--timing", action=argparse.BooleanOptionalAction, default=True,
                   help="also time ex-03-predict-cost's four models (default: yes)")
    p.add_argument("--tiny", action="store_true",
                   help=f"{TINY['steps']} steps a run, a few sources: seconds (the tests)")
    p.add_argument("--note", default="", help="recorded in the results (e.g. the machine's load)")
    args = p.parse_args(argv)
    if args.results.is_absolute():
        p.error("give --results relative to the repository (it is recorded in the results, "
                "which must not name folders of the machine that made them)")
    if any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds must be different non-negative integers, got {args.seeds}")
    out = args.results / "toy_seeds.json"
    try:                                     # the file's seeds and scale, before any training
        refuse_other_settings("toy_seeds", out, {"seeds": args.seeds,
                                                 "scale": "tiny" if args.tiny else "full"})
    except store.ResultError as e:
        return fail(e)
    torch.set_num_threads(1)                 # as the chapters (train_toy uses one thread anyway)
    command = command_line("toy_seeds", argv)
    with record(command, threads=torch.get_num_threads(), note=args.note) as call:
        result = runs_of(args)
    try:
        save("toy_seeds", out, result, call, derive=merged)
    except store.ResultError as e:
        return fail(e)
    except OSError as e:
        return fail(f"cannot write {args.results / 'toy_seeds.json'}: {e.strerror}; "
                    "give a folder you can write to")
    print(f"wrote {out} in {call.wall_s:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
