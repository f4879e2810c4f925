"""Padding, masks and length-bucketed batches limited by a token budget.

Sentences have different lengths, but a tensor is a rectangle. We pad every sequence of a batch
with ``PAD_ID`` up to the longest one and keep a boolean mask that is ``True`` at real tokens
(the book's mask convention, book/notation.md). To waste little compute on padding, sentences of
similar length go into the same batch ("bucketing"), and a batch holds as many sentences as fit
in a budget of ``max_tokens`` padded tokens, so short sentences come in big batches and long
ones in small batches.

Models that read one sequence per example (the tasks, the language model) get a
:class:`SeqBatch` instead of a translation :class:`Batch`.

This module also holds the two things every batch of the book is read with: the mask of real
tokens built from lengths (:func:`lengths_mask`) and the loss over real target tokens
(:func:`translation_loss`, PAD ignored), used by every model and chapter from Part I's toy task
to chapter 12's language model.

Every example appears in exactly one batch of an epoch: nothing is dropped or truncated. An
example that alone exceeds the budget is an error, not a silent skip.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from . import BOS_ID, EOS_ID, PAD_ID


class BatchingError(ValueError):
    """Bad input to the batching code; the message says what was wrong and how to fix it."""


def lengths_mask(lengths: torch.Tensor | Sequence[int], L: int | None = None) -> torch.Tensor:
    """(B, L) bool mask, True at the first ``lengths[b]`` positions of row b (the real tokens of
    a right-padded batch, book/notation.md). ``L`` defaults to the longest length."""
    lengths = torch.as_tensor(lengths)                                    # (B,)
    L = int(lengths.max()) if L is None else L
    return torch.arange(L, device=lengths.device)[None, :] < lengths[:, None]  # (B, L)


def translation_loss(logits: torch.Tensor, tgt_out: torch.Tensor,
                     label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy over real target tokens. logits (B, T, V), tgt_out (B, T) with PAD at
    padded positions (ignored). With label smoothing eps the target distribution puts 1 - eps on
    the right token and spreads eps uniformly over the whole vocabulary. The one loss of the
    book: the toy task, the translators and (shifted by one) the language model use it."""
    if logits.shape[:-1] != tgt_out.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be (B, T, V) for targets "
                         f"{tuple(tgt_out.shape)} (B, T)")
    V = logits.shape[-1]
    return F.cross_entropy(logits.float().reshape(-1, V), tgt_out.reshape(-1),
                           ignore_index=PAD_ID, label_smoothing=label_smoothing)


