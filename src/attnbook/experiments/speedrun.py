"""The speedrun (chapter 11): the evening model (``cpu-base``) made to train in under ten
minutes on 2 CPU cores, one change at a time, each change measured before it is kept.

    python -m attnbook speedrun --out runs/speedrun --results results/cpu

The command first measures each candidate's seconds per training step (``bench``: 30 steps
after a few to warm up, 2 threads), then trains the LADDER's rows one after another with
2 threads each, and scores every run as the cpu-base runs are scored
(``scoring.score_base_run``: the average of the last k snapshots with the lowest validation loss,
its validation BLEU and its test BLEU, with beam search and greedy).

Each row of LADDER is the row above with one change, trained for as many steps as fit in ten
minutes at the speed measured on the book's machine. A change is kept when the row's
mean validation BLEU is above that of the row it changes, over the seeds both have, and that row
was kept; the test set is scored but never chooses. The last
row PRESET_ROW is the ``cpu-speedrun`` preset. REJECTED changes were measured by their speed
only: they make a step no faster per token, so they cannot put more training in the same
minutes. LONGER rows train the preset's runs on, past ten minutes, to find the minutes the
recipe needs for 40 BLEU. With ``--evening runs/evening`` every row is compared with the evening
model's runs, seed with seed, by sacreBLEU's paired bootstrap.

A run whose folder already holds its metrics is not trained again, so an interrupted command
continues where it stopped; a call's runs (say, more seeds) are merged into speedrun.json.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..training.recipe import override, preset
from .scoring import at_end, paired_bootstrap
from .sweeps import summarise, tiny_run

MINUTES = 10


def snapshots(steps: int) -> tuple:
    """Where a run of ``steps`` steps saves its weights: at a third and two thirds of the way
    (BLEU against minutes), and four times in its last 14 %, so that checkpoint averaging
    (scoring.AVERAGE_SPAN: the last 15 %) can choose among the last 1 to 5."""
    gap = int(0.14 * steps / 4)
    return (steps // 3, 2 * steps // 3) + tuple(steps - k * gap for k in (4, 3, 2, 1))


# The ladder: (name, what changed, the row it changes, its changes, steps). Each row is the row
# it names with one change. A row that makes a step cheaper trains as many steps, in fifties, as
# fit in 97 % of MINUTES at its speed measured on the book's machine (the 15-step bench of the
# first calls: 0.96, 0.59 and 0.51 s a step, 2 threads; no dropout's steps from a quick bench
# against the preset, 8 % faster; the runs' minutes are the check); a change of schedule or
# rate keeps its parent's.
# The rows after "fit" are the speedrun's candidates, named so in their configs.
LADDER = (
    ("fit", "cpu-base fitted to 10 minutes: 600 steps, checkpoint averaging", None, {}, 600),
    ("bf16", "+ bf16 autocast: 950 steps", "fit", {"precision": "bf16-if-native"}, 950),
    ("vocab4000", "+ a 4,000-piece vocabulary: 1,100 steps", "bf16", {"vocab_size": 4000}, 1100),
    ("cosine", "+ a cosine decay to zero", "vocab4000", {"schedule": "cosine"}, 1100),
    ("cosine-peak5e-3", "+ a peak rate of 5e-3", "cosine", {"peak_lr": 5e-3}, 1100),
    ("dropout0", "+ no dropout: 1,200 steps", "vocab4000", {"dropout": 0.0}, 1200),
)
PRESET_ROW = "vocab4000"          # the row the cpu-speedrun preset is
# Changes measured by their speed only, each on the preset's row.
REJECTED = (
    ("compile", "+ torch.compile (dynamic shapes)", PRESET_ROW, {"compile": True}),
    ("batch8192", "+ 8,192-token batches", PRESET_ROW, {"max_tokens": 8192}),
)
# The preset trained on past ten minutes, to see how long its recipe takes to 40 BLEU: each
# row's runs resume the last checkpoints of the row it names, in folders of their own. The
# inverse-sqrt rate does not depend on max_steps, so a resumed run is the run a longer preset
# would train. (name, what changed, the row it resumes, steps)
LONGER = (
    ("steps1600", "the preset trained on to 1,600 steps", PRESET_ROW, 1600),
    ("steps2000", "the preset trained on to 2,000 steps", "steps1600", 2000),
    ("steps2400", "the preset trained on to 2,400 steps", "steps2000", 2400),
)
RESUMES = {name: parent for name, _, parent, _ in LONGER}     # a LONGER row: the row it resumes


def config(name: str, seed: int = 0):
    """The TrainConfig of LADDER row, REJECTED change or LONGER row ``name`` with ``seed``: its
    parent's with its change and its steps (and snapshots for them; a LONGER row's only in its
    averaging window, as its curve is the rows before it)."""
    if name in RESUMES:
        steps = next(r[3] for r in LONGER if r[0] == name)
        return replace(config(RESUMES[name], seed), max_steps=steps,
                       snapshot_steps=snapshots(steps)[2:])
    rows = {r[0]: r for r in LADDER + REJECTED}
    _, _, parent, changes, *steps = rows[name]
    cfg = preset("cpu-base") if parent is None else replace(config(parent),
                                                            preset="cpu-speedrun")
    cfg = replace(override(cfg, **changes), seed=seed)
    if steps and steps[0] != cfg.max_steps:
        cfg = replace(cfg, max_steps=steps[0], snapshot_steps=snapshots(steps[0]))
    return cfg


def resume_from(parent: Path, folder: Path) -> None:
    """Start a LONGER row's run in ``folder`` from the run in ``parent``: its last checkpoint,
    log and tokenizer (not its metrics, scores or snapshots, which are the parent's)."""
    if (folder / "checkpoint.pt").is_file():
        return                                  # started before: train_all resumes it
    if not (parent / "metrics.json").is_file():
        raise SystemExit(f"{folder.name} resumes {parent}, which has not finished: train its "
                         "row first (give both rows to --rows)")
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("checkpoint.pt", "log.jsonl", "tokenizer.model"):
        shutil.copy2(parent / name, folder / name)


def row_config(name: str, seed: int, tiny: int | None = None):
    """config(name, seed), or with ``tiny`` the tests' tiny run: ``tiny`` steps, and a LONGER
    row ``tiny`` more than the row it resumes."""
    cfg = config(name, seed)
    if not tiny:
        return cfg
    parent, steps = RESUMES.get(name), tiny
    while parent:
        parent, steps = RESUMES.get(parent), steps + tiny
    return replace(tiny_run(cfg, steps), warmup=min(cfg.warmup, tiny))


def bench(names, out: Path, steps: int = 30, threads: int = 2, data_dir=None,
          warmup: int = 3) -> dict:
    """Seconds per training step and target tokens per second of each config ``names``, over
    ``steps`` steps after ``warmup`` steps (10 when compiled, whose first steps compile)."""
    from ..training import loop
    torch.set_num_threads(threads)
    rows = {}
    for name in names:
        cfg = config(name)
        run = loop.setup(cfg, out / f"bench_{name}", data_dir=data_dir, device=torch.device("cpu"))
        for _ in range(10 if cfg.compile else warmup):
            loop.train_step(run)
        start, tokens = time.perf_counter(), run.tokens_seen
        for _ in range(steps):
            loop.train_step(run)
        seconds = time.perf_counter() - start
        rows[name] = {"s_per_step": round(seconds / steps, 3),
                      "target_tokens_per_s": round((run.tokens_seen - tokens) / seconds)}
        print(f"{name}: {rows[name]['s_per_step']} s a step", flush=True)
    return rows


def verdicts(runs: list[dict]) -> dict:
    """{row: kept?} for the LADDER rows in ``runs`` (a speedrun.json's): a row is kept when its
    parent is (the first row is) and its mean validation BLEU over the seeds both have is above
    its parent's over the same seeds."""
    val = {}
    for r in runs:
        val.setdefault(r["row"], {})[r["seed"]] = r["val_bleu"]
    kept = {}
    for name, _, parent, *_ in LADDER:
        if name not in val:
            continue
        seeds = sorted(set(val[name]) & set(val.get(parent, {})))
        mean = lambda row: sum(val[row][s] for s in seeds) / len(seeds)   # noqa: E731
        kept[name] = parent is None or (kept.get(parent, False) and bool(seeds)
                                        and mean(name) > mean(parent))
    return kept


def summaries(runs: list[dict]) -> dict:
    """Each row's mean and spread over its seeds."""
    out = {}
    for name in dict.fromkeys(r["row"] for r in runs):
        mine = [r for r in runs if r["row"] == name]
        out[name] = {k: summarise([r[k] for r in mine])
                     for k in ("val_bleu", "test_bleu", "greedy_test_bleu", "train_minutes")}
    return out


def against_evening(runs: list[dict], evening: list[dict], refs: list[str]) -> list[dict]:
    """sacreBLEU's paired bootstrap of every row of ``runs`` against the evening model's
    ``evening`` runs, seed with seed, beam search and greedy (scoring.paired_bootstrap). Each run
    has its ``seed`` and its test translations (``hypotheses``, ``greedy_hypotheses``); a
    speedrun run its ``row`` too. In the rows, ``a`` is "evening" and ``b`` the speedrun's row."""
    def as_model(r, name):
        return {"model": name, "seed": r["seed"], "hypotheses_at_step": at_end(r)}
    base = [as_model(r, "evening") for r in evening]
    out = []
    for name in dict.fromkeys(r["row"] for r in runs):
        out += paired_bootstrap(base + [as_model(r, name) for r in runs if r["row"] == name],
                                refs, ["evening", name])
    return out


def merged(out: dict, old: dict | None) -> dict:
    """A speedrun.json as :func:`attnbook.experiments.registry.save` merged it (a call's runs
    replace those of the same row and seed): the file's speed measurements kept unless the call
    measured them again, the runs and comparisons of rows no longer on the ladder dropped, the
    call's comparisons replacing those of the same row and seed; then the summary and the
    verdicts over all the runs. ``old``: the file before the call (None: there was none)."""
    out = dict(out)
    if old is not None:
        names = {r[0] for r in LADDER + REJECTED}           # a call's bench measures every row
        out["bench"] = {k: v for k, v in (out["bench"] or old.get("bench") or {}).items()
                        if k in names}
        names |= set(RESUMES)
        out["runs"] = [r for r in out["runs"] if r["row"] in names]   # rows of today's ladder
        mine = out["bootstrap"]                          # this call's comparisons
        made = {(r["b"], r["seed"]) for r in mine}       # a call's comparisons replace the old
        out["bootstrap"] = [r for r in old.get("bootstrap", []) if r["b"] in names
                            and (r["b"], r["seed"]) not in made] + mine
    return out | {"summary": summaries(out["runs"]), "kept": verdicts(out["runs"]),
                  "preset_row": PRESET_ROW}
