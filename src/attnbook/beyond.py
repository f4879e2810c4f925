"""What comes next (chapter 13): attention that costs less, built from scratch and swapped into
the book's own models.

Three ways round the T x T matrix of softmax attention (chapter 4):

* **Online-softmax attention** (:func:`online_softmax_attention`): the same result as
  :func:`attnbook.attention.scaled_dot_product_attention`, computed block by block with a running
  maximum and a running sum, so that no T x S matrix is ever stored (the idea of FlashAttention).
  The work is still T x S; the memory is linear in T.
* **Linear attention** (:func:`linear_attention`, :class:`LinearAttention`): the exponential of
  the score is replaced by a product of feature maps, phi(q) . phi(k) with phi = elu + 1, so the
  sum over keys can be taken once (non-causal) or as a running sum (causal). A different model,
  not an approximation of the softmax.
* **A gated diagonal recurrence** (:func:`linear_recurrence`, :class:`GatedRecurrence`): a small
  state-space layer, h_t = a_t * h_{t-1} + (1 - a_t) * u_t with a gate a_t chosen by the token,
  in the spirit of S4D, LRU and Mamba.

Each mixer is called like :class:`attnbook.mha.MultiHeadAttention`,
``mixer(x, key_mask=None, causal=False) -> (out (B, T, d_model), None)``, so
:func:`mixer_model` builds chapter 12's ``SelfAttentionStack(cfg, causal=True)`` and swaps the
self-attention of every block for another mixer. :func:`reversal_batch` poses chapter 1's
reversal task to such a decoder-only model as one sequence ``BOS source EOS target EOS``,
a :class:`attnbook.batching.SeqBatch` like every batch of one sequence per example.

Shapes follow book/notation.md; masks are True where attention is allowed (a real token).
"""
from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import PAD_ID
from .attention import causal_mask, check_qkv
from .batching import SeqBatch, pad, translation_loss
from .lm import prompt_target_example
from .loop import fit
from .mha import MultiHeadAttention
from .schedules import warmup_cosine_scheduler
from .toy import make_batch as toy_batch
from .toy import vocab_size
from .transformer import SelfAttentionStack, TransformerConfig
from .utils import count_parameters, deterministic

MIXERS = ("softmax", "linear", "recurrent")


# ---------------------------------------------------------------------------------------------
# Online softmax: exact attention without the T x S matrix

