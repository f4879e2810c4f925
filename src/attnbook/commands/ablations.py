"""``python -m attnbook ablations``: the paper's Table 3 in miniature (appendix).

The command line only: the work is :mod:`attnbook.experiments.ablations`."""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from .. import store
from ..cli import Parser, fail
from ..data import load_multi30k
from ..experiments.ablations import _score_ablation_run, merged, variant_jobs, variant_table
from ..experiments.registry import SEEDS, refuse_other_settings, write_result
from ..experiments.sweeps import TINY_VAL_SENTENCES, score_all, train_all
from ..experiments.table3 import MEASURED, VARIANTS
from ..record import command_line, record
from ..training.options import add_common
from ..utils import get_device


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="python -m attnbook ablations",
               description="The paper's Table 3 in miniature (cpu-tiny, Multi30k).")
    p.add_argument("--out", type=Path, required=True, help="folder for the runs")
    p.add_argument("--results", type=Path, help="folder for ablations.json")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(MEASURED),
                   help="default: " + " ".join(MEASURED))
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p.add_argument("--jobs", type=int, default=2, help="runs trained at once")
    p.add_argument("--threads", type=int, default=1, help="PyTorch threads per run")
    p.add_argument("--sentences", type=int, default=0,
                   help="score on the first N test sentences only (0 = all; the tests use a few)")
    p.add_argument("--steps", type=int, default=0,
                   help="train this many steps instead of the preset's, validating on the first "
                        f"{TINY_VAL_SENTENCES} sentences (the tests use a few)")
    p.add_argument("--note", default="", help="recorded in the results (e.g. the machine's load)")
    add_common(p, "device", "data-dir")
    args = p.parse_args(argv)
    if any(Path(a).is_absolute() for a in (args.out, args.results or ".")):
        p.error("give --out and --results relative to the repository (they are recorded in the "
                "results, which must not name folders of the machine that made them)")
    jobs = variant_jobs(args.variants, args.seeds, args.out)
    if args.steps:
        jobs = [(n, replace(c, max_steps=args.steps, snapshot_steps=(), eval_every=args.steps,
                            val_sentences=TINY_VAL_SENTENCES),
                 f.parent / f"{f.name}_test{args.steps}") for n, c, f in jobs]
    test_set = load_multi30k("test_2016_flickr", data_dir=args.data_dir)[:args.sentences or None]
    test_set = f"test_2016_flickr ({len(test_set)} sentences)"
    target = args.results / "ablations.json" if args.results else None
    if target:                                   # the file's settings, before any training
        try:
            refuse_other_settings("ablations", target, {"preset": "cpu-tiny",
                                                        "test_set": test_set})
        except store.ResultError as e:
            return fail(e)
    with record(command_line("ablations", argv), threads=args.threads,
                      processes=args.jobs, note=args.note) as call:
        start = time.perf_counter()
        train_all([(c, f) for _, c, f in jobs], args.jobs, args.threads, args.data_dir,
                  args.device)
        call.extra["this_call_train_wall_time_s"] = round(time.perf_counter() - start, 1)
        print(f"trained {len(jobs)} runs in {call.extra['this_call_train_wall_time_s']:.0f} s")
        if not args.results:
            return 0
        start = time.perf_counter()
        runs = score_all(_score_ablation_run, [f for _, _, f in jobs], args.jobs, args.threads,
                         args.data_dir, args.sentences, str(get_device(args.device)))
        call.extra["score_wall_time_s"] = round(time.perf_counter() - start, 1)
    call.hardware["cpu_threads"] = args.threads
    data = {"preset": "cpu-tiny", "test_set": test_set,
            "decoding": "beam 4, alpha 0.6",
            "perplexity": "exp(validation cross-entropy per target token, no label smoothing)",
            "variants": variant_table(args.variants, jobs, runs)}
    return write_result("ablations", target, data, call, derive=merged)


if __name__ == "__main__":
    raise SystemExit(main())
