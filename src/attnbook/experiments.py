"""Chapter 9's experiments, run as commands: the learning-rate sweep and the seeded leaderboard.

    python -m attnbook.experiments sweep --preset cpu-tiny --out runs/sweep --results results/cpu
    python -m attnbook.experiments board --preset cpu-tiny --out runs/board --results results/cpu

Both train many small runs with ``attnbook.train`` (``--jobs`` processes at once, each with
``--threads`` PyTorch threads: one thread per run gives results that do not depend on how busy
the machine is), then score them.

* **sweep**: every model at several peak learning rates (seed 0, ``--max-steps``, shorter than
  the preset), chosen by validation loss, never by the test set. Each run also records the
  attention entropy of every layer during training, and the scoring measures what a collapsed
  model does: validation BLEU, how much the decoder leans on the source (the validation loss
  when each source is replaced by another sentence's), and how often its outputs run past
  twice the reference length. Writes ``sweep.json``.
* **board**: every model at its chosen peak learning rate, 3 seeds, the full preset, with
  snapshots of the weights at earlier steps: test BLEU (beam search, sacreBLEU) at every
  snapshot gives BLEU against training budget. Writes ``board.json``.

A run whose folder already holds its metrics is not trained again, so an interrupted command
continues where it stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from multiprocessing import get_context
from pathlib import Path

import torch

from .train import MODELS, PRESETS, preset, same_run, train
from .utils import versions

SWEEP_LRS = {  # peak learning rates tried at cpu-tiny: the committed Transformer peak was 1.25e-2
    "transformer": (1e-3, 2e-3, 3e-3, 6e-3, 1.25e-2),
    "decoder-only": (1.5e-3, 3e-3, 6e-3),
    "gru": (1e-3, 2e-3, 4e-3),
    "gru-additive": (1e-3, 2e-3, 4e-3),
    "gru-dot": (1e-3, 2e-3, 4e-3),
}
SNAPSHOTS = (150, 300, 600)   # BLEU against budget: these steps and the preset's last


def run_name(cfg) -> str:
    return f"{cfg.model}_lr{cfg.peak_lr:g}_seed{cfg.seed}_steps{cfg.max_steps}"


def _train_one(job):
    """Train one run (in a worker process) unless its folder already holds its metrics."""
    cfg, folder, threads, data_dir = job
    torch.set_num_threads(threads)
    folder = Path(folder)
    metrics_file = folder / "metrics.json"
    if metrics_file.is_file() and same_run(json.loads(metrics_file.read_text())["config"],
                                           asdict(cfg)) \
            and json.loads(metrics_file.read_text())["steps"] == cfg.max_steps:
        return json.loads(metrics_file.read_text())
    resume = (folder / "checkpoint.pt").is_file()
    return train(cfg, folder, resume=resume, data_dir=data_dir, progress=False, evaluate=False)


def train_all(jobs: list, n_procs: int, threads: int, data_dir=None) -> list[dict]:
    """Train every (cfg, folder) of ``jobs``, ``n_procs`` at a time; their metrics, in order."""
    args = [(cfg, str(folder), threads, data_dir) for cfg, folder in jobs]
    if n_procs == 1:
        return [_train_one(a) for a in args]
    with ProcessPoolExecutor(n_procs, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_train_one, args))


def sweep_jobs(preset_name: str, models, max_steps: int, out: Path) -> list:
    jobs = []
    for m in models:
        for lr in SWEEP_LRS[m]:
            cfg = replace(preset(preset_name, m), peak_lr=lr, max_steps=max_steps, seed=0,
                          snapshot_steps=tuple(s for s in SNAPSHOTS if s < max_steps))
            jobs.append((cfg, out / run_name(cfg)))
    return jobs


def board_jobs(preset_name: str, models, seeds, out: Path, reuse: Path | None = None) -> list:
    """Every model at its preset's peak learning rate, for each seed. With ``reuse`` (the sweep's
    folder), a run whose first steps the sweep already trained (same model, rate and seed)
    starts from the sweep's checkpoint: the schedule does not depend on the total number of
    steps, so continuing it is the same as training from scratch (tests/test_train.py)."""
    jobs = []
    for m in models:
        for seed in seeds:
            cfg = preset(preset_name, m)
            cfg = replace(cfg, seed=seed,
                          snapshot_steps=tuple(s for s in SNAPSHOTS if s < cfg.max_steps))
            folder = out / run_name(cfg)
            for steps in sorted({s for s in SNAPSHOTS if s < cfg.max_steps}, reverse=True):
                done = reuse and reuse / run_name(replace(cfg, max_steps=steps))
                if done and (done / "checkpoint.pt").is_file() and not folder.exists():
                    shutil.copytree(done, folder)
                    (folder / "metrics.json").unlink(missing_ok=True)
                    break
            jobs.append((cfg, folder))
    return jobs


def header(preset_name: str, command: str, n_procs: int, threads: int) -> dict:
    return {"preset": preset_name, "command": command, "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "hardware": versions(), "processes_at_once": n_procs, "threads_per_run": threads,
            "load_average_before": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m attnbook.experiments",
                                description="Chapter 9's learning-rate sweep and seeded leaderboard.")
    p.add_argument("what", choices=("sweep", "board", "train-only"))
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu-tiny")
    p.add_argument("--out", type=Path, required=True, help="folder for the runs")
    p.add_argument("--results", type=Path, help="folder for sweep.json / board.json")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--max-steps", type=int, default=600, help="sweep: steps per run")
    p.add_argument("--jobs", type=int, default=2, help="runs trained at once")
    p.add_argument("--threads", type=int, default=1, help="PyTorch threads per run")
    p.add_argument("--reuse", type=Path, help="board: the sweep's runs folder, to continue its runs")
    p.add_argument("--data-dir")
    args = p.parse_args(argv)
    if args.what == "sweep":
        jobs = sweep_jobs(args.preset, args.models, args.max_steps, args.out)
    else:
        jobs = board_jobs(args.preset, args.models, args.seeds, args.out, args.reuse)
    start = time.perf_counter()
    train_all(jobs, args.jobs, args.threads, args.data_dir)
    print(f"trained {len(jobs)} runs in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
