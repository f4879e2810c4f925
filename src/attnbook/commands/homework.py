"""``python -m attnbook homework``: the student edition, and grading.

The command line only: the work is :mod:`attnbook.book.homework`."""
from __future__ import annotations

import sys
from pathlib import Path

from ..book.homework import format_table, grade_notebook, write_student_edition
from ..cli import Parser, fail


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m attnbook homework",
                    description="Student edition and grading of the book's homework.")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("student", help="write the student edition of notebooks")
    s.add_argument("src", type=Path, help="a notebook or a folder of notebooks")
    s.add_argument("dest", type=Path, help="output folder")
    g = sub.add_parser("grade", help="run notebooks and grade their coding exercises")
    g.add_argument("paths", type=Path, nargs="+", help="notebooks or folders of notebooks")
    g.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args(argv)

    if args.command == "student":
        for out in write_student_edition(args.src, args.dest):
            print(f"wrote {out}")
        return 0

    notebooks = []
    for p in args.paths:
        if not p.exists():
            return fail(f"{p} does not exist; give a notebook or a folder of notebooks")
        notebooks += sorted(p.glob("*.ipynb")) if p.is_dir() else [p]
    rows = []
    for path in notebooks:
        print(f"grading {path} ...", file=sys.stderr, flush=True)
        rows += [(path.name, r) for r in grade_notebook(path, timeout=args.timeout)]
    if not rows:
        print("no coding exercises found")
        return 0
    print(format_table(rows))
    failed = sum(not r.passed for _, r in rows)
    print(f"\n{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
