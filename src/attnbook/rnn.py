"""GRU encoder-decoders for Part I: one without attention, one with additive attention.

Chapter 1 (notebooks/01_bottleneck.ipynb) trains :class:`Seq2Seq` with ``attention=False``: the
decoder sees the source only through one fixed-size vector, a summary of the encoder states.
Chapter 2 (notebooks/02_additive_attention.ipynb) sets ``attention=True``: at every output step
the decoder looks back at all encoder states through :class:`AdditiveAttention` (Bahdanau et al.,
2015).
Chapter 3 (notebooks/03_dot_product_attention.ipynb) swaps in the multiplicative scores of
:class:`LuongAttention` (Luong et al., 2015) with ``Seq2Seq(..., attention=True, score="dot")``
or ``score="general"``.

Attention is written as three steps that every attention in the book shares:

    scores e (B, T, S)  ->  masked softmax: weights alpha (B, T, S)  ->  weighted sum c (B, T, d_v)

The shared base class :class:`ScoredAttention` runs those steps; :class:`AdditiveAttention` and
:class:`LuongAttention` only define how the scores are made. The masked softmax is the one of
:mod:`attnbook.attention` (blocked positions get exactly zero weight, a row with no allowed
position gets zeros, never NaN), so the dot-product score of Part II sits next to this one.

Shapes (book/notation.md): B batch, S source length, T target length, V vocabulary,
d_model the width of embeddings and GRU states. Masks are ``True`` at real tokens (attention
allowed) and ``False`` at padding. Sequences are padded on the right with ``PAD_ID``.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from . import PAD_ID
from .batching import lengths_mask
from .attention import masked_softmax  # shared by every attention in the book: exact zeros


# ---------------------------------------------------------------------------------------------
# Input checks: a wrong shape fails here with a message, not deep inside a matmul


def _check_ids_and_mask(ids: torch.Tensor, mask: torch.Tensor, name: str) -> None:
    """ids: (B, L) int64; mask: (B, L) bool, True at real tokens, padding only on the right."""
    if ids.dim() != 2:
        raise ValueError(f"{name}: expected token ids of shape (B, L), "
                         f"got shape {tuple(ids.shape)}")
    if ids.dtype != torch.long:
        raise ValueError(f"{name}: expected int64 token ids, got dtype {ids.dtype}")
    if mask.shape != ids.shape:
        raise ValueError(f"{name}_mask: expected shape {tuple(ids.shape)} (same as {name}), "
                         f"got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"{name}_mask: expected dtype torch.bool (True = real token), "
                         f"got {mask.dtype}")
    lengths = mask.sum(1)  # (B,)
    if (lengths == 0).any():
        raise ValueError(f"{name}_mask: sequence {int((lengths == 0).nonzero()[0])} has no real "
                         "token; every sequence needs at least one")
    right_padded = lengths_mask(lengths, ids.shape[1])
    if not torch.equal(mask, right_padded):
        raise ValueError(f"{name}_mask: padding must come after the real tokens (right "
                         "padding), with True at real tokens and False at padding")


# ---------------------------------------------------------------------------------------------
# Attention: score -> masked softmax -> weighted sum


def weighted_sum(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Context vectors c_t = sum_i alpha_{t,i} v_i.  weights (B, T, S), values (B, S, d_v)."""
    return weights @ values  # (B, T, d_v)


