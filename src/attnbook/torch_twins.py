"""The book's models rebuilt from PyTorch's own modules, with the same weights: the one bridge
between the two, both directions (``*_to_torch``: the book's weights into PyTorch's modules;
``*_from_torch``: PyTorch's into the book's), used by the tests, chapters 5, 6, 8 and 10 and the
benchmarks.

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


# --- The weight bridge, both directions: each function takes (the book's module, PyTorch's) ---

def _check_attention(mine: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    if theirs.embed_dim != mine.d_model or theirs.num_heads != mine.h \
            or not theirs._qkv_same_embed_dim or mine.d_k != mine.d_v:
        raise ValueError("nn.MultiheadAttention must have the same d_model and h, and "
                         "kdim = vdim = d_model; this module must have d_k = d_model / h "
                         "(PyTorch's module has no separate key width)")


@torch.no_grad()
def attention_to_torch(mine: MultiHeadAttention, theirs: nn.MultiheadAttention
                       ) -> nn.MultiheadAttention:
    """Copy the book's W_q, W_k, W_v (each (d_model, d_model)) stacked into ``theirs``'
    ``in_proj_weight`` (3 d_model, d_model) and ``in_proj_bias``, and W_o into ``out_proj``."""
    _check_attention(mine, theirs)
    theirs.in_proj_weight.copy_(torch.cat([mine.W_q.weight, mine.W_k.weight, mine.W_v.weight]))
    if theirs.in_proj_bias is not None and mine.W_q.bias is not None:
        theirs.in_proj_bias.copy_(torch.cat([mine.W_q.bias, mine.W_k.bias, mine.W_v.bias]))
    theirs.out_proj.load_state_dict(mine.W_o.state_dict())
    return theirs


@torch.no_grad()
def attention_from_torch(mine: MultiHeadAttention, theirs: nn.MultiheadAttention
                         ) -> MultiHeadAttention:
    """The other way: ``theirs``' ``in_proj_weight`` (3 d_model, d_model) split into the book's
    W_q, W_k, W_v, ``out_proj`` into W_o (biases too, where both have them)."""
    _check_attention(mine, theirs)
    for W, w in zip((mine.W_q, mine.W_k, mine.W_v), theirs.in_proj_weight.chunk(3)):
        W.weight.copy_(w)
    mine.W_o.weight.copy_(theirs.out_proj.weight)
    if theirs.in_proj_bias is not None and mine.W_q.bias is not None:
        for W, b in zip((mine.W_q, mine.W_k, mine.W_v), theirs.in_proj_bias.chunk(3)):
            W.bias.copy_(b)
        mine.W_o.bias.copy_(theirs.out_proj.bias)
    return mine


def _block_pairs(mine: nn.Module, theirs: nn.Module) -> list:
    """(book submodule, PyTorch submodule) of an encoder or decoder block and its
    ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``, attention aside."""
    pairs = [(mine.ff.linear1, theirs.linear1), (mine.ff.linear2, theirs.linear2)]
    return pairs + [(getattr(mine, f"norm{i}"), getattr(theirs, f"norm{i}"))
                    for i in (1, 2, 3) if hasattr(theirs, f"norm{i}")]


def _attention_pairs(mine: nn.Module, theirs: nn.Module) -> list:
    pairs = [(mine.self_attn, theirs.self_attn)]
    if hasattr(theirs, "multihead_attn"):                      # a decoder layer: cross-attention
        pairs.append((mine.cross_attn, theirs.multihead_attn))
    return pairs


@torch.no_grad()
def block_to_torch(mine: nn.Module, theirs: nn.Module) -> None:
    """Copy a book encoder or decoder block into ``nn.TransformerEncoderLayer`` or
    ``nn.TransformerDecoderLayer``: attention(s), feed-forward and LayerNorms (norm1..norm3)."""
    for a, b in _attention_pairs(mine, theirs):
        attention_to_torch(a, b)
    for a, b in _block_pairs(mine, theirs):
        b.load_state_dict(a.state_dict())


@torch.no_grad()
def block_from_torch(mine: nn.Module, theirs: nn.Module) -> None:
    """The other way: a PyTorch encoder or decoder layer's weights into the book's block."""
    for a, b in _attention_pairs(mine, theirs):
        attention_from_torch(a, b)
    for a, b in _block_pairs(mine, theirs):
        a.load_state_dict(b.state_dict())


def _stack_pairs(model: Transformer, twin: nn.Transformer) -> tuple[list, list]:
    """([(book block, PyTorch layer)], [(book final LayerNorm, PyTorch's)]) of the two stacks;
    only pre-LN stacks end with a LayerNorm."""
    blocks = list(zip([*model.encoder, *model.decoder], [*twin.encoder.layers, *twin.decoder.layers]))
    norms = [(model.enc_norm, twin.encoder.norm), (model.dec_norm, twin.decoder.norm)]
    return blocks, norms if model.cfg.norm_first else []


@torch.no_grad()
def transformer_to_torch(model: Transformer, twin: nn.Transformer) -> nn.Transformer:
    """Copy the book's encoder and decoder stacks (blocks, and pre-LN's final LayerNorms) into
    an ``nn.Transformer`` of the same configuration; embeddings and output layer aside."""
    blocks, norms = _stack_pairs(model, twin)
    for mine, theirs in blocks:
        block_to_torch(mine, theirs)
    for mine, theirs in norms:
        theirs.load_state_dict(mine.state_dict())
    return twin


@torch.no_grad()
def transformer_from_torch(model: Transformer, twin: nn.Transformer) -> Transformer:
    """The other way: an ``nn.Transformer``'s stacks into the book's Transformer."""
    blocks, norms = _stack_pairs(model, twin)
    for mine, theirs in blocks:
        block_from_torch(mine, theirs)
    for mine, theirs in norms:
        mine.load_state_dict(theirs.state_dict())
    return model


def _layer_kwargs(cfg: TransformerConfig, dropout: float = 0.0) -> dict:
    return dict(d_model=cfg.d_model, nhead=cfg.h, dim_feedforward=cfg.d_ff, dropout=dropout,
                batch_first=True, norm_first=cfg.norm_first)


def _final_norm(cfg: TransformerConfig):
    """Pre-LN stacks end with a LayerNorm; post-LN ones have none (nn.Transformer's default
    would add one, the paper and the book do not)."""
    return nn.LayerNorm(cfg.d_model) if cfg.norm_first else None


def _nn_transformer(cfg: TransformerConfig, dropout: float) -> nn.Transformer:
    """An ``nn.Transformer`` (batch_first) of ``cfg``'s size, with the book's final LayerNorms."""
    kw = _layer_kwargs(cfg, dropout)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), cfg.n_layers,
                                norm=_final_norm(cfg), enable_nested_tensor=False)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), cfg.n_layers,
                                norm=_final_norm(cfg))
    return nn.Transformer(custom_encoder=enc, custom_decoder=dec, **kw)


def torch_transformer(model: Transformer, dropout: float = 0.0) -> nn.Transformer:
    """An ``nn.Transformer`` (batch_first) with ``model``'s configuration and a copy of its
    blocks' weights: the encoder-decoder stack only, on embedded inputs (B, S, d_model) and
    (B, T, d_model). Embedding, positions and output layer stay the book's (chapter 8)."""
    twin = transformer_to_torch(model, _nn_transformer(model.cfg, dropout))
    return twin.to(next(model.parameters()).dtype).eval()


def torch_encoder(model: nn.Module) -> nn.TransformerEncoder:
    """An ``nn.TransformerEncoder`` with the blocks (and final LayerNorm) of a
    :class:`attnbook.transformer.SelfAttentionStack` (chapter 12's decoder-only model is one,
    run with a causal mask), weights copied; on embedded inputs (B, T, d_model)."""
    c = model.cfg
    twin = nn.TransformerEncoder(nn.TransformerEncoderLayer(**_layer_kwargs(c)), c.n_layers,
                                 norm=_final_norm(c), enable_nested_tensor=False)
    for theirs, mine in zip(twin.layers, model.blocks):
        block_to_torch(mine, theirs)
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
        self.transformer = _nn_transformer(cfg, cfg.dropout)
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
        transformer_to_torch(model, self.transformer)
        return self
