"""The synthetic transduction task of Part I: generate it, train on it, score it by length.

A source is a random string of ``n_symbols`` different symbols; the target is the same string
reversed (``task="reverse"``) or copied (``task="copy"``). Symbols use ids 4, 5, ...: ids 0-3 are
the book's special tokens PAD, UNK, BOS, EOS. A batch is the book's one batch type,
:class:`attnbook.batching.Batch` (book/notation.md), as for real translations:

    src      (B, S)      symbol ids, right-padded with PAD_ID
    src_mask (B, S)      True at real tokens
    tgt_in   (B, S + 1)  BOS + target: what the decoder reads
    tgt_out  (B, S + 1)  target + EOS: what it must predict
    tgt_mask (B, S + 1)  True at real target positions (where the loss counts)
    index    (B,)        0 .. B - 1

Because the data are endless and free, the training loop draws a fresh batch at every step and
runs for a fixed number of steps; :func:`accuracy_by_length` then decodes greedily on fresh
sequences of each length.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from . import BOS_ID, EOS_ID, PAD_ID
from .batching import Batch, lengths_mask, pad, translation_loss
from .decoding import greedy_decode
from .loop import fit
from .reproduce import Agreement, NotReproduced, check_result, from_seeds

SYMBOL_OFFSET = 4           # the first symbol's id: 0-3 are PAD, UNK, BOS, EOS
TASKS = ("reverse", "copy")

# The reversal experiment of Part I: the settings chapters 1-3 train and score their models with,
# and that ``python -m attnbook toy_seeds`` repeats for more seeds. One definition, so that the
# chapters and the command cannot drift apart.
PART1 = dict(
    task=dict(n_symbols=20, min_len=2, max_len=20, task="reverse"),  # sources of 2 to 20 symbols
    train=dict(steps=1200, batch_size=64, lr=3e-3, seed=0),          # chapters 1 and 2
    score_steps=600,              # chapter 3: three attention scores, half the budget each
    d_model=64,
    lengths=list(range(2, 21, 2)),                                   # scored at 2, 4, ..., 20
    alignment=dict(length=20, n=200, seed=5),   # the test sources of the attention statistics
)


def vocab_size(n_symbols: int) -> int:
    """Size of the vocabulary for ``n_symbols`` symbols: the 4 special ids come first."""
    return SYMBOL_OFFSET + n_symbols


def to_symbols(ids) -> list[str]:
    """Readable labels for ids: symbols 4, 5, ... become 'a', 'b', ...; specials their pieces.

    ids: a 1-D tensor or list. Handy for printing and for the axes of attention heatmaps.
    """
    special = {PAD_ID: "<pad>", 1: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    out = []
    for i in ids:
        if i in special:
            out.append(special[i])
        elif i - SYMBOL_OFFSET < 26:
            out.append(chr(ord("a") + i - SYMBOL_OFFSET))
        else:
            out.append(f"#{i - SYMBOL_OFFSET}")
    return out


def make_batch(batch_size: int, min_len: int, max_len: int, n_symbols: int,
               task: str = "reverse", generator: torch.Generator | None = None) -> Batch:
    """A batch of random sources with lengths drawn uniformly from [min_len, max_len].

    Use ``min_len == max_len`` for a batch of one length. ``generator`` makes it reproducible.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    if n_symbols < 1:
        raise ValueError(f"n_symbols must be at least 1, got {n_symbols}")
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)  # (B,)
    S = int(lengths.max())
    pos = torch.arange(S)[None, :]                                      # (1, S)
    src_mask = lengths_mask(lengths, S)                                 # (B, S)
    symbols = torch.randint(SYMBOL_OFFSET, SYMBOL_OFFSET + n_symbols, (batch_size, S),
                            generator=generator)                        # (B, S)
    src = symbols.masked_fill(~src_mask, PAD_ID)                        # (B, S)
    if task == "reverse":  # target position j holds source position L - 1 - j
        idx = (lengths[:, None] - 1 - pos).clamp(min=0)                 # (B, S)
        tgt = src.gather(1, idx).masked_fill(~src_mask, PAD_ID)         # (B, S)
    else:
        tgt = src
    B = batch_size
    pad_col = torch.full((B, 1), PAD_ID, dtype=torch.long)
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID, dtype=torch.long), tgt], 1)  # (B, S + 1)
    tgt_out = torch.cat([tgt, pad_col], 1)                              # (B, S + 1)
    tgt_out[torch.arange(B), lengths] = EOS_ID                          # EOS right after the target
    tgt_mask = lengths_mask(lengths + 1, S + 1)                         # (B, S + 1)
    return Batch(src, src_mask, tgt_in, tgt_out, tgt_mask, index=torch.arange(B))


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run the block with ``n`` PyTorch CPU threads, then restore the previous number.

    The models of Part I are small: each operation takes microseconds, and extra threads only add
    synchronisation. One thread is as fast on an idle machine and many times faster on a busy
    one (a shared CI runner, a laptop running other jobs). ``None`` changes nothing.
    """
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_toy(model: torch.nn.Module, steps: int, n_symbols: int, min_len: int, max_len: int,
              task: str = "reverse", batch_size: int = 64, lr: float = 3e-3, clip: float = 1.0,
              seed: int = 0, log_every: int | None = None,
              num_threads: int | None = 1) -> list[float]:
    """Train ``model`` with Adam for exactly ``steps`` steps, a fresh random batch each step.

    The model is called as ``model(src, src_mask, tgt_in)`` and must return logits of shape
    (B, T, V), as every model of the book does (:class:`attnbook.rnn.Seq2Seq`, the Transformer). The data come from a
    generator seeded with ``seed``, so two models trained with the same seed see the same
    batches. Gradients are clipped to norm ``clip``. ``num_threads``: CPU threads during the
    loop (see :func:`cpu_threads`). Returns the loss of every step (a list of ``steps`` floats).
    """
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def next_batch(step):
        return make_batch(batch_size, min_len, max_len, n_symbols, task, generator=gen).to(device)

    def loss_fn(model, b):
        return translation_loss(model(b.src, b.src_mask, b.tgt_in), b.tgt_out)  # PAD ignored

    with cpu_threads(num_threads):
        history = fit(model, next_batch, loss_fn, steps, opt, clip=clip, log_every=log_every)
    model.eval()
    return history


@torch.no_grad()
def greedy_tokens(model, src: torch.Tensor, src_mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """Greedy output as a padded tensor.

    src, src_mask: (B, S), mask True at real tokens. Decodes with
    :func:`attnbook.decoding.greedy_decode` (at most ``max_len`` tokens, EOS included) and returns
    tokens (B, L), L <= max_len: each output followed by EOS if it ended there, then PAD.
    """
    ids = greedy_decode(model, src, src_mask, max_len=max_len)
    ids = [row + [EOS_ID] if len(row) < max_len else row for row in ids]
    return pad(ids)[0].to(src.device)                                    # (B, L)


@torch.no_grad()
def greedy_tokens_with_attention(model, src: torch.Tensor, src_mask: torch.Tensor, max_len: int):
    """:func:`greedy_tokens`, and the attention that produced them: (tokens (B, L), the weights
    (B, L, S) the search used, None for a model without attention). The weights come from one
    teacher-forced pass over the model's own output, ``model.forward_with_attention`` (row t: the
    weights while predicting token t; rows after a sentence's EOS are not meaningful). The GRU
    is deterministic, so these are exactly the search's weights (tests/test_rnn.py checks it).
    """
    tokens = greedy_tokens(model, src, src_mask, max_len)                # (B, L)
    bos = torch.full_like(tokens[:, :1], BOS_ID)
    tgt_in = torch.cat([bos, tokens[:, :-1]], 1)                         # (B, L)
    _, weights = model.forward_with_attention(src, src_mask, tgt_in)     # (B, L, V), (B, L, S)
    return tokens, weights


@torch.no_grad()
def accuracy_by_length(model: torch.nn.Module, lengths: Sequence[int], n_symbols: int,
                       task: str = "reverse", n_per_length: int = 200, seed: int = 1234,
                       num_threads: int | None = 1) -> dict:
    """Greedy-decode fresh sources of each length and score the outputs.

    For each length L, ``n_per_length`` random sources of exactly L symbols are decoded for at
    most L + 1 steps (L symbols then EOS). Returns a dict of lists, one entry per length:

      "length": the lengths;
      "exact":  exact-match accuracy, the fraction of outputs equal to the target, EOS included;
      "token":  per-token accuracy, the fraction of the L target positions predicted right.

    ``num_threads``: CPU threads during the evaluation (see :func:`cpu_threads`).
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    out = {"length": [], "exact": [], "token": []}
    with cpu_threads(num_threads):
        for L in lengths:
            batch = make_batch(n_per_length, L, L, n_symbols, task, generator=gen)
            src, src_mask = batch.src.to(device), batch.src_mask.to(device)
            pred = greedy_tokens(model, src, src_mask, max_len=L + 1).cpu()  # (n, <= L + 1)
            pred = F.pad(pred, (0, L + 1 - pred.shape[1]), value=PAD_ID)    # (n, L + 1)
            correct = pred == batch.tgt_out                                  # (n, L + 1)
            out["length"].append(int(L))
            out["exact"].append(correct.all(1).float().mean().item())
            out["token"].append(correct[:, :L].float().mean().item())
    model.train(was_training)
    return out


