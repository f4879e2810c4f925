"""``python -m attnbook beyond_runs``: chapter 13's measurements.

The command line only: the work is :mod:`attnbook.experiments.beyond_runs`."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from .. import store
from ..cli import Parser, fail
from ..experiments.beyond_runs import PARTS, in_order, run_part
from ..experiments.registry import SEEDS, refuse_other_settings, write_result
from ..record import command_line, record


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m attnbook beyond_runs", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    p.add_argument("--note", default="", help="a note stored with the results")
    p.add_argument("--only", action="append", choices=PARTS, metavar="PART",
                   help="run only this part and keep the file's others (repeatable): "
                        + ", ".join(PARTS))
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), metavar="SEED",
                   help="seeds (default: 0 1 2)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps of each reversal run instead of REVERSAL's (the tests)")
    args = p.parse_args(argv)
    parts = args.only or list(PARTS)
    try:                                         # the file's seeds, before any training
        refuse_other_settings("beyond", args.out, {"seeds": list(args.seeds)})
    except store.ResultError as e:
        return fail(e)
    torch.set_num_threads(args.threads)
    command = command_line("beyond_runs", sys.argv[1:] if argv is None else argv)
    with record(command, threads=args.threads, note=args.note) as call:
        result = {"seeds": list(args.seeds), **{part: run_part(part, args) for part in parts}}
    return write_result("beyond", args.out, result, call, derive=in_order,
                        said=f" ({', '.join(parts)}) in {call.wall_s:.0f} s")


if __name__ == "__main__":
    raise SystemExit(main())
