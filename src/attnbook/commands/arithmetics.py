"""``python -m attnbook arithmetics``: the same runs with three of PyTorch's kernel sets.

The command line only: the work is :mod:`attnbook.experiments.arithmetics`."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from .. import store
from ..cli import Parser, fail
from ..experiments.arithmetics import (ARITHMETICS, PROBES, RUNS, SIZE, TINY_SIZE, compared, figure,
                                       spawn, worker)
from ..experiments.registry import save
from ..record import command_line, record
from ..reproduce import K_RANGE


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="python -m attnbook arithmetics",
               description="The same runs with three of PyTorch's kernel sets (book/reproducibility.md).")
    p.add_argument("--results", type=Path, required=True,
                   help="folder for arithmetics.json and .png, relative to the repository")
    p.add_argument("--tiny", action="store_true", help="3 steps a run, a small product: seconds")
    p.add_argument("--worker", choices=list(ARITHMETICS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.results.is_absolute():
        p.error("give --results relative to the repository (it is recorded in the results)")
    if args.worker:
        worker(args.worker, args.tiny, args.results)
        return 0
    seeds_file = store.ROOT / "results" / "cpu" / "toy_seeds.json"    # the book's, from anywhere
    committed = store.Result(store.read(seeds_file), seeds_file)
    command = command_line("arithmetics", argv)
    with tempfile.TemporaryDirectory(dir=".") as tmp, \
            record(command, threads=1, processes=2) as call:
        folder = Path(os.path.relpath(tmp))
        for batch in (("native", "avx2"), ("plain",)):     # two at a time: one core each
            workers = [spawn(name, args.tiny, folder) for name in batch]
            if any(w.wait() for w in workers):
                return fail("a worker failed (its error is above); run it alone with "
                            f"`{command} --worker NAME`")
        made = {n: json.loads((folder / f"{n}.json").read_text())
                | {"runs": store.read(folder / n / "toy_seeds.json")["runs"]} for n in ARITHMETICS}
        products = {n: torch.load(folder / f"{n}.pt", weights_only=True) for n in ARITHMETICS}
    data = {
        "scale": "tiny" if args.tiny else "full", "arithmetics_env": ARITHMETICS,
        "probes": PROBES, "gflops_of": f"a {TINY_SIZE if args.tiny else SIZE} x "
                                      f"{TINY_SIZE if args.tiny else SIZE} matrix product, "
                                      "one thread, the best of 5",
        "runs": list(RUNS), "k_range": K_RANGE,
        "arithmetics": [compared(made[n], committed, products[n], products["native"])
                        for n in ARITHMETICS]}
    try:
        written = save("arithmetics", args.results / "arithmetics.json", data, call)
        figure(store.read(written), args.results / "arithmetics.png")
    except OSError as e:
        return fail(f"cannot write into {args.results}: {e.strerror}; give a folder you can "
                    "write to")
    print(f"wrote {args.results / 'arithmetics.json'} in {call.wall_s:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