def online_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             mask: torch.Tensor | None = None, causal: bool = False,
                             scale: float | None = None, block_size: int = 128) -> torch.Tensor:
    """softmax(q k^T * scale) v, computed in blocks of ``block_size`` queries x ``block_size`` keys.

    q: (..., T, d_k); k: (..., S, d_k); v: (..., S, d_v), as for
    :func:`attnbook.attention.scaled_dot_product_attention`, with the same ``mask`` (bool,
    broadcastable to (..., T, S), True = may attend; a (B, S) padding mask needs
    ``padding_mask`` first), ``causal`` and ``scale``, and the same result: a query whose keys are
    all blocked gets a zero output. Returns out (..., T, d_v) only: the weights are never stored.

    For each block of queries it keeps a running maximum m, a running sum of exponentials l and a
    running weighted sum of values acc; a new block of scores s updates them as
    m' = max(m, max s), l' = l e^(m - m') + sum e^(s - m'), acc' = acc e^(m - m') + e^(s - m') v,
    and out = acc / l at the end (Milakov and Gimelshein 2018; Dao et al. 2022). The largest
    temporary is one (..., block_size, block_size) block of scores.
    """
    check_qkv(q, k, v)
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    T, S, d_k = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor (True = may attend), got {mask.dtype}")
        try:
            full = torch.broadcast_shapes(mask.shape, (*lead, T, S))
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores "
                             f"(..., T, S) = {(*lead, T, S)}; a (B, S) padding mask needs "
                             "padding_mask(mask) or mask[:, None, :] first") from None
        mask = mask.broadcast_to(full)                  # a view: no T x S copy is made
    out = q.new_zeros(*lead, T, v.shape[-1])            # (..., T, d_v)
    for i in range(0, T, block_size):
        qi = q[..., i:i + block_size, :] * scale        # (..., Bq, d_k)
        Bq = qi.shape[-2]
        m = q.new_full((*lead, Bq, 1), float("-inf"))   # running maximum of each query's scores
        l = q.new_zeros(*lead, Bq, 1)                   # running sum of exp(score - m)
        acc = q.new_zeros(*lead, Bq, v.shape[-1])       # running sum of exp(score - m) v
        for j in range(0, S, block_size):
            if causal and j > i + Bq - 1 + (S - T):
                break                                   # this block and all later ones: future
            s = qi @ k[..., j:j + block_size, :].transpose(-2, -1)  # (..., Bq, Bk)
            allowed = None
            if causal:
                rows = torch.arange(i, i + Bq, device=q.device)[:, None] + (S - T)
                allowed = torch.arange(j, j + s.shape[-1], device=q.device)[None, :] <= rows
            if mask is not None:
                block = mask[..., i:i + Bq, j:j + block_size]
                allowed = block if allowed is None else block & allowed
            if allowed is not None:
                s = s.masked_fill(~allowed, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))       # (..., Bq, 1)
            m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # nothing allowed yet
            p = torch.exp(s - m_safe)                                # (..., Bq, Bk), blocked: 0
            rescale = torch.exp(m - m_safe)                          # old sums to the new max
            l = l * rescale + p.sum(-1, keepdim=True)
            acc = acc * rescale + p @ v[..., j:j + block_size, :]    # (..., Bq, d_v)
            m = m_new
        out[..., i:i + Bq, :] = acc / l.masked_fill(l == 0, 1.0)    # no key allowed: zeros
    return out


# ---------------------------------------------------------------------------------------------
# Linear attention

def feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1, elementwise: positive, so phi(q) . phi(k) > 0 acts as a similarity
    (Katharopoulos et al. 2020)."""
    return F.elu(x) + 1


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                     key_mask: torch.Tensor | None = None, chunk_size: int | None = 64,
                     eps: float = 1e-6) -> torch.Tensor:
    """Linear attention: out_t = phi(q_t) M / (phi(q_t) . z) with M = sum_s phi(k_s) v_s^T and
    z = sum_s phi(k_s), the sums over all keys (non-causal) or over s <= t (causal).

    q: (..., T, d_k); k: (..., S, d_k); v: (..., S, d_v). causal needs S == T.
    key_mask: bool, broadcastable to (..., S), True at real keys (for heads (B, h, S, d_k) pass
    ``mask[:, None, :]``); blocked keys add nothing to the sums. A query with no key gets zeros.
    Returns out (..., T, d_v).

    Non-causal, M is one (..., d_k, d_v) matrix computed once: time and memory linear in S.
    Causal, M_t is a running sum, computed one of two ways (same result):

    * ``chunk_size=None``: every M_t at once by ``cumsum``, which stores a (d_k, d_v) matrix per
      position: memory linear in T, but d_k d_v numbers per position;
    * ``chunk_size=C``: blocks of C positions; inside a block, the attention-like form
      (phi(Q) phi(K)^T, lower triangle) V, and one running (M, z) carried from block to block
      (how fast implementations do it). Memory: C x C per block plus the output.

    :func:`linear_attention_recurrent` is the one-position-at-a-time form (C = 1).
    """
    check_qkv(q, k, v)
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal linear attention needs as many queries as keys; got T = "
                         f"{q.shape[-2]}, S = {k.shape[-2]}")
    phi_q, phi_k = feature_map(q), feature_map(k)                   # (..., T, d_k), (..., S, d_k)
    if key_mask is not None:
        phi_k = phi_k * _key_mask(key_mask, k)[..., None]
    if not causal:
        M = phi_k.transpose(-2, -1) @ v                             # (..., d_k, d_v)
        z = phi_k.sum(-2)[..., None]                                # (..., d_k, 1)
        return (phi_q @ M) / (phi_q @ z + eps)                      # (..., T, d_v)
    if chunk_size is None:
        M = torch.cumsum(phi_k[..., :, None] * v[..., None, :], dim=-3)  # (..., T, d_k, d_v)
        z = torch.cumsum(phi_k, dim=-2)                             # (..., T, d_k)
        num = (phi_q[..., None, :] @ M)[..., 0, :]                  # (..., T, d_v)
        return num / ((phi_q * z).sum(-1, keepdim=True) + eps)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1 (or None), got {chunk_size}")
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    M = q.new_zeros(*lead, q.shape[-1], v.shape[-1])               # sums over earlier blocks
    z = q.new_zeros(*lead, q.shape[-1], 1)
    out = q.new_empty(*lead, q.shape[-2], v.shape[-1])             # (..., T, d_v)
    for i in range(0, q.shape[-2], chunk_size):
        fq, fk = phi_q[..., i:i + chunk_size, :], phi_k[..., i:i + chunk_size, :]  # (..., C, d_k)
        vc = v[..., i:i + chunk_size, :]                            # (..., C, d_v)
        A = (fq @ fk.transpose(-2, -1)).tril()                      # (..., C, C): s <= t
        num = fq @ M + A @ vc                                       # (..., C, d_v)
        den = fq @ z + A.sum(-1, keepdim=True)                      # (..., C, 1)
        out[..., i:i + chunk_size, :] = num / (den + eps)
        M = M + fk.transpose(-2, -1) @ vc
        z = z + fk.sum(-2)[..., None]
    return out


def linear_attention_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               key_mask: torch.Tensor | None = None,
                               eps: float = 1e-6) -> torch.Tensor:
    """Causal linear attention as a recurrent network: one state (M, z) updated per position,
    M_t = M_{t-1} + phi(k_t) v_t^T, z_t = z_{t-1} + phi(k_t),
    out_t = phi(q_t) M_t / (phi(q_t) . z_t).

    Same arguments and result as ``linear_attention(q, k, v, causal=True, key_mask=key_mask)``.
    Besides the output (..., T, d_v), it holds only the state, (..., d_k, d_v): memory that does
    not grow with T, and constant work per generated token. (Under autograd every state is kept
    for the backward pass; train with the parallel form.)
    """
    check_qkv(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"the recurrent form is causal and needs as many queries as keys; got "
                         f"T = {q.shape[-2]}, S = {k.shape[-2]}")
    phi_q, phi_k = feature_map(q), feature_map(k)
    if key_mask is not None:
        phi_k = phi_k * _key_mask(key_mask, k)[..., None]
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    d_k, d_v, T = q.shape[-1], v.shape[-1], q.shape[-2]
    M = q.new_zeros(*lead, d_k, d_v)                                # the state
    z = q.new_zeros(*lead, d_k)
    out = q.new_empty(*lead, T, d_v)
    for t in range(T):
        M = M + phi_k[..., t, :, None] * v[..., t, None, :]         # (..., d_k, d_v)
        z = z + phi_k[..., t, :]                                    # (..., d_k)
        num = (phi_q[..., t, None, :] @ M)[..., 0, :]               # (..., d_v)
        out[..., t, :] = num / ((phi_q[..., t, :] * z).sum(-1, keepdim=True) + eps)
    return out


def _key_mask(key_mask: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The key mask as a float (..., S) multiplier, after checking it."""
    if key_mask.dtype != torch.bool:
        raise TypeError(f"key_mask must be a bool tensor (True = real key), got {key_mask.dtype}")
    try:
        torch.broadcast_shapes(key_mask.shape, k.shape[:-1])
    except RuntimeError:
        raise ValueError(f"key_mask of shape {tuple(key_mask.shape)} does not broadcast to the "
                         f"keys' (..., S) = {tuple(k.shape[:-1])}; for heads (B, h, S, d_k) pass "
                         "mask[:, None, :]") from None
    return key_mask.to(k.dtype)


