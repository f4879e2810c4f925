"""The Transformer encoder-decoder (chapter 8), built from the book's own pieces.

    src (B, S) --embed*sqrt(d_model)+PE--> [EncoderBlock] x N --> memory (B, S, d_model)
    tgt_in (B, T) --embed*sqrt(d_model)+PE--> [DecoderBlock] x N (self-attn causal, cross-attn
        to memory) --> LayerNorm? --> logits (B, T, V) = x @ E^T  (weights tied with the embedding)

Each block is a residual stack of sub-layers. ``norm_first=False`` is the paper's post-LN,
``x = LayerNorm(x + Sublayer(x))``; ``norm_first=True`` is pre-LN, ``x = x + Sublayer(LayerNorm(x))``,
with one final LayerNorm after the stack. Chapter 8 compares the two.

Masks follow the book's convention: ``src_mask`` (B, S) and ``tgt_mask`` (B, T) are True at real
tokens; the decoder's self-attention is causal.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import PAD_ID
from .mha import MultiHeadAttention
from .positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding


@dataclass
class TransformerConfig:
    vocab_size: int = 8000
    d_model: int = 512
    h: int = 8
    d_ff: int = 2048
    n_layers: int = 6         # N encoder blocks and N decoder blocks
    dropout: float = 0.1
    max_len: int = 1024       # longest sequence the positional encoding must cover
    norm_first: bool = False  # False: post-LN as in the paper; True: pre-LN
    positional: str = "sinusoidal"  # "learned", or "none" (chapter 7's experiment)
    learned_std: float = 0.02       # the learned table's starting standard deviation
    tie_embeddings: bool = True     # one matrix for source, target embeddings and output layer
    d_k: int = 0                    # query/key width per head; 0: d_model / h (Table 3, row B)

    def to_dict(self) -> dict:
        return asdict(self)


def positional_encoding(cfg: TransformerConfig) -> nn.Module:
    """The positional encoding named by ``cfg.positional``: sinusoidal, learned or none."""
    if cfg.positional == "sinusoidal":
        return SinusoidalPositionalEncoding(cfg.d_model, cfg.max_len)
    if cfg.positional == "learned":
        return LearnedPositionalEncoding(cfg.d_model, cfg.max_len, cfg.learned_std)
    if cfg.positional == "none":
        return _NoPositions()
    raise ValueError(f"unknown positional encoding {cfg.positional!r}: choose sinusoidal, "
                     "learned or none")


class _NoPositions(nn.Module):
    def forward(self, x, offset=0):
        return x


class FeedForward(nn.Module):
    """Position-wise feed-forward network: (B, L, d_model) -> (B, L, d_model)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(F.relu(self.linear1(x))))  # (B, L, d_model)


class EncoderBlock(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual connection and LayerNorm."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.h, cfg.dropout, d_k=cfg.d_k or None)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.norm1, self.norm2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(self, x, src_mask, causal: bool = False, cache: dict | None = None):
        """x: (B, S, d_model), src_mask: (B, S) -> (B, S, d_model). causal=True hides later
        positions: the block of a decoder-only model (chapter 12). cache: the self-attention's
        key/value cache when generating one token at a time (then src_mask covers the cached
        positions and the new ones)."""
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), key_mask=src_mask, causal=causal,
                                                cache=cache)[0])
            x = x + self.dropout(self.ff(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, key_mask=src_mask, causal=causal,
                                                           cache=cache)[0]))
            x = self.norm2(x + self.dropout(self.ff(x)))
        return x  # (B, S, d_model)


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to the encoder's output, then feed-forward."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.h, cfg.dropout, d_k=cfg.d_k or None)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.h, cfg.dropout, d_k=cfg.d_k or None)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(cfg.d_model) for _ in range(3))
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(self, x, memory, tgt_mask, src_mask, need_weights: bool = False,
                cache: dict | None = None):
        """x: (B, T, d_model), memory: (B, S, d_model) -> (B, T, d_model); with need_weights,
        also the cross-attention weights (B, h, T, S). cache: {"self": {}, "cross": {}}, the
        key/value caches of the two attention layers when decoding one token at a time."""
        c_self, c_cross = (None, None) if cache is None else (cache["self"], cache["cross"])
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), key_mask=tgt_mask, causal=True,
                                                cache=c_self)[0])
            a, w = self.cross_attn(self.norm2(x), memory, key_mask=src_mask,
                                   need_weights=need_weights, cache=c_cross)
            x = x + self.dropout(a)
            x = x + self.dropout(self.ff(self.norm3(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, key_mask=tgt_mask, causal=True,
                                                           cache=c_self)[0]))
            a, w = self.cross_attn(x, memory, key_mask=src_mask, need_weights=need_weights,
                                   cache=c_cross)
            x = self.norm2(x + self.dropout(a))
            x = self.norm3(x + self.dropout(self.ff(x)))
        return (x, w) if need_weights else x  # (B, T, d_model)


