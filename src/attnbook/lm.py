"""Decoder-only Transformers (chapter 12): language models, sampling, and translation as one sequence.

A decoder-only model is a causal :class:`attnbook.transformer.SelfAttentionStack`: token ids
(B, L) -> logits (B, L, V), where ``logits[b, t]`` scores the token that follows ``ids[b, :t+1]``.

* **Language modelling.** Each sentence is ``BOS ids EOS``; the loss is the cross-entropy of
  every next token (PAD ignored): :func:`lm_batches` (a :class:`attnbook.batching.SeqBatch`
  whose targets are the next tokens), :func:`lm_loss`.
* **Generation.** :func:`generate` samples one token at a time with a temperature and top-k,
  feeding only the newest token thanks to the key/value cache.
* **Translation as one sequence.** ``BOS source EOS target EOS``: the prompt (``BOS source EOS``)
  is given, the target is predicted, so the loss covers the target tokens only
  (:func:`prompt_target_example`). :class:`DecoderOnlyTranslator` wraps the stack in the
  ``encode``/``decode`` interface of :mod:`attnbook.decoding`, so the book's greedy and beam
  search, ``evaluate.translate`` and BLEU work on it unchanged, and ``attnbook.commands.train`` trains it
  (``--model decoder-only``) with the batches and recipe of chapter 9.

Padding never shifts positions: every token's position counts the real tokens before it in its
own sequence, so a sentence gets the same logits alone and inside a padded batch.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from . import BOS_ID, EOS_ID, PAD_ID
from .batching import SeqBatch, pad, token_batches, translation_loss
from .transformer import SelfAttentionStack, TransformerConfig


# ---------------------------------------------------------------------------------------------
# Language modelling

def next_token_batch(ids: torch.Tensor, mask: torch.Tensor) -> SeqBatch:
    """A language model's batch from ids (B, L) right-padded with PAD and mask (B, L), True at
    real tokens: targets[:, t] = ids[:, t + 1], the next token (PAD after each sequence's last
    token), and scored True where there is a next token to predict."""
    targets = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], PAD_ID)], 1)    # (B, L)
    scored = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1)          # (B, L)
    return SeqBatch(ids, targets, mask, scored)


def lm_batches(seqs: Sequence[Sequence[int]], max_tokens: int, shuffle: bool = True,
               seed: int = 0) -> list[SeqBatch]:
    """Length-bucketed batches of whole sequences (e.g. ``BOS caption EOS``) within a token
    budget: a list of :func:`next_token_batch` (ids (B, L) int64 right-padded with PAD, mask
    True at real tokens, targets the next tokens). Every sequence appears exactly once; nothing
    is truncated."""
    groups = token_batches([len(s) for s in seqs], max_tokens, shuffle=shuffle, seed=seed)
    return [next_token_batch(*pad([seqs[i] for i in g])) for g in groups]


def lm_loss(logits: torch.Tensor, ids: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Next-token cross-entropy: logits (B, L, V) of the model on ids (B, L); position t predicts
    ids[:, t + 1]. It is the book's one loss (:func:`attnbook.batching.translation_loss`, PAD
    ignored) on targets shifted by one."""
    return translation_loss(logits[:, :-1], ids[:, 1:], label_smoothing)


# ---------------------------------------------------------------------------------------------
# Sampling

