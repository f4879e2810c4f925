"""Attention, the one function the rest of the book calls, and the masks it takes.

Every attention in this book has the same three steps (chapter 3):

1. **score** each key against the query: ``e = score(q, k)``;
2. **normalise** the scores over the keys with a softmax, blocked keys getting exactly zero
   weight: ``alpha = masked_softmax(e, mask)``;
3. **sum** the values with those weights: ``c = alpha @ v``.

Scaled dot-product attention (chapter 4) is the case ``score(q, k) = q . k / sqrt(d_k)``:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Mask convention (book/notation.md): a boolean mask is ``True`` where attention is allowed and
``False`` where it is blocked, as in ``torch.nn.functional.scaled_dot_product_attention``.
A query whose keys are *all* blocked (a fully masked row) gets all-zero weights and a zero output,
never NaN. PyTorch 2.13's fused ``scaled_dot_product_attention`` also returns zeros there, but a
plain ``softmax`` over a row of -inf, and ``nn.MultiheadAttention``, return NaN (chapter 4 shows
all three).
"""
from __future__ import annotations

import math

import torch


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None,
                   dim: int = -1) -> torch.Tensor:
    """Softmax of ``scores`` over ``dim`` in which blocked positions get exactly zero weight.

    scores: (..., S) float tensor.
    mask: bool tensor broadcastable to ``scores``, True = may attend; None allows everything.
    Returns weights of the shape of ``scores``: each row sums to 1 over its allowed positions,
    or is all zeros if none is allowed.
    """
    if mask is None:
        return torch.softmax(scores, dim=dim)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = may attend), got {mask.dtype}")
    scores = scores.masked_fill(~mask, float("-inf"))
    any_allowed = mask.any(dim=dim, keepdim=True)
    scores = scores.masked_fill(~any_allowed, 0.0)  # a fully masked row: no -inf-only softmax
    return torch.softmax(scores, dim=dim) * mask     # ... and its weights become zero here


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError, naming the shapes, unless q (..., T, d_k), k (..., S, d_k), v (..., S, d_v)."""
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(f"q, k, v need at least 2 dimensions (..., length, width); got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"queries and keys must have the same width d_k: q has {q.shape[-1]}, "
                         f"k has {k.shape[-1]} (shapes {tuple(q.shape)} and {tuple(k.shape)})")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"keys and values must have the same length S: k has {k.shape[-2]}, "
                         f"v has {v.shape[-2]} (shapes {tuple(k.shape)} and {tuple(v.shape)})")


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None, causal: bool = False,
                                 scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d_k)) v, written out so that every step can be read and inspected.

    q: (..., T, d_k) queries; k: (..., S, d_k) keys; v: (..., S, d_v) values. The leading
       dimensions (for example (B,) or (B, h)) must match or broadcast.
    mask: bool, broadcastable to (..., T, S), True = query t may attend to key s. A padding mask
       of shape (B, S) must be reshaped first, e.g. ``mask[:, None, None, :]`` for (B, h, T, S)
       (see :func:`padding_mask`).
    causal: also block every key s > t + (S - T), i.e. the future (see :func:`causal_mask`).
    scale: the factor applied to q k^T; default 1 / sqrt(d_k).
    Returns ``(out, weights)``: out (..., T, d_v) and the attention weights (..., T, S).
    """
    check_qkv(q, k, v)
    T, S, d_k = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale                  # (..., T, S)
    if causal:
        c = causal_mask(T, S, device=q.device)                  # (T, S)
        mask = c if mask is None else mask & c
    if mask is not None:
        try:
            torch.broadcast_shapes(mask.shape, scores.shape)
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores "
                             f"(..., T, S) = {tuple(scores.shape)}; a (B, S) padding mask needs "
                             "padding_mask(mask) or mask[:, None, :] first") from None
    weights = masked_softmax(scores, mask)                      # (..., T, S)
    return weights @ v, weights                                 # (..., T, d_v), (..., T, S)


def causal_mask(T: int, S: int | None = None, offset: int = 0, device=None) -> torch.Tensor:
    """(T, S) bool mask, True where query t may see key s (the book's convention: True = may
    attend): s <= t + (S - T) + offset.

    With S == T (the usual case) this is the lower triangle: each position sees itself and the
    past. With S > T the queries are the *last* T of S positions (as when decoding with a cache).
    ``offset`` moves the diagonal, for the experiments with a wrong mask: +1 lets query t see
    key t + 1 (the token it must predict), -1 hides key t from it. PyTorch's ``attn_mask`` of
    ``nn.Transformer`` is the opposite (True = blocked): ``~causal_mask(T)``.
    """
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T + offset)


def padding_mask(mask: torch.Tensor, heads: bool = True) -> torch.Tensor:
    """Turn a (B, S) padding mask (True at real tokens) into one that broadcasts over scores.

    heads=True gives (B, 1, 1, S) for scores (B, h, T, S); heads=False gives (B, 1, S) for
    scores (B, T, S).
    """
    if mask.dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(f"expected a (B, S) bool padding mask, got shape {tuple(mask.shape)} and "
                         f"dtype {mask.dtype}")
    return mask[:, None, None, :] if heads else mask[:, None, :]


def to_torch_mask(mask: torch.Tensor) -> torch.Tensor:
    """The book's mask (True = may attend) in the convention of ``nn.MultiheadAttention`` and
    ``nn.Transformer`` (True = ignore this position): simply its negation."""
    return ~mask
