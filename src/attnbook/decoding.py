"""Turning a trained model into translations: greedy and beam search (chapter 9).

The decoder outputs, at each position, a score (logit) for every token of the vocabulary;
softmax turns them into the probability of the next token given the source and the prefix. A
translation is built one token at a time, starting from BOS, until the model emits EOS:

* greedy search takes the most probable token at every step;
* beam search keeps the k most probable prefixes (the "beam") and extends each by every token,
  so that a choice that looks worse now can win later. A finished hypothesis is ranked by its
  log-probability divided by a length penalty, ((5 + length) / 6) ** alpha (Wu et al., 2016),
  since summing more negative log-probabilities otherwise always favours short outputs.

Both work on any model with the two methods of :class:`attnbook.transformer.Transformer`:
``encode(src, src_mask) -> memory`` and ``decode(tgt_in, memory, src_mask) -> logits (B, T, V)``;
the GRU models of :mod:`attnbook.rnn` have them too (their memory is a tuple of tensors).
Outputs are lists of token ids without BOS and EOS.

With ``use_cache=True`` (the default) each step feeds only the newest token, and the model keeps
what it computed for the earlier ones in a cache (``decode(..., cache=dict)``): the keys and
values of every decoder layer for the Transformer, the recurrent state for a GRU. Without the
cache, step t re-runs the decoder over all t tokens of the prefix; the result is the same
(tests/test_decoding.py checks it) but the work grows with the square of the output length.
"""
from __future__ import annotations

import torch

from . import BOS_ID, EOS_ID, PAD_ID


def _next_log_probs(model, ys, memory, src_mask, cache=None, min_len=0):
    if cache is None:
        logits = model.decode(ys, memory, src_mask)[:, -1].float()  # (N, V): the whole prefix
    else:                                                             # only the newest token
        logits = model.decode(ys[:, -1:], memory, src_mask, cache=cache)[:, -1].float()
    banned = [PAD_ID, BOS_ID] + ([EOS_ID] if ys.shape[1] <= min_len else [])
    logits[:, banned] = float("-inf")                           # never generate PAD or BOS
    return torch.log_softmax(logits, dim=-1)                    # (N, V)


def _repeat_rows(memory, k: int):
    """Repeat each sentence's memory k times along the batch: a tensor or a tuple of tensors
    (the GRU models' memory is (H, h_last))."""
    if isinstance(memory, tuple):
        return tuple(m.repeat_interleave(k, dim=0) for m in memory)
    return memory.repeat_interleave(k, dim=0)


def _select_rows(cache, rows: torch.Tensor):
    """Keep rows ``rows`` (along the batch) of every tensor in a cache, in place: when beam search
    reorders its hypotheses, each one's cached keys and values (or state) must follow it."""
    items = cache.items() if isinstance(cache, dict) else enumerate(cache)
    for key, val in items:
        if isinstance(val, torch.Tensor):
            cache[key] = val.index_select(0, rows)
        elif isinstance(val, (dict, list)):
            _select_rows(val, rows)
        elif isinstance(val, tuple):
            cache[key] = tuple(v.index_select(0, rows) for v in val)


def _strip(row: list[int]) -> list[int]:
    return row[:row.index(EOS_ID)] if EOS_ID in row else row


@torch.no_grad()
def greedy_decode(model, src: torch.Tensor, src_mask: torch.Tensor,
                  max_len: int = 100, use_cache: bool = True,
                  min_len: int = 0) -> list[list[int]]:
    """Most probable token at each step, for a batch. src, src_mask: (B, S). Returns B id lists.

    Stops at EOS or after ``max_len`` tokens (then the output is incomplete: no EOS was chosen).
    EOS is not allowed before ``min_len`` tokens (the benchmarks use it to fix the output length).
    """
    memory = model.encode(src, src_mask)                                  # (B, S, d_model)
    B = src.shape[0]
    cache = {} if use_cache else None
    ys = torch.full((B, 1), BOS_ID, dtype=torch.long, device=src.device)  # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        next_tok = _next_log_probs(model, ys, memory, src_mask, cache, min_len).argmax(-1)  # (B,)
        next_tok = next_tok.masked_fill(done, PAD_ID)
        ys = torch.cat([ys, next_tok[:, None]], dim=1)
        done |= next_tok == EOS_ID
        if done.all():
            break
    return [_strip([t for t in row if t != PAD_ID]) for row in ys[:, 1:].tolist()]


