"""``python -m attnbook data``: download, check and inspect Multi30k.

The command line only: the work is :mod:`attnbook.data`."""
from __future__ import annotations

import os
from pathlib import Path

from ..cli import Parser, fail
from ..data import ENV_DIR, SHA256, DataError, cache_dir, download, locate, verify


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m attnbook data", description="Multi30k, Task 1: aligned "
                    "image-caption translations in German, English and French.")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("download", help="download and verify all nine Multi30k Task 1 files "
                       f"(where ${ENV_DIR} names a folder and no --to is given: verify that folder)")
    d.add_argument("--to", type=Path, default=None, help="target folder (default: the cache)")
    v = sub.add_parser("verify", help="check the sha256 sums of the files in a folder")
    v.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "download" and args.to is None and os.environ.get(ENV_DIR):
            for name in sorted(SHA256):             # the loader reads this folder: check it
                print(f"ok  {locate(*name.split('.')[:2])}")
        elif args.command == "download":
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
                                    f"attnbook data download --to {args.folder}`")
                verify(path, name)
                print(f"ok  {path}")
    except DataError as e:
        return fail(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
