"""Synthetic tasks for the Transformer chapters, and one small loop that trains on them.

A task is a function ``make_batch(batch_size, generator) -> SeqBatch``
(:class:`attnbook.batching.SeqBatch`): ids (B, T) int64 token ids; targets (B, T) int64, the
label of each position (a class: 0 is a class like any other); mask (B, T) bool, True at real
tokens (the book's convention); scored (B, T) bool, True where a label counts.
Symbols start at 4: ids 0-3 are PAD, UNK, BOS, EOS, as everywhere in the book.

Models are called as ``model(ids, mask) -> logits (B, T, n_classes)``, which is what
:class:`attnbook.transformer.SelfAttentionStack` does.

Chapter 5's neighbour task and its model are built inline in their chapter first (chapter 6's
greedy generation too, whose package version is :func:`attnbook.decoding.greedy_generate`); the
versions here serve ``python -m attnbook exercise_runs`` (the measured answers of the exercises),
and each chapter checks that its own agrees.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from . import BOS_ID, EOS_ID
from .batching import SeqBatch, lengths_mask
from .loop import fit
from .schedules import warmup_cosine_scheduler
from .transformer import SelfAttentionStack, TransformerConfig

Task = Callable[[int, torch.Generator], SeqBatch]


def train_on_task(model: torch.nn.Module, make_batch: Task, steps: int, lr: float = 1e-3,
                  batch_size: int = 64, warmup: int = 50, clip: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Train with Adam, a linear warm-up then cosine decay; returns the loss of every step.

    Batches come from ``make_batch`` with a generator seeded by ``seed``, so two models trained
    with the same seed see exactly the same data.
    """
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    sched = warmup_cosine_scheduler(opt, warmup, steps)

    def loss_fn(model, b: SeqBatch):
        return F.cross_entropy(model(b.ids, b.mask)[b.scored], b.targets[b.scored])  # (B, T, C)

    return fit(model, lambda step: make_batch(batch_size, g), loss_fn, steps, opt, sched, clip)


@torch.no_grad()
def task_accuracy(model: torch.nn.Module, make_batch: Task, n_batches: int = 4,
                  batch_size: int = 256, seed: int = 12345) -> tuple[float, float]:
    """(per-token accuracy, whole-sequence accuracy) on fresh batches, in eval mode."""
    g = torch.Generator().manual_seed(seed)
    model.eval()
    tok_right = tok_total = seq_right = seq_total = 0
    for _ in range(n_batches):
        b = make_batch(batch_size, g)
        right = (model(b.ids, b.mask).argmax(-1) == b.targets) | ~b.scored     # (B, T)
        tok_right += int((right & b.scored).sum())
        tok_total += b.n_scored
        seq_right += int(right.all(dim=1).sum())
        seq_total += b.ids.shape[0]
    model.train()
    return tok_right / tok_total, seq_right / seq_total


# ---------------------------------------------------------------------------------------------
# Chapter 5

T_NEIGHBOUR = 12                   # sequence length
OFFSETS = (-2, -1, 1, 2)           # the four neighbours: bit i of the label = neighbour OFFSETS[i]


def make_neighbour_batch(batch_size: int, generator: torch.Generator):
    """Chapter 5's task: random bits (ids 4 and 5) and, at t = 2..9, the pattern of the four
    neighbours t-2, t-1, t+1, t+2 as a class 0..15. Returns a SeqBatch: ids (B, T), targets
    (B, T), mask all True (no padding), scored True where a label counts (positions 2..9);
    T = 12."""
    bits = torch.randint(0, 2, (batch_size, T_NEIGHBOUR), generator=generator)   # (B, T)
    t = torch.arange(2, T_NEIGHBOUR - 2)
    targets = torch.zeros(batch_size, T_NEIGHBOUR, dtype=torch.long)
    targets[:, t] = sum(bits[:, t + o] * 2 ** i for i, o in enumerate(OFFSETS))
    scored = torch.zeros(batch_size, T_NEIGHBOUR, dtype=torch.bool)
    scored[:, t] = True
    return SeqBatch(ids=bits + 4, targets=targets, mask=torch.ones_like(scored), scored=scored)


class NeighbourReader(torch.nn.Module):
    """Chapter 5's model: a one-layer SelfAttentionStack with h heads, d_ff = 2 d_model, that
    labels every position (16 classes). No sequence has padding, so attention sees every
    position: the batch's mask is all True and is not passed on."""

    def __init__(self, h: int, d_model: int = 32):
        super().__init__()
        cfg = TransformerConfig(vocab_size=6, d_model=d_model, h=h, d_ff=2 * d_model,
                                n_layers=1, dropout=0.0, max_len=T_NEIGHBOUR)
        self.stack = SelfAttentionStack(cfg, causal=False, n_out=16)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.stack(ids)                                                   # (B, T, 16)


