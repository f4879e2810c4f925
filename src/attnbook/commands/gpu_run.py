"""``python -m attnbook gpu_run``: the GPU call: one prepared plan of at most nine minutes.

The command line only: the work is :mod:`attnbook.experiments.gpu_run`."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from ..cli import Parser, fail
from ..data import DataError
from ..experiments.gpu_plans import EXTRA_PARTS, PARTS, PLANS
from ..experiments.gpu_run import CHILDREN, DATA_COPY, ROOT, collect, prepare_data, run_call
from ..training.recipe import ConfigError
from ..training.runs import RunError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in CHILDREN:                 # a part's child process (run_call starts it)
        name, plan, work, *rest = argv
        return CHILDREN[name](PLANS[plan], Path(work), *rest)
    p = Parser(prog="python -m attnbook gpu_run",
               description="The GPU call: tune gpu-base, race the families on the clock, run "
                           "the benchmarks; one command of at most nine minutes.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, help="folder for the call's files (on the lent "
                                               "machine: $OUT)")
    what.add_argument("--prepare-data", action="store_true",
                      help="copy Multi30k into .gpu_data/ (ignored by git) for the GPU machine")
    what.add_argument("--collect", type=Path, metavar="OUT",
                      help="copy a call's files into results/ and draw the benchmark figures")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU: seconds")
    p.add_argument("--plan", choices=[n for n in PLANS if not n.startswith("dry")],
                   default="full",
                   help="full (default): every part, nine minutes; eager: the training race "
                        "again without torch.compile, five candidates, about four minutes; "
                        "seeds: three seeds of each family, every run scored, the paired "
                        "bootstrap, about six minutes; select: gpu-base against dropout 0.3, "
                        "each alone for four minutes; families0, families1, families2: the four "
                        "families alone for 80 s each, one seed a call, scored both ways with the "
                        "bootstrap; recall: chapter 13's cost of generating, attention's "
                        "cache against the selective state, about two minutes (with "
                        "--dry-run: each one's tiny version)")
    p.add_argument("--only", action="append", choices=PARTS + EXTRA_PARTS,
                   help="run only this part "
                   "(repeatable; the parts after check read what earlier calls left in --work)")
    p.add_argument("--work", type=Path, help="folder for runs and caches (default: a new "
                                             "temporary folder)")
    p.add_argument("--data-dir", type=Path, help="Multi30k (default: .gpu_data/multi30k if it "
                                                 "is there, else $MULTI30K_DIR or the cache)")
    p.add_argument("--results", type=Path, default=ROOT / "results",
                   help="with --collect: the results folder (default: the repository's)")
    args = p.parse_args(argv)
    try:
        return _main(args)
    except (DataError, RunError, ConfigError, ValueError, FileNotFoundError) as e:
        return fail(e)


def _main(args) -> int:
    if args.prepare_data:
        files = prepare_data()
        print(f"copied {len(files)} files into {DATA_COPY / 'multi30k'}; name .gpu_data in the "
              "device call's carry")
        return 0
    if args.collect:
        for f in collect(args.collect, args.results, allow_dry=args.results != ROOT / "results"):
            print(f"wrote {f}")
        return 0
    plan = PLANS["dry" if args.plan in ("full", "eager") else f"dry-{args.plan}"] \
        if args.dry_run else PLANS[args.plan]
    data_dir = args.data_dir or (DATA_COPY / "multi30k" if (DATA_COPY / "multi30k").is_dir()
                                 else None)
    work = args.work or Path(tempfile.mkdtemp(prefix="attnbook-gpu-run-"))
    summary = run_call(plan, args.out.resolve(), work.resolve(), data_dir, args.only)
    print(json.dumps({"parts": {k: v["status"] for k, v in summary["parts"].items()},
                      "best": summary["best"], "wall_s": summary["calls"][0]["wall_s"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
