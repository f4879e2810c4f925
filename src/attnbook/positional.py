"""Positional encodings (chapter 7): telling a permutation-equivariant model where tokens are.

* sinusoidal (Vaswani et al., 2017): fixed, defined for any position;
  PE[p, 2i] = sin(p / 10000^(2i/d_model)),  PE[p, 2i+1] = cos(p / 10000^(2i/d_model));
* learned: one trained vector per position, up to a maximum length fixed in advance.

Both map token embeddings (B, T, d_model) to embeddings plus position information (B, T, d_model).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn


def sinusoidal_encoding(T: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The (T, d_model) table of sinusoidal encodings for positions 0..T-1 (d_model even)."""
    if d_model % 2 != 0:
        raise ValueError(f"d_model must be even for sinusoidal encodings (sin/cos pairs), got {d_model}")
    pos = torch.arange(T, dtype=torch.float32)[:, None]                              # (T, 1)
    freq = torch.exp(-math.log(base) * torch.arange(0, d_model, 2).float() / d_model)  # (d_model/2,)
    pe = torch.zeros(T, d_model)
    pe[:, 0::2] = torch.sin(pos * freq)                                              # (T, d_model/2)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe


class SinusoidalPositionalEncoding(nn.Module):
    """Add sinusoidal encodings to x: (B, T, d_model) -> (B, T, d_model). Works for any T: the
    table is precomputed up to ``max_len`` and extended on the fly for longer inputs."""

    def __init__(self, d_model: int, max_len: int = 1024):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, offset: int | torch.Tensor = 0) -> torch.Tensor:
        """offset: an int (the tokens sit at positions offset .. offset + T - 1), or a (B, T)
        int64 tensor giving every token its own position (chapter 12: padding anywhere in a
        sequence without shifting the positions of its real tokens)."""
        if isinstance(offset, torch.Tensor):
            need = int(offset.max()) + 1 if offset.numel() else 0
            if need > self.pe.shape[0]:
                self.pe = sinusoidal_encoding(need, self.d_model).to(self.pe.device)
            return x + self.pe[offset].to(x.dtype)                         # (B, T, d_model)
        T = x.shape[1]
        if offset + T > self.pe.shape[0]:
            self.pe = sinusoidal_encoding(offset + T, self.d_model).to(self.pe.device)
        return x + self.pe[offset:offset + T].to(x.dtype)


class LearnedPositionalEncoding(nn.Module):
    """Add a learned vector per position: (B, T, d_model) -> (B, T, d_model), T <= max_len.

    A learned table has no entry beyond ``max_len``; a longer input is an error that says so,
    rather than a silent truncation.
    """

    def __init__(self, d_model: int, max_len: int = 1024, std: float = 0.02):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=std)   # 0.02 as BERT and GPT-2 (chapter 7)

    def forward(self, x: torch.Tensor, offset: int | torch.Tensor = 0) -> torch.Tensor:
        """offset: an int, or a (B, T) int64 tensor of per-token positions (as above)."""
        if isinstance(offset, torch.Tensor):
            last = int(offset.max()) if offset.numel() else -1
        else:
            last = offset + x.shape[1] - 1
        if last >= self.max_len:
            raise ValueError(f"positions up to {last} requested, but the learned table "
                             f"has only max_len={self.max_len} rows; build the model with a larger "
                             "max_len (positions beyond it were never trained)")
        if isinstance(offset, torch.Tensor):
            return x + self.embedding(offset).to(x.dtype)                  # (B, T, d_model)
        pos = torch.arange(offset, offset + x.shape[1], device=x.device)
        return x + self.embedding(pos)[None].to(x.dtype)
