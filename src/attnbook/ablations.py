"""The paper's Table 3, in miniature: ablations of the cpu-tiny Transformer on Multi30k.

    python -m attnbook.ablations --out runs/ablations --results results/cpu

Vaswani et al. (2017, Table 3) vary one thing at a time in their base model: (A) the number of
heads at a fixed width (so d_k = d_model / h shrinks as h grows), (B) the key width d_k alone,
(C) the model's size, (D) dropout and label smoothing, (E) learned instead of sinusoidal
positions. Here each variant changes one thing in the ``cpu-tiny`` Transformer (d_model 128,
4 heads, 2+2 layers, no dropout, label smoothing 0.1, 1,200 steps), and each is trained with 3 seeds, one thread per run, so that losses and BLEU do
not depend on how busy the machine is. The baseline is exactly the leaderboard's Transformer
(chapter 9, ``board.json``): the same configuration, so the same runs.

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

from . import store
from .bleu import bleu
from .cli import Parser, add_common, fail
from .data import load_multi30k
from .decoding import translate
from .sweeps import (SNAPSHOTS, open_run, run_name, score_all, summarise,
                     train_all)
from .recipe import override, preset
from .utils import get_device
from .registry import SEEDS

# Each variant: (Table 3's row, what changes, the overrides of cpu-tiny's Transformer, by field
# name: recipe.override). results/cpu/ablations.json records them as they are written here.
VARIANTS = {
    "base": ("base", "cpu-tiny's Transformer: h = 4 (d_k = 32), dropout 0, label smoothing 0.1, "
             "sinusoidal positions", {}),
    "heads-1": ("A", "1 head, d_k = 128", dict(h=1)),
    "heads-8": ("A", "8 heads, d_k = 16", dict(h=8)),
    "heads-16": ("A", "16 heads, d_k = 8", dict(h=16)),
    "d-k-16": ("B", "d_k = 16 instead of 32 (4 heads; values keep 32)", dict(d_k=16)),
    "d-k-8": ("B", "d_k = 8 instead of 32 (4 heads; values keep 32)", dict(d_k=8)),
    "layers-1": ("C", "1 + 1 layers instead of 2 + 2", dict(n_layers=1)),
    "d-ff-512": ("C", "feed-forward width 512 instead of 256", dict(d_ff=512)),
    "dropout-0.1": ("D", "dropout 0.1", dict(dropout=0.1)),
    "no-label-smoothing": ("D", "label smoothing 0", dict(label_smoothing=0.0)),
    "label-smoothing-0.2": ("D", "label smoothing 0.2", dict(label_smoothing=0.2)),
    "learned-positions": ("E", "learned positional embeddings instead of sinusoids",
                          dict(positional="learned")),
    "learned-positions-large": ("E", "the same, the table started at the sinusoids' scale "
                                "(std 1/sqrt(2) instead of 0.02)",
                                dict(positional="learned", learned_std=2 ** -0.5)),
}
# The variants results/cpu/ablations.json holds (the default); the others are there to be run
# (the appendix's homework): a run of cpu-tiny took 3.3 minutes at 2 threads on a quiet 2-core
# machine (results/cpu/cpu_tiny_transformer_2threads.json).
MEASURED = ("base", "heads-1", "heads-8", "d-k-16", "d-k-8", "layers-1", "d-ff-512", "dropout-0.1",
            "no-label-smoothing", "learned-positions", "learned-positions-large")


# Vaswani et al. (2017), Table 3 (newstest2013, the development set): for each variant, the
# paper's corresponding change, and (BLEU, perplexity) of the changed model and of the model it
# is compared with. Rows correspond by what they do: "8 heads" doubles our 4 as the paper's 16
# doubles its 8; the paper's base has dropout and ours has none, so its dropout row is read the
# other way round (its base against its row without dropout).
PAPER_BASE = (25.8, 4.92)
PAPER = {
    "heads-1": ("h = 1 (d_k = 512)", (24.9, 5.29), PAPER_BASE),
    "heads-8": ("h = 16 (d_k = 32), twice the base's heads", (25.8, 4.91), PAPER_BASE),
    "heads-16": ("h = 32 (d_k = 16), four times", (25.4, 5.01), PAPER_BASE),
    "d-k-16": ("d_k = 32 instead of 64, half the base's", (25.4, 5.01), PAPER_BASE),
    "d-k-8": ("d_k = 16 instead of 64, a quarter", (25.1, 5.16), PAPER_BASE),
    "layers-1": ("N = 2 instead of 6", (23.7, 6.11), PAPER_BASE),
    "d-ff-512": ("d_ff = 4096, twice the base's", (26.2, 4.75), PAPER_BASE),
    "dropout-0.1": ("dropout 0.1 (its base) against 0.0", PAPER_BASE, (24.6, 5.77)),
    "no-label-smoothing": ("label smoothing 0", (25.3, 4.67), PAPER_BASE),
    "label-smoothing-0.2": ("label smoothing 0.2", (25.7, 5.47), PAPER_BASE),
    "learned-positions": ("learned positional embedding", (25.7, 4.92), PAPER_BASE),
    "learned-positions-large": ("learned positional embedding", (25.7, 4.92), PAPER_BASE),
}


def change(res: dict, name: str, key: str) -> float:
    """Mean of ``key`` ("test_bleu" or "val_perplexity") over the variant's seeds, minus the
    base's mean."""
    v = {x["variant"]: x for x in res["variants"]}
    return v[name][key]["mean"] - v["base"][key]["mean"]