class ScoredAttention(nn.Module):
    """score -> masked softmax -> weighted sum: the part every attention of Part I shares.

    A subclass sets ``d_query``, ``d_key`` and ``d_proj`` (the width of its projected keys) and
    defines two methods:

      ``project_keys(keys (B, S, d_key)) -> keys_proj (B, S, d_proj)``, what can be computed once
      per source sequence (``W_k k_i``); and
      ``score(query (B, T, d_query), keys_proj (B, S, d_proj)) -> e (B, T, S)``.

    ``forward(query, keys, mask, values=None, keys_proj=None)`` takes a query of shape
    (B, d_query), one per sequence, or (B, T, d_query) for T queries at once; keys of shape
    (B, S, d_key); a mask of shape (B, S), True at real source tokens (attention allowed) and
    False at padding. Values default to the keys (the encoder states). It returns the context
    (B, d_v) and the weights alpha (B, S) -- or (B, T, d_v) and (B, T, S). Padded positions get
    exactly zero weight. Pass ``keys_proj = project_keys(keys)`` to reuse the projected keys
    across decoder steps.
    """

    d_query: int
    d_key: int
    d_proj: int

    def _check_keys(self, keys: torch.Tensor) -> None:
        if keys.dim() != 3 or keys.shape[-1] != self.d_key:
            raise ValueError(f"keys: expected shape (B, S, {self.d_key}), got {tuple(keys.shape)}")

    def forward(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor,
                values: torch.Tensor | None = None, keys_proj: torch.Tensor | None = None):
        single = query.dim() == 2
        if query.dim() not in (2, 3) or query.shape[-1] != self.d_query:
            raise ValueError(f"query: expected shape (B, {self.d_query}) or (B, T, {self.d_query}),"
                             f" got {tuple(query.shape)}")
        B = query.shape[0]
        if keys.dim() != 3 or keys.shape[0] != B or keys.shape[-1] != self.d_key:
            raise ValueError(f"keys: expected shape ({B}, S, {self.d_key}), "
                             f"got {tuple(keys.shape)}")
        S = keys.shape[1]
        if mask.shape != (B, S) or mask.dtype != torch.bool:
            raise ValueError(f"mask: expected a bool tensor of shape ({B}, {S}) (True = real "
                             f"token), got {mask.dtype} of shape {tuple(mask.shape)}")
        values = keys if values is None else values
        if values.dim() != 3 or values.shape[:2] != (B, S):
            raise ValueError(f"values: expected shape ({B}, {S}, d_v), got {tuple(values.shape)}")
        if keys_proj is None:
            keys_proj = self.project_keys(keys)                   # (B, S, d_proj)
        elif keys_proj.shape != (B, S, self.d_proj):
            raise ValueError(f"keys_proj: expected shape ({B}, {S}, {self.d_proj}), "
                             f"got {tuple(keys_proj.shape)}")
        if single:
            query = query[:, None, :]                             # (B, 1, d_query)
        e = self.score(query, keys_proj)                          # (B, T, S)
        alpha = masked_softmax(e, mask[:, None, :])               # (B, T, S)
        c = weighted_sum(alpha, values)                           # (B, T, d_v)
        if single:
            return c[:, 0], alpha[:, 0]                           # (B, d_v), (B, S)
        return c, alpha


class AdditiveAttention(ScoredAttention):
    """Bahdanau's additive attention: e_{t,i} = tanh(q_t W_q + k_i W_k) v, in the book's row
    vectors (the layers ``W_q``, ``W_k`` store the transposes of the formula's matrices).

    Args:
        d_query: width of a query (for the GRU decoder, its state s_{t-1}: d_model).
        d_key: width of a key (an encoder state h_i: d_model).
        d_attn: width of the hidden layer where query and key are added.

    ``forward(query, keys, mask)`` takes a query of shape (B, d_query), one per sequence, or
    (B, T, d_query) for T queries at once; keys of shape (B, S, d_key); a mask of shape (B, S),
    True at real source tokens. Values default to the keys (the encoder states). It returns the
    context (B, d_v) and the weights alpha (B, S) -- or (B, T, d_v) and (B, T, S).

    Keys are projected once per source sequence. ``W_k k_i`` does not depend on the decoder
    step t, only ``W_q q_t`` does, so a decoder that produces T tokens calls
    :meth:`project_keys` once and passes the result as ``keys_proj`` at every step. Projecting
    inside the loop would repeat the same (B, S, d_key) x (d_key, d_attn) product T times:
    O(T S d_key d_attn) work instead of O(S d_key d_attn), with identical results.
    """

    def __init__(self, d_query: int, d_key: int, d_attn: int):
        super().__init__()
        self.d_query, self.d_key, self.d_attn = d_query, d_key, d_attn
        self.d_proj = d_attn
        self.W_q = nn.Linear(d_query, d_attn, bias=False)
        self.W_k = nn.Linear(d_key, d_attn, bias=False)
        self.v = nn.Linear(d_attn, 1, bias=False)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """W_k k_i for every source position: keys (B, S, d_key) -> (B, S, d_attn)."""
        self._check_keys(keys)
        return self.W_k(keys)  # (B, S, d_attn)

    def score(self, query: torch.Tensor, keys_proj: torch.Tensor) -> torch.Tensor:
        """Scores e_{t,i}: query (B, T, d_query), keys_proj (B, S, d_attn) -> (B, T, S)."""
        q = self.W_q(query)                                       # (B, T, d_attn)
        hidden = torch.tanh(q[:, :, None, :] + keys_proj[:, None, :, :])  # (B, T, S, d_attn)
        return self.v(hidden).squeeze(-1)                         # (B, T, S)


