"""The paper's Table 3, in miniature: ablations of the cpu-tiny Transformer on Multi30k.

    python -m attnbook ablations --out runs/ablations --results results/cpu

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
(:mod:`attnbook.store`'s format); a call's variants are merged into the file by name
(:func:`attnbook.experiments.registry.save`), and the call's provenance record names the
variants it made.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from ..bleu import bleu
from ..decoding import translate
from .sweeps import (SNAPSHOTS, open_run, run_name, summarise)
from ..training.recipe import override, preset
from .table3 import VARIANTS

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


def merged(out: dict, old: dict | None) -> dict:
    """An ablations.json as :func:`attnbook.experiments.registry.save` merged it (a call's
    variants replace those of the same name), put in order: the variants in the order of
    VARIANTS, and ``train_time_s_sum`` over all of them. The call that made a variant is the
    last whose rows name it (``attnbook.store.Result.call_of``). ``old``: the file before the
    call (None: there was none)."""
    order = list(VARIANTS)
    variants = sorted(out["variants"], key=lambda v: order.index(v["variant"]))
    return out | {"variants": variants,
                  "train_time_s_sum": round(sum(r["train_time_s"] for v in variants
                                                for r in v["runs"]), 1)}


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
