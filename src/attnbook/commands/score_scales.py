"""``python -m attnbook score_scales``: how large the models' attention scores are (chapter 4).

The command line only: the work is :mod:`attnbook.experiments.score_scales`."""
from __future__ import annotations

import sys
from pathlib import Path

from ..cli import Parser, fail
from ..experiments.registry import save
from ..experiments.scales import measure_run
from ..record import command_line, record
from ..training.runs import RunError


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m attnbook score_scales",
               description="How large are the attention scores of the book's models? (chapter 4)")
    p.add_argument("--run", type=Path, required=True, help="a run folder written by attnbook.commands.train")
    p.add_argument("--average", type=int, default=5, help="average the run's last K snapshots")
    p.add_argument("--sentences", type=int, default=256, help="validation pairs to measure on")
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    try:
        with record(command_line("score_scales", argv)) as call:
            result = measure_run(args.run, args.average, args.sentences)
    except RunError as e:
        return fail(e)
    result = {"average": args.average,
              "stats": {"var_q": "Var of the entries of the queries, at real query positions",
                        "var_k": "Var of the entries of the keys, at real key positions",
                        "var_dot": "Var(q . k) over the (query, key) pairs that may attend",
                        "var_scaled": "Var(q . k / sqrt(d_k)) over the same pairs",
                        "row_var_scaled": "variance of q . k / sqrt(d_k) within one query's row, "
                                          "averaged over real queries and heads"},
              **result}
    print(f"wrote {save('score_scales', args.out, result, call)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