def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row from logits (B, V) -> (B,) int64.

    The logits are divided by ``temperature`` (below 1 sharpens, above 1 flattens), all but the
    ``top_k`` largest are set to -inf, and the token is drawn from the softmax. temperature = 0
    or top_k = 1 is greedy: the argmax. PAD and BOS are never drawn.
    """
    logits = logits.float().clone()
    logits[:, [PAD_ID, BOS_ID]] = float("-inf")
    if temperature == 0 or top_k == 1:
        return logits.argmax(-1)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)                                                 # (B, V)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def generate(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None,
             generator: torch.Generator | None = None, use_cache: bool = True) -> list[list[int]]:
    """Continue each prompt with a decoder-only model (a causal SelfAttentionStack).

    prompt_ids: (B, P) int64, no padding (usually starting with BOS). Each step samples the next
    token with :func:`sample_next` (``generator`` makes it reproducible) and stops a sequence at
    EOS. With ``use_cache`` only the newest token is fed and the keys and values of the earlier
    ones come from the cache; without it the whole sequence is re-run at every step (same result,
    quadratic work). Returns B lists of new token ids, without the EOS.
    """
    if prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
        raise ValueError(f"prompt_ids must be (B, P) with P >= 1, got {tuple(prompt_ids.shape)}")
    B = prompt_ids.shape[0]
    cache = {} if use_cache else None
    ys, new = prompt_ids, prompt_ids                          # all tokens so far; tokens to feed
    done = torch.zeros(B, dtype=torch.bool, device=prompt_ids.device)
    for _ in range(max_new_tokens):
        logits = model(ys)[:, -1] if cache is None else model(new, cache=cache)[:, -1]  # (B, V)
        tok = sample_next(logits, temperature, top_k, generator).masked_fill(done, PAD_ID)
        new = tok[:, None]                                    # (B, 1)
        ys = torch.cat([ys, new], dim=1)
        done |= tok == EOS_ID
        if done.all():
            break
    out = ys[:, prompt_ids.shape[1]:].tolist()
    return [row[:row.index(EOS_ID)] if EOS_ID in row else [t for t in row if t != PAD_ID]
            for row in out]


# ---------------------------------------------------------------------------------------------
# Translation as one sequence: BOS source EOS target EOS

def prompt_target_example(src: Sequence[int], tgt: Sequence[int]) -> tuple[list[int], list[int]]:
    """The decoder-only training example of one pair (ids without BOS/EOS).

    Returns (inputs, targets), both of length len(src) + len(tgt) + 2: inputs is
    ``BOS src EOS tgt`` and targets is the next token at every input position, PAD over the
    prompt (nothing to learn there: the prompt is given) and ``tgt EOS`` over the target.
    """
    seq = [BOS_ID, *src, EOS_ID, *tgt, EOS_ID]
    n_prompt = len(src) + 2                     # BOS src EOS
    targets = [PAD_ID] * (n_prompt - 1) + seq[n_prompt:]
    return seq[:-1], targets


def token_positions(mask: torch.Tensor) -> torch.Tensor:
    """(B, L) bool, True at real tokens -> (B, L) int64: each token's position = the number of
    real tokens before it in its row (padding gets the position of the next real token)."""
    return (mask.long().cumsum(1) - mask.long()).clamp(min=0)


class DecoderOnlyTranslator(nn.Module):
    """A causal SelfAttentionStack that translates with the sequence ``BOS source EOS target``.

    It has the interface of :class:`attnbook.transformer.Transformer` for the decoders of the
    book: ``encode(src, src_mask)`` returns the *prompt* (no computation: there is no encoder),
    and ``decode(tgt_in, memory, src_mask, tgt_mask=None, cache=None)`` runs the stack over
    prompt + target and returns the logits of the target positions (B, T, V). tgt_in starts with
    BOS, as for the encoder-decoder; here that first prediction comes from the prompt's EOS, so
    tgt_in[:, 0] is not fed. With a cache the first call processes the prompt, later calls one
    token each.

    Prompts are right-padded (B, S + 2); the gap of PAD between a short prompt and its target is
    masked out, and positions count real tokens only (:func:`token_positions`), so padding
    changes nothing.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.stack = SelfAttentionStack(cfg, causal=True)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor):
        """src (B, S), src_mask (B, S) -> memory = (prompt (B, S+2), prompt_mask (B, S+2)):
        BOS src EOS in each row, right-padded."""
        B = src.shape[0]
        lengths = src_mask.sum(1)                                           # (B,)
        col = lambda v: torch.full((B, 1), v, dtype=src.dtype, device=src.device)  # noqa: E731
        prompt = torch.cat([col(BOS_ID), src.masked_fill(~src_mask, PAD_ID), col(PAD_ID)], 1)
        prompt_mask = torch.cat([col(1).bool(), src_mask, col(0).bool()], 1)
        rows = torch.arange(B, device=src.device)
        prompt[rows, lengths + 1] = EOS_ID                                  # right after the source
        prompt_mask[rows, lengths + 1] = True
        return prompt, prompt_mask

    def decode(self, tgt_in: torch.Tensor, memory, src_mask: torch.Tensor | None = None,
               tgt_mask: torch.Tensor | None = None, cache: dict | None = None) -> torch.Tensor:
        """tgt_in (B, T) = BOS y_1 .. y_{T-1} (or, with a non-empty cache, the next tokens only)
        -> logits (B, T, V): row t scores y_{t+1} given the prompt and y_1..y_t."""
        prompt, prompt_mask = memory
        B, T = tgt_in.shape
        new_mask = torch.ones_like(tgt_in, dtype=torch.bool) if tgt_mask is None else tgt_mask
        first = cache is None or not cache
        if first:   # prompt + targets after BOS
            ids = torch.cat([prompt, tgt_in[:, 1:]], 1)                     # (B, P + T - 1)
            mask = torch.cat([prompt_mask, new_mask[:, 1:]], 1)
            pos = token_positions(mask)
        else:       # only the new tokens; positions continue from the cache
            ids, mask = tgt_in, new_mask
            pos = cache["next_pos"][:, None] + token_positions(mask)
        if cache is not None:
            stack_cache = cache.setdefault("stack", {})
            h = self.stack.hidden(ids, mask, cache=stack_cache, positions=pos)
            cache["next_pos"] = pos[:, -1] + mask[:, -1].long()
        else:
            h = self.stack.hidden(ids, mask, positions=pos)                 # (B, L, d_model)
        if first:   # only the target positions get scores (the output layer costs V per token)
            P = prompt.shape[1]
            eos_at = prompt_mask.sum(1) - 1                 # the prompt's EOS: it predicts y_1
            h = torch.cat([h[torch.arange(B, device=ids.device), eos_at][:, None], h[:, P:]], 1)
        return self.stack.out(h)                                            # (B, T, V)

    def forward(self, src, src_mask, tgt_in, tgt_mask=None):
        """Teacher-forced logits (B, T, V), like Transformer.forward: the loss is on the
        target positions only, because only they are returned."""
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, tgt_mask)