def length_penalty(length: torch.Tensor | int, alpha: float):
    """GNMT length penalty ((5 + length) / 6) ** alpha; alpha = 0 means no penalty."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(model, src: torch.Tensor, src_mask: torch.Tensor, beam_size: int = 4,
                max_len: int = 100, alpha: float = 0.6,
                return_scores: bool = False, use_cache: bool = True, min_len: int = 0):
    """Beam search for a batch. src, src_mask: (B, S). Returns B id lists (and their scores).

    Each of the B sentences keeps ``beam_size`` hypotheses, searched together as one batch of
    B * beam_size rows. A hypothesis that has emitted EOS stays in the beam with its score frozen
    (it is extended by PAD at no cost). At the end, each sentence's hypotheses are ranked by
    log-probability / length_penalty(length, alpha), where length counts the EOS.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    B, k = src.shape[0], beam_size
    device = src.device
    memory = model.encode(src, src_mask)                                  # (B, S, d_model)
    memory = _repeat_rows(memory, k)                                      # (B*k, S, d_model)
    src_mask_k = src_mask.repeat_interleave(k, dim=0)                     # (B*k, S)
    cache = {} if use_cache else None
    ys = torch.full((B * k, 1), BOS_ID, dtype=torch.long, device=device)  # (B*k, 1)
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0                      # at the start all beams are the same: keep one
    finished = torch.zeros(B, k, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, k, device=device)
    for _ in range(max_len):
        logp = _next_log_probs(model, ys, memory, src_mask_k, cache, min_len).view(B, k, -1)
        V = logp.shape[-1]
        # a finished hypothesis can only be continued by PAD, at no cost
        frozen = torch.full_like(logp, float("-inf"))
        frozen[..., PAD_ID] = 0.0
        logp = torch.where(finished[..., None], frozen, logp)
        cand = (scores[..., None] + logp).view(B, k * V)                  # (B, k*V)
        scores, flat = cand.topk(k, dim=-1)                               # (B, k)
        beam, tok = flat // V, flat % V                                   # (B, k)
        rows = (beam + torch.arange(B, device=device)[:, None] * k).view(-1)  # (B*k,)
        ys = torch.cat([ys[rows], tok.view(-1, 1)], dim=1)
        if cache is not None:
            _select_rows(cache, rows)           # each surviving hypothesis keeps its own cache
        was_finished = finished.gather(1, beam)
        lengths = lengths.gather(1, beam) + (~was_finished).float()
        finished = was_finished | (tok == EOS_ID)
        if finished.all():
            break
    final = scores / length_penalty(lengths, alpha)                      # (B, k)
    best = final.argmax(dim=-1)                                          # (B,)
    out = ys.view(B, k, -1)[torch.arange(B, device=device), best, 1:].tolist()
    hyps = [_strip([t for t in row if t != PAD_ID]) for row in out]
    if return_scores:
        return hyps, final[torch.arange(B, device=device), best].tolist()
    return hyps


@torch.no_grad()
def sequence_log_prob(model, src: torch.Tensor, src_mask: torch.Tensor, hyp: list[int],
                      complete: bool = True) -> float:
    """log p(hyp [+ EOS] | src) for one sentence (src: (1, S)); used to check the searches."""
    ids = [BOS_ID, *hyp] + ([EOS_ID] if complete else [])
    ys = torch.tensor([ids[:-1]], device=src.device)
    logits = model.decode(ys, model.encode(src, src_mask), src_mask)[0].float()  # (T, V)
    logits[:, [PAD_ID, BOS_ID]] = float("-inf")
    logp = torch.log_softmax(logits, dim=-1)
    return float(logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum())