class LuongAttention(ScoredAttention):
    """Luong's multiplicative attention: e_{t,i} = q_t . k_i ("dot") or q_t W k_i^T ("general").

    Args:
        d_query: width of a query (for the GRU decoder, its state s_{t-1}: d_model).
        d_key: width of a key (an encoder state h_i: d_model). ``kind="dot"`` compares query and
            key directly, so it needs ``d_key == d_query``.
        kind: ``"dot"`` (no parameters) or ``"general"`` (a bilinear form, the matrix W stored
            as the bias-free ``nn.Linear`` ``W_k`` from d_key to d_query, so ``W_k.weight`` is the
            (d_query, d_key) matrix W of the formula).

    Luong et al.'s third score, "concat", tanh([q_t, k_i] W) v, is :class:`AdditiveAttention`
    (splitting W into the blocks acting on q_t and on k_i gives q_t W_q + k_i W_k).

    Same interface as :class:`AdditiveAttention` (see :class:`ScoredAttention` for the shapes and
    the mask convention). :meth:`project_keys` gives W k_i for "general", computed once per source
    sequence, and the keys unchanged for "dot"; the score is then one batched matrix product,
    query (B, T, d_query) @ keys_proj^T (B, d_query, S) -> (B, T, S), with no (B, T, S, d)
    intermediate tensor.
    """

    KINDS = ("dot", "general")

    def __init__(self, d_query: int, d_key: int, kind: str = "dot"):
        super().__init__()
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        if kind == "dot" and d_query != d_key:
            raise ValueError(f'kind="dot" compares query and key directly, so it needs '
                             f'd_query == d_key, got d_query={d_query} and d_key={d_key}; '
                             f'use kind="general" to learn a (d_query, d_key) matrix')
        self.d_query, self.d_key, self.kind = d_query, d_key, kind
        self.d_proj = d_query
        self.W_k = nn.Linear(d_key, d_query, bias=False) if kind == "general" else None

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """W k_i ("general") or k_i ("dot"): keys (B, S, d_key) -> (B, S, d_query)."""
        self._check_keys(keys)
        return keys if self.W_k is None else self.W_k(keys)      # (B, S, d_query)

    def score(self, query: torch.Tensor, keys_proj: torch.Tensor) -> torch.Tensor:
        """Scores e_{t,i}: query (B, T, d_query), keys_proj (B, S, d_query) -> (B, T, S)."""
        return query @ keys_proj.transpose(1, 2)                  # (B, T, S)

    def extra_repr(self) -> str:
        return f"d_query={self.d_query}, d_key={self.d_key}, kind={self.kind!r}"


SCORES = ("additive", "dot", "general")


def make_attention(score: str, d_model: int, d_attn: int | None = None) -> ScoredAttention:
    """The attention module for a decoder of width d_model whose queries and keys are d_model wide.

    score: "additive" (:class:`AdditiveAttention`, hidden width ``d_attn``, default d_model),
    "dot" or "general" (:class:`LuongAttention`; ``d_attn`` must then be None).
    """
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if score == "additive":
        return AdditiveAttention(d_model, d_model, d_attn or d_model)
    if d_attn is not None:
        raise ValueError(f"d_attn is the hidden width of the additive score; the {score!r} score "
                         f"has no hidden layer, so leave d_attn=None (got {d_attn})")
    return LuongAttention(d_model, d_model, kind=score)


# ---------------------------------------------------------------------------------------------
# Encoder and the two decoders


class Encoder(nn.Module):
    """Embedding + one-layer bidirectional GRU.

    One GRU reads the source left to right, another right to left, each with d_model / 2 units;
    h_i = [forward state at i; backward state at i] sees the whole sequence, most sharply
    around token i (Bahdanau et al., 2015). Packing makes both directions skip the padding.

    forward(src (B, S) int64, src_mask (B, S) bool) returns
      H      (B, S, d_model): the encoder states h_1..h_S (zero at padded positions);
      h_last (B, d_model):    [forward state after the last real token; backward state after
                              the first]: a summary of the whole source in one vector.
    """

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"d_model must be even (two directions of d_model / 2), got {d_model}")
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        self.rnn = nn.GRU(d_model, d_model // 2, batch_first=True, bidirectional=True)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor):
        _check_ids_and_mask(src, src_mask, "src")
        x = self.embed(src)                                       # (B, S, d_model)
        lengths = src_mask.sum(1).cpu()                           # (B,)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                   enforce_sorted=False)
        out, h_n = self.rnn(packed)                               # h_n: (2, B, d_model / 2)
        H, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                total_length=src.shape[1])  # (B, S, d_model)
        h_last = torch.cat([h_n[0], h_n[1]], dim=-1)              # (B, d_model)
        return H, h_last


