"""Turning a trained model into translations: greedy and beam search (chapter 9).

The decoder outputs, at each position, a score (logit) for every token of the vocabulary;
softmax turns them into the probability of the next token given the source and the prefix. A
translation is built one token at a time, starting from BOS, until the model emits EOS:

* greedy search takes the most probable token at every step;
* beam search keeps, for each sentence, the k most probable unfinished prefixes (the *alive*
  hypotheses) and extends each by every token, so that a choice that looks worse now can win
  later. Of the 2k best candidates, those among the k best that end in EOS move to a set of
  *finished* hypotheses, ranked by log-probability / ((5 + length) / 6) ** alpha, the length
  penalty of Wu et al. (2016) (summing more negative log-probabilities otherwise always favours
  short outputs); the k best that do not end in EOS stay alive. The search of a sentence stops
  when no alive hypothesis can beat its best finished one any more, or at its maximum length,
  by default its source length + 50 tokens (Vaswani et al., 2017, section 6.1).

Both work on any model with the two methods of :class:`attnbook.transformer.Transformer`:
``encode(src, src_mask) -> memory`` and ``decode(tgt_in, memory, src_mask) -> logits (B, T, V)``;
the GRU models of :mod:`attnbook.rnn` have them too (their memory is a tuple of tensors), and
these are the book's only decoders, Part I's included (:func:`attnbook.toy.greedy_tokens` pads
greedy outputs into a tensor and reads their attention by teacher forcing).
Outputs are lists of token ids without BOS and EOS; PAD and BOS are never chosen.
:func:`greedy_generate` is the decoder-only counterpart of chapter 6's toy tasks: one model
reads the prompt and what it wrote so far and writes the next token.

With ``use_cache=True`` (the default) each step feeds only the newest token, and the model keeps
what it computed for the earlier ones in a cache (``decode(..., cache=dict)``): the keys and
values of every decoder layer for the Transformer, the recurrent state for a GRU. Without the
cache, step t re-runs the decoder over all t tokens of the prefix; the result is the same
(tests/test_decoding.py checks it) but not the work. Over a whole output of n tokens, without
the cache the projections, feed-forward layers and output layer cost O(n^2) and self-attention
O(n^3) (step t recomputes all t positions, each attending to up to t keys); with it they cost
O(n) and O(n^2) (step t computes one position, which attends to t cached keys). Chapter 9 and the
appendix count the operations.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import BOS_ID, EOS_ID, PAD_ID
from .batching import pad


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


def _take_rows(memory, rows: torch.Tensor):
    """Rows ``rows`` of a memory (a tensor or the GRU models' tuple of tensors)."""
    if isinstance(memory, tuple):
        return tuple(m.index_select(0, rows) for m in memory)
    return memory.index_select(0, rows)


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


def _max_lens(src_mask: torch.Tensor, max_len) -> torch.Tensor:
    """The longest output (in tokens, EOS included) allowed for each sentence, (B,): the source
    length + 50 (Vaswani et al., 2017, section 6.1) when ``max_len`` is None, else ``max_len``
    (an int, or a (B,) tensor of per-sentence limits)."""
    if max_len is None:
        return src_mask.sum(dim=1) + 50
    return torch.as_tensor(max_len, device=src_mask.device).expand(src_mask.shape[0])


@torch.no_grad()
def greedy_generate(model: torch.nn.Module, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """Chapter 6's greedy generation: prompt (B, P) ids -> the n_new tokens the model writes
    (B, n_new), each the argmax of the whole vocabulary after the last token, with the whole
    sequence run again at every step (no cache, no stop at EOS)."""
    model.eval()
    ids = prompt
    for _ in range(n_new):
        next_id = model(ids)[:, -1].argmax(dim=-1)                # (B,)
        ids = torch.cat([ids, next_id[:, None]], dim=1)
    return ids[:, prompt.shape[1]:]


@torch.no_grad()
def greedy_decode(model, src: torch.Tensor, src_mask: torch.Tensor,
                  max_len=None, use_cache: bool = True,
                  min_len: int = 0) -> list[list[int]]:
    """Most probable token at each step, for a batch. src, src_mask: (B, S). Returns B id lists.

    A sentence stops at EOS or after its ``max_len`` tokens (then the output is incomplete: no
    EOS was chosen). ``max_len=None`` means the sentence's source length + 50; an int or a (B,)
    tensor sets the limits. EOS is not allowed before ``min_len`` tokens (the benchmarks use it
    to fix the output length).
    """
    memory = model.encode(src, src_mask)                                  # (B, S, d_model)
    B = src.shape[0]
    limit = _max_lens(src_mask, max_len)                                  # (B,)
    cache = {} if use_cache else None
    ys = torch.full((B, 1), BOS_ID, dtype=torch.long, device=src.device)  # (B, 1)
    done = limit <= 0                                                     # (B,)
    for t in range(1, int(limit.max()) + 1):                  # t: output tokens after this step
        if done.all():
            break
        next_tok = _next_log_probs(model, ys, memory, src_mask, cache, min_len).argmax(-1)  # (B,)
        next_tok = next_tok.masked_fill(done, PAD_ID)
        ys = torch.cat([ys, next_tok[:, None]], dim=1)
        done |= (next_tok == EOS_ID) | (t >= limit)
    return [_strip([t for t in row if t != PAD_ID]) for row in ys[:, 1:].tolist()]


def length_penalty(length: torch.Tensor | int, alpha: float):
    """GNMT length penalty ((5 + length) / 6) ** alpha; alpha = 0 means no penalty."""
    return ((5.0 + length) / 6.0) ** alpha


def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (B, n, ...), idx (B, m) -> x[b, idx[b, j]]: (B, m, ...)."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], idx]


@torch.no_grad()
def beam_search(model, src: torch.Tensor, src_mask: torch.Tensor, beam_size: int = 4,
                max_len=None, alpha: float = 0.6,
                return_scores: bool = False, use_cache: bool = True, min_len: int = 0):
    """Beam search for a batch. src, src_mask: (B, S). Returns B id lists (and their scores).

    Each of the B sentences keeps k = ``beam_size`` *alive* hypotheses (searched together as
    B * k rows of one batch) and a set of at most k *finished* ones (ended by EOS). Each step:

    1. every alive hypothesis is extended by every token: k * V candidates per sentence, ranked
       by log-probability; the 2k best are kept;
    2. those of the k best that end in EOS are finished: their score is log-prob /
       length_penalty(length with EOS, alpha); the finished set keeps its k best scores;
    3. the k best candidates that do not end in EOS are the new alive hypotheses (2k candidates
       hold at least k of them, as at most k end in EOS).

    A sentence stops when no alive hypothesis can beat its best finished one: log-probabilities
    only fall as a hypothesis grows and (alpha >= 0) the penalty grows with the length, so the
    best score an alive hypothesis can still reach is its log-prob / length_penalty(max_len + 1,
    alpha). It stops too after ``max_len`` tokens (default: its source length + 50; an int or a
    (B,) tensor sets it). Its answer is its best finished hypothesis or, if none finished, its
    best alive one, scored log-prob / length_penalty(max_len, alpha) (no EOS counted). The search
    ends when every sentence has stopped. beam_size = 1 with alpha = 0 is greedy search (the best
    candidate is either EOS, and then nothing alive can beat it, or the one hypothesis kept).
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0 (the stopping rule relies on it), got {alpha}")
    B, k = src.shape[0], beam_size
    device, ninf = src.device, float("-inf")
    limit = _max_lens(src_mask, max_len)                                  # (B,)
    if (limit < 1).any():
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    max_penalty = length_penalty(limit.float() + 1, alpha)               # (B,) for the stop
    memory = _repeat_rows(model.encode(src, src_mask), k)                 # (B*k, S, d_model)
    src_mask_k = src_mask.repeat_interleave(k, dim=0)                     # (B*k, S)
    cache = {} if use_cache else None
    alive = torch.full((B, k, 1), BOS_ID, dtype=torch.long, device=device)  # (B, k, t) with BOS
    alive_lp = torch.full((B, k), ninf, device=device)
    alive_lp[:, 0] = 0.0                    # at the start all rows are the same: keep one
    fin = torch.full((B, k, 1), PAD_ID, dtype=torch.long, device=device)  # (B, k, t), PAD after EOS
    fin_score = torch.full((B, k), ninf, device=device)                    # (B, k), best first
    hyps, scores = [None] * B, [None] * B
    active = torch.arange(B, device=device)  # (B,): the input rows of the sentences still searched
    for t in range(1, int(limit.max()) + 1):          # t: tokens (EOS included) after this step
        logp = _next_log_probs(model, alive.view(B * k, t), memory, src_mask_k, cache, min_len)
        V = logp.shape[-1]                  # 1. extend every alive hypothesis by every token
        cand = (alive_lp[..., None] + logp.view(B, k, V)).view(B, k * V)  # (B, k*V)
        top_lp, flat = cand.topk(2 * k, dim=-1)                           # (B, 2k), best first
        beam, tok = flat // V, flat % V                                   # (B, 2k)
        seqs = torch.cat([_gather(alive, beam), tok[..., None]], dim=-1)  # (B, 2k, t+1)
        is_eos = tok == EOS_ID                                            # (B, 2k)
        # 2. the k best candidates that end in EOS join the finished set
        new_score = (top_lp[:, :k] / length_penalty(t, alpha)).masked_fill(~is_eos[:, :k], ninf)
        pool = torch.cat([F.pad(fin, (0, 1), value=PAD_ID), seqs[:, :k]], 1)
        fin_score, pick = torch.cat([fin_score, new_score], 1).topk(k, dim=-1)  # (B, k)
        fin = _gather(pool, pick)                                         # (B, k, t+1)
        # 3. the k best that do not end in EOS stay alive
        alive_lp, pick = top_lp.masked_fill(is_eos, ninf).topk(k, dim=-1)  # (B, k)
        alive = _gather(seqs, pick)                                       # (B, k, t+1)
        if cache is not None:               # each alive hypothesis keeps its own cache rows
            rows = _gather(beam, pick) + torch.arange(B, device=device)[:, None] * k
            _select_rows(cache, rows.view(-1))
        # a sentence stops when its best finished score beats what any alive one can reach
        stop = (fin_score[:, 0] >= alive_lp[:, 0] / max_penalty) | (t >= limit)  # (B,)
        for b in stop.nonzero().view(-1).tolist():
            i = int(active[b])              # the sentence's place in the input batch
            if fin_score[b, 0] > ninf:
                hyps[i], scores[i] = _strip(fin[b, 0, 1:].tolist()), float(fin_score[b, 0])
            else:                           # nothing finished by max_len: the best alive one
                hyps[i] = alive[b, 0, 1:].tolist()
                scores[i] = float(alive_lp[b, 0] / length_penalty(t, alpha))
        if stop.all():
            break
        if stop.any():                      # the search goes on for the other sentences only
            keep = (~stop).nonzero().view(-1)                                 # (B',)
            rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)  # (B'*k,)
            alive, alive_lp, fin, fin_score = alive[keep], alive_lp[keep], fin[keep], fin_score[keep]
            limit, max_penalty, active = limit[keep], max_penalty[keep], active[keep]
            memory, src_mask_k = _take_rows(memory, rows), src_mask_k[rows]
            if cache is not None:
                _select_rows(cache, rows)
            B = keep.numel()
    return (hyps, scores) if return_scores else hyps


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


# ---------------------------------------------------------------------------------------------
# Text in, text out

MAX_SOURCE_TOKENS = 256  # longer inputs are refused, never cut: Multi30k's longest has ~80


@torch.no_grad()
def translate(model, tokenizer, sentences: list[str], beam_size: int = 4, alpha: float = 0.6,
              batch_size: int = 64, device=None, max_extra: int = 50,
              max_source_tokens: int = MAX_SOURCE_TOKENS) -> list[str]:
    """Translate a list of sentences; the order of the output matches the input.

    Sentences are decoded in batches of similar length; each may produce up to its source
    length + ``max_extra`` tokens. beam_size = 1 is greedy search. An empty sentence, or one of
    more than ``max_source_tokens`` tokens, is an error that names it (nothing is truncated).
    """
    device = device or next(model.parameters()).device
    model.eval()
    ids = tokenizer.encode_batch(sentences, max_len=max_source_tokens)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [None] * len(ids)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        src, mask = pad([ids[i] for i in idx])
        src, mask = src.to(device), mask.to(device)
        max_len = mask.sum(dim=1) + max_extra          # (B,): each sentence's own limit
        if beam_size == 1:
            hyps = greedy_decode(model, src, mask, max_len=max_len)
        else:
            hyps = beam_search(model, src, mask, beam_size=beam_size, max_len=max_len, alpha=alpha)
        for i, h in zip(idx, hyps):
            out[i] = tokenizer.decode(h)
    return out