def markdown_table(res: dict, names=None) -> str:
    """The variants ``names`` (default: all) of ``res`` as a Markdown table: test BLEU and
    validation perplexity, mean ± std (min–max) over the seeds, the change from the base, and
    the paper's change for the corresponding row."""
    spread = lambda s: f"{s['mean']:.2f} ± {s['std']:.2f} ({s['min']:.2f}–{s['max']:.2f})"  # noqa: E731
    rows = ["| variant | row | change | parameters | test BLEU | ΔBLEU | validation perplexity "
            "| Δppl | paper: its change | ΔBLEU | Δppl |", "|" + "---|" * 11]
    for v in res["variants"]:
        name = v["variant"]
        if names is not None and name not in names:
            continue
        ours = ("", "") if name == "base" else (f"{change(res, name, 'test_bleu'):+.2f}",
                                                f"{change(res, name, 'val_perplexity'):+.2f}")
        what, (b1, p1), (b0, p0) = PAPER.get(name, ("", (0, 0), (0, 0)))
        theirs = (what, f"{b1 - b0:+.1f}", f"{p1 - p0:+.2f}") if what else ("", "", "")
        rows.append(f"| {name} | {v['row']} | {v['change']} | {v['parameters']:,} | "
                    f"{spread(v['test_bleu'])} | {ours[0]} | {spread(v['val_perplexity'])} | "
                    f"{ours[1]} | {' | '.join(theirs)} |")
    return "\n".join(rows)


def outside_base_range(res: dict, name: str, key: str) -> bool:
    """Whether all of the variant's seeds lie on one side of all of the base's seeds: a change
    that three seeds of each can tell apart from chance."""
    v = {x["variant"]: x for x in res["variants"]}
    a, b = v[name][key], v["base"][key]
    return a["min"] > b["max"] or a["max"] < b["min"]


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
    out = store.merge(old, new, "variants", by=("variant",), same=("preset", "test_set"))
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
    p = Parser(prog="python -m attnbook.ablations",
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
                   help="train this many steps instead of the preset's (the tests use a few)")
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
        jobs = [(n, replace(c, max_steps=args.steps, snapshot_steps=(), eval_every=args.steps),
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
    with store.record(store.command_line("attnbook.ablations", argv), threads=args.threads,
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
