"""Multi-head attention (chapter 5), used for self-attention and cross-attention (chapter 6).

h heads attend in parallel, each in its own d_k = d_model / h dimensional subspace:

    head_i = Attention(x_q W_q^i, x_kv W_k^i, x_kv W_v^i)        i = 1..h
    MultiHead(x_q, x_kv) = concat(head_1, ..., head_h) W_o

The h projections W_q^1..W_q^h are stored as one (d_model, d_model) matrix ``W_q`` whose output is
split into h slices, so the number of parameters, 4 d_model^2 (+ biases), does not depend on h.

``d_k`` may be set apart from the heads' value width d_v = d_model / h (the paper's Table 3, row
B, shrinks d_k alone): then W_q and W_k are (d_model, h d_k) and the scores are divided by
sqrt(d_k). By default d_k = d_v = d_model / h, as everywhere in the book.

Masks follow the book's convention (book/notation.md): ``key_mask`` is a (B, S) bool tensor,
True at real key tokens; ``causal=True`` additionally hides future positions from each query.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import causal_mask, scaled_dot_product_attention


class MultiHeadAttention(nn.Module):
    """Multi-head attention with learned projections W_q, W_k, W_v and output projection W_o.

    forward(x, context=None, key_mask=None, causal=False, need_weights=False)
      x: (B, T, d_model), the sequence the queries come from.
      context: (B, S, d_model), the sequence keys and values come from; None means x itself
        (self-attention). In the decoder's cross-attention it is the encoder's output.
      key_mask: (B, S) bool, True at real tokens of ``context`` (or of x); None: no padding.
      causal: query t sees only keys s <= t (decoder self-attention).
      need_weights: also return the attention weights (B, h, T, S); this uses the book's
        from-scratch attention. Otherwise PyTorch's fused ``scaled_dot_product_attention`` runs,
        which is faster and gives the same result (tests/test_mha.py checks this).
      cache: a dict, for incremental decoding (the key/value cache). In self-attention the keys
        and values of x are appended to ``cache["k"], cache["v"]`` (B, h, S, d_k), and the T new
        queries attend to all S cached positions (causal then lets the t-th new query see keys
        up to S - T + t). In cross-attention the context's keys and values are computed on the
        first call and reused afterwards: the encoder's output does not change while decoding.
    Returns (out, weights): out (B, T, d_model); weights (B, h, T, S) or None.

    Setting ``record = True`` makes every call keep its weights and key mask in ``last``
    (``(weights, key_mask)``), which :func:`attnbook.training.loop.attention_entropy` reads without
    changing any model's forward.
    """

    def __init__(self, d_model: int, h: int, dropout: float = 0.0, bias: bool = True,
                 d_k: int | None = None):
        super().__init__()
        if d_model % h != 0:
            raise ValueError(f"d_model={d_model} is not divisible by h={h} heads; each head "
                             "gets d_model / h dimensions, so choose h among the divisors of d_model")
        if d_k is not None and d_k < 1:
            raise ValueError(f"d_k must be at least 1 (or None for d_model / h), got {d_k}")
        self.d_model, self.h, self.d_v = d_model, h, d_model // h
        self.d_k = self.d_v if d_k is None else d_k     # query/key width of each head
        self.W_q = nn.Linear(d_model, h * self.d_k, bias=bias)
        self.W_k = nn.Linear(d_model, h * self.d_k, bias=bias)
        self.W_v = nn.Linear(d_model, d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout
        self.record, self.last = False, None

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, h * n) -> (B, h, L, n): head i holds dimensions i*n .. (i+1)*n - 1 (n is d_k
        for queries and keys, d_v for values)."""
        B, L, width = x.shape
        return x.view(B, L, self.h, width // self.h).transpose(1, 2)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None, causal: bool = False,
                need_weights: bool = False, cache: dict | None = None):
        is_self = context is None
        context = x if context is None else context
        if x.dim() != 3 or x.shape[-1] != self.d_model or context.dim() != 3 \
                or context.shape[-1] != self.d_model or context.shape[0] != x.shape[0]:
            raise ValueError(f"expected x (B, T, {self.d_model}) and context (B, S, {self.d_model}), "
                             f"got {tuple(x.shape)} and {tuple(context.shape)}")
        B, T, _ = x.shape
        q = self.split_heads(self.W_q(x))               # (B, h, T, d_k)
        if cache is not None and not is_self and "k" in cache:
            k, v = cache["k"], cache["v"]               # the memory, projected on the first step
        else:
            k = self.split_heads(self.W_k(context))     # (B, h, S, d_k)
            v = self.split_heads(self.W_v(context))     # (B, h, S, d_v)
            if cache is not None:
                if is_self and "k" in cache:            # earlier positions + the T new ones
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        S = k.shape[2]
        if key_mask is not None and (key_mask.shape != (B, S) or key_mask.dtype != torch.bool):
            raise ValueError(f"key_mask must be a ({B}, {S}) bool tensor, True at real tokens; "
                             f"got shape {tuple(key_mask.shape)}, dtype {key_mask.dtype}")
        mask = None if key_mask is None else key_mask[:, None, None, :]   # (B, 1, 1, S)
        if causal:
            c = causal_mask(T, S, device=x.device)                         # (T, S)
            mask = c if mask is None else mask & c                         # (B, 1, T, S)
        p = self.dropout if self.training else 0.0
        if need_weights or self.record:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask)  # (B, h, T, d_v)
            if p > 0:  # dropout on the weights, as the fused kernel does
                weights = F.dropout(weights, p)
                out = weights @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
            weights = None
        if self.record:
            self.last = (weights.detach(), key_mask)
        out = out.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, d_model): concat heads
        return self.W_o(out), weights


