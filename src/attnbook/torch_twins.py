"""The book's models rebuilt from PyTorch's own modules, with the same weights: the one bridge
between the two, used by the tests, chapters 5, 8 and 10 and the benchmarks.

Two differences of interface, and only two, separate the book's modules from PyTorch's:

* ``nn.MultiheadAttention`` stores W_q, W_k and W_v stacked in one ``in_proj_weight`` of shape
  (3 d_model, d_model) (and ``in_proj_bias``), and W_o as ``out_proj``;
* PyTorch's masks mean the opposite of the book's: True = *ignore* this position
  (:func:`attnbook.attention.to_torch_mask` negates a book mask).

A twin made here computes what the book's model computes, to rounding error (chapter 8 and
tests/test_transformer.py check it). Twins are built without dropout: they are for comparing
outputs, or (``TorchTransformer``) for timing PyTorch's modules on the same work.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from . import PAD_ID
from .attention import causal_mask
from .mha import MultiHeadAttention
from .transformer import Transformer, TransformerConfig, positional_encoding


@torch.no_grad()
def copy_attention(theirs: nn.MultiheadAttention, mine: MultiHeadAttention) -> None:
    """Copy the book's W_q, W_k, W_v, W_o into an ``nn.MultiheadAttention`` of the same size.
    (The other way round is :meth:`attnbook.mha.MultiHeadAttention.load_from_torch`.)"""
    theirs.in_proj_weight.copy_(torch.cat([mine.W_q.weight, mine.W_k.weight, mine.W_v.weight]))
    theirs.in_proj_bias.copy_(torch.cat([mine.W_q.bias, mine.W_k.bias, mine.W_v.bias]))
    theirs.out_proj.load_state_dict(mine.W_o.state_dict())


@torch.no_grad()
def copy_block(theirs: nn.Module, mine: nn.Module) -> None:
    """Copy a book encoder or decoder block into ``nn.TransformerEncoderLayer`` or
    ``nn.TransformerDecoderLayer``: attention(s), feed-forward and LayerNorms (norm1..norm3)."""
    copy_attention(theirs.self_attn, mine.self_attn)
    if hasattr(theirs, "multihead_attn"):                      # a decoder layer: cross-attention
        copy_attention(theirs.multihead_attn, mine.cross_attn)
    theirs.linear1.load_state_dict(mine.ff.linear1.state_dict())
    theirs.linear2.load_state_dict(mine.ff.linear2.state_dict())
    for i in (1, 2, 3):
        if hasattr(theirs, f"norm{i}"):
            getattr(theirs, f"norm{i}").load_state_dict(getattr(mine, f"norm{i}").state_dict())


def _layer_kwargs(cfg: TransformerConfig, dropout: float = 0.0) -> dict:
    return dict(d_model=cfg.d_model, nhead=cfg.h, dim_feedforward=cfg.d_ff, dropout=dropout,
                batch_first=True, norm_first=cfg.norm_first)


def _final_norm(cfg: TransformerConfig):
    """Pre-LN stacks end with a LayerNorm; post-LN ones have none (nn.Transformer's default
    would add one, the paper and the book do not)."""
    return nn.LayerNorm(cfg.d_model) if cfg.norm_first else None


def torch_transformer(model: Transformer, dropout: float = 0.0) -> nn.Transformer:
    """An ``nn.Transformer`` (batch_first) with ``model``'s configuration and a copy of its
    blocks' weights: the encoder-decoder stack only, on embedded inputs (B, S, d_model) and
    (B, T, d_model). Embedding, positions and output layer stay the book's (chapter 8)."""
    c, kw = model.cfg, _layer_kwargs(model.cfg, dropout)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), c.n_layers,
                                norm=_final_norm(c), enable_nested_tensor=False)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), c.n_layers, norm=_final_norm(c))
    twin = nn.Transformer(custom_encoder=enc, custom_decoder=dec, **kw)
    for theirs, mine in zip([*twin.encoder.layers, *twin.decoder.layers],
                            [*model.encoder, *model.decoder]):
        copy_block(theirs, mine)
    if c.norm_first:
        twin.encoder.norm.load_state_dict(model.enc_norm.state_dict())
        twin.decoder.norm.load_state_dict(model.dec_norm.state_dict())
    return twin.to(next(model.parameters()).dtype).eval()


def torch_encoder(model: nn.Module) -> nn.TransformerEncoder:
    """An ``nn.TransformerEncoder`` with the blocks (and final LayerNorm) of a
    :class:`attnbook.transformer.SelfAttentionStack` (chapter 10's decoder-only model is one,
    run with a causal mask), weights copied; on embedded inputs (B, T, d_model)."""
    c = model.cfg
    twin = nn.TransformerEncoder(nn.TransformerEncoderLayer(**_layer_kwargs(c)), c.n_layers,
                                 norm=_final_norm(c), enable_nested_tensor=False)
    for theirs, mine in zip(twin.layers, model.blocks):
        copy_block(theirs, mine)
    if c.norm_first:
        twin.norm.load_state_dict(model.norm.state_dict())
    return twin.to(next(model.parameters()).dtype).eval()


class TorchTransformer(nn.Module):
    """``nn.Transformer`` wrapped like the book's Transformer: the same embedding (scaled by
    sqrt(d_model)), positional encoding, dropout and tied output layer, so both do the same work
    (the appendix times the two).

    forward(src (B, S), src_mask (B, S), tgt_in (B, T), tgt_mask (B, T)) -> logits (B, T, V);
    masks in the book's convention (True = real token), negated for PyTorch's modules.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        kw = _layer_kwargs(cfg, cfg.dropout)
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), cfg.n_layers,
                                    norm=_final_norm(cfg), enable_nested_tensor=False)
        dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), cfg.n_layers,
                                    norm=_final_norm(cfg))
        self.transformer = nn.Transformer(custom_encoder=enc, custom_decoder=dec, **kw)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD_ID)
        self.pos = positional_encoding(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.out.weight = self.embed.weight

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.pos(self.embed(ids) * math.sqrt(self.cfg.d_model)))

    def forward(self, src, src_mask, tgt_in, tgt_mask=None):
        T = tgt_in.shape[1]
        future = ~causal_mask(T, device=tgt_in.device)   # (T, T) PyTorch's way: True = blocked
        x = self.transformer(self.embed_tokens(src), self.embed_tokens(tgt_in), tgt_mask=future,
                             src_key_padding_mask=~src_mask, memory_key_padding_mask=~src_mask,
                             tgt_key_padding_mask=None if tgt_mask is None else ~tgt_mask,
                             tgt_is_causal=True)                          # (B, T, d_model)
        return self.out(x)                                                # (B, T, V)

    @torch.no_grad()
    def load_from_book(self, model: Transformer) -> "TorchTransformer":
        """Copy the weights of the book's ``model`` (same configuration) into this module."""
        self.embed.weight.copy_(model.embed.weight)
        for theirs, mine in zip([*self.transformer.encoder.layers, *self.transformer.decoder.layers],
                                [*model.encoder, *model.decoder]):
            copy_block(theirs, mine)
        if self.cfg.norm_first:
            self.transformer.encoder.norm.load_state_dict(model.enc_norm.state_dict())
            self.transformer.decoder.norm.load_state_dict(model.dec_norm.state_dict())
        return self
