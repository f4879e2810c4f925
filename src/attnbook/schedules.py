"""Learning-rate schedules: each is a function of the (1-based) step, in one place.

* :func:`warmup_cosine`: a linear warm-up, then a cosine decay to zero. The small experiments of
  chapters 5-8 and 10 use it: a fixed, short budget of steps.
* :func:`noam_lr`: the paper's schedule (Vaswani et al. 2017, section 5.3), a linear warm-up,
  then a decay as 1/sqrt(step); :func:`warmup_lr` is the same shape with its peak stated
  (chapter 9 trains with it).

:func:`scheduler` turns a factor into the ``LambdaLR`` that multiplies an optimiser's rate by it;
:func:`warmup_cosine_scheduler` and :func:`warmup_lr_scheduler` are the two schedules so turned,
the only ones the package builds (the graders and the small experiments use them);
:func:`training_scheduler` picks one of them by name for ``train`` (``TrainConfig.schedule``).
"""
from __future__ import annotations

import math
from typing import Callable

import torch


def warmup_cosine(step: int, warmup: int, steps: int) -> float:
    """The factor at ``step`` (1-based) of ``steps``: step / warmup for the first ``warmup``
    steps (no warm-up if 0), times 0.5 (1 + cos(pi (step - 1) / steps)), which falls from 1 to ~0."""
    ramp = min(1.0, step / warmup) if warmup else 1.0
    return ramp * 0.5 * (1 + math.cos(math.pi * (step - 1) / steps))


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's learning rate at ``step`` (1-based): linear warm-up, then ~ 1/sqrt(step)."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def warmup_lr(step: int, peak_lr: float, warmup: int) -> float:
    """The same shape with its peak stated: linear warm-up to ``peak_lr`` at step ``warmup``,
    then ``peak_lr * sqrt(warmup / step)``. noam_lr(s, d, w, f) == warmup_lr(s, f * (d * w)^-0.5, w)."""
    step = max(step, 1)
    return peak_lr * min(step / warmup, (warmup / step) ** 0.5)


def scheduler(opt: torch.optim.Optimizer, factor: Callable[[int], float]):
    """A ``LambdaLR`` whose rate after k calls of ``step()`` is the optimiser's rate times
    ``factor(k + 1)``: the first optimiser step uses factor(1)."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda i: factor(i + 1))


def warmup_cosine_scheduler(opt: torch.optim.Optimizer, warmup: int, steps: int):
    """The optimiser's rate times :func:`warmup_cosine` (the short runs of chapters 5-8, 10)."""
    return scheduler(opt, lambda s: warmup_cosine(s, warmup, steps))


def training_scheduler(opt: torch.optim.Optimizer, schedule: str, peak_lr: float, warmup: int,
                       steps: int):
    """The rate of chapter 9's training (the optimiser's rate at 1.0): ``schedule``
    "inverse-sqrt" is :func:`warmup_lr`; "cosine" is ``peak_lr`` times :func:`warmup_cosine`
    over ``steps`` steps (the speedrun's, whose short budget ends at a rate near zero)."""
    if schedule == "inverse-sqrt":
        return warmup_lr_scheduler(opt, peak_lr, warmup)
    if schedule == "cosine":
        return scheduler(opt, lambda s: peak_lr * warmup_cosine(s, warmup, steps))
    raise ValueError(f"unknown schedule {schedule!r}: choose inverse-sqrt or cosine")


def warmup_lr_scheduler(opt: torch.optim.Optimizer, peak_lr: float, warmup: int):
    """The optimiser's rate times :func:`warmup_lr`: with the optimiser's rate at 1.0 (as
    chapter 9's training sets it), the rate is warmup_lr(step, peak_lr, warmup) itself."""
    return scheduler(opt, lambda s: warmup_lr(s, peak_lr, warmup))