def attention_modules(model: nn.Module) -> dict[str, MultiHeadAttention]:
    """Every MultiHeadAttention of ``model`` by its module name ("encoder.0.self_attn", ...)."""
    return {n: m for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)}


@contextlib.contextmanager
def recording(modules):
    """The one way the book captures attention weights: inside ``with recording(mods):`` every
    module of ``mods`` (a dict or list of MultiHeadAttention, e.g. :func:`attention_modules`)
    keeps ``m.last = (weights (B, h, T, S), key_mask (B, S) or None)`` of its latest forward
    pass. Recording computes attention from scratch (the fused kernel returns no weights); on
    leaving the block it stops and ``last`` is cleared, even after an error."""
    mods = list(modules.values() if isinstance(modules, dict) else modules)
    for m in mods:
        m.record, m.last = True, None
    try:
        yield modules
    finally:
        for m in mods:
            m.record, m.last = False, None


@contextlib.contextmanager
def scaling_heads(mha: MultiHeadAttention, scale: torch.Tensor):
    """Inside ``with scaling_heads(mha, scale):`` head i's output is multiplied by ``scale[i]``
    before W_o mixes the heads (scale: (h,) float; 0 switches a head off, 1 keeps it as it is):
    a forward pre-hook on W_o, removed on leaving the block, even after an error. The head
    ablations (attnbook.experiments.head_ablation) and the page's exported translator
    (attnbook.book.live, whose ``scale`` is an input of the graph) switch heads off this way."""
    if scale.shape != (mha.h,):
        raise ValueError(f"scale must have shape ({mha.h},), one factor per head; got "
                         f"{tuple(scale.shape)}")

    def hook(_, args):
        x = args[0]                               # (B, T, h * d_v): the heads' outputs side by side
        B, T, _ = x.shape
        x = (x.view(B, T, mha.h, mha.d_v) * scale.to(x.dtype).view(1, 1, mha.h, 1)).view(B, T, -1)
        return (x, *args[1:])

    handle = mha.W_o.register_forward_pre_hook(hook)
    try:
        yield mha
    finally:
        handle.remove()
