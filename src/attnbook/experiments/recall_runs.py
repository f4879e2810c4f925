"""Chapter 13's recall experiment (MQAR, :mod:`attnbook.recall`) and what generating costs.

    python -m attnbook run recall --only PART     # about 35 minutes of 2 cores for all four

1. **pairs** (``--only pairs``): the six models of :data:`attnbook.recall.MIXERS` at
   :data:`SETTINGS`, each at its default state size (:data:`DEFAULTS`), on three tasks
   (:data:`TASKS`: T = 16 and 32 with 4 pairs, T = 32 with 8), seeds 0, 1 and 2: recall
   accuracy on 1,000 fresh sequences.
2. **state** (``--only state``): the fixed-state models with smaller and larger states
   (:data:`STATE_SIZES`) on the hardest task: accuracy against the numbers a model carries.
3. **conv** (``--only conv``): the hybrid and the selective model without their short
   convolution (``d_conv=1``) on the three tasks: what the convolution does for recall.
4. **generation** (``--only generation``): :func:`attnbook.recall.generation_cost`, one layer of
   softmax attention with its cache against one selective state-space layer, seconds and bytes
   per generated token at t = 256 .. 65,536, one thread (run it on a quiet machine: the times
   are the result); ``--device cuda`` measures a GPU (the GPU call's plan "recall" runs it).

Every call merges its rows into the file by their key (part, mixer, T, pairs, state setting,
seed; generation: mixer and t); the settings must match the file's. The JSON
(:mod:`attnbook.store`'s format) carries the provenance of every call.
"""
from __future__ import annotations

import time

import torch

from ..recall import (MIXERS, mqar_batch, recall_accuracy, recall_model, state_numbers,
                      train_recall, vocab_size)
from ..utils import count_parameters, deterministic
from .registry import ROWS

SETTINGS = dict(d_model=32, n_layers=2, n_keys=16, n_values=16, steps=1500, batch_size=64,
                lr=3e-3, warmup=50, eval_sequences=1000, eval_seed=1234)
TASKS = [(16, 4), (32, 4), (32, 8)]                       # (T, n_pairs)
DEFAULTS = {"attention": dict(h=4), "linear": dict(h=4), "gated": dict(d_state=32),
            "lti": dict(d_state=8), "selective": dict(d_state=8), "hybrid": dict(d_state=8)}
STATE_SIZES = {"linear": [dict(h=8), dict(h=1)], "gated": [dict(d_state=8), dict(d_state=128)],
               "lti": [dict(d_state=2), dict(d_state=32)],
               "selective": [dict(d_state=2), dict(d_state=16)]}
GENERATION = dict(lengths=[256, 1024, 4096, 16384, 65536], d_model=256, h=4, d_state=16,
                  steps=32)
PARTS = ("pairs", "state", "conv", "generation")
KEY = ROWS["recall"].key    # (part, mixer, T, n_pairs, h, d_state, seed); "conv" rows: d_conv = 1


def jobs(part: str, seeds) -> list[dict]:
    """The runs of a part, most expensive first (so that two processes finish together)."""
    out = []
    if part == "pairs":
        for T, n_pairs in TASKS:
            out += [dict(part=part, mixer=m, T=T, n_pairs=n_pairs, **DEFAULTS[m]) for m in MIXERS]
    elif part == "conv":
        for T, n_pairs in TASKS:
            out += [dict(part=part, mixer=m, T=T, n_pairs=n_pairs, **DEFAULTS[m])
                    for m in ("selective", "hybrid")]
    else:
        T, n_pairs = TASKS[-1]
        out += [dict(part=part, mixer=m, T=T, n_pairs=n_pairs, **size)
                for m, sizes in STATE_SIZES.items() for size in sizes]
    out = [{"h": 4, "d_state": 8, **j, "seed": s} for j in out for s in seeds]
    def cost(j):        # the selective scan's tensors grow with d_state; the others' little
        return j["T"] * {"selective": 4 * max(j["d_state"], 4) / 8, "hybrid": 3}.get(j["mixer"], 1)
    return sorted(out, key=lambda j: -cost(j))


def run_one(job: dict, steps: int | None = None) -> dict:
    """Train one model from its seed on fresh MQAR batches and score it on the task's fixed
    evaluation sequences; the job's fields, its size, state and accuracy."""
    torch.set_num_threads(1)
    s = SETTINGS
    deterministic(job["seed"])
    V = vocab_size(s["n_keys"], s["n_values"])
    model = recall_model(job["mixer"], V, d_model=s["d_model"], n_layers=s["n_layers"],
                         h=job["h"], d_state=job["d_state"],
                         d_conv=1 if job["part"] == "conv" else 4)
    start = time.perf_counter()
    losses = train_recall(model, job["n_pairs"], job["T"], steps or s["steps"], s["n_keys"],
                          s["n_values"], s["batch_size"], s["lr"], s["warmup"], job["seed"])
    seconds = time.perf_counter() - start
    test = mqar_batch(s["eval_sequences"], job["n_pairs"], job["T"], s["n_keys"], s["n_values"],
                      torch.Generator().manual_seed(s["eval_seed"]))
    return {**job, "params": count_parameters(model),
            "state_numbers": state_numbers(model, job["T"]),
            "accuracy": round(recall_accuracy(model, test), 4),
            "final_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4),
            "train_seconds": round(seconds, 1)}


def _run(args) -> dict:
    return run_one(*args)


def merged(out: dict, old: dict | None, parts: list[str]) -> dict:
    """A recall.json as :func:`attnbook.experiments.registry.save` merged it (a call's runs
    replace those of the same key): the generation costs kept from the file unless this call
    measured them, and the call's rows named by its ``parts``. ``old``: the file before the call
    (None: there was none)."""
    if old is not None and "generation" not in parts:
        out = out | {"generation": old.get("generation", [])}
    out["calls"][-1]["rows"] = parts
    return out