class LinearAttention(MultiHeadAttention):
    """Multi-head linear attention: MultiHeadAttention's projections W_q, W_k, W_v, W_o and its
    h heads, with :func:`linear_attention` in place of the softmax.

    forward(x (B, T, d_model), key_mask (B, T) bool or None, causal) -> (out (B, T, d_model), None).
    Self-attention only; there are no weights to return.
    """

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None, causal: bool = False,
                need_weights: bool = False, cache: dict | None = None):
        if context is not None or need_weights or cache is not None:
            raise NotImplementedError("LinearAttention does self-attention only, without weights "
                                      "or a key/value cache (its state is the cache: see "
                                      "linear_attention_recurrent)")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"expected x (B, T, {self.d_model}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        if key_mask is not None and (key_mask.shape != (B, T) or key_mask.dtype != torch.bool):
            raise ValueError(f"key_mask must be a ({B}, {T}) bool tensor, True at real tokens; "
                             f"got shape {tuple(key_mask.shape)}, dtype {key_mask.dtype}")
        q, k, v = (self.split_heads(W(x)) for W in (self.W_q, self.W_k, self.W_v))  # (B, h, T, d_k)
        m = None if key_mask is None else key_mask[:, None, :]                       # (B, 1, T)
        out = linear_attention(q, k, v, causal=causal, key_mask=m)          # (B, h, T, d_k)
        return self.W_o(out.transpose(1, 2).reshape(B, T, self.d_model)), None


# ---------------------------------------------------------------------------------------------
# A gated diagonal state-space layer

