"""The paper's Table 3, in miniature: ablations of the cpu-tiny Transformer on Multi30k.

    python -m attnbook.experiments.ablations --out runs/ablations --results results/cpu

Vaswani et al. (2017, Table 3) vary one thing at a time in their base model: (A) the number of
heads at a fixed width (so d_k = d_model / h shrinks as h grows), (B) the key width d_k alone,
(C) the model's size, (D) dropout and label smoothing, (E) learned instead of sinusoidal
positions. Here each variant changes one thing in the ``cpu-tiny`` Transformer (d_model 128,
4 heads, 2+2 layers, no dropout, label smoothing 0.1, 1,200 steps), and each is trained with 3 seeds, one thread per run, so that losses and BLEU do
not depend on how busy the machine is. The baseline is exactly the leaderboard's Transformer
(chapter 10, ``board.json``): the same configuration, so the same runs.

Each run is scored by test BLEU (beam search, sacreBLEU) and validation perplexity, exp of the
validation cross-entropy without label smoothing; the paper reports both, and label smoothing
"hurts perplexity ... but improves accuracy and BLEU score". Writes ``ablations.json``
(:mod:`attnbook.store`'s format); with ``--merge`` it merges this call's variants into the file
by name (:func:`attnbook.store.merge`), and each variant's ``call`` is the index of the
provenance record of the call that made it.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from .. import store
from ..record import command_line, record
from ..bleu import bleu
from ..cli import Parser, fail
from ..training.options import add_common
from ..data import load_multi30k
from ..decoding import translate
from .sweeps import (SNAPSHOTS, TINY_VAL_SENTENCES, open_run, run_name, score_all, summarise,
                     train_all)
from ..training.recipe import override, preset
from ..utils import get_device
from .registry import ROWS, SEEDS
from .table3 import MEASURED, VARIANTS

def variant_jobs(names, seeds, out: Path) -> list:
    """(name, cfg, folder) for every variant and seed. The configuration is the leaderboard's
    (with its snapshots), so the baseline's folders are the board's runs under another name."""
    jobs = []
    for name in names:
        for seed in seeds:
            cfg = override(preset("cpu-tiny", "transformer"), seed=seed, **VARIANTS[name][2])
            cfg = replace(cfg, snapshot_steps=tuple(s for s in SNAPSHOTS if s < cfg.max_steps))
            jobs.append((name, cfg, out / name / run_name(cfg)))
    return jobs


def _score_ablation_run(job) -> dict:
    """Test BLEU of the last checkpoint (beam search) and validation perplexity of one run."""
    folder, model, tok, cfg, test, _ = open_run(job, "test_2016_flickr")
    hyps = translate(model, tok, [s for s, _ in test], beam_size=cfg.beam_size,
                     alpha=cfg.length_alpha)
    result = bleu(hyps, [t for _, t in test])
    metrics = json.loads((folder / "metrics.json").read_text())
    return {"seed": cfg.seed, "test_bleu": result["bleu"], "bleu_signature": result["signature"],
            "val_loss": round(metrics["val_loss"], 4),
            "val_perplexity": round(math.exp(metrics["val_loss"]), 3),
            "parameters": metrics["parameters"], "train_time_s": metrics["train_time_s"]}


def merge(old: dict, new: dict) -> dict:
    """``new``'s variants (a result of one call, :mod:`attnbook.store`) added to ``old``'s by
    :func:`attnbook.store.merge` (a variant of the same name is replaced; another preset or test
    set is a one-line ResultError), in the order of VARIANTS; each variant's ``call`` is the index
    of the call that made it, and ``train_time_s_sum`` covers them all."""
    out = ROWS["ablations"].merge(old, new)
    made = set(out["calls"][-1]["rows"])
    order = list(VARIANTS)
    out["variants"] = sorted(
        [dict(v, call=len(out["calls"]) - 1) if v["variant"] in made else v
         for v in out["variants"]], key=lambda v: order.index(v["variant"]))
    out["train_time_s_sum"] = round(sum(r["train_time_s"] for v in out["variants"]
                                        for r in v["runs"]), 1)
    return out


def variant_table(names, jobs, runs) -> list[dict]:
    """The rows of ablations.json: each variant's change, size and scores over its seeds."""
    table = []
    for name in names:
        mine = [r for (n, _, _), r in zip(jobs, runs) if n == name]
        row, what, overrides = VARIANTS[name]
        table.append({"variant": name, "row": row, "change": what, "overrides": overrides,
                      "parameters": mine[0]["parameters"],
                      "test_bleu": summarise([r["test_bleu"] for r in mine]),
                      "val_perplexity": summarise([r["val_perplexity"] for r in mine]),
                      "runs": mine})
    return table


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="python -m attnbook.experiments.ablations",
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
    p.add_argument("--merge", action="store_true",
                   help="add these variants to the existing ablations.json instead of replacing it")
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
    old = None
    if args.merge and target and target.is_file():       # refused before anything is trained
        try:
            old = store.read(target)
            if (old.get("preset"), old.get("test_set")) != ("cpu-tiny", test_set):
                raise store.ResultError(
                    f"{target} holds preset {old.get('preset')!r} on {old.get('test_set')!r}, "
                    f"this call cpu-tiny on {test_set!r}; give the file's --sentences, or write "
                    "to another --results folder")
        except store.ResultError as e:
            return fail(e)
    with record(command_line("attnbook.experiments.ablations", argv), threads=args.threads,
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
    result = store.result("ablations", {
        "preset": "cpu-tiny", "test_set": test_set,
        "decoding": "beam 4, alpha 0.6",
        "perplexity": "exp(validation cross-entropy per target token, no label smoothing)",
        "train_time_s_sum": round(sum(r["train_time_s"] for r in runs), 1),
        "variants": [dict(v, call=0) for v in variant_table(args.variants, jobs, runs)]}, call)
    if old is not None:
        try:
            result = merge(old, result)
        except store.ResultError as e:
            return fail(e)
    store.write(target, result)
    print(f"wrote {args.results / 'ablations.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
