"""How large are the attention scores of the book's models? (chapter 4)

Chapter 4 argues that Var(q . k) grows in proportion to d_k, and that dividing by sqrt(d_k) keeps
the scores' size independent of the width. This module measures it in real models: a forward
pre-hook on every MultiHeadAttention recomputes its queries q and keys k (B, h, L, d_k) and
accumulates, over the real query positions and the keys each may attend to,

    var_q, var_k        Var of the entries of q and of k
    var_dot             Var(q . k), the raw dot products
    var_scaled          Var(q . k / sqrt(d_k)), the scores the softmax sees
    row_var_scaled      the variance of the scaled scores *within* one query's row, averaged over
                        rows (what sets how sharp the softmax is: it ignores a shift of a row)

``python -m attnbook score_scales`` (``attnbook.experiments.score_scales``, the command) measures with
:func:`measure_run` a trained translator and a freshly initialised model of the same configuration on the
first ``--sentences`` validation pairs of Multi30k. :func:`width_sweep` measures freshly
initialised Transformers of several widths (chapter 4 runs it live).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from ..attention import causal_mask
from ..batching import make_batch
from ..data import load_multi30k
from ..mha import MultiHeadAttention
from ..training.recipe import build_model, forward_logits
from ..training.runs import load_run
from ..transformer import Transformer, TransformerConfig

STATS = ("var_q", "var_k", "var_dot", "var_scaled", "row_var_scaled")


class _Moments:
    """Running count, sum and sum of squares (float64) of the values it is given."""

    def __init__(self):
        self.n, self.s, self.s2 = 0, 0.0, 0.0

    def add(self, x: torch.Tensor) -> None:
        x = x.double()
        self.n += x.numel()
        self.s += float(x.sum())
        self.s2 += float((x * x).sum())

    def var(self) -> float:
        mean = self.s / self.n
        return self.s2 / self.n - mean * mean


def _kind(name: str) -> tuple[str, int]:
    """Module name -> (kind, layer): 'encoder.0.self_attn' -> ('encoder self', 1), ..."""
    parts = name.split(".")
    return f"{parts[-3]} {parts[-1].removesuffix('_attn')}", int(parts[-2]) + 1


@torch.no_grad()
def score_statistics(model: torch.nn.Module, batches) -> list[dict]:
    """Score statistics of every MultiHeadAttention of ``model`` over ``batches`` (Batch objects,
    see book/notation.md): one dict per layer with its name, kind, layer number, d_k and
    :data:`STATS`. Self-attention queries count where the key mask is True (real tokens); the
    queries of cross-attention where the batch's tgt_mask is True. Runs in eval mode."""
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise ValueError("the model has no MultiHeadAttention: score statistics are measured on "
                         "the book's Transformer models (not on the GRU models of chapters 1-3)")
    acc = {n: {s: _Moments() for s in STATS[:4]} | {"row": _Moments()} for n, _ in layers}
    current = {}

    def hook(name):
        def pre_hook(mha, args, kwargs):
            x = args[0]
            context = args[1] if len(args) > 1 else kwargs.get("context")
            key_mask, causal = kwargs.get("key_mask"), kwargs.get("causal", False)
            kv = x if context is None else context
            q = mha.split_heads(mha.W_q(x))                        # (B, h, T, d_k)
            k = mha.split_heads(mha.W_k(kv))                       # (B, h, S, d_k)
            B, _, T, d_k = q.shape
            S = k.shape[2]
            keys = torch.ones(B, S, dtype=torch.bool) if key_mask is None else key_mask.cpu()
            queries = keys if context is None else current["tgt_mask"]
            if queries.shape != (B, T):
                queries = torch.ones(B, T, dtype=torch.bool)
            allowed = queries[:, :, None] & keys[:, None, :]       # (B, T, S)
            if causal:
                allowed = allowed & causal_mask(T, S)               # (T, S)
            dot = (q @ k.transpose(-2, -1)).cpu()                  # (B, h, T, S)
            a = acc[name]
            a["var_q"].add(q.cpu().transpose(1, 2)[queries])       # real query positions
            a["var_k"].add(k.cpu().transpose(1, 2)[keys])
            pairs = allowed[:, None].expand_as(dot)                # (B, h, T, S)
            a["var_dot"].add(dot[pairs])
            a["var_scaled"].add(dot[pairs] / math.sqrt(d_k))
            scaled = (dot / math.sqrt(d_k)).double().masked_fill(~pairs, 0.0)
            n = pairs.sum(-1)                                      # (B, h, T) keys per row
            mean = scaled.sum(-1) / n.clamp(min=1)
            row_var = (scaled * scaled).sum(-1) / n.clamp(min=1) - mean * mean  # (B, h, T)
            a["row"].add(row_var[n > 0])
        return pre_hook

    handles = [m.register_forward_pre_hook(hook(n), with_kwargs=True) for n, m in layers]
    was_training = model.training
    model.eval()
    try:
        for b in batches:
            current["tgt_mask"] = b.tgt_mask.cpu()
            forward_logits(model, b)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    rows = []
    for name, m in layers:
        a = acc[name]
        kind, layer = _kind(name)
        rows.append({"name": name, "kind": kind, "layer": layer, "d_k": m.d_k,
                     **{s: round(a[s].var(), 4) for s in STATS[:4]},
                     "row_var_scaled": round(a["row"].s / a["row"].n, 4)})
    return rows