def linear_recurrence(a: torch.Tensor, b: torch.Tensor,
                      chunk_size: int | None = None) -> torch.Tensor:
    """h_t = a_t * h_{t-1} + b_t for t = 1..T, with h_0 = 0, elementwise (a diagonal state).

    a (values in (0, 1]), b: (..., T, d). Returns h (..., T, d).
    ``chunk_size=None``: one step per position, a state of d numbers (the recurrent form).
    ``chunk_size=C``: blocks of C positions, each computed at once by
    :func:`linear_recurrence_parallel`, plus the state carried in from the block before,
    decayed by the product of the gates so far: h_t = (a_1 ... a_t) h_0 + (parallel part).
    Same result; far fewer, larger operations (Mamba-2 computes its layer this way).
    """
    if a.shape != b.shape or a.dim() < 2:
        raise ValueError(f"a and b must have the same shape (..., T, d); got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    h = b.new_zeros(*b.shape[:-2], 1, b.shape[-1])                  # (..., 1, d)
    out = b.new_empty(b.shape)
    step = 1 if chunk_size is None else chunk_size
    if step < 1:
        raise ValueError(f"chunk_size must be at least 1 (or None), got {chunk_size}")
    for t in range(0, b.shape[-2], step):
        if chunk_size is None:
            h = a[..., t:t + 1, :] * h + b[..., t:t + 1, :]         # (..., 1, d)
            out[..., t:t + 1, :] = h
            continue
        ac, bc = a[..., t:t + step, :], b[..., t:t + step, :]       # (..., C, d)
        hc = linear_recurrence_parallel(ac, bc) + torch.cumprod(ac, dim=-2) * h  # (..., C, d)
        out[..., t:t + step, :] = hc
        h = hc[..., -1:, :]
    return out


def linear_recurrence_parallel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same h as :func:`linear_recurrence`, all positions at once:
    h_t = sum_{s <= t} (a_{s+1} ... a_t) b_s, a causal T x T matrix of decays times b.

    a (values in (0, 1]), b: (..., T, d) -> h (..., T, d). It stores a (..., d, T, T) matrix, like
    softmax attention: it shows that a diagonal recurrence is causal attention whose weights are
    products of gates, with no softmax (Dao and Gu 2024).
    """
    if a.shape != b.shape or a.dim() < 2:
        raise ValueError(f"a and b must have the same shape (..., T, d); got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    T = a.shape[-2]
    L = torch.cumsum(torch.log(a), dim=-2).transpose(-2, -1)       # (..., d, T): log a_1 ... a_t
    decay = L[..., :, None] - L[..., None, :]                       # (..., d, T, T): t, s
    causal = causal_mask(T, device=a.device)                        # (T, T): s <= t
    W = torch.exp(decay.masked_fill(~causal, float("-inf")))        # (..., d, T, T)
    return (W @ b.transpose(-2, -1)[..., None])[..., 0].transpose(-2, -1)  # (..., T, d)


def check_recurrent_call(layer: nn.Module, x, context, key_mask, causal, need_weights, cache,
                         cache_note: str) -> None:
    """The one-line errors of a recurrent mixer called like MultiHeadAttention (this module's
    GatedRecurrence, attnbook.ssm's layers): it is causal, mixes one sequence (B, T, d_model)
    without weights or a key/value cache, and takes a (B, T) bool key_mask or None."""
    name = type(layer).__name__
    if not causal:
        raise ValueError(f"{name} reads left to right and is always causal; for a "
                         "bidirectional layer run a second one on the reversed sequence")
    if context is not None or need_weights or cache is not None:
        raise NotImplementedError(f"{name} mixes one sequence, without weights or a cache "
                                  f"({cache_note})")
    if x.dim() != 3 or x.shape[-1] != layer.d_model:
        raise ValueError(f"expected x (B, T, {layer.d_model}), got {tuple(x.shape)}")
    if key_mask is not None and (key_mask.shape != x.shape[:2] or key_mask.dtype != torch.bool):
        raise ValueError(f"key_mask must be a {tuple(x.shape[:2])} bool tensor, True at real "
                         f"tokens; got {tuple(key_mask.shape)}, {key_mask.dtype}")


class GatedRecurrence(nn.Module):
    """A small gated diagonal state-space layer: (B, T, d_model) -> (B, T, d_model).

        u_t = W_u x_t                              what to write        (B, T, d_state)
        a_t = sigmoid(W_a x_t)                     how much to keep     (B, T, d_state)
        h_t = a_t * h_{t-1} + (1 - a_t) * u_t      the state            (B, T, d_state)
        y_t = W_o (h_t * silu(W_g x_t))            read out, gated      (B, T, d_model)

    Each of the d_state channels is a leaky running average whose rate a_t is chosen by the
    current token (the *selectivity* of Mamba, a GRU's update gate without its non-linear
    recurrence), so the layer trains in parallel over T and generates with a state of d_state
    numbers. W_a's bias starts so that the channels keep between 1/2 and 63/64 of their state
    per step: memories of 2 to 64 tokens, as the diagonal initialisations of S4D and LRU spread
    their time scales.

    Called like MultiHeadAttention: forward(x, key_mask=None, causal=True) -> (y, None). It is
    causal by construction; at a position where key_mask is False the state passes unchanged.
    """

    def __init__(self, d_model: int, d_state: int | None = None):
        super().__init__()
        d_state = d_state or d_model
        self.d_model, self.d_state = d_model, d_state
        self.W_u = nn.Linear(d_model, d_state)
        self.W_a = nn.Linear(d_model, d_state)
        self.W_g = nn.Linear(d_model, d_state)
        self.W_o = nn.Linear(d_state, d_model)
        with torch.no_grad():   # keep rates a = 1 - 1/tau, tau from 2 to 64 tokens
            tau = torch.logspace(math.log10(2), math.log10(64), d_state)
            self.W_a.bias.copy_(torch.logit(1 - 1 / tau))
            self.W_a.weight.mul_(0.1)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None, causal: bool = True,
                need_weights: bool = False, cache: dict | None = None):
        check_recurrent_call(self, x, context, key_mask, causal, need_weights, cache,
                             "its state h_t plays the cache's part")
        a = torch.sigmoid(self.W_a(x))                              # (B, T, d_state)
        b = (1 - a) * self.W_u(x)                                   # (B, T, d_state)
        if key_mask is not None:
            real = key_mask[..., None]                              # (B, T, 1)
            a, b = torch.where(real, a, 1.0), b * real              # padding: state unchanged
        h = linear_recurrence(a, b)                                 # (B, T, d_state)
        return self.W_o(h * F.silu(self.W_g(x))), None              # (B, T, d_model)


# ---------------------------------------------------------------------------------------------
# One model, three mixers

def make_mixer(kind: str, d_model: int, h: int) -> nn.Module:
    """The token mixer named ``kind``: "softmax" (MultiHeadAttention), "linear"
    (LinearAttention) or "recurrent" (GatedRecurrence with d_state = d_model). The three have
    the same number of parameters, 4 d_model^2 + 4 d_model."""
    if kind == "softmax":
        return MultiHeadAttention(d_model, h)
    if kind == "linear":
        return LinearAttention(d_model, h)
    if kind == "recurrent":
        return GatedRecurrence(d_model)
    raise ValueError(f"unknown mixer {kind!r}: choose one of {MIXERS}")


def mixer_model(cfg: TransformerConfig, kind: str) -> SelfAttentionStack:
    """Chapter 12's decoder-only model, ``SelfAttentionStack(cfg, causal=True)``, with the
    self-attention of every block replaced by the mixer ``kind`` (see :func:`make_mixer`).
    forward(ids (B, L), mask (B, L) or None) -> logits (B, L, V), as before."""
    if kind not in MIXERS:
        raise ValueError(f"unknown mixer {kind!r}: choose one of {MIXERS}")
    model = SelfAttentionStack(cfg, causal=True)
    for block in model.blocks:
        block.self_attn = make_mixer(kind, cfg.d_model, cfg.h)
    return model


# ---------------------------------------------------------------------------------------------
# Chapter 1's reversal task for a decoder-only model, and a small training loop

def reversal_batch(batch_size: int, min_len: int, max_len: int, n_symbols: int,
                   generator: torch.Generator | None = None,
                   task: str = "reverse") -> SeqBatch:
    """Chapter 1's task (:func:`attnbook.toy.make_batch`) as one sequence per example,
    ``BOS source EOS target EOS`` (:func:`attnbook.lm.prompt_target_example`), a SeqBatch.

    ids (B, L), L = 2 * longest + 2: BOS src EOS tgt, right-padded; mask True at real tokens.
    targets[b, t] is the token after ids[b, t] where that token belongs to the target (tgt EOS),
    PAD elsewhere (the prompt is given; padding); scored is True there. positions count from the
    separator, outwards on both sides: the source's last token is 1 before EOS, its first is n
    before it, and the target's tokens (EOS included, as the first input) are 0, 1, 2, ... after
    it. For reversal, the input that predicts output j then has position j - 1 and the source
    token it must copy has position j: the alignment is handed to the model, and what it must
    learn is to fetch a token from its context by position (and chapter 1's GRU decoder would
    still have to carry all n tokens in its state).
    """
    b = toy_batch(batch_size, min_len, max_len, n_symbols, task, generator=generator)
    lengths = b.src_mask.sum(1).tolist()
    pairs = [prompt_target_example(b.src[i, :n].tolist(), b.tgt_out[i, :n].tolist())
             for i, n in enumerate(lengths)]
    ids, mask = pad([p[0] for p in pairs])                          # (B, L)
    targets, _ = pad([p[1] for p in pairs])                         # (B, L), PAD over the prompt
    positions, _ = pad([[*range(n + 1, 0, -1), *range(n + 1)] for n in lengths])
    return SeqBatch(ids, targets, mask, scored=targets != PAD_ID, positions=positions)


def train_model(model: nn.Module, next_batch: Callable[[int], SeqBatch], steps: int,
                lr: float = 3e-3, warmup: int = 20, clip: float = 1.0) -> list[float]:
    """AdamW with a linear warm-up and a cosine decay, for ``steps`` steps; returns the losses.

    next_batch(step) -> a SeqBatch whose targets are PAD wherever nothing is scored; the loss is
    the book's one loss, ``translation_loss`` of ``model(ids, mask, positions=positions)``
    against targets.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = warmup_cosine_scheduler(opt, warmup, steps)

    def loss_fn(model, b: SeqBatch):
        logits = model(b.ids, b.mask, positions=b.positions)       # (B, L, V)
        return translation_loss(logits, b.targets)                 # PAD targets ignored

    losses = fit(model, next_batch, loss_fn, steps, opt, sched, clip)
    model.eval()
    return losses


@torch.no_grad()
def reversal_accuracy(model: nn.Module, lengths: Sequence[int], n_symbols: int,
                      n_per_length: int = 200, seed: int = 1234, task: str = "reverse") -> dict:
    """Exact-match and per-token accuracy on fresh sources of each length, teacher-forced.

    Returns {"length": [...], "exact": [...], "token": [...]}, like
    :func:`attnbook.toy.accuracy_by_length` (so ``plot_accuracy_by_length`` draws it). "exact":
    all L target tokens and the EOS right; this equals greedy decoding's exact match, since a
    greedy decoder that is right at every step is fed exactly the teacher-forced inputs.
    "token": the fraction of the L target tokens right, each given the true ones before it.
    """
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    out = {"length": [], "exact": [], "token": []}
    for L in lengths:
        b = reversal_batch(n_per_length, L, L, n_symbols, gen, task)
        pred = model(b.ids, b.mask, positions=b.positions).argmax(-1)   # (n, 2L + 2)
        right = (pred == b.targets)[:, L + 1:]                      # (n, L + 1): tgt, EOS
        out["length"].append(int(L))
        out["exact"].append(right.all(1).float().mean().item())
        out["token"].append(right[:, :L].float().mean().item())
    model.train(was_training)
    return out


# ---------------------------------------------------------------------------------------------
# Chapter 13's reversal experiment: its settings and one run (``python -m attnbook beyond_runs``
# makes every run; the chapter and its exercises use the same settings)

REVERSAL = dict(n_symbols=8, min_len=1, max_len=16, steps=1500, batch_size=32, lr=3e-3,
                lengths=list(range(2, 17, 2)), n_per_length=200,
                model=dict(d_model=32, h=1, d_ff=64, n_layers=1, dropout=0.0, norm_first=True,
                           positional="sinusoidal", max_len=64))


def reversal_config() -> TransformerConfig:
    """The reversal model's configuration: one block, d_model 32, one head."""
    return TransformerConfig(vocab_size=vocab_size(REVERSAL["n_symbols"]), **REVERSAL["model"])


def run_reversal(kind: str, seed: int, mixer: Callable[[], nn.Module] | None = None,
                 steps: int | None = None) -> dict:
    """Train one reversal model; its accuracy by length, parameters and training seconds.

    ``deterministic(seed)``, then ``mixer_model(reversal_config(), kind)``; with ``mixer``, the
    mixer of every block is then replaced by ``mixer()`` (the exercises' variants, e.g.
    ``lambda: LinearAttention(32, 4)``). The data order comes from ``seed`` too. ``steps``:
    fewer than REVERSAL's, for the tests.
    """
    r = REVERSAL
    deterministic(seed)
    model = mixer_model(reversal_config(), kind)
    if mixer is not None:
        for block in model.blocks:
            block.self_attn = mixer()
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    losses = train_model(model, lambda step: reversal_batch(r["batch_size"], r["min_len"],
                                                            r["max_len"], r["n_symbols"], gen),
                         steps or r["steps"], lr=r["lr"])
    seconds = time.perf_counter() - start
    acc = reversal_accuracy(model, r["lengths"], r["n_symbols"], r["n_per_length"])
    last = losses[-50:]
    return {"mixer": kind, "seed": seed, "params": count_parameters(model),
            "train_seconds": round(seconds, 2), "final_loss": round(sum(last) / len(last), 4),
            "exact": [round(a, 4) for a in acc["exact"]],
            "token": [round(a, 4) for a in acc["token"]]}
