"""The one small training loop of the book's short runs: the toy tasks of chapters 1-8, the
exercises' measurements and chapter 13's comparisons. (Chapter 9's translator has its own,
:mod:`attnbook.training.loop`: checkpoints, resume, precision, several processes.)

Every step does the same five things in the same order, so that two runs with the same seed
and the same batches give the same weights, whichever chapter calls it:

    batch = next_batch(step); loss = loss_fn(model, batch)
    opt.zero_grad(); loss.backward(); clip the gradient norm; opt.step(); sched.step()
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def fit(model: torch.nn.Module, next_batch: Callable[[int], Any],
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], steps: int,
        opt: torch.optim.Optimizer, sched=None, clip: float | None = None,
        log_every: int | None = None) -> list[float]:
    """Train ``model`` for ``steps`` optimiser steps; returns the loss of every step.

    ``next_batch(step)`` gives the step's batch (any type: a :class:`attnbook.batching.Batch`,
    a tuple); ``loss_fn(model, batch)`` its scalar loss. The gradient's norm is clipped to
    ``clip`` (None or 0: not clipped); ``sched``, if given, steps after the optimiser. The model
    is put in training mode and left in it. ``log_every``: print the mean loss of the last
    ``log_every`` steps every ``log_every`` steps.
    """
    model.train()
    losses = []
    for step in range(steps):
        loss = loss_fn(model, next_batch(step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1:5d}  loss {sum(losses[-log_every:]) / log_every:.3f}")
    return losses
