"""``python -m attnbook course``: time every notebook and its exercises (teachers' page).

The command line only: the work is :mod:`attnbook.book.course`."""
from __future__ import annotations

import sys
from pathlib import Path

from .. import store
from ..book.course import NOTEBOOKS, WORDS_PER_MINUTE, in_order, measure
from ..cli import Parser, fail
from ..experiments.registry import save
from ..record import command_line, record


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="python -m attnbook course",
               description="Time every notebook and its exercises (the teachers' page).")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    p.add_argument("--out", type=Path, default=store.ROOT / "results" / "cpu" / "course.json")
    p.add_argument("--only", nargs="+", metavar="NOTEBOOK",
                   help="these notebooks (stems), merged into the file by notebook")
    p.add_argument("--notebooks", type=Path, default=NOTEBOOKS,
                   help="the folder of the notebooks (default: the book's)")
    args = p.parse_args(argv)
    paths = sorted(args.notebooks.glob("*.ipynb"))
    if args.only:
        unknown = set(args.only) - {q.stem for q in paths}
        if unknown:
            return fail(f"no notebook {', '.join(sorted(unknown))}; give stems such as 01_bottleneck")
        paths = [q for q in paths if q.stem in args.only]
    with record(command_line("course", argv), threads=args.threads,
                      note="each notebook alone, in a fresh kernel") as call:
        rows = []
        for q in paths:
            rows.append(measure(q, args.threads))
            print(f"{q.stem}: {rows[-1]['run_seconds']} s", flush=True)
    data = {"words_per_minute": WORDS_PER_MINUTE, "notebooks": rows}
    print(f"wrote {save('course', args.out, data, call, derive=in_order)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
