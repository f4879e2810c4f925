"""Run folders (chapter 9): checkpoints written atomically and loaded safely, a trained run's
model and tokenizer, and checkpoint averaging.

A run folder written by ``python -m attnbook.train`` holds ``checkpoint.pt`` (model, optimizer,
schedule, data position and random states), ``tokenizer.model``, ``log.jsonl`` (one line per
evaluation), ``metrics.json`` and, if asked for, ``snapshots/step_N.pt`` (weights only).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from .recipe import TrainConfig, build_model
from .tokenizer import Tokenizer
from .utils import get_device


def save_checkpoint(path: Path, **state) -> None:
    """Write atomically: an interruption during the write never leaves half a checkpoint."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, device="cpu") -> dict:
    """Load safely: ``weights_only=True`` refuses anything but tensors and plain containers."""
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; train first, or drop --resume")
    return torch.load(path, map_location=device, weights_only=True)


def load_run(run: Path, device=None):
    """The model and tokenizer of a run folder written by ``python -m attnbook.train``."""
    run = Path(run)
    device = device or get_device()
    if not run.is_dir():
        raise FileNotFoundError(f"{run} is not a run folder; train one with "
                                "`python -m attnbook.train --preset cpu-tiny --out RUN`")
    ckpt = load_checkpoint(run / "checkpoint.pt", device)
    tok = Tokenizer(run / "tokenizer.model")
    cfg = TrainConfig.from_dict(ckpt["config"])
    model = build_model(cfg, ckpt["vocab_size"]).to(device)
    model.load_state_dict(ckpt["model"])
    return model.eval(), tok, cfg


def average_checkpoints(paths) -> dict:
    """The element-wise mean of the ``model`` weights saved in ``paths`` (checkpoint averaging,
    Vaswani et al., 2017, section 6.1: the base model averages its last 5 checkpoints). Every
    file must hold the same parameters with the same shapes."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints: no checkpoints given")
    total = None
    for p in paths:
        sd = load_checkpoint(p)["model"]
        if total is None:
            total = {k: v.double().clone() for k, v in sd.items()}
            dtypes = {k: v.dtype for k, v in sd.items()}
            continue
        if sd.keys() != total.keys() or any(sd[k].shape != total[k].shape for k in sd):
            raise ValueError(f"{p} holds other parameters than {paths[0]}: "
                             "average checkpoints of one run only")
        for k, v in sd.items():
            total[k] += v.double()
    return {k: (v / len(paths)).to(dtypes[k]) for k, v in total.items()}
