"""``python -m attnbook recall_runs``: chapter 13's recall and generation costs.

The command line only: the work is :mod:`attnbook.experiments.recall_runs`."""
from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch

from .. import store
from ..cli import Parser, fail
from ..experiments.recall_runs import (GENERATION, KEY, PARTS, SETTINGS, TASKS, _run, jobs, merged,
                                       run_one)
from ..experiments.registry import SEEDS, refuse_other_settings, write_result
from ..recall import generation_cost
from ..record import command_line, record


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m attnbook recall_runs",
               description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write (or merge into)")
    p.add_argument("--only", action="append", choices=PARTS, metavar="PART",
                   help="run only this part (repeatable): " + ", ".join(PARTS))
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), metavar="SEED",
                   help="seeds (default: 0 1 2)")
    p.add_argument("--jobs", type=int, default=2, help="processes at once, one thread each")
    p.add_argument("--steps", type=int, default=None, help="training steps instead of "
                   "SETTINGS' (the tests' tiny run; such a file is not the chapter's)")
    p.add_argument("--lengths", type=int, nargs="+", default=None,
                   help="generation: the lengths t instead of GENERATION's (the tests)")
    p.add_argument("--device", default="cpu", help="generation: the device (cpu, or cuda in "
                   "the GPU call's plan 'recall'); the training parts run on the CPU")
    p.add_argument("--note", default="", help="a note stored with the results")
    args = p.parse_args(argv)
    parts = list(dict.fromkeys(args.only or PARTS))
    settings = SETTINGS | ({"steps": args.steps} if args.steps else {})
    generation = GENERATION | ({"lengths": args.lengths} if args.lengths else {}) \
        | ({"device": args.device} if args.device != "cpu" else {})     # named when not the CPU
    name = "recall" if args.device == "cpu" else "recall_gpu"
    try:                                        # the file's settings, before any training
        refuse_other_settings(name, args.out, {"settings": settings,
                                               "generation_settings": generation})
    except store.ResultError as e:
        return fail(e)
    command = command_line("recall_runs",
                           sys.argv[1:] if argv is None else argv)
    runs, gen = [], []
    with record(command, threads=1, processes=args.jobs, note=args.note) as call:
        todo = [j for part in parts if part != "generation" for j in jobs(part, args.seeds)]
        if todo and args.jobs > 1:
            with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
                runs = list(pool.map(_run, [(j, args.steps) for j in todo]))
        else:
            runs = [run_one(j, args.steps) for j in todo]
        for r in runs:
            print(f"{r['part']:5s} {r['mixer']:9s} T={r['T']:3d} pairs={r['n_pairs']} "
                  f"state={r['state_numbers']:6d}: accuracy {r['accuracy']:.3f} "
                  f"({r['train_seconds']:.0f} s)")
        if "generation" in parts:
            torch.set_num_threads(1)
            kw = {k: generation[k] for k in ("d_model", "h", "d_state", "steps")}
            gen = [row | {"s_per_token": round(row["s_per_token"], 7)}
                   for kind in ("attention", "selective")
                   for row in generation_cost(kind, generation["lengths"], **kw,
                                              device=args.device)]
    data = {"settings": settings, "tasks": TASKS, "generation_settings": generation,
            "runs": sorted(runs, key=lambda r: [str(r[k]) for k in KEY]), "generation": gen}
    return write_result(name, args.out, data, call,
                        derive=lambda out, old: merged(out, old, parts),
                        said=f" ({', '.join(parts)}) in {call.wall_s:.0f} s")


if __name__ == "__main__":
    raise SystemExit(main())