# ---------------------------------------------------------------------------------------------
# Chapter 7

def make_lookback_task(min_len: int, max_len: int, offset: int = 2, n_symbols: int = 8) -> Task:
    """An order task of lengths ``min_len..max_len``: label each position with the symbol
    ``offset`` positions earlier. Returns a ``make_batch(batch_size, generator) -> SeqBatch``.

    ids (B, T): symbols are ids 4 .. 3 + n_symbols; each sequence has a length drawn uniformly
    from min_len..max_len and is padded on the right with PAD_ID up to T, the longest in the batch.
    targets (B, T): at a real position t >= offset, the class ``ids[b, t - offset] - 3``
    (1 .. n_symbols); at t < offset, class 0 ("nothing there"); 0 at padding.
    mask (B, T) and scored (B, T): True at real tokens, False at padding (every real position's
    label counts).
    A model therefore needs n_symbols + 1 output classes and a vocabulary of 4 + n_symbols ids.

    Only the order of the tokens determines the labels: a model that sees the sequence as a bag of
    tokens (self-attention without positions) cannot tell which token came ``offset`` earlier.
    """
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    if offset < 1 or n_symbols < 2:
        raise ValueError(f"need offset >= 1 and n_symbols >= 2, got {offset} and {n_symbols}")

    def make_batch(batch_size: int, generator: torch.Generator):
        lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)
        T = int(lengths.max())
        mask = lengths_mask(lengths, T)                                        # (B, T)
        x = torch.randint(4, 4 + n_symbols, (batch_size, T), generator=generator)
        x = x.masked_fill(~mask, 0)                                            # PAD_ID = 0
        y = torch.zeros(batch_size, T, dtype=torch.long)                       # (B, T)
        if T > offset:
            y[:, offset:] = x[:, :-offset] - 3                                # symbol -> class
        y = y.masked_fill(~mask, 0)
        return SeqBatch(ids=x, targets=y, mask=mask, scored=mask)

    return make_batch


# ---------------------------------------------------------------------------------------------
# Chapter 6

def make_caesar_copy_task(k: int = 4, n_symbols: int = 8, shift: int = 1) -> Task:
    """A language-modelling task "a b c d | a+1 b+1 c+1 d+1" for a decoder-only model (chapter 6).

    Each sequence is ``[BOS, a_1 .. a_k, SEP, b_1 .. b_k, EOS]``: a_1 .. a_k are drawn uniformly
    from ``n_symbols`` symbols (ids 4 .. 3 + n_symbols), SEP is id 4 + n_symbols, and b_j is a_j
    moved ``shift`` places along the alphabet of symbols, wrapping round (a Caesar cipher;
    ``shift=0`` is a plain copy). A language model reads ``ids = sequence[:-1]`` and predicts
    ``targets = sequence[1:]``, the next token at every position. Returns a
    ``make_batch(batch_size, generator) -> SeqBatch`` with

    ids (B, T) and targets (B, T), T = 2k + 2: targets[:, t] == ids[:, t + 1];
    mask and scored (B, T), all True (every position is a real token and every label counts).

    The vocabulary has n_symbols + 5 ids. The first k targets are random, so no model that reads
    only the past can beat a loss of k ln(n_symbols) / (2k + 2) per position; everything after
    them is determined by the past. To generate, give a model the prompt ``ids[:, :k + 2]``
    (BOS, a_1 .. a_k, SEP) and compare its next k + 1 tokens with ``targets[:, k + 1:]``.
    """
    if k < 1 or n_symbols < 2:
        raise ValueError(f"need k >= 1 and n_symbols >= 2, got k={k} and n_symbols={n_symbols}")
    sep = 4 + n_symbols

    def make_batch(batch_size: int, generator: torch.Generator):
        a = torch.randint(0, n_symbols, (batch_size, k), generator=generator)  # (B, k)
        b = (a + shift) % n_symbols                                             # (B, k)
        col = lambda i: torch.full((batch_size, 1), i, dtype=torch.long)        # noqa: E731
        seq = torch.cat([col(BOS_ID), a + 4, col(sep), b + 4, col(EOS_ID)], 1)  # (B, 2k + 3)
        mask = torch.ones(batch_size, 2 * k + 2, dtype=torch.bool)             # (B, T)
        return SeqBatch(ids=seq[:, :-1], targets=seq[:, 1:], mask=mask, scored=mask)

    return make_batch