def pad(seqs: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad id lists into a rectangle.

    Returns ``ids`` of shape (B, L), int64, padded with ``pad_id`` on the right, and ``mask`` of
    shape (B, L), bool, ``True`` at real tokens, where L is the longest sequence.
    """
    if len(seqs) == 0:
        raise BatchingError("cannot pad an empty list of sequences")
    lengths = [len(s) for s in seqs]
    if min(lengths) == 0:
        raise BatchingError(f"sequence {lengths.index(0)} is empty; every sequence needs at "
                            "least one token")
    ids = torch.full((len(seqs), max(lengths)), pad_id, dtype=torch.long)  # (B, L)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return ids, lengths_mask(lengths)                           # (B, L), (B, L)


@dataclass
class Batch:
    """A padded translation batch; shapes and meanings are listed in book/notation.md."""

    src: torch.Tensor       # (B, S) int64 source ids
    src_mask: torch.Tensor  # (B, S) bool, True at real source tokens
    tgt_in: torch.Tensor    # (B, T) int64, BOS + target ids: the decoder's input
    tgt_out: torch.Tensor   # (B, T) int64, target ids + EOS: what the decoder must predict
    tgt_mask: torch.Tensor  # (B, T) bool, True at real target positions
    index: torch.Tensor     # (B,) int64, positions of these examples in the data set

    def to(self, device) -> "Batch":
        return Batch(*(t.to(device, non_blocking=True) for t in
                       (self.src, self.src_mask, self.tgt_in, self.tgt_out, self.tgt_mask,
                        self.index)))

    @property
    def n_tgt_tokens(self) -> int:
        """Number of real target tokens: the ones the loss is computed on."""
        return int(self.tgt_mask.sum())


def make_batch(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]],
               index: Sequence[int] | None = None) -> Batch:
    """Build a Batch from source and target id lists (without BOS/EOS; they are added here)."""
    if len(src) != len(tgt):
        raise BatchingError(f"{len(src)} source sequences but {len(tgt)} target sequences")
    src_ids, src_mask = pad(src)                                # (B, S)
    tgt_in, tgt_mask = pad([[BOS_ID, *t] for t in tgt])         # (B, T)
    tgt_out, _ = pad([[*t, EOS_ID] for t in tgt])               # (B, T)
    index = torch.as_tensor(range(len(src)) if index is None else index, dtype=torch.long)
    return Batch(src_ids, src_mask, tgt_in, tgt_out, tgt_mask, index)


@dataclass
class SeqBatch:
    """A batch of one sequence per example, for the models that are a single stack of blocks
    (a :class:`attnbook.transformer.SelfAttentionStack` and its variants): chapters 5-7's tasks,
    chapter 12's language model, chapter 13's reversal and recall. book/notation.md lists it.

    Two masks, because what attention may see and where the loss counts can differ: chapter 5
    labels only positions 2..9 of sequences without padding, and a language model scores the
    next token, which the last real token of a sentence does not have.
    """

    ids: torch.Tensor        # (B, L) int64 input ids, right-padded with PAD_ID
    targets: torch.Tensor    # (B, L) int64, what each position must output: a token or a class
    mask: torch.Tensor       # (B, L) bool, True at real tokens: what attention may see
    scored: torch.Tensor     # (B, L) bool, True where targets count (loss and accuracy)
    positions: torch.Tensor | None = None  # (B, L) int64 each token's position; None: 0..L-1

    def __post_init__(self):
        shape = tuple(self.ids.shape)
        if len(shape) != 2:
            raise BatchingError(f"ids must be (B, L), got shape {shape}")
        for name in ("targets", "mask", "scored", "positions"):
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != shape:
                raise BatchingError(f"{name} has shape {tuple(t.shape)} but ids has {shape}; "
                                    "every field of a SeqBatch is (B, L)")
        if self.mask.dtype != torch.bool or self.scored.dtype != torch.bool:
            raise BatchingError(f"mask and scored must be bool, got {self.mask.dtype} and "
                                f"{self.scored.dtype}")

    def to(self, device) -> "SeqBatch":
        return SeqBatch(*(None if t is None else t.to(device, non_blocking=True) for t in
                          (self.ids, self.targets, self.mask, self.scored, self.positions)))

    @property
    def n_scored(self) -> int:
        """Number of positions whose target counts: the ones the loss is computed on."""
        return int(self.scored.sum())


def token_batches(lengths: Sequence[int], max_tokens: int, shuffle: bool = True,
                  seed: int = 0) -> list[list[int]]:
    """Group example indices into batches of similar length within a token budget.

    lengths: the padded length each example needs (for translation, max(source, target) + 1).
    A batch of n examples whose longest needs L tokens costs n * L <= max_tokens.
    With ``shuffle`` the order of examples of equal length and the order of the batches are
    shuffled (reproducibly, from ``seed``); without it batches come shortest first.
    Returns a list of batches, each a list of indices; every index appears exactly once.
    """
    if max_tokens <= 0:
        raise BatchingError(f"max_tokens must be positive, got {max_tokens}")
    too_long = [(i, n) for i, n in enumerate(lengths) if n > max_tokens]
    if too_long:
        i, n = too_long[0]
        raise BatchingError(f"example {i} needs {n} tokens, more than max_tokens={max_tokens} "
                            f"({len(too_long)} such example(s)); raise max_tokens or filter long "
                            "examples out explicitly")
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    if shuffle:
        rng.shuffle(order)                      # random order among equal lengths ...
    order.sort(key=lambda i: lengths[i])        # ... then stable sort by length
    batches, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and longest_if_added * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches


class TranslationBatches:
    """Length-bucketed, token-limited batches of (source ids, target ids) pairs.

    Iterating gives one epoch of :class:`Batch` objects; each epoch is shuffled differently
    (seed + epoch number) but reproducibly.

        >>> batches = TranslationBatches(src_ids, tgt_ids, max_tokens=4096)
        >>> for epoch in range(10):
        ...     for batch in batches:         # batch.src: (B, S), batch.tgt_in: (B, T), ...
        ...         ...
    """

    def __init__(self, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]],
                 max_tokens: int, shuffle: bool = True, seed: int = 0):
        if len(src) != len(tgt):
            raise BatchingError(f"{len(src)} source sequences but {len(tgt)} target sequences; "
                                "the two sides must be aligned")
        for name, seqs in (("source", src), ("target", tgt)):
            empty = [i for i, s in enumerate(seqs) if len(s) == 0]
            if empty:
                raise BatchingError(f"{name} sequence {empty[0]} is empty ({len(empty)} in all); "
                                    "every sentence needs at least one token")
        self.src, self.tgt = src, tgt
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        # +1: the target gains BOS (tgt_in) or EOS (tgt_out)
        self.lengths = [max(len(s), len(t) + 1) for s, t in zip(src, tgt)]
        self.epoch = 0
        self._check = token_batches(self.lengths, max_tokens, shuffle=False)  # fails early

    def __len__(self) -> int:
        return len(self._check)

    def epoch_groups(self, epoch: int) -> list[list[int]]:
        """The example indices of every batch of epoch ``epoch``: the same for the same epoch,
        so that training interrupted in the middle of an epoch can resume at the same batch."""
        return token_batches(self.lengths, self.max_tokens, self.shuffle, self.seed + epoch)

    def batch(self, idx: Sequence[int]) -> Batch:
        """The Batch of the examples ``idx``."""
        return make_batch([self.src[i] for i in idx], [self.tgt[i] for i in idx], idx)

    def __iter__(self) -> Iterator[Batch]:
        groups = self.epoch_groups(self.epoch)
        self.epoch += 1
        for idx in groups:
            yield self.batch(idx)
