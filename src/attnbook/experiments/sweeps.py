"""Training and scoring many runs at once: what chapter 10's experiments (``experiments``) and the
ablations (``ablations``, ``head_ablation``) share.

* :func:`train_all` trains (cfg, folder) jobs, ``n_procs`` processes at once with ``threads``
  PyTorch threads each; a run whose folder holds its metrics is not trained again, one with a
  checkpoint resumes (so an interrupted command continues).
* :func:`score_all` scores run folders the same way with a scoring function, caching each row in
  the folder (``score_<kind>.json``); :func:`open_run` is how a scoring function opens its run.
* :func:`summarise` (mean and spread over seeds); :func:`tiny_run` (a preset cut short for the tests).
* :func:`add_run_options` and :func:`results_file`: the options and checks of the commands that
  train one run at a time into a result file (``evening``, ``speedrun``).
"""
from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from multiprocessing import get_context
from pathlib import Path

import torch

from ..training.options import add_common
from ..data import load_multi30k
from ..training.recipe import same_run
from ..training.runs import load_run
from ..training.loop import train
from ..utils import get_device

SNAPSHOTS = (150, 300, 600, 1200)   # snapshots of the weights at these steps: BLEU against budget


def run_name(cfg) -> str:
    """A run's folder name: model, peak rate, seed and steps."""
    return f"{cfg.model}_lr{cfg.peak_lr:g}_seed{cfg.seed}_steps{cfg.max_steps}"


TINY_VAL_SENTENCES = 64


def tiny_run(cfg, steps: int):
    """``cfg`` cut to ``steps`` steps, without snapshots, its validation loss on the first
    TINY_VAL_SENTENCES sentences (the tests' tiny run of a long preset)."""
    return replace(cfg, max_steps=steps, warmup=min(cfg.warmup, steps), eval_every=steps,
                   snapshot_steps=(), val_sentences=TINY_VAL_SENTENCES)


def _train_one(job):
    """Train one run (in a worker process) unless its folder already holds its metrics."""
    cfg, folder, threads, data_dir, device = job
    torch.set_num_threads(threads)
    folder = Path(folder)
    metrics_file = folder / "metrics.json"
    if metrics_file.is_file() and same_run(json.loads(metrics_file.read_text())["config"],
                                           asdict(cfg)) \
            and json.loads(metrics_file.read_text())["steps"] == cfg.max_steps:
        return json.loads(metrics_file.read_text())
    resume = (folder / "checkpoint.pt").is_file()
    return train(cfg, folder, resume=resume, data_dir=data_dir, progress=False, evaluate=False,
                 device=get_device(device))


def train_all(jobs: list, n_procs: int, threads: int, data_dir=None, device=None) -> list[dict]:
    """Train every (cfg, folder) of ``jobs``, ``n_procs`` at a time; their metrics, in order."""
    args = [(cfg, str(folder), threads, data_dir, device) for cfg, folder in jobs]
    if n_procs == 1:
        return [_train_one(a) for a in args]
    with ProcessPoolExecutor(n_procs, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_train_one, args))


def load_weights(folder: Path, step: int | None = None, device="cpu"):
    """(model, tokenizer, cfg) of a run folder, with the weights of its snapshot at ``step``
    (None: the last checkpoint)."""
    model, tok, cfg = load_run(folder, torch.device(device))
    if step is not None and step != cfg.max_steps:
        snap = torch.load(folder / "snapshots" / f"step_{step}.pt", map_location=device,
                          weights_only=True)
        model.load_state_dict(snap["model"])
    return model.eval(), tok, cfg


def open_run(job, split: str):
    """A scoring job's run: (folder, model, tokenizer, config, the first ``limit`` pairs of
    ``split``, device), in a worker with the job's number of threads."""
    folder, threads, data_dir, limit, device = job
    torch.set_num_threads(threads)
    model, tok, cfg = load_weights(Path(folder), device=device)
    pairs = load_multi30k(split, cfg.src_lang, cfg.tgt_lang, data_dir)[:limit or None]
    return Path(folder), model, tok, cfg, pairs, device


def _score_cached(job) -> dict:
    """Score one run, or read its score from the run folder (``score_<kind>.json``, written
    when the run was scored with the same arguments: delete it to score again)."""
    fn, folder, *rest = job
    cache = Path(folder) / f"score_{fn.__name__.strip('_')}.json"
    key = {"limit": rest[2], "device": rest[3]}
    if getattr(fn, "version", 0):                   # a scorer that changed what it measures
        key["version"] = fn.version
    if cache.is_file():
        saved = json.loads(cache.read_text())
        if saved["key"] == key:
            return saved["row"]
    row = fn((folder, *rest))
    cache.write_text(json.dumps({"key": key, "row": row}) + "\n")
    return row


def score_all(fn, folders: list, n_procs: int, threads: int, data_dir=None,
              limit: int = 0, device: str = "cpu") -> list[dict]:
    """``fn(job)`` of every run folder, ``n_procs`` at a time (each job as :func:`open_run`
    reads it), or its cached score; the rows in the order of ``folders``."""
    args = [(fn, str(f), threads, data_dir, limit, device) for f in folders]
    if n_procs == 1:
        return [_score_cached(a) for a in args]
    with ProcessPoolExecutor(n_procs, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_score_cached, args))


def summarise(values: list[float]) -> dict:
    """Mean, standard deviation (0 for one value), min, max and number of ``values`` (seeds)."""
    t = torch.tensor(values, dtype=torch.float64)
    return {"mean": round(float(t.mean()), 2), "std": round(float(t.std()), 2) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values)}


def add_run_options(p, name: str) -> None:
    """The options of a command that trains runs one at a time into ``<name>.json``: where the
    runs and the result go, threads, the tests' tiny run and a note."""
    p.add_argument("--out", type=Path, required=True, help="folder for the runs")
    p.add_argument("--results", type=Path, help=f"folder for {name}.json")
    p.add_argument("--threads", type=int, default=2, help="PyTorch threads (default 2: the "
                                                          "budget is for 2 cores)")
    p.add_argument("--max-steps", type=int, help="the tests' tiny run: this many steps")
    p.add_argument("--sentences", type=int, default=0,
                   help="score only the first N sentences of each set (0 = all; the tests)")
    p.add_argument("--note", default="", help="recorded in the results (e.g. the machine's load)")
    add_common(p, "device", "data-dir")


def results_file(p, args, name: str) -> Path | None:
    """``--results``' ``<name>.json`` (None without --results), after checking that the folders
    are relative (they are recorded in the result)."""
    if any(Path(a).is_absolute() for a in (args.out, args.results or ".")):
        p.error("give --out and --results relative to the repository (they are recorded in the "
                "results, which must not name folders of the machine that made them)")
    target = args.results / f"{name}.json" if args.results else None
    return target