class Decoder(nn.Module):
    """GRU decoder WITHOUT attention: the source reaches it only through c = h_last.

    Like Cho et al. (2014), the encoder's fixed summary c is the initial state s_0 and is fed, with
    the previous token's embedding, into every step and into the output layer. c is the same
    (B, d_model) vector at every step: this is the bottleneck of chapter 1.
    """

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        self.rnn = nn.GRU(2 * d_model, d_model, batch_first=True)
        self.out = nn.Linear(2 * d_model, vocab_size)

    def prepare(self, H, h_last, src_mask):
        """What every step needs from the source: only the fixed vector c (B, d_model)."""
        return h_last

    def forward(self, tgt_in, H, h_last, src_mask):
        """Teacher forcing over all T steps at once: tgt_in (B, T) -> logits (B, T, V), None."""
        c = self.prepare(H, h_last, src_mask)                     # (B, d_model)
        c_all = c[:, None, :].expand(-1, tgt_in.shape[1], -1)     # (B, T, d_model)
        x = torch.cat([self.embed(tgt_in), c_all], dim=-1)        # (B, T, 2 d_model)
        s, _ = self.rnn(x, h_last[None])                          # (B, T, d_model)
        return self.out(torch.cat([s, c_all], dim=-1)), None      # (B, T, V)

    def step(self, y_prev, s_prev, memory):
        """One step: y_prev (B,) ids, s_prev (B, d_model) -> logits (B, V), s (B, d_model), None."""
        c = memory                                                # (B, d_model)
        x = torch.cat([self.embed(y_prev), c], dim=-1)            # (B, 2 d_model)
        s = self.rnn(x[:, None], s_prev[None])[0][:, 0]           # (B, d_model)
        return self.out(torch.cat([s, c], dim=-1)), s, None


class AttnDecoder(nn.Module):
    """GRU decoder WITH attention: additive (Bahdanau et al., 2015) by default.

    s_0 is the encoder's summary h_last. At step t the previous state s_{t-1} is the query;
    attention over the encoder states h_1..h_S gives the weights alpha_{t,i} and the context
    c_t; then s_t = GRU([emb(y_{t-1}); c_t], s_{t-1}) and logits = W_out [s_t; c_t].

    score: "additive" (:class:`AdditiveAttention` with hidden width d_attn), "dot" or "general"
    (:class:`LuongAttention`, which has no d_attn: pass None). Only the score changes.
    """

    def __init__(self, vocab_size: int, d_model: int, d_attn: int | None,
                 score: str = "additive"):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        self.attention = make_attention(score, d_model, d_attn)
        self.cell = nn.GRUCell(2 * d_model, d_model)
        self.out = nn.Linear(2 * d_model, vocab_size)

    def prepare(self, H, h_last, src_mask):
        """Per-source cache, built once: the states, their key projections, the mask."""
        return H, self.attention.project_keys(H), src_mask        # keys projected ONCE

    def forward(self, tgt_in, H, h_last, src_mask):
        """Teacher forcing: tgt_in (B, T) -> logits (B, T, V), weights alpha (B, T, S).

        The same computation as calling :meth:`step` T times, but the embeddings and the output
        layer, which do not feed the recurrence, run once for all steps.
        """
        memory = self.prepare(H, h_last, src_mask)
        y = self.embed(tgt_in)                                    # (B, T, d_model)
        s, states, contexts, alphas = h_last, [], [], []
        for t in range(tgt_in.shape[1]):
            c, alpha, s = self._recur(y[:, t], s, memory)         # (B, d), (B, S), (B, d)
            states.append(s)
            contexts.append(c)
            alphas.append(alpha)
        sc = torch.cat([torch.stack(states, 1), torch.stack(contexts, 1)], dim=-1)  # (B, T, 2d)
        return self.out(sc), torch.stack(alphas, 1)               # (B, T, V), (B, T, S)

    def _recur(self, y_prev_emb, s_prev, memory):
        """Attend with s_{t-1}, then update the state: returns c_t, alpha_t, s_t."""
        H, keys_proj, src_mask = memory
        c, alpha = self.attention(s_prev, H, src_mask, keys_proj=keys_proj)  # (B, d), (B, S)
        s = self.cell(torch.cat([y_prev_emb, c], dim=-1), s_prev)  # (B, d_model)
        return c, alpha, s

    def step(self, y_prev, s_prev, memory):
        """One step: y_prev (B,), s_prev (B, d_model) -> logits (B, V), s_t, alpha_t (B, S)."""
        c, alpha, s = self._recur(self.embed(y_prev), s_prev, memory)
        return self.out(torch.cat([s, c], dim=-1)), s, alpha      # (B, V)