def random_batches(vocab_size: int, n_batches: int = 2, B: int = 16, L: int = 24, seed: int = 0):
    """Batches of random token ids (4 .. vocab_size - 1) with lengths L/2 .. L, so that some
    positions are padding: inputs for a model at initialisation, whose embeddings are random."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n_batches):
        lengths = torch.randint(L // 2, L + 1, (2, B), generator=g).tolist()
        seqs = [torch.randint(4, vocab_size, (n,), generator=g).tolist()
                for n in lengths[0] + lengths[1]]
        out.append(make_batch(seqs[:B], seqs[B:], index=range(i * B, (i + 1) * B)))
    return out


def width_sweep(d_ks=(8, 16, 32, 64, 128, 256), h: int = 2, n_layers: int = 2,
                vocab_size: int = 1000, seed: int = 0) -> list[dict]:
    """score_statistics of freshly initialised Transformers with d_model = h * d_k (d_ff =
    4 d_model, no dropout), all on the same random batches: one row per width and layer."""
    batches = random_batches(vocab_size, seed=seed)
    rows = []
    for d_k in d_ks:
        torch.manual_seed(seed)
        cfg = TransformerConfig(vocab_size=vocab_size, d_model=h * d_k, h=h, d_ff=4 * h * d_k,
                                n_layers=n_layers, dropout=0.0)
        rows += score_statistics(Transformer(cfg), batches)
    return rows


def validation_batches(tok, n_sentences: int, batch_size: int = 64, data_dir=None) -> list:
    """The first ``n_sentences`` pairs of Multi30k's validation split, encoded, in batches."""
    pairs = load_multi30k("val", data_dir=data_dir)[:n_sentences]
    src = tok.encode_batch([s for s, _ in pairs])
    tgt = tok.encode_batch([t for _, t in pairs])
    starts = range(0, len(src), batch_size)
    return [make_batch(src[i:i + batch_size], tgt[i:i + batch_size],
                       range(i, min(i + batch_size, len(src)))) for i in starts]


def measure_run(run: Path, average: int = 5, n_sentences: int = 256, seed: int = 0) -> dict:
    """score_statistics of a trained run (the mean of its last ``average`` snapshots) and of a
    freshly initialised model of the same configuration (seed ``seed``), on the same sentences."""
    model, tok, cfg = load_run(run, torch.device("cpu"), average=average)
    batches = validation_batches(tok, n_sentences)
    torch.manual_seed(seed)
    fresh = build_model(cfg)
    return {"config": cfg.arch.to_dict(),
            "sentences": f"the first {n_sentences} pairs of Multi30k's validation split",
            "trained": score_statistics(model, batches),
            "initialised": score_statistics(fresh, batches)}
