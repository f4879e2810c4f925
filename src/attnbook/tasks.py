"""Synthetic tasks for the Transformer chapters, and one small loop that trains on them.

A task is a function ``make_batch(batch_size, generator) -> (inputs, targets, mask)``:
inputs (B, T) int64 token ids; targets (B, T) int64, the label of each position; mask (B, T)
bool, True where a position is a real token whose label counts (the book's convention).
Symbols start at 4: ids 0-3 are PAD, UNK, BOS, EOS, as everywhere in the book.

Models are called as ``model(inputs, mask) -> logits (B, T, n_classes)``, which is what
:class:`attnbook.transformer.SelfAttentionStack` does.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

Task = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def train_on_task(model: torch.nn.Module, make_batch: Task, steps: int, lr: float = 1e-3,
                  batch_size: int = 64, warmup: int = 50, clip: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Train with Adam, a linear warm-up then cosine decay; returns the loss of every step.

    Batches come from ``make_batch`` with a generator seeded by ``seed``, so two models trained
    with the same seed see exactly the same data.
    """
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * i / steps)))
    model.train()
    losses = []
    for _ in range(steps):
        x, y, mask = make_batch(batch_size, g)
        logits = model(x, mask)                                      # (B, T, C)
        loss = F.cross_entropy(logits[mask], y[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def task_accuracy(model: torch.nn.Module, make_batch: Task, n_batches: int = 4,
                  batch_size: int = 256, seed: int = 12345) -> tuple[float, float]:
    """(per-token accuracy, whole-sequence accuracy) on fresh batches, in eval mode."""
    g = torch.Generator().manual_seed(seed)
    model.eval()
    tok_right = tok_total = seq_right = seq_total = 0
    for _ in range(n_batches):
        x, y, mask = make_batch(batch_size, g)
        right = (model(x, mask).argmax(-1) == y) | ~mask             # (B, T)
        tok_right += int((right & mask).sum())
        tok_total += int(mask.sum())
        seq_right += int(right.all(dim=1).sum())
        seq_total += x.shape[0]
    model.train()
    return tok_right / tok_total, seq_right / seq_total
