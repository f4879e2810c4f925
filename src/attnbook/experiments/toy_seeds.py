"""Part I's experiments on the reversal task with three seeds: what chapters 1-3 train for seed 0.

    python -m attnbook toy_seeds --results results/cpu      # RESULTS/toy_seeds.json, one thread:
                                                            # 15 CPU-minutes (34 on a busy 2-core VM)
    python -m attnbook toy_seeds --results out --tiny       # a few steps each: what the tests run

Every run is trained and scored exactly as the chapters train and score seed 0, with the settings
of :data:`attnbook.toy.PART1`: ``deterministic(seed)``, then the model, then
``train_toy(model, **task, **train, seed=seed)`` (so seed 0 sees the chapters' batches), then
``accuracy_by_length`` on the chapters' lengths. The runs (:data:`RUNS`):

* ``no-attention`` and ``additive``: chapters 1 and 2, the GRU encoder-decoder without and with
  additive attention, 1,200 steps;
* ``additive-600``, ``dot-600`` and ``general-600``: chapter 3, the three attention scores,
  600 steps;
* ``no-attention-4800`` and ``no-attention-d128``: chapter 1's exercise ex-01-budget, four times
  the steps, or a summary twice as wide (1,200 steps);
* ``copy``: chapter 2's exercise ex-02-copy, chapter 2's attention model trained and scored on
  ``task="copy"`` (the target is the source unchanged), 1,200 steps;
* ``transformer`` and ``conv``: chapter 10's three families on one task, chapter 8's toy
  Transformer (d_model 64, 4 heads, d_ff 128, 3 + 3 layers) and a ConvS2S with as many layers as
  give it that Transformer's parameters outside the embeddings, trained exactly as the GRUs
  (1,200 steps, the same batches and learning rate); and ``additive-lr1e-3`` ...
  ``conv-lr0.01``: the three families at the other rates of :data:`TOY_RATES` (a tenth to three times it),
  so that each can be shown at its own rate;
* with ``--timing`` (the default), chapter 3's exercise ex-03-predict-cost: milliseconds per
  training step of four attention models (:func:`step_times`).

Each run records its exact match and per-token accuracy by length, the final training loss (the
mean of the last 50 steps, as chapter 3 prints it), the loss in blocks of 50 steps, its training
time; for the models without attention the accuracy of each output position on 20-symbol sources
(chapter 1's measurement), and for the attention models the statistics of their weights on
chapter 3's test sources (:func:`attnbook.toy.reversal_alignment`, or
:func:`attnbook.toy.copy_alignment` for the copy task). The JSON (:mod:`attnbook.store`'s format)
also names the settings, and its provenance record the command, git commit, date, hardware,
versions, threads (1), wall and CPU time; chapters 1-3 load it.

A call is merged into the existing JSON by (name, seed)
(:func:`attnbook.experiments.registry.save`; other seeds or scale are a one-line error): the runs
of ``--runs`` replace those with their name and seed, the file's other runs (and, with
``--no-timing``, its timing) stay as they were, and the call is appended to its ``calls`` with
the runs it made, so each run still names the call that made it:

    python -m attnbook toy_seeds --results results/cpu --runs copy --no-timing
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from .. import PAD_ID
from ..conv import ConvS2S, layers_like
from ..rnn import Seq2Seq
from ..transformer import Transformer, TransformerConfig
from ..toy import (PART1, accuracy_by_length, copy_alignment, greedy_tokens, make_batch,
                  reversal_alignment, train_toy, vocab_size)
from ..utils import count_parameters, deterministic

STEPS, SCORE_STEPS, D_MODEL = PART1["train"]["steps"], PART1["score_steps"], PART1["d_model"]
# name: the model (Seq2Seq's arguments), its training steps, and where the book shows it
RUNS = {
    "no-attention": dict(model=dict(attention=False), steps=STEPS, shown="chapters 1, 2, 3"),
    "additive": dict(model=dict(attention=True, score="additive"), steps=STEPS, shown="chapter 2"),
    "additive-600": dict(model=dict(attention=True, score="additive"), steps=SCORE_STEPS,
                         shown="chapter 3"),
    "dot-600": dict(model=dict(attention=True, score="dot"), steps=SCORE_STEPS, shown="chapter 3"),
    "general-600": dict(model=dict(attention=True, score="general"), steps=SCORE_STEPS,
                        shown="chapter 3"),
    "no-attention-4800": dict(model=dict(attention=False), steps=4 * STEPS,
                              shown="chapter 1, ex-01-budget"),
    "no-attention-d128": dict(model=dict(attention=False, d_model=2 * D_MODEL), steps=STEPS,
                              shown="chapter 1, ex-01-budget"),
    "copy": dict(model=dict(attention=True, score="additive"), steps=STEPS, task="copy",
                 shown="chapter 2, ex-02-copy"),
    "transformer": dict(model=dict(family="transformer"), steps=STEPS, shown="chapter 10"),
    "conv": dict(model=dict(family="conv"), steps=STEPS, shown="chapter 10"),
}
# chapter 10's three families, each at its own learning rate: the runs above at 3e-3, and these
# at a tenth, a third and three times that rate (chosen by the final training loss, which on this task
# is measured on examples never seen before: every batch is drawn afresh)
TOY_RATES = (3e-4, 1e-3, 3e-3, 1e-2)
FAMILIES = {"additive": dict(attention=True, score="additive"), "transformer": dict(family="transformer"),
            "conv": dict(family="conv")}
RUNS |= {f"{name}-lr{lr:g}": dict(model=model, steps=STEPS, lr=lr, shown="chapter 10")
         for name, model in FAMILIES.items() for lr in TOY_RATES if lr != PART1["train"]["lr"]}
# chapter 8's toy Transformer, and the size a ConvS2S must match
TOY_TRANSFORMER = dict(d_model=D_MODEL, h=4, d_ff=2 * D_MODEL, n_layers=3, dropout=0.0, max_len=32)


def build(model_kw: dict, vocab: int) -> torch.nn.Module:
    """The model of a run: a GRU encoder-decoder (Seq2Seq's arguments), or, with ``family``,
    chapter 8's toy Transformer or a ConvS2S of its size."""
    family = model_kw.get("family", "gru")
    if family == "gru":
        return Seq2Seq(vocab, **model_kw)
    transformer = Transformer(TransformerConfig(vocab_size=vocab, **TOY_TRANSFORMER))
    if family == "transformer":
        return transformer
    outside = sum(p.numel() for n, p in transformer.named_parameters() if "embed" not in n)
    return ConvS2S(vocab, D_MODEL, layers_like(outside, D_MODEL), max_len=TOY_TRANSFORMER["max_len"])
# Chapter 3's exercise ex-03-predict-cost: the time per training step of four attention models
COST = {"additive-64": dict(score="additive"), "additive-256": dict(score="additive", d_attn=256),
        "dot-64": dict(score="dot"), "dot-128": dict(score="dot", d_model=2 * D_MODEL)}
COST_STEPS, COST_ROUNDS = 50, 3
TINY = dict(steps=3, n_per_length=8, n_alignment=8, rounds=1)  # --tiny: seconds, meaningless
BLOCK = 50                                                      # the loss curve: means of 50 steps


@torch.no_grad()
def accuracy_by_position(model, length: int = 20, n: int = 500, seed: int = 5) -> list[float]:
    """Accuracy of each output position on ``n`` sources of ``length`` symbols: chapter 1's
    measurement of which outputs a model without attention gets right (the same operations)."""
    L = length
    test = make_batch(n, L, L, PART1["task"]["n_symbols"],
                      generator=torch.Generator().manual_seed(seed))
    pred = greedy_tokens(model, test.src, test.src_mask, max_len=L + 1)       # (n, <= L + 1)
    pred = F.pad(pred, (0, L + 1 - pred.shape[1]), value=PAD_ID)              # (n, L + 1)
    return (pred[:, :L] == test.tgt_out[:, :L]).float().mean(0).tolist()       # (L,)


def run(name: str, seed: int, tiny: bool = False) -> dict:
    """Train and score run ``name`` (a key of :data:`RUNS`) with ``seed``, as the chapters do."""
    spec = RUNS[name]
    task = PART1["task"] | {"task": spec.get("task", PART1["task"]["task"])}
    lengths = PART1["lengths"]
    train = PART1["train"] | {"seed": seed, "steps": TINY["steps"] if tiny else spec["steps"],
                              "lr": spec.get("lr", PART1["train"]["lr"])}
    model_kw = {"d_model": D_MODEL} | spec["model"]
    deterministic(seed)                                     # the initial weights: as the chapters
    model = build(model_kw, vocab_size(task["n_symbols"]))
    start = time.perf_counter()
    history = train_toy(model, **task, **train)             # seed: the data order
    seconds = time.perf_counter() - start
    n = TINY["n_per_length"] if tiny else 200               # accuracy_by_length's default
    acc = accuracy_by_length(model, lengths, n_symbols=task["n_symbols"], task=task["task"],
                             n_per_length=n)
    block = min(BLOCK, len(history))
    out = {"name": name, "seed": seed, "steps": train["steps"], "lr": train["lr"], **model_kw,
           "params": count_parameters(model), "train_seconds": round(seconds, 2),
           "ms_per_step": round(1000 * seconds / train["steps"], 2),
           "final_loss": sum(history[-50:]) / len(history[-50:]),
           "loss_blocks": [sum(history[i:i + block]) / block
                           for i in range(0, len(history) - block + 1, block)],
           "length": acc["length"], "exact": acc["exact"], "token": acc["token"]}
    if spec["model"].get("attention") is False:
        out["by_position"] = accuracy_by_position(model, n=TINY["n_per_length"] if tiny else 500)
    if spec["model"].get("attention"):
        align = PART1["alignment"] | ({"n": TINY["n_alignment"]} if tiny else {})
        alignment = copy_alignment if task["task"] == "copy" else reversal_alignment
        out["alignment"] = alignment(model, task["n_symbols"], **align)
    return out


def step_times(tiny: bool = False) -> dict:
    """Milliseconds per training step of each model of :data:`COST` (ex-03-predict-cost).

    Each model trains ``COST_STEPS`` steps from seed 0, as the exercise's solution does, in
    ``COST_ROUNDS`` rounds that take turns between the models, so that a busy spell of a shared
    machine slows all of them; each model keeps its fastest round.
    """
    steps, rounds = (TINY["steps"], TINY["rounds"]) if tiny else (COST_STEPS, COST_ROUNDS)
    times = {name: [] for name in COST}
    for _ in range(rounds):
        for name, kw in COST.items():
            deterministic(0)
            model = Seq2Seq(vocab_size(PART1["task"]["n_symbols"]), attention=True,
                            **({"d_model": D_MODEL} | kw))
            start = time.perf_counter()
            train_toy(model, **PART1["task"], **(PART1["train"] | {"steps": steps}))
            times[name].append(1000 * (time.perf_counter() - start) / steps)
    return {"steps": steps, "models": {n: {"d_model": D_MODEL} | kw for n, kw in COST.items()},
            "ms_per_step": {name: round(min(t), 2) for name, t in times.items()},
            "rounds_ms": {name: [round(x, 2) for x in t] for name, t in times.items()}}


def spread(runs: list[dict], key: str) -> dict:
    """Min, mean and max over seeds of a per-length list ``key`` ("exact" or "token")."""
    columns = list(zip(*(r[key] for r in runs)))
    return {"min": [min(c) for c in columns], "mean": [sum(c) / len(c) for c in columns],
            "max": [max(c) for c in columns]}


def merged(out: dict, old: dict | None) -> dict:
    """A toy_seeds.json as :func:`attnbook.experiments.registry.save` merged it (a call's runs
    replace those of the file with the same name and seed), put in order: the runs in the order
    of :data:`RUNS`, then seed; the run specs of the file's and the call's runs; and the spread
    of every run over its seeds. ``old``: the file before the call (None: there was none)."""
    order = {name: i for i, name in enumerate(RUNS)}
    runs = sorted(out["runs"], key=lambda r: (order.get(r["name"], len(order)), r["seed"]))
    specs = (old or {}).get("run_specs", {}) | out["run_specs"]
    return out | {
        "run_specs": {name: specs[name] for name in sorted(specs, key=lambda n: order.get(n, 99))},
        "runs": runs,
        "spread": {name: {key: spread([r for r in runs if r["name"] == name], key)
                          for key in ("exact", "token")}
                   for name in sorted({r["name"] for r in runs}, key=lambda n: order.get(n, 99))}}


def runs_of(args) -> dict:
    """One call's data of toy_seeds.json: the runs of ``--runs`` and ``--seeds`` and
    (``--timing``) ex-03-predict-cost's step times; :func:`merged` adds the spread of every run
    over its seeds when the call is written."""
    result = {"scale": "tiny" if args.tiny else "full", "seeds": args.seeds,
              "settings": PART1 | {"n_per_length": 200},
              "run_specs": {name: RUNS[name] for name in args.runs}, "runs": []}
    if args.tiny:
        result["settings"] = result["settings"] | {"tiny": TINY}
    for name in args.runs:
        for seed in args.seeds:
            r = run(name, seed, tiny=args.tiny)
            result["runs"].append(r)
            print(f"{name:18s} seed {seed}: final loss {r['final_loss']:.3f}, exact match at "
                  f"{PART1['lengths'][-1]} symbols {r['exact'][-1]:.2f} "
                  f"({r['train_seconds']:.0f} s)", flush=True)
    if args.timing:
        result["predict_cost"] = step_times(tiny=args.tiny)
        print("ms per training step:", result["predict_cost"]["ms_per_step"], flush=True)
    return result