@torch.no_grad()
def reversal_alignment(model: torch.nn.Module, n_symbols: int, length: int = 20, n: int = 200,
                       seed: int = 5) -> dict:
    """How closely a reversal model's attention follows the anti-diagonal (chapters 2 and 3).

    Decodes ``n`` fresh sources of ``length`` symbols greedily (:func:`greedy_tokens`) and
    averages, over the sources and the ``length`` symbol steps (the EOS step left out):

      "largest":   the largest weight of each step (1 for a hard look-up);
      "diagonal":  the weight on the symbol being copied, source position S - 1 - t;
      "neighbour": the weight on its right-hand neighbour, S - t;
      "band":      the weight within one position of the anti-diagonal.

    The chapters compute the same numbers inline, with the same operations.
    """
    L = length
    test = make_batch(n, L, L, n_symbols, generator=torch.Generator().manual_seed(seed))
    _, weights = greedy_tokens_with_attention(model, test.src, test.src_mask,
                                              max_len=L + 1)             # (n, T, S)
    w = weights[:, :L]                      # (n, L, L); fewer rows if every output stopped early
    offset = torch.arange(L)[None, :] - (L - 1 - torch.arange(L))[:, None]  # (T, S) i - (S-1-t)
    offset = offset[: w.shape[1]]
    return {"largest": w.max(-1).values.mean().item(),
            "diagonal": (w * (offset == 0)).sum(-1).mean().item(),
            "neighbour": (w * (offset == 1)).sum(-1).mean().item(),
            "band": (w * (offset.abs() <= 1)).sum(-1).mean().item()}


