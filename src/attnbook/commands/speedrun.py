"""``python -m attnbook speedrun``: cpu-base in under ten minutes (chapter 11).

The command line only: the work is :mod:`attnbook.experiments.speedrun`."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..cli import Parser
from ..data import load_multi30k
from ..experiments.registry import SEEDS, write_result
from ..experiments.scoring import score_base_run
from ..experiments.speedrun import (LADDER, LONGER, MINUTES, REJECTED, RESUMES, against_evening,
                                    bench, merged, resume_from, row_config)
from ..experiments.sweeps import add_run_options, results_file, score_all, train_all
from ..record import command_line, record
from ..utils import get_device


def parser() -> Parser:
    p = Parser(prog="python -m attnbook speedrun",
               description="The speedrun: cpu-base made to train in under ten minutes on 2 "
                           "cores, one measured change at a time (chapter 11).")
    rows = [r[0] for r in LADDER + LONGER]
    p.add_argument("--rows", nargs="+", choices=rows, default=rows)
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    add_run_options(p, "speedrun")
    p.add_argument("--evening", type=Path, help="the evening runs' folder (runs/evening): compare "
                   "every row with its transformer_seed<k> runs by sacreBLEU's paired bootstrap")
    p.add_argument("--no-bench", action="store_true", help="skip the speed measurement "
                   "(a call that adds seeds keeps the file's)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args = p.parse_args(argv)
    target = results_file(p, args, "speedrun")
    evening = [args.evening / f"transformer_seed{seed}" for seed in args.seeds] if args.evening \
        else []
    if args.evening and args.evening.is_absolute():
        p.error("give --evening relative to the repository (it is recorded in the results)")
    if any(not (f / "metrics.json").is_file() for f in evening):
        p.error(f"--evening {args.evening} lacks a finished run of a seed in {args.seeds}: train "
                "them with `python -m attnbook run evening`, or leave --evening out")
    jobs = [(name, cfg, args.out / f"{name}_seed{cfg.seed}")
            for name in sorted(args.rows, key=p.get_default("rows").index)
            for cfg in (row_config(name, seed, args.max_steps) for seed in args.seeds)]
    with record(command_line("speedrun", argv),
                      threads=args.threads, note=args.note) as call:
        speeds = None
        if not args.no_bench:
            names = ([n for n in args.rows if n not in RESUMES] if args.max_steps
                     else [r[0] for r in LADDER + REJECTED])
            speeds = bench(names, args.out, 2 if args.max_steps else 30, args.threads,
                           args.data_dir, 1 if args.max_steps else 3)   # tiny: 1 + 2 steps
        start = time.perf_counter()
        for name, cfg, folder in jobs:      # in the rows' order: a LONGER row after its parent
            if name in RESUMES:
                resume_from(args.out / f"{RESUMES[name]}_seed{cfg.seed}", folder)
            train_all([(cfg, folder)], 1, args.threads, args.data_dir, args.device)
        call.extra["this_call_train_wall_time_s"] = round(time.perf_counter() - start, 1)
        if not target:
            return 0
        runs = score_all(score_base_run, [folder for *_, folder in jobs], 1, args.threads,
                         args.data_dir, args.sentences, str(get_device(args.device)))
        for (name, cfg, _), r in zip(jobs, runs):
            r.update(row=name, seed=cfg.seed, train_minutes=round(r["train_time_s"] / 60, 2))
        bootstrap = []
        if evening:
            base = score_all(score_base_run, evening, 1, args.threads, args.data_dir,
                             args.sentences, str(get_device(args.device)))
            for seed, r in zip(args.seeds, base):
                r["seed"] = seed
            test = load_multi30k("test_2016_flickr", data_dir=args.data_dir)
            bootstrap = against_evening(runs, base, [t for _, t in test][:args.sentences or None])
    call.hardware["cpu_threads"] = args.threads
    for r in runs:
        del r["hypotheses"], r["greedy_hypotheses"]
    result = {"minutes": MINUTES,
              "ladder": [{"row": n, "change": c, "parent": parent} for n, c, parent, *_ in LADDER],
              "rejected": [{"row": n, "change": c} for n, c, *_ in REJECTED],
              "longer": [{"row": n, "change": c, "resumes": parent} for n, c, parent, _ in LONGER],
              "rule": "a row is kept when the row it changes was kept and its mean validation "
                      "BLEU (beam 4, each run's chosen checkpoint average) over the seeds both "
                      "have is above that row's; rejected changes were measured by speed only",
              "bootstrap_rule": "sacreBLEU's paired bootstrap (1,000 resamples of the test set) "
                                "of each row against the evening model (evening.json's "
                                "transformer runs), seed with seed, beam search and greedy",
              "bench": speeds, "bootstrap": bootstrap, "runs": runs}
    return write_result("speedrun", target, result, call, derive=merged)


if __name__ == "__main__":
    raise SystemExit(main())
