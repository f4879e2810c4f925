"""``python -m attnbook diagrams``: draw the book's diagrams as SVG files.

The command line only: the work is :mod:`attnbook.book.diagrams`."""
from __future__ import annotations

from ..book.diagrams import write_all
from ..cli import Parser


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m attnbook diagrams",
                    description="Write the book's diagrams as SVG files.")
    parser.add_argument("--out", default="book/figures",
                        help="folder to write NAME.svg into (default: book/figures)")
    for path in write_all(parser.parse_args(argv).out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
