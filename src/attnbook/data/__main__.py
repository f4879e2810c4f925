"""Multi30k's command line: ``python -m attnbook.data download [--to DIR]`` fetches and checks all
nine files; ``python -m attnbook.data verify DIR`` checks the sha256 sums of a folder's files.
The loader itself is the package, ``attnbook.data``; every mistake is one line
``error: <problem>; <fix>`` with exit status 2 (``attnbook.cli``).
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..cli import Parser, fail
from . import SHA256, DataError, cache_dir, download, verify


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m attnbook.data", description="Multi30k, Task 1: aligned "
                    "image-caption translations in German, English and French.")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("download", help="download and verify all nine Multi30k Task 1 files")
    d.add_argument("--to", type=Path, default=None, help="target folder (default: the cache)")
    v = sub.add_parser("verify", help="check the sha256 sums of the files in a folder")
    v.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "download":
            dest = args.to or cache_dir() / "multi30k"
            for name in sorted(SHA256):
                path = dest / name
                if path.is_file():
                    verify(path, name)
                else:
                    download(name, dest)
                print(f"ok  {path}")
        else:
            for name in sorted(SHA256):
                path = args.folder / name
                if not path.is_file():
                    raise DataError(f"{path} not found; download the files with `python -m "
                                    f"attnbook.data download --to {args.folder}`")
                verify(path, name)
                print(f"ok  {path}")
    except DataError as e:
        return fail(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