class Seq2Seq(nn.Module):
    """GRU encoder-decoder, with (``attention=True``) or without attention.

    forward(src (B, S), src_mask (B, S), tgt_in (B, T)) returns logits (B, T, V) for tgt_out,
      like every model of the book; forward_with_attention returns (logits, the attention
      weights (B, T, S)), the weights None without attention.
    Both variants share the bidirectional encoder, the initial decoder state s_0 = c (the
    encoder's summary ``h_last``) and the form of the output layer; they differ only in what the
    decoder reads from the source: the one fixed c, or a fresh c_t at each step.

    score (with ``attention=True``): "additive" (the default, chapter 2; hidden width d_attn,
    default d_model), "dot" or "general" (chapter 3; no d_attn).
    """

    def __init__(self, vocab_size: int, d_model: int = 64, attention: bool = False,
                 d_attn: int | None = None, score: str = "additive"):
        super().__init__()
        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {score!r}")
        if not attention and score != "additive":
            raise ValueError(f"score={score!r} needs attention=True: the model without attention "
                             "computes no scores")
        self.vocab_size, self.d_model, self.attention = vocab_size, d_model, attention
        self.score = score
        self.encoder = Encoder(vocab_size, d_model)
        if attention:
            self.decoder = AttnDecoder(vocab_size, d_model, d_attn, score=score)
        else:
            self.decoder = Decoder(vocab_size, d_model)

    def forward(self, src, src_mask, tgt_in, tgt_mask=None) -> torch.Tensor:
        """Teacher-forced logits (B, T, V). ``tgt_mask`` is accepted for the book's common
        interface and not needed: the recurrence only ever looks back, and the loss ignores the
        outputs at padded target positions."""
        return self.forward_with_attention(src, src_mask, tgt_in, tgt_mask)[0]

    def forward_with_attention(self, src, src_mask, tgt_in, tgt_mask=None):
        """As :meth:`forward`, and also the weights the decoder gave the source at each step:
        (logits (B, T, V), alphas (B, T, S)); alphas is None without attention. The decoder
        computes them in any case, so this pass costs what forward costs."""
        if tgt_in.dim() != 2 or tgt_in.shape[0] != src.shape[0]:
            raise ValueError(f"tgt_in: expected shape ({src.shape[0]}, T), "
                             f"got {tuple(tgt_in.shape)}")
        H, h_last = self.encoder(src, src_mask)                   # (B, S, d), (B, d)
        return self.decoder(tgt_in, H, h_last, src_mask)          # (B, T, V), (B, T, S)

    # The interface of attnbook.decoding (greedy and beam search), shared with the Transformer,
    # so that one harness decodes and scores every model of the book (chapter 9).
    def encode(self, src, src_mask):
        """src (B, S), src_mask (B, S) -> memory: the tuple (H (B, S, d), h_last (B, d))."""
        return self.encoder(src, src_mask)

    def decode(self, tgt_in, memory, src_mask, cache: dict | None = None):
        """tgt_in (B, T) -> logits (B, T, V), re-running the decoder over the whole prefix.

        cache: a dict, empty on the first call, for incremental decoding: then tgt_in holds only
        the new tokens, and the cache keeps the decoder state s after the prefix (and the
        projected keys): a recurrent model's "cache" is just its state.
        """
        H, h_last = memory
        if cache is None:
            return self.decoder(tgt_in, H, h_last, src_mask)[0]
        if not cache:
            cache.update(s=h_last, prepared=self.decoder.prepare(H, h_last, src_mask))
        logits = []
        for t in range(tgt_in.shape[1]):
            step_logits, cache["s"], _ = self.decoder.step(tgt_in[:, t], cache["s"],
                                                           cache["prepared"])
            logits.append(step_logits)                            # (B, V)
        return torch.stack(logits, dim=1)                         # (B, T, V)


def width_like(n_params: int, step: int = 16) -> int:
    """The width d_model, a multiple of ``step``, at which :class:`Seq2Seq` with additive
    attention has the number of parameters nearest ``n_params`` outside its embeddings and its
    output layer (chapter 10's GRU of the Transformer's size: the Transformer's output layer is
    its embedding, so neither count includes one). The count does not depend on the vocabulary."""
    def inside(d: int) -> int:
        with torch.device("meta"):        # shapes only: no memory, no initialisation
            m = Seq2Seq(2, d, attention=True)
        return sum(p.numel() for n, p in m.named_parameters()
                   if "embed" not in n and not n.startswith("decoder.out"))
    return min(range(step, 64 * step + 1, step), key=lambda d: abs(inside(d) - n_params))
