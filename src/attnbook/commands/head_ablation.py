"""``python -m attnbook head_ablation``: knock out each head of a trained translator (attention-map pages).

The command line only: the work is :mod:`attnbook.experiments.head_ablation`."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from .. import store
from ..cli import Parser, UsageError, fail
from ..data import DataError
from ..experiments.head_ablation import EVERY, ablation_study, figure
from ..experiments.registry import save
from ..record import command_line, record
from ..training.options import add_common, apply_common
from ..training.runs import RunError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="python -m attnbook head_ablation", description=__doc__.split("\n")[0])
    p.add_argument("--run", type=Path, required=True, help="run folder of a Transformer")
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--figure", type=Path, help="also draw the scatter plot into this SVG file")
    p.add_argument("--every", type=int, default=EVERY,
                   help=f"BLEU on every N-th validation sentence (default {EVERY}; 0: no BLEU)")
    add_common(p, "average", "threads", "data-dir")
    p.set_defaults(threads=1)
    args = p.parse_args(argv)
    try:
        if args.every < 0:
            raise UsageError(f"--every must be 0 (no BLEU) or more, got {args.every}")
        if any(x is not None and x.is_absolute() for x in (args.run, args.out, args.figure)):
            raise UsageError("give --run, --out and --figure relative to the repository: "
                             "they are recorded in the results")
        apply_common(args)
        with record(command_line("head_ablation", argv),
                          threads=torch.get_num_threads()) as call:
            result = ablation_study(args.run, args.average, args.every, args.data_dir,
                                    device="cpu")
        name = "head_ablation" + ("_cpu_tiny" if args.out.parent.name == "head_ablation_cpu_tiny"
                                  else "")
        print(f"wrote {save(name, args.out, result, call)}")
        if args.figure:
            print(f"wrote {figure(store.read(args.out), args.figure)}")
    except (UsageError, RunError, DataError, ValueError) as e:
        return fail(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