class Transformer(nn.Module):
    """Encoder-decoder Transformer for translation; forward returns logits (B, T, V)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=cfg.d_model ** -0.5)
        with torch.no_grad():
            self.embed.weight[PAD_ID].zero_()
        self.pos = positional_encoding(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layers))
        self.decoder = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        # pre-LN leaves the residual stream un-normalised: one LayerNorm after each stack
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.out.weight = self.embed.weight  # one (V, d_model) matrix, used three times

    def embed_tokens(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """(B, L) ids -> (B, L, d_model): embedding * sqrt(d_model) + positional encoding."""
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"expected a (B, L) int64 tensor of token ids, got shape "
                             f"{tuple(ids.shape)} and dtype {ids.dtype}")
        return self.dropout(self.pos(self.embed(ids) * math.sqrt(self.cfg.d_model), offset))

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """src (B, S) ids, src_mask (B, S) bool -> memory (B, S, d_model)."""
        x = self.embed_tokens(src)
        for block in self.encoder:
            x = block(x, src_mask)
        return self.enc_norm(x)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
               tgt_mask: torch.Tensor | None = None, cache: dict | None = None) -> torch.Tensor:
        """tgt_in (B, T) ids, memory (B, S, d_model) -> logits (B, T, V).

        cache: a dict, empty on the first call, for incremental decoding: then tgt_in holds only
        the tokens that follow those already decoded (usually one), and each layer's keys and
        values of the earlier positions come from the cache instead of being recomputed.
        """
        return self._decode(tgt_in, memory, src_mask, tgt_mask, cache, need_weights=False)[0]

    def decode_with_attention(self, tgt_in: torch.Tensor, memory: torch.Tensor,
                              src_mask: torch.Tensor, tgt_mask: torch.Tensor | None = None,
                              cache: dict | None = None):
        """As :meth:`decode`, and also the cross-attention weights of every decoder layer:
        (logits (B, T, V), a list of N tensors (B, h, T, S)), which source positions each
        target position read."""
        return self._decode(tgt_in, memory, src_mask, tgt_mask, cache, need_weights=True)

    def _decode(self, tgt_in, memory, src_mask, tgt_mask, cache, need_weights: bool):
        """The decoder's pass: (logits (B, T, V), the cross-attention weights, [] without
        need_weights). The weights cost the attention's explicit form instead of
        scaled_dot_product_attention's fused kernel, so only decode_with_attention asks."""
        if cache is not None:
            if not cache:
                cache.update(length=0, layers=[{"self": {}, "cross": {}} for _ in self.decoder])
            offset, layers = cache["length"], cache["layers"]
            cache["length"] += tgt_in.shape[1]
        else:
            offset, layers = 0, [None] * len(self.decoder)
        x = self.embed_tokens(tgt_in, offset)
        cross = []
        for block, layer_cache in zip(self.decoder, layers):
            if need_weights:
                x, w = block(x, memory, tgt_mask, src_mask, need_weights=True, cache=layer_cache)
                cross.append(w)
            else:
                x = block(x, memory, tgt_mask, src_mask, cache=layer_cache)
        logits = self.out(self.dec_norm(x))  # (B, T, V): a score for every vocabulary entry
        return logits, cross

    def forward(self, src, src_mask, tgt_in, tgt_mask=None) -> torch.Tensor:
        """src (B, S), src_mask (B, S), tgt_in (B, T), tgt_mask (B, T) -> logits (B, T, V).

        softmax(logits[b, t]) is the model's probability distribution over the next token
        after tgt_in[b, :t+1]. tgt_mask only matters at padded target positions (whose outputs
        are ignored by the loss); real positions never see padding because of the causal mask.
        """
        check_source(src, src_mask)
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, tgt_mask)

    def forward_with_attention(self, src, src_mask, tgt_in, tgt_mask=None):
        """As :meth:`forward`, and also every decoder layer's cross-attention weights:
        (logits (B, T, V), a list of N tensors (B, h, T, S)), as :meth:`decode_with_attention`
        returns them."""
        check_source(src, src_mask)
        return self.decode_with_attention(tgt_in, self.encode(src, src_mask), src_mask, tgt_mask)


