"""``python -m attnbook live``: the translator page's model: export and score it.

The command line only: the work is :mod:`attnbook.book.live`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ..book.live import FORMS, RESULTS, export, score_forms
from ..cli import Parser, fail
from ..data import DataError
from ..experiments.registry import save
from ..record import command_line, record
from ..training.runs import RunError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="python -m attnbook live",
               description="The translator page's model: export the stored cpu-base model to "
                           "ONNX, or score every form of it against PyTorch.")
    p.add_argument("what", choices=("export", "score"))
    p.add_argument("--out", type=Path, required=True,
                   help="export: the page's folder (_static/translator); score: a work folder")
    p.add_argument("--form", choices=FORMS, help="export: the form (default: the one "
                   "results/cpu/live.json chose)")
    p.add_argument("--results", type=Path, help="score: the folder for live.json")
    p.add_argument("--sentences", type=int, default=0, help="score: the first N test "
                   "sentences only (0 = all; the tests use a few)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    try:
        if args.what == "export":
            form = args.form or _chosen_form()
            manifest = export(args.out, form)
            print(f"wrote {args.out}: {form}, " + ", ".join(
                f"{f} {v['bytes'] / 1e6:.1f} MB" for f, v in manifest["files"].items()))
            return 0
        with record(command_line("live", argv), threads=1) as call:
            result = score_forms(args.out, args.sentences)
        if args.results:
            print(f"wrote {save('live', args.results / 'live.json', result, call)}: chose "
                  f"{result['chosen']}")
        return 0
    except (DataError, RunError, ValueError) as e:
        return fail(e)


def _chosen_form() -> str:
    path = RESULTS / "live.json"
    if not path.is_file():
        raise ValueError(f"{path} is missing: run `python -m attnbook live score` first, "
                         "or give --form")
    return json.loads(path.read_text())["chosen"]


if __name__ == "__main__":
    raise SystemExit(main())