@torch.no_grad()
def copy_alignment(model: torch.nn.Module, n_symbols: int, length: int = 20, n: int = 200,
                   seed: int = 5) -> dict:
    """How closely a copy model's attention follows the main diagonal (chapter 2's ex-02-copy).

    The copy-task analogue of :func:`reversal_alignment`, on the same test sources: decodes ``n``
    fresh sources of ``length`` symbols greedily and averages, over the sources and the
    ``length`` symbol steps (the EOS step left out):

      "largest":  the largest weight of each step (1 for a hard look-up);
      "diagonal": the weight on the symbol being copied, source position t;
      "left":     the weight on its left-hand neighbour, t - 1;
      "right":    the weight on its right-hand neighbour, t + 1;
      "band":     the weight within one position of the diagonal.
    """
    L = length
    test = make_batch(n, L, L, n_symbols, task="copy",
                      generator=torch.Generator().manual_seed(seed))
    _, weights = greedy_tokens_with_attention(model, test.src, test.src_mask,
                                              max_len=L + 1)             # (n, T, S)
    w = weights[:, :L]                      # (n, L, L); fewer rows if every output stopped early
    offset = torch.arange(L)[None, :] - torch.arange(L)[:, None]          # (T, S) i - t
    offset = offset[: w.shape[1]]
    return {"largest": w.max(-1).values.mean().item(),
            "diagonal": (w * (offset == 0)).sum(-1).mean().item(),
            "left": (w * (offset == -1)).sum(-1).mean().item(),
            "right": (w * (offset == 1)).sum(-1).mean().item(),
            "band": (w * (offset.abs() <= 1)).sum(-1).mean().item()}


