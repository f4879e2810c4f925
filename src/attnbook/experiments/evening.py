"""The evening scale (chapter 11): the ``cpu-base`` preset, chosen in chapter 9 for at most 30
minutes of training on 2 CPU cores, trained with several seeds, one run after another with 2
threads each, so that a run's minutes are what a reader's laptop would take.

    python -m attnbook evening --models transformer --out runs/evening --results results/cpu

Each run is scored as the cpu-base candidates are (``scoring.score_base_run``): the test BLEU
of its snapshots against training minutes; the average of the last k snapshots with the lowest
validation loss; and that average's validation BLEU and test BLEU, with beam search and greedy.
Given several models, sacreBLEU's paired bootstrap compares every two of them, seed with seed
(``scoring.paired_bootstrap``). A call's runs are merged into ``evening.json`` by model and
seed; the summaries are made again from all its runs.

A run whose folder already holds its metrics is not trained again, so an interrupted command
continues where it stopped.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..data import load_multi30k
from ..training.recipe import preset
from .sweeps import score_all, summarise, tiny_run
from .scoring import at_end, merge_bootstrap, paired_bootstrap, score_base_run
from ..utils import get_device

PRESET = "cpu-base"
# Equal minutes, not equal steps: a model other than the Transformer trains for as many steps as
# fill the Transformer's time. At 2 threads on the book's machine (quiet, 150 steps each) a
# cpu-base step of GRU + additive took 0.60 s and one of the Transformer 0.96 s, so 2,200 GRU steps
# take about the Transformer's 1,400 steps' 22 minutes (evening.json records both). Its snapshots
# keep the preset's places counted back from the last step.
STEPS = {"gru-additive": 2200}
SELECTION = ("each run: the average of its last k snapshots with the lowest validation loss "
             "(as the cpu-base candidates); the test set is scored but never chooses")


def evening_jobs(models, seeds, out: Path, steps: int | None = None) -> list:
    """(config, folder) of each model and seed at the cpu-base preset; with ``steps`` (the
    tests' tiny run), that many steps without snapshots."""
    jobs = []
    for m in models:
        for seed in seeds:
            cfg = replace(preset(PRESET, m), seed=seed)
            if m in STEPS:
                shift = STEPS[m] - cfg.max_steps
                cfg = replace(cfg, max_steps=STEPS[m],
                              snapshot_steps=tuple(s + shift for s in cfg.snapshot_steps))
            if steps:
                cfg = tiny_run(cfg, steps)
            jobs.append((cfg, out / f"{m}_seed{seed}"))
    return jobs


def summaries(runs: list[dict]) -> dict:
    """Each model's mean and spread over its seeds: test BLEU (beam and greedy), validation
    BLEU and training minutes."""
    out = {}
    for m in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == m]
        out[m] = {"test_bleu": summarise([r["test_bleu"] for r in mine]),
                  "greedy_test_bleu": summarise([r["greedy_test_bleu"] for r in mine]),
                  "val_bleu": summarise([r["val_bleu"] for r in mine]),
                  "train_minutes": summarise([round(r["train_time_s"] / 60, 2) for r in mine])}
    return out


def score(args, jobs: list) -> dict:
    """evening.json's results: every run's scores, and the paired bootstrap of every two models."""
    runs = score_all(score_base_run, [folder for _, folder in jobs], 1, args.threads,
                     args.data_dir, args.sentences, str(get_device(args.device)))
    for (cfg, _), r in zip(jobs, runs):
        r.update(model=cfg.model, seed=cfg.seed, peak_lr=cfg.peak_lr)
        r["hypotheses_at_step"] = at_end(r)
        del r["hypotheses"], r["greedy_hypotheses"]
    test = load_multi30k("test_2016_flickr", data_dir=args.data_dir)
    refs = [t for _, t in test][:args.sentences or None]        # the pairs the runs translated
    bootstrap = paired_bootstrap(runs, refs, list(dict.fromkeys(args.models)))
    for r in runs:
        del r["hypotheses_at_step"]
    return {"preset": PRESET, "selection": SELECTION,
            "bootstrap_rule": "sacreBLEU's paired bootstrap (1,000 resamples of the test set): "
                              "every two models of a call, seed with seed, beam search and greedy",
            "bootstrap": bootstrap, "runs": runs}


def merged(out: dict, old: dict | None) -> dict:
    """An evening.json as :func:`attnbook.experiments.registry.save` merged it (a call's runs
    replace those of the same model and seed), with the call's bootstrap comparisons merged in,
    and the summary and ``train_time_s_sum`` over all the runs. ``old``: the file before the
    call (None: there was none)."""
    bootstrap = merge_bootstrap((old or {}).get("bootstrap", []), out["bootstrap"])
    return out | {"bootstrap": bootstrap, "summary": summaries(out["runs"]),
                  "train_time_s_sum": round(sum(r["train_time_s"] for r in out["runs"]), 1)}