def check_source(src: torch.Tensor, src_mask: torch.Tensor) -> None:
    """A clear error when a source and its mask do not have the same shape (B, S)."""
    if src.shape != src_mask.shape:
        raise ValueError(f"src {tuple(src.shape)} and src_mask {tuple(src_mask.shape)} differ")


class SelfAttentionStack(nn.Module):
    """Token ids (B, T) -> scores (B, T, n_out): embedding, positions, N self-attention blocks.

    With ``causal=True`` each position sees only itself and the past: a decoder-only language
    model (chapters 6 and 10). With ``causal=False`` every position sees the whole sequence: an
    encoder that labels each position (chapters 5 and 7). ``n_out`` defaults to the vocabulary
    size; with ``tie_embeddings`` and n_out == vocab_size the output layer reuses the embedding.

    forward(ids (B, T) int64, mask (B, T) bool or None, True at real tokens) -> (B, T, n_out).
    ``positions`` (B, T) int64 gives each token its own position instead of offset + 0..T-1, so
    that padding can sit anywhere without shifting the real tokens' positions; ``cache`` is the
    key/value cache for generation, as in ``Transformer.decode`` (chapter 12).
    """

    def __init__(self, cfg: TransformerConfig, causal: bool, n_out: int | None = None):
        super().__init__()
        self.cfg, self.causal = cfg, causal
        n_out = n_out or cfg.vocab_size
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=cfg.d_model ** -0.5)
        self.pos = positional_encoding(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.out = nn.Linear(cfg.d_model, n_out, bias=False)
        if cfg.tie_embeddings and n_out == cfg.vocab_size:
            self.out.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None, offset: int = 0,
                cache: dict | None = None, positions: torch.Tensor | None = None):
        """cache: a dict, empty on the first call, for generating one token at a time: then ids
        (and mask, if given) hold only the new tokens, each block's keys and values of the
        earlier positions come from the cache, and offset is the number of cached positions."""
        return self.out(self.hidden(ids, mask, offset, cache, positions))  # (B, T, n_out)

    def hidden(self, ids: torch.Tensor, mask: torch.Tensor | None = None, offset: int = 0,
               cache: dict | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The final hidden states (B, T, d_model), before the output layer ``self.out``: a
        caller that needs the scores of only some positions applies it to those alone."""
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"expected a (B, T) int64 tensor of token ids, got shape "
                             f"{tuple(ids.shape)} and dtype {ids.dtype}")
        B, T = ids.shape
        layers = [None] * len(self.blocks)
        if cache is not None:
            if not cache:
                cache.update(length=0, mask=None, layers=[{} for _ in self.blocks])
            offset, layers = cache["length"], cache["layers"]
            cache["length"] += T
            if mask is not None or cache["mask"] is not None:  # keys: cached + new positions
                ones = lambda n: torch.ones(B, n, dtype=torch.bool, device=ids.device)  # noqa: E731
                old = cache["mask"] if cache["mask"] is not None else ones(offset)
                mask = cache["mask"] = torch.cat([old, ones(T) if mask is None else mask], 1)
        pos = offset if positions is None else positions
        x = self.dropout(self.pos(self.embed(ids) * math.sqrt(self.cfg.d_model), pos))
        for block, layer_cache in zip(self.blocks, layers):
            x = block(x, mask, causal=self.causal, cache=layer_cache)  # (B, T, d_model)
        return self.norm(x)                                       # (B, T, d_model)