def run_quantities(run: dict, alignment_keys=()) -> dict:
    """The quantities of a reversal run that the chapters compare with a stored one: exact match
    and per-token accuracy at each length ("exact@20"), the final loss, and the attention
    statistics ``alignment_keys`` ("align.band"). ``run`` is a row of toy_seeds.json, or the
    same keys measured here (``length``, ``exact``, ``token``, ``final_loss``, ``alignment``)."""
    out = {f"{key}@{L}": value for key in ("exact", "token")
           for L, value in zip(run["length"], run[key])}
    out["final_loss"] = run["final_loss"]
    return out | {f"align.{k}": run["alignment"][k] for k in alignment_keys}


def measured(acc: dict, history: Sequence[float], alignment: dict | None = None) -> dict:
    """A run made here as a row of toy_seeds.json: its accuracies by length (``acc``, as
    :func:`accuracy_by_length` returns them), its final loss (the mean of the last 50 of
    ``history``) and, if given, some of its attention statistics (keys of
    :func:`reversal_alignment`)."""
    return {**acc, "final_loss": sum(history[-50:]) / len(history[-50:]),
            "alignment": dict(alignment or {})}


def run_difference(stored: dict, acc: dict, history: Sequence[float],
                   alignment: dict | None = None) -> float:
    """The largest absolute difference between a run stored by ``python -m attnbook run
    toy_seeds`` and the same run made here (:func:`measured`'s arguments). 0.0 when the two are
    the same run, bit for bit; infinity when they were scored on different lengths."""
    if stored["length"] != acc["length"]:
        return float("inf")
    keys = tuple(alignment or {})
    a, b = run_quantities(stored, keys), run_quantities(measured(acc, history, alignment), keys)
    return max(abs(a[q] - b[q]) for q in a)


def check_stored_run(result, name: str, acc: dict, history: Sequence[float],
                     alignment: dict | None = None) -> Agreement:
    """Check that seed 0 of run ``name`` in ``result`` (toy_seeds.json, ``python -m attnbook
    run toy_seeds``) is the run a chapter just made; returns the
    :class:`~attnbook.reproduce.Agreement` (how far apart, by which rule).

    Where the file's run was made with this machine's arithmetic (the same processor, vector
    kernels and PyTorch) the two are the same run bit for bit, and any difference means the file
    is stale. Elsewhere the last bits differ and training amplifies them: the run here may be
    up to :data:`attnbook.reproduce.K_RANGE` times as far from seed 0, in each kind of quantity,
    as the file's seeds are from each other (:func:`attnbook.reproduce.from_seeds`). Beyond
    that: :class:`attnbook.reproduce.NotReproduced` (an AssertionError) saying which rule
    applied, by how much it failed, and the command that remakes the file.
    """
    seeds = {r["seed"]: r for r in result["runs"] if r["name"] == name}
    if seeds[0]["length"] != acc["length"]:
        raise NotReproduced(f"seed 0 of {name!r} was scored on lengths {seeds[0]['length']}, "
                            f"this run on {acc['length']}: score it on the file's lengths")
    keys = tuple(alignment or {})
    runs = {seed: run_quantities(r, keys) for seed, r in sorted(seeds.items())}
    tolerances = from_seeds(list(runs.values()), seeds=list(runs))
    return check_result(result, f"seed 0 of {name!r}",
                        run_quantities(measured(acc, history, alignment), keys), runs[0],
                        tolerances, Path(result.path).name, row=f"{name}/0",
                        remake=f"python -m attnbook run toy_seeds --only {name}")
