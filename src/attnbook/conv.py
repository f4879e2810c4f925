"""A convolutional translator (chapter 10): a small ConvS2S {Gehring et al., 2017}.

The third family of the paper's comparison, beside recurrence (``rnn``) and self-attention
(``transformer``). Every layer is a gated convolution over a window of ``kernel`` positions:

    src (B, S) --embed + learned positions--> e --> [GatedConv, residual] x N --> z (B, S, d)
        keys z, values z + e (the encoder's output and its input embeddings)
    tgt_in (B, T) --embed + positions--> g --> [causal GatedConv -> attention to (z, z + e),
        residual] x N --> logits (B, T, V) = x @ E^T (weights tied with the embedding)

A gated convolution (GLU) computes ``A * sigmoid(B)`` from a convolution with 2 d output
channels split in halves A and B. The encoder's convolutions are centred (each position sees
(kernel - 1) / 2 neighbours on each side), the decoder's are causal (position t sees t-kernel+1
.. t), so a position learns about far-away ones only through the depth: N layers of kernel k
see N (k - 1) + 1 positions, where self-attention sees all of them in one layer. Every decoder
layer attends to the source: its query is the layer's output projected and added to the target
embedding, ``softmax(q z^T)`` over the real source positions, and the context ``a (z + e)`` is
added to the layer's output. Residual sums are scaled by sqrt(0.5) to keep their variance.

Masks follow the book's convention: ``src_mask`` (B, S) is True at real tokens. Padded source
positions are zeroed before every convolution, so a padded sentence reads exactly what it would
read alone (a convolution pads with zeros too). The interface is every translator's: forward,
encode, decode(..., cache=dict) for greedy and beam search; a decoder layer's cache is its last
kernel - 1 inputs.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import PAD_ID
from .positional import LearnedPositionalEncoding

SQRT_HALF = math.sqrt(0.5)


class GatedConv(nn.Module):
    """GLU(conv(x)) over time: x (B, L, d_model) -> (B, L, d_model).

    ``causal=True``: position t sees positions t - kernel + 1 .. t (the decoder); otherwise the
    window is centred (the encoder; ``kernel`` odd). ``cache`` (a dict, causal only): for
    incremental decoding, x holds only the new positions and the cache keeps the last
    kernel - 1 inputs, so that the output equals that of the whole sequence."""

    def __init__(self, d_model: int, kernel: int, causal: bool):
        super().__init__()
        if kernel < 1 or (not causal and kernel % 2 == 0):
            raise ValueError(f"kernel={kernel}: give a kernel of at least 1, odd for the encoder's "
                             "centred window")
        self.kernel, self.causal = kernel, causal
        self.conv = nn.Conv1d(d_model, 2 * d_model, kernel)
        nn.init.normal_(self.conv.weight, std=math.sqrt(4 / (kernel * d_model)))  # as ConvS2S
        nn.init.zeros_(self.conv.bias)

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        k = self.kernel
        if cache is not None:                      # the window's past comes from the cache
            past = cache.get("x", x.new_zeros(x.shape[0], k - 1, x.shape[2]))  # (B, k-1, d)
            x = torch.cat([past, x], dim=1)                                    # (B, k-1+L, d)
            cache["x"] = x[:, x.shape[1] - (k - 1):]
            pad = (0, 0)
        else:
            pad = (k - 1, 0) if self.causal else ((k - 1) // 2, (k - 1) // 2)
        y = self.conv(F.pad(x.transpose(1, 2), pad))                          # (B, 2d, L)
        return F.glu(y, dim=1).transpose(1, 2)                                # (B, L, d)


class ConvDecoderLayer(nn.Module):
    """A causal gated convolution, then attention to the source:
    x (B, T, d), g (B, T, d) the target embeddings, keys z (B, S, d), values (B, S, d),
    src_mask (B, S) -> (x' (B, T, d), weights (B, T, S))."""

    def __init__(self, d_model: int, kernel: int):
        super().__init__()
        self.conv = GatedConv(d_model, kernel, causal=True)
        self.W_q = nn.Linear(d_model, d_model)    # the layer's output, to the attention's space

    def forward(self, x, g, z, values, src_mask, cache: dict | None = None):
        h = self.conv(x, cache)                                              # (B, T, d)
        q = (self.W_q(h) + g) * SQRT_HALF                                    # (B, T, d)
        scores = q @ z.transpose(1, 2)                                       # (B, T, S)
        scores = scores.masked_fill(~src_mask[:, None, :], float("-inf"))
        weights = torch.softmax(scores, dim=-1)                              # (B, T, S)
        S = src_mask.sum(-1, keepdim=True)[:, :, None].to(h.dtype)           # (B, 1, 1)
        c = (weights @ values) * S * torch.rsqrt(S)    # ConvS2S: scale by sqrt(S) real positions
        h = (h + c) * SQRT_HALF
        return (h + x) * SQRT_HALF, weights                                  # (B, T, d)


def layers_like(parameters: int, d_model: int, kernel: int = 3) -> int:
    """The number of encoder (and of decoder) layers whose parameters, outside the embeddings
    and positions, come closest to ``parameters``: the size of a model to compare with."""
    pair = 2 * (2 * d_model * d_model * kernel + 2 * d_model) + d_model * d_model + d_model
    return max(1, round(parameters / pair))


class ConvS2S(nn.Module):
    """The convolutional encoder-decoder: forward(src (B, S), src_mask (B, S), tgt_in (B, T))
    -> logits (B, T, V), like every translator of the book; forward_with_attention also
    returns every decoder layer's weights, a list of N tensors (B, T, S).

    vocab_size, d_model; n_layers convolutions in the encoder and n_layers in the decoder;
    kernel the window (odd); max_len the longest sequence of the learned positions."""

    def __init__(self, vocab_size: int, d_model: int = 128, n_layers: int = 4, kernel: int = 3,
                 max_len: int = 512):
        super().__init__()
        self.vocab_size, self.d_model, self.n_layers, self.kernel = vocab_size, d_model, n_layers, kernel
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=d_model ** -0.5)
        self.src_pos = LearnedPositionalEncoding(d_model, max_len, std=0.1)
        self.tgt_pos = LearnedPositionalEncoding(d_model, max_len, std=0.1)
        self.encoder = nn.ModuleList(GatedConv(d_model, kernel, causal=False) for _ in range(n_layers))
        self.decoder = nn.ModuleList(ConvDecoderLayer(d_model, kernel) for _ in range(n_layers))
        self.out = nn.Linear(d_model, vocab_size, bias=False)
        self.out.weight = self.embed.weight                 # tied, as the Transformer's

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor):
        """src (B, S), src_mask (B, S) -> memory: the tuple (keys z (B, S, d), values z + e)."""
        if src.shape != src_mask.shape:
            raise ValueError(f"src {tuple(src.shape)} and src_mask {tuple(src_mask.shape)} differ")
        real = src_mask[..., None].to(self.embed.weight.dtype)                # (B, S, 1)
        e = self.src_pos(self.embed(src)) * real                              # (B, S, d)
        x = e
        for conv in self.encoder:
            x = (conv(x) + x) * SQRT_HALF * real       # padding stays zero: it reads as alone
        return x, x + e

    def decode(self, tgt_in: torch.Tensor, memory, src_mask: torch.Tensor,
               cache: dict | None = None) -> torch.Tensor:
        """tgt_in (B, T), memory from :meth:`encode` -> logits (B, T, V).

        cache: a dict, empty on the first call, for incremental decoding: then tgt_in holds only
        the new tokens, and each layer's convolution takes the earlier inputs of its window
        from the cache."""
        return self.decode_with_attention(tgt_in, memory, src_mask, cache)[0]

    def decode_with_attention(self, tgt_in: torch.Tensor, memory, src_mask: torch.Tensor,
                              cache: dict | None = None):
        """As :meth:`decode`, and also every decoder layer's weights: (logits (B, T, V), a list
        of N tensors (B, T, S)). Every layer computes its weights in any case."""
        z, values = memory
        if cache is not None:
            if not cache:
                cache.update(length=0, layers=[{} for _ in self.decoder])
            offset, layers = cache["length"], cache["layers"]
            cache["length"] += tgt_in.shape[1]
        else:
            offset, layers = 0, [None] * len(self.decoder)
        g = self.tgt_pos(self.embed(tgt_in), offset)                          # (B, T, d)
        x, attention = g, []
        for layer, layer_cache in zip(self.decoder, layers):
            x, w = layer(x, g, z, values, src_mask, layer_cache)
            attention.append(w)
        logits = self.out(x)                                                  # (B, T, V)
        return logits, attention

    def forward(self, src, src_mask, tgt_in, tgt_mask=None) -> torch.Tensor:
        """Teacher-forced logits (B, T, V). ``tgt_mask`` is accepted for the book's common
        interface and not needed: the causal convolutions only look back, and the loss
        ignores the outputs at padded target positions."""
        return self.forward_with_attention(src, src_mask, tgt_in, tgt_mask)[0]

    def forward_with_attention(self, src, src_mask, tgt_in, tgt_mask=None):
        """As :meth:`forward`, and also every decoder layer's weights, as
        :meth:`decode_with_attention` returns them."""
        if tgt_in.dim() != 2 or tgt_in.shape[0] != src.shape[0]:
            raise ValueError(f"tgt_in: expected shape ({src.shape[0]}, T), "
                             f"got {tuple(tgt_in.shape)}")
        return self.decode_with_attention(tgt_in, self.encode(src, src_mask), src_mask)
