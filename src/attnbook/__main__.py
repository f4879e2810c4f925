"""``python -m attnbook <command> ...``: the book's commands under one name.

    python -m attnbook run --list                  # every experiment, its result file and cost
    python -m attnbook run NAME                    # as it made its committed result file
    python -m attnbook run NAME --seeds 0 1        # other seeds (merged by key into the file)
    python -m attnbook run NAME --only KEY         # one part (a run, a variant, an exercise)
    python -m attnbook run NAME --tiny --out DIR   # a tiny run into DIR (relative; default
                                                   # runs/tiny/NAME): seconds (the tests)
    python -m attnbook train ...                   # = python -m attnbook train ... (any command)

``run`` looks NAME up in :mod:`attnbook.experiments.registry` and calls the ``main`` of its command
(:mod:`attnbook.commands`); the command writes its result through
:func:`attnbook.experiments.registry.save`. Mistakes are one line ``error: ...`` and exit status 2.
"""
from __future__ import annotations

import importlib
import shlex
import sys

from .cli import Parser, fail
from .commands import COMMANDS, table
from .experiments.registry import EXPERIMENTS
from . import record
from .store import ResultError, find


def listing() -> str:
    """Each experiment as its value says: files, full run, variants, rows and key, cost."""
    lines, pad = [], " " * 24
    for e in EXPERIMENTS.values():
        seeds = f"seeds {' '.join(map(str, e.seeds))}" \
            if e.seeds_flag or "{seed}" in " ".join(e.args) else "no seeds"
        only = f"; --only KEY runs one part ({' '.join(e.only)})" if e.only else ""
        rows = e.rows.describe() if e.rows else "the whole file, made by one call"
        lines += [f"{e.name:<23} {', '.join(f'results/{r}' for r in e.result)}",
                  f"{pad}full run: python -m attnbook {e.command} {' '.join(e.args)}",
                  f"{pad}variants: {seeds}{only}",
                  f"{pad}rows: {rows}",
                  f"{pad}shown in {e.shown_in}; cost {e.cost()}"
                  + (f"; needs {e.needs}" if e.needs else "")]
    return "\n".join(lines)


def run_command(argv: list[str]) -> int:
    p = Parser(prog="python -m attnbook run",
               description="Run a named experiment of the book (see --list).")
    p.add_argument("name", nargs="?", choices=sorted(EXPERIMENTS), metavar="NAME",
                   help="the experiment: " + ", ".join(EXPERIMENTS))
    p.add_argument("--list", action="store_true", help="list the experiments, files and costs")
    p.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                   help="other seeds than the experiment's (default 0 1 2); on an existing "
                        "result only with --only or --tiny")
    p.add_argument("--only", metavar="KEY", action="append",
                   help="run one part (merged by key into the file); one --only per call")
    p.add_argument("--tiny", action="store_true", help="a tiny run (seconds; the tests)")
    p.add_argument("--out", help="with --tiny: the folder to write into, relative to the "
                                 "repository (default runs/tiny/NAME)")
    args = p.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    if args.name is None:
        p.error("give an experiment's NAME, or --list")
    e = EXPERIMENTS[args.name]
    if args.only and len(args.only) > 1:
        return fail(f"one --only KEY per call (got {', '.join(args.only)}): run the command "
                    "once for each part")
    args.only = args.only[0] if args.only else None
    if args.tiny and not e.tiny:
        return fail(f"{e.name} has no tiny run (it needs {e.needs or 'a long run'}); run it "
                    "without --tiny")
    out = (args.out or f"runs/tiny/{e.name}") if args.tiny else None   # relative, as recorded
    try:
        cmd = e.argv(out, args.seeds, args.only)
    except ResultError as err:
        return fail(err)
    made = [f"results/{r}" for r in e.result if find(r)]
    if args.seeds and not (args.tiny or args.only) and made:
        return fail(f"--seeds without --only would merge other seeds into every part of "
                    f"{', '.join(made)}, whose summaries are over each part's seeds; give --only "
                    "KEY to redo or add a part with its seeds, or move the file away first")
    seeds = args.seeds or e.seeds
    if "{seed}" in " ".join(cmd):                  # one call a seed (head_ablation_cpu_tiny)
        runs = [[a.replace("{seed}", str(s)) for a in cmd] for s in seeds]
    else:
        runs = [cmd]
    # the records name the command as typed (record), and the command it ran in their extra
    with record.typed_as(shlex.join(["python", "-m", "attnbook", "run", *argv])):
        for one in runs:
            print(f"python -m attnbook {e.command} {' '.join(one)}", flush=True)
            status = command(e.command).main(one)
            if status:
                return status
    if out:
        print(f"tiny run written under {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.split("``run`` looks NAME")[0].rstrip() + "\n\ncommands:\n" + table())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "run":
        return run_command(rest)
    if name not in COMMANDS:
        return fail(f"unknown command {name!r}; give run or one of {', '.join(COMMANDS)}; "
                    "see `python -m attnbook --help`")
    return command(name).main(rest)


def command(name: str):
    """The module of command ``name`` (``attnbook.commands.NAME``), imported when it runs."""
    return importlib.import_module(COMMANDS[name][0])


if __name__ == "__main__":
    raise SystemExit(main())
