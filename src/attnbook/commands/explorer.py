"""``python -m attnbook explorer``: the attention explorer pages' data.

The command line only: the work is :mod:`attnbook.book.explorer`."""
from __future__ import annotations

from pathlib import Path

from ..book.explorer import COUNT, EVERY, explore, write
from ..cli import Parser, UsageError, fail
from ..data import DataError
from ..training.options import add_common, apply_common
from ..training.runs import STORED_MODELS, RunError


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m attnbook explorer", description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, nargs="?", help="run folder of a Transformer or of a GRU "
                   "with attention (checkpoint.pt, tokenizer.model)")
    p.add_argument("--stored", metavar="NAME", choices=sorted(STORED_MODELS),
                   help="a model stored in the package instead of a run folder: "
                        + ", ".join(sorted(STORED_MODELS)))
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--every", type=int, default=EVERY, help=f"step between test sentences "
                                                            f"(default {EVERY})")
    p.add_argument("--count", type=int, default=COUNT, help=f"sentences (default {COUNT})")
    p.add_argument("--bleu", action="store_true", help="measure the test BLEU of the weights "
                   "shown (all test sentences: minutes) instead of reading the run's metrics.json")
    add_common(p, "average", "threads", "data-dir")
    p.set_defaults(threads=1)  # the same bytes on every run: one thread, on the CPU
    args = p.parse_args(argv)
    try:
        if (args.run is None) == (args.stored is None):
            raise UsageError("give a run folder or --stored NAME (one of them)")
        if args.every < 1 or args.count < 1:
            raise UsageError("--every and --count must be at least 1")
        if args.out.suffix != ".json":
            raise UsageError(f"--out {args.out}: give a file name ending in .json (the .js and "
                             ".svg files are written beside it)")
        apply_common(args)
        data = explore(args.run, args.every, args.count, args.data_dir, average=args.average,
                       measure_bleu=args.bleu, stored=args.stored)
        paths = write(data, args.out)
    except (UsageError, RunError, DataError, ValueError) as e:
        return fail(e)
    for path in paths:
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
