"""The book's diagrams: the paper's pictures redrawn with the book's shapes and the package's names.

One function per diagram returns a matplotlib ``Figure``; ``python -m attnbook diagrams`` writes
them all as SVG into book/figures/ (``--out`` another folder), byte for byte the same on every run
(tests/test_diagrams.py regenerates them and compares with the committed files).

Every figure is drawn on an opaque white card with dark strokes, so that it reads the same in the
theme's dark mode; colours come from the Okabe-Ito palette; text is DejaVu Sans (DejaVu Sans Mono
for code), kept as SVG text with a generic fallback, which keeps the files small. Coordinates are
in inches (one data unit = one inch), so box sizes and font sizes can be compared directly.

Names of the package's code go through :func:`_code` (or :func:`_attr`) with their module, for
example ``_code("transformer.EncoderBlock")``: the test imports every one of them, so a rename in
the package that the diagrams miss fails the tests. The library never imports this module.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.path import Path as MplPath

from ..plotting import OKABE_ITO

INK, MUTED = "#1a1a1a", "#555555"
BLUE, ORANGE, GREEN, PURPLE, SKY, VERMILLION, YELLOW = OKABE_ITO
# Text stays text (small files, searchable): DejaVu Sans where the reader has it, else the
# browser's sans-serif (DejaVu is wide, so any fallback fits the boxes); code in DejaVu Sans Mono.
SVG_RC = {"svg.hashsalt": "attnbook", "svg.fonttype": "none", "font.sans-serif": ["DejaVu Sans"],
          "font.monospace": ["DejaVu Sans Mono"]}
FONT, CODE_FONT, SHAPE_FONT = 12.5, 10.5, 10.5


def _tint(colour: str, amount: float = 0.35) -> str:
    """``colour`` mixed with white: ``amount`` of the colour, the rest white (light box fills)."""
    rgb = np.array(mpl.colors.to_rgb(colour))
    return mpl.colors.to_hex(amount * rgb + (1 - amount) * np.ones(3))


# Fills by the paper's colour scheme: attention orange, feed-forward blue, Add & Norm yellow,
# embeddings pink, output green.
ATTN, FF, NORM, EMBED, OUT, POS = (_tint(ORANGE), _tint(SKY), _tint(YELLOW, 0.45), _tint(PURPLE),
                                   _tint(GREEN), _tint(VERMILLION, 0.25))
HEADS = [ORANGE, SKY, GREEN, PURPLE]  # head 1..4 of the multi-head picture


def _code(dotted: str) -> str:
    """The name shown for a piece of the package, ``"module.Name[.attr]"`` -> ``"Name[.attr]"``."""
    return dotted.split(".", 1)[1]


def _attr(dotted: str) -> str:
    """Only the last part: ``"module.Class.attr"`` -> ``"attr"`` (a method or a layer)."""
    return dotted.rsplit(".", 1)[1]


# ---------------------------------------------------------------------------------------------
# Drawing helpers

def _canvas(w: float, h: float) -> tuple[Figure, object]:
    """A w x h inch figure whose axes run 0..w, 0..h, on a white rounded card."""
    fig = Figure(figsize=(w, h))
    fig.patch.set_alpha(0.0)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, w)
    ax.set_ylim(0, h)
    ax.axis("off")
    ax.add_patch(FancyBboxPatch((0.03, 0.03), w - 0.06, h - 0.06, lw=1.0, fc="white", ec="#999999",
                                boxstyle="round,pad=0,rounding_size=0.18", zorder=-5))
    return fig, ax


def _text(ax, x, y, s, size=FONT, mono=False, colour=INK, ha="center", va="center",
          linespacing=1.15, **kw):
    return ax.text(x, y, s, fontsize=size, family="monospace" if mono else "sans-serif",
                   color=colour, ha=ha, va=va, linespacing=linespacing, **kw)


def _shape(ax, x, y, s, size=SHAPE_FONT, ha="center", **kw):
    """A tensor shape written on an arrow: monospace, on a white patch that interrupts the line."""
    return _text(ax, x, y, s, size=size, mono=True, ha=ha, zorder=5,
                 bbox=dict(fc="white", ec="none", pad=1.5), **kw)


def _box(ax, x, y, w, h, title, code=None, fill="white", size=FONT, code_size=CODE_FONT,
         lw=1.3):
    """A rounded box centred on (x, y): ``title`` (sans) above ``code`` (monospace)."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, lw=lw, fc=fill, ec=INK,
                                boxstyle="round,pad=0,rounding_size=0.07", zorder=2))
    n_title = title.count("\n") + 1 if title else 0
    n_code = code.count("\n") + 1 if code else 0
    lh_title, lh_code = 1.2 * size / 72, 1.2 * code_size / 72  # line heights in inches
    if title:
        _text(ax, x, y + n_code * lh_code / 2, title, size=size, zorder=3)
    if code:
        _text(ax, x, y - n_title * lh_title / 2, code, size=code_size, mono=True, colour="#222222",
              zorder=3)


def _arrow(ax, *points, lw=1.3, colour=INK, head=True):
    """A line through ``points`` (x, y) with an arrow head at the last one."""
    path = MplPath(points, [MplPath.MOVETO] + [MplPath.LINETO] * (len(points) - 1))
    ax.add_patch(FancyArrowPatch(path=path, arrowstyle="-|>" if head else "-", lw=lw,
                                 color=colour, mutation_scale=13, shrinkA=0, shrinkB=0,
                                 joinstyle="miter", zorder=1))


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a reproducible SVG (fixed ids, no date)."""
    with mpl.rc_context(SVG_RC):
        fig.savefig(path, format="svg", metadata={"Date": None})
    return path


# ---------------------------------------------------------------------------------------------
# 1. The Transformer (the paper's Figure 1)

def _norm_box(ax, x, y, w, h=0.36):
    """The thin "Add & Norm" box centred on (x, y): the residual sum, then a LayerNorm."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, lw=1.3, fc=NORM, ec=INK,
                                boxstyle="round,pad=0,rounding_size=0.07", zorder=2))
    _text(ax, x - w / 2 + 0.12, y, "Add & Norm", ha="left", zorder=3)
    _text(ax, x + w / 2 - 0.12, y, "nn.LayerNorm", size=CODE_FONT, mono=True, ha="right", zorder=3)


def _sublayer(ax, x, y0, w, h, title, code, fill, res_x):
    """Arrow up from y0, a sub-layer box, and its Add & Norm with the residual path around it
    (on the side of ``res_x``). Returns (top of the Add & Norm box, centre of the sub-layer)."""
    y_box, y_norm = y0 + 0.36, y0 + 0.36 + h + 0.22 + 0.18
    _arrow(ax, (x, y0), (x, y_box))
    _box(ax, x, y_box + h / 2, w, h, title, code, fill=fill)
    _arrow(ax, (x, y_box + h), (x, y_norm - 0.18))
    edge = x - w / 2 if res_x < x else x + w / 2
    _arrow(ax, (x, y0 + 0.14), (res_x, y0 + 0.14), (res_x, y_norm), (edge, y_norm), lw=1.1)
    _norm_box(ax, x, y_norm, w)
    return y_norm + 0.18, y_box + h / 2


def _stem(ax, x, w, ids, words, L):
    """Token ids -> embedding * sqrt(d_model) -> + positional encoding -> the block's bottom edge
    (returned)."""
    _text(ax, x, 0.5, words, size=FONT - 1)
    _text(ax, x, 0.27, ids, size=CODE_FONT, mono=True)
    _arrow(ax, (x, 0.68), (x, 1.12))
    _shape(ax, x, 0.9, f"(B, {L})")
    _box(ax, x, 1.43, w, 0.62, "Embedding × √d_model",
         _code("transformer.Transformer.embed_tokens"), fill=EMBED)
    _arrow(ax, (x, 1.74), (x, 2.2))
    _shape(ax, x, 1.97, f"(B, {L}, d_model)")
    _box(ax, x, 2.51, w, 0.62, "+ Positional Encoding",
         _code("positional.SinusoidalPositionalEncoding"), fill=POS)
    _arrow(ax, (x, 2.82), (x, 3.3), head=False)
    _shape(ax, x, 3.06, f"(B, {L}, d_model)")
    return 3.3


def _frame(ax, left, right, bottom, top, name):
    """The grey frame of a repeated block, its class name and "× N" in the header."""
    ax.add_patch(FancyBboxPatch((left, bottom), right - left, top - bottom, lw=1.1, fc="#efefef",
                                ec=MUTED, boxstyle="round,pad=0,rounding_size=0.12", zorder=0))
    _text(ax, left + 0.1, top - 0.2, name, size=CODE_FONT + 0.5, mono=True, ha="left",
          weight="bold")
    _text(ax, right - 0.1, top - 0.2, "× N", ha="right", weight="bold")


def transformer() -> Figure:
    """The paper's Figure 1 with the book's shapes on the arrows and the package's names in the
    boxes: encoder (left) and decoder (right), read from the bottom up."""
    W, H, w = 6.4, 12.3, 2.45
    fig, ax = _canvas(W, H)
    xe, xd = 1.675, 4.725
    res_e, res_d = xe - w / 2 - 0.15, xd + w / 2 + 0.15
    fe, fd = (xe - w / 2 - 0.3, xe + w / 2 + 0.12), (xd - w / 2 - 0.12, xd + w / 2 + 0.3)
    mha = _code("mha.MultiHeadAttention")

    # the encoder: src -> N x (self-attention, feed-forward) -> memory
    bottom = top = _stem(ax, xe, w, "src", "Inputs: source ids", "S")
    top, _ = _sublayer(ax, xe, top, w, 0.62, "Multi-Head Attention", mha, ATTN, res_e)
    top, _ = _sublayer(ax, xe, top, w, 0.62, "Feed Forward", _code("transformer.FeedForward"), FF,
                       res_e)
    _frame(ax, *fe, bottom - 0.12, top + 0.5, _code("transformer.EncoderBlock"))
    enc_top = top

    # the decoder: tgt_in -> N x (masked self-attention, cross-attention, feed-forward) -> logits
    top = _stem(ax, xd, w, "tgt_in", "Outputs (shifted right)", "T")
    top, _ = _sublayer(ax, xd, top, w, 0.82, "Masked Multi-Head\nAttention",
                       mha + "\n(causal=True)", ATTN, res_d)
    top, y_cross = _sublayer(ax, xd, top, w, 0.82, "Multi-Head Attention\nover the memory",
                             mha + "\n(x, memory)", ATTN, res_d)
    top, _ = _sublayer(ax, xd, top, w, 0.62, "Feed Forward", _code("transformer.FeedForward"), FF,
                       res_d)
    _frame(ax, *fd, bottom - 0.12, top + 0.5, _code("transformer.DecoderBlock"))

    # memory: the encoder's output, read by the cross-attention of every decoder block
    y_mem, x_gap = enc_top + 1.35, (fe[1] + fd[0]) / 2
    _arrow(ax, (xe, enc_top), (xe, y_mem), (x_gap, y_mem), (x_gap, y_cross), (xd - w / 2, y_cross),
           lw=1.8, colour=BLUE)
    _text(ax, xe, enc_top + 1.05, "memory", colour=BLUE, weight="bold",
          bbox=dict(fc="white", ec="none", pad=1.5), zorder=5)
    _shape(ax, xe, enc_top + 0.78, "(B, S, d_model)")

    # the output layer and the softmax
    y = top + 0.5
    _arrow(ax, (xd, top), (xd, y + 0.45))
    _shape(ax, xd, y + 0.2, "(B, T, d_model)")
    _box(ax, xd, y + 0.76, w, 0.62, "Linear", _code("transformer.Transformer.out"), fill=OUT)
    _arrow(ax, (xd, y + 1.07), (xd, y + 1.55))
    _shape(ax, xd, y + 1.31, "logits (B, T, V)")
    _box(ax, xd, y + 1.96, w, 0.82, "Softmax", _code("batching.translation_loss") + ",\n"
         + _code("decoding.greedy_decode") + ", ...", fill=OUT)
    _arrow(ax, (xd, y + 2.37), (xd, y + 2.8))
    _shape(ax, xd, y + 2.58, "(B, T, V)")
    _text(ax, xd, y + 3.0, "Output Probabilities")

    # what the picture does not say
    notes = ["Read from the bottom up.", "",
             "Left: Transformer.encode,", "right: Transformer.decode.", "",
             "Inside a block every arrow", "is (B, S, d_model) in the", "encoder, (B, T, d_model)",
             "in the decoder.", "",
             "Post-LN, as in the paper", "(norm_first=False).", "",
             "Linear and the embeddings", "share one (V, d_model)", "matrix (weight tying)."]
    _text(ax, 0.3, H - 0.35, "\n".join(notes), size=FONT - 1, ha="left", va="top",
          colour=MUTED, linespacing=1.3)
    return fig


# ---------------------------------------------------------------------------------------------
# 2. Attention as a soft look-up (chapter 3)

# Chapter 3's worked example: one query, four keys with their values (S = 4, d_k = 2, d_v = 1).
LOOKUP_Q = np.array([2.0, 1.0])
LOOKUP_KEYS = np.array([[0.8, 0.6], [-0.5, 1.0], [-1.0, -0.5], [0.0, 3.0]])
LOOKUP_VALUES = np.array([10.0, 20.0, 30.0, 40.0])


def soft_lookup() -> Figure:
    """One query scored against four keys; softmax weights; the weighted sum of the values."""
    e = LOOKUP_KEYS @ LOOKUP_Q                                   # scores (S,)
    alpha = np.exp(e - e.max()) / np.exp(e - e.max()).sum()     # weights (S,)
    c = float(alpha @ LOOKUP_VALUES)
    W, H = 6.2, 6.9
    fig, ax = _canvas(W, H)
    xs = [1.45 + 1.05 * i for i in range(4)]
    rows = dict(query=6.25, keys=5.05, scores=4.2, softmax=3.55, weights=2.55, values=1.55,
                output=0.45)
    shapes = dict(query="(d_k,)", keys="(S, d_k)", scores="(S,)", weights="(S,)",
                  values="(S, d_v)", output="(d_v,)")
    labels = dict(query="query", keys="keys", scores="scores\nq · kᵢ", weights="weights\nαᵢ",
                  values="values", output="output")
    for name, y in rows.items():
        if name != "softmax":
            _text(ax, 0.2, y, labels[name], size=FONT - 1.5, colour=MUTED, ha="left")
            _text(ax, 5.2, y, shapes[name], size=CODE_FONT, mono=True, colour=MUTED, ha="left")

    _box(ax, 3.025, rows["query"], 2.2, 0.5, None, "q = [2.0, 1.0]", fill=ATTN, code_size=FONT - 1)
    for i, x in enumerate(xs):
        k1, k2 = LOOKUP_KEYS[i]
        _arrow(ax, (3.025 + (x - 3.025) * 0.35, rows["query"] - 0.25), (x, rows["keys"] + 0.34))
        _box(ax, x, rows["keys"], 0.95, 0.62, f"k{'₁₂₃₄'[i]}", f"[{k1:g}, {k2:g}]",
             fill=_tint(BLUE, 0.25), code_size=CODE_FONT - 0.5)
        _arrow(ax, (x, rows["keys"] - 0.31), (x, rows["scores"] + 0.17))
        _text(ax, x, rows["scores"], f"{e[i]:.2f}", size=FONT - 0.5)
        _arrow(ax, (x, rows["scores"] - 0.17), (x, rows["softmax"] + 0.21))
        _arrow(ax, (x, rows["softmax"] - 0.21), (x, rows["weights"] + 0.47))
        bar = 0.7 * alpha[i]
        ax.add_patch(Rectangle((x - 0.2, rows["weights"] - 0.3), 0.4, bar, fc=BLUE, ec=INK, lw=1))
        ax.plot([x - 0.35, x + 0.35], [rows["weights"] - 0.3] * 2, color=INK, lw=1)
        _text(ax, x, rows["weights"] + 0.25, f"{alpha[i]:.3f}", size=FONT - 0.5)
        _text(ax, x + 0.22, rows["values"] + 0.45, "×", size=FONT)
        _arrow(ax, (x, rows["weights"] - 0.3), (x, rows["values"] + 0.25))
        _box(ax, x, rows["values"], 0.95, 0.5, None, f"v{'₁₂₃₄'[i]} = {LOOKUP_VALUES[i]:g}",
             fill=_tint(GREEN, 0.3), code_size=CODE_FONT)
        _arrow(ax, (x, rows["values"] - 0.25), (3.025 + (x - 3.025) * 0.3, rows["output"] + 0.25))
        _shape(ax, x + (3.025 - x) * 0.35, rows["values"] - 0.52,
               f"{alpha[i] * LOOKUP_VALUES[i]:.2f}", size=CODE_FONT - 0.5)
    _box(ax, 3.025, rows["softmax"], 4.0, 0.42, "softmax over all four scores", fill=NORM,
         size=FONT - 1)
    _box(ax, 3.025, rows["output"], 2.6, 0.5, None, f"c = Σ αᵢ vᵢ = {c:.2f}",
         fill=_tint(GREEN, 0.3), code_size=FONT - 1)
    _text(ax, 5.2, rows["softmax"], "weights ≥ 0,\nsum to 1", size=FONT - 2.5, colour=MUTED,
          ha="left")
    return fig


# ---------------------------------------------------------------------------------------------
# 3. Multi-head attention (chapter 5; the paper's Figure 2, right)

def _split_bar(ax, x, y, w, h=0.24, n=4):
    """One token's d_model numbers as a bar cut into n pieces of d_k, one per head (1..n)."""
    for i in range(n):
        ax.add_patch(Rectangle((x - w / 2 + i * w / n, y), w / n, h, fc=_tint(HEADS[i], 0.75),
                               ec=INK, lw=1, zorder=2))
        _text(ax, x - w / 2 + (i + 0.5) * w / n, y + h / 2, str(i + 1), size=9, zorder=3)


def multi_head() -> Figure:
    """Project, split into h heads, attend in every head at once, concatenate, project."""
    W, H = 6.4, 9.95
    fig, ax = _canvas(W, H)
    xs, xm, bw = (1.25, 3.0, 4.75), 2.6, 1.45
    _text(ax, 0.3, H - 0.3, _code("mha.MultiHeadAttention") + ", drawn with h = 4 heads",
          size=CODE_FONT + 0.5, mono=True, ha="left", va="top", weight="bold")
    _text(ax, 0.3, H - 0.65,
          "Read from the bottom up. L stands for T (queries) or S (keys, values).",
          size=FONT - 2.5, colour=MUTED, ha="left", va="top")

    # inputs and the three projections
    _text(ax, xs[0], 0.36, "x", size=CODE_FONT + 1, mono=True, weight="bold")
    _text(ax, 3.875, 0.36, "context (x itself in self-attention)", size=FONT - 2)
    ax.plot([xs[1], xs[2]], [0.56, 0.56], color=INK, lw=1.3)
    ax.plot([3.875, 3.875], [0.48, 0.56], color=INK, lw=1.3)
    projections = (_attr("mha.MultiHeadAttention.W_q"), _attr("mha.MultiHeadAttention.W_k"),
                   _attr("mha.MultiHeadAttention.W_v"))
    for x, name, L in zip(xs, projections, "TSS"):
        _arrow(ax, (x, 0.56 if x > xs[0] else 0.5), (x, 1.35))
        _shape(ax, x, 0.98, f"(B, {L}, d_model)")
        _box(ax, x, 1.63, bw, 0.56, "Linear", name, fill=_tint(BLUE, 0.2))
        _arrow(ax, (x, 1.91), (x, 2.62))
        _shape(ax, x, 2.26, f"(B, {L}, d_model)")
        _split_bar(ax, x, 2.62, bw)
        _arrow(ax, (x, 2.86), (x, 3.2))
    _box(ax, 3.0, 3.48, 5.3, 0.56, "Split: d_model = h pieces of d_k",
         _attr("mha.MultiHeadAttention.split_heads") + ": view(B, L, h, d_k).transpose(1, 2)",
         size=FONT - 1, code_size=CODE_FONT - 1)
    for x, L in zip(xs, "TSS"):
        _arrow(ax, (x, 3.76), (x, 4.5))
        _shape(ax, x, 4.12, f"(B, h, {L}, d_k)")

    # h attentions in one call: the boxes behind the first stand for heads 2..h
    for i in (3, 2, 1):
        ax.add_patch(FancyBboxPatch((0.5 + 0.09 * i, 4.5 + 0.09 * i), 5.0, 0.9, lw=1.2,
                                    fc=_tint(HEADS[i], 0.5), ec=INK, zorder=1.5 - 0.1 * i,
                                    boxstyle="round,pad=0,rounding_size=0.07"))
    _box(ax, 3.0, 4.95, 5.0, 0.9, "Scaled Dot-Product Attention, all heads at once",
         _code("attention.scaled_dot_product_attention") + "\nor F.scaled_dot_product_attention",
         fill=_tint(HEADS[0], 0.5), size=FONT - 1)
    _text(ax, 5.98, 5.55, "h", weight="bold")
    _arrow(ax, (xm, 5.67), (xm, 6.3))
    _shape(ax, xm, 5.97, "(B, h, T, d_k)")
    _arrow(ax, (5.0, 5.67), (5.0, 5.98))
    _text(ax, 5.0, 6.25, "weights\n(B, h, T, S)", size=CODE_FONT, mono=True)

    # concatenate the heads, project
    _box(ax, xm, 6.62, 3.4, 0.64, "Concat", "transpose(1, 2).reshape(B, T, d_model)",
         fill=_tint(BLUE, 0.2), code_size=CODE_FONT - 1)
    _arrow(ax, (xm, 6.94), (xm, 7.45))
    _shape(ax, xm, 7.2, "(B, T, d_model)")
    _split_bar(ax, xm, 7.45, bw)
    _arrow(ax, (xm, 7.69), (xm, 7.95))
    _box(ax, xm, 8.23, bw, 0.56, "Linear", _attr("mha.MultiHeadAttention.W_o"),
         fill=_tint(BLUE, 0.2))
    _arrow(ax, (xm, 8.51), (xm, 9.0))
    _shape(ax, xm, 8.76, "out (B, T, d_model)")
    return fig


# ---------------------------------------------------------------------------------------------
# 4. The masks as matrices (chapter 6)

def _grid(ax, x, y, mask, cell, tokens):
    """A boolean (T, S) mask as a grid, lower-left corner (x, y): True (may attend) is filled
    blue, False (blocked) is white with a cross; tokens label the rows and the columns."""
    T, S = mask.shape
    for t in range(T):
        for i in range(S):
            cx, cy = x + i * cell, y + (T - 1 - t) * cell
            ax.add_patch(Rectangle((cx, cy), cell, cell, fc=BLUE if mask[t, i] else "white",
                                   ec=INK, lw=0.9, zorder=2))
            if not mask[t, i]:
                _text(ax, cx + cell / 2, cy + cell / 2, "×", size=10, colour="#999999", zorder=3)
    for j, tok in enumerate(tokens):
        _text(ax, x + (j + 0.5) * cell, y + T * cell + 0.08, tok, size=9, va="bottom",
              rotation=90)
        _text(ax, x - 0.06, y + (T - 0.5 - j) * cell, tok, size=9, ha="right")


def masks() -> Figure:
    """Padding mask, causal mask and both combined, for one sequence of 3 tokens padded to 5."""
    W, H, cell = 6.4, 3.9, 0.27
    fig, ax = _canvas(W, H)
    tokens = ["<s>", "y₁", "y₂", "pad", "pad"]
    real = np.array([True, True, True, False, False])
    pad = np.broadcast_to(real, (5, 5))              # (B, 1, 1, T) broadcast over the queries
    causal = np.tril(np.ones((5, 5), dtype=bool))    # (T, T)
    panels = [(0.55, pad, "padding mask", _code("attention.padding_mask") + "(tgt_mask)",
               "(B, T) → (B, 1, 1, T)"),
              (2.7, causal, "causal mask", _code("attention.causal_mask") + "(T)", "(T, T)"),
              (4.85, pad & causal, "both", "padding & causal", "(B, 1, T, T)")]
    for x, mask, title, code, shape in panels:
        _grid(ax, x, 1.05, mask, cell, tokens)
        xc = x + 2.5 * cell
        _text(ax, xc, 0.78, title, size=FONT - 0.5, weight="bold")
        _text(ax, xc, 0.5, code, size=CODE_FONT - 1.5, mono=True)
        _text(ax, xc, 0.25, shape, size=CODE_FONT - 1.5, mono=True, colour=MUTED)
    _text(ax, 2.27, 1.73, "&", size=20, weight="bold")
    _text(ax, 4.42, 1.73, "=", size=20, weight="bold")
    # legend and axes
    ax.add_patch(Rectangle((0.3, H - 0.45), 0.2, 0.2, fc=BLUE, ec=INK, lw=0.9))
    _text(ax, 0.58, H - 0.35, "True: may attend", size=FONT - 2, ha="left")
    ax.add_patch(Rectangle((2.45, H - 0.45), 0.2, 0.2, fc="white", ec=INK, lw=0.9))
    _text(ax, 2.55, H - 0.35, "×", size=10, colour="#999999")
    _text(ax, 2.73, H - 0.35, "False: blocked (weight 0)", size=FONT - 2, ha="left")
    _text(ax, 0.3, H - 0.72, "rows: query t,  columns: key i", size=FONT - 2.5, colour=MUTED,
          ha="left")
    return fig


# ---------------------------------------------------------------------------------------------
# 5. The encoder's memory feeds every decoder block (chapter 8)

def memory_to_decoder() -> Figure:
    """N encoder blocks make the memory once; the cross-attention of each of the N decoder
    blocks reads it (Add & Norm left out)."""
    W, H = 6.4, 9.75
    fig, ax = _canvas(W, H)
    xe, xd, x_bus, we, wd = 1.3, 4.7, 3.05, 1.9, 2.3
    _text(ax, xe, 0.35, "src", size=CODE_FONT + 0.5, mono=True)
    _text(ax, xd, 0.35, "tgt_in", size=CODE_FONT + 0.5, mono=True)
    for x, w, L in ((xe, we, "S"), (xd, wd, "T")):
        _arrow(ax, (x, 0.52), (x, 1.0))
        _shape(ax, x, 0.76, f"(B, {L})")
        _box(ax, x, 1.25, w, 0.5, None, _code("transformer.Transformer.embed_tokens"), fill=EMBED,
             code_size=CODE_FONT - 1)

    # the encoder: EncoderBlock 1, 2, ..., N
    enc, y_prev = _code("transformer.EncoderBlock"), 1.5
    for y, n in zip((2.2, 3.1, 4.3), ("1", "2", "N")):
        _arrow(ax, (xe, y_prev), (xe, y - 0.22))
        if n != "N":
            _shape(ax, xe, (y_prev + y - 0.22) / 2, "(B, S, d_model)")
        _box(ax, xe, y, we, 0.44, None, f"{enc} {n}", fill=_tint(SKY, 0.2), code_size=CODE_FONT)
        y_prev = y + 0.22
    _text(ax, xe - 0.35, 3.72, "⋮", size=15)

    # the memory: up from the last encoder block, then along a bus to every decoder block
    ys, y_mem = (2.3, 4.25, 6.45), 5.25        # the decoder blocks' bottom edges; the bus joint
    _arrow(ax, (xe, 4.52), (xe, y_mem), (x_bus, y_mem), head=False, lw=2.2, colour=BLUE)
    ax.plot([x_bus, x_bus], [ys[0] + 0.68, ys[-1] + 0.68], color=BLUE, lw=2.2, zorder=1)
    _text(ax, xe, y_mem + 0.52, "memory", colour=BLUE, weight="bold")
    _text(ax, xe, y_mem + 0.25, "(B, S, d_model)", size=SHAPE_FONT, mono=True)

    # the decoder: DecoderBlock 1, 2, ..., N: self-attention, cross-attention, feed-forward
    dec, y_prev = _code("transformer.DecoderBlock"), 1.5
    for y, n in zip(ys, ("1", "2", "N")):
        ax.add_patch(FancyBboxPatch((xd - wd / 2 - 0.15, y), wd + 0.3, 1.55, lw=1.1, fc="#efefef",
                                    ec=MUTED, boxstyle="round,pad=0,rounding_size=0.1", zorder=0))
        _text(ax, xd - wd / 2 - 0.05, y + 1.38, f"{dec} {n}", size=CODE_FONT - 0.5, mono=True,
              ha="left", weight="bold")
        _arrow(ax, (xd, y_prev), (xd, y + 0.1))
        if n != "N":
            _shape(ax, xd, (y_prev + y) / 2, "(B, T, d_model)")
        subs = ((_attr("transformer.DecoderBlock.self_attn") + " (causal)", ATTN),
                (_attr("transformer.DecoderBlock.cross_attn"), ATTN),
                (_attr("transformer.DecoderBlock.ff"), FF))
        for j, (sub, fill) in enumerate(subs):
            _box(ax, xd, y + 0.25 + 0.43 * j, wd, 0.3, None, sub, fill=fill, code_size=CODE_FONT)
            _arrow(ax, (xd, y + 0.1 + 0.43 * j - (0.03 if j else 0)), (xd, y + 0.1 + 0.43 * j))
        _arrow(ax, (x_bus, y + 0.68), (xd - wd / 2, y + 0.68), lw=2.2, colour=BLUE)
        _text(ax, (x_bus + xd - wd / 2) / 2, y + 0.83, "K, V", size=9.5, colour=BLUE)
        y_prev = y + 1.55
    _text(ax, xd - 0.3, 6.17, "⋮", size=15)

    # the output layer
    _arrow(ax, (xd, 8.0), (xd, 8.45))
    _shape(ax, xd, 8.22, "(B, T, d_model)")
    _box(ax, xd, 8.67, wd, 0.44, None, _code("transformer.Transformer.out"), fill=OUT)
    _arrow(ax, (xd, 8.89), (xd, 9.25))
    _text(ax, xd, 9.38, "logits (B, T, V)", size=SHAPE_FONT, mono=True, va="bottom")
    notes = ["Transformer.encode runs once:", "memory is the last encoder", "block's output.", "",
             "The cross_attn of every", "decoder block reads the same", "memory: queries from the",
             "decoder, keys and values", "(K, V) from the memory.", "",
             "Add & Norm left out."]
    _text(ax, 0.3, H - 0.35, "\n".join(notes), size=FONT - 1.5, ha="left", va="top",
          colour=MUTED, linespacing=1.3)
    return fig


# ---------------------------------------------------------------------------------------------
# 6. Incremental decoding with the key/value cache (chapter 12)

def kv_cache() -> Figure:
    """Step t of generation in one self-attention layer: only the newest token is fed; its key
    and value are appended to the cache, and its one query attends over all t cached keys."""
    W, H, t, cell = 6.4, 7.4, 5, 0.56
    fig, ax = _canvas(W, H)
    xs = [1.95 + 0.62 * i for i in range(t)]
    old, new = _tint(BLUE, 0.18), _tint(ORANGE, 0.55)
    sub = "₁₂₃₄₅"
    _text(ax, 0.3, H - 0.3, f"Step t = {t} of " + _code("lm.generate") + ", one layer of "
          + _code("transformer.SelfAttentionStack"), size=CODE_FONT, mono=True, ha="left",
          va="top", weight="bold")
    ax.add_patch(Rectangle((0.3, H - 0.86), 0.22, 0.22, fc=old, ec=INK, lw=0.9))
    _text(ax, 0.6, H - 0.75, "kept from earlier steps", size=FONT - 2, ha="left")
    ax.add_patch(Rectangle((3.2, H - 0.86), 0.22, 0.22, fc=new, ec=INK, lw=0.9))
    _text(ax, 3.5, H - 0.75, "computed at this step", size=FONT - 2, ha="left")

    rows = dict(tokens=5.9, query=4.35, keys=3.4, weights=2.5, values=1.6)
    names = dict(tokens=("tokens", "ids (B, 1)"), query=("query", "(B, h, 1, d_k)"),
                 keys=("cache['k']", "(B, h, t, d_k)"), weights=("weights", "(B, h, 1, t)"),
                 values=("cache['v']", "(B, h, t, d_k)"))
    letters = dict(tokens="x", keys="k", weights="α", values="v")
    for row, y in rows.items():
        _text(ax, 0.3, y + 0.1, names[row][0], size=FONT - 1.5, mono=row in ("keys", "values"),
              ha="left")
        _text(ax, 0.3, y - 0.15, names[row][1], size=CODE_FONT - 1.5, mono=True, colour=MUTED,
              ha="left")
        for i, x in enumerate(xs):
            if row == "query" and i < t - 1:
                continue
            fill = new if i == t - 1 or row == "weights" else old
            _box(ax, x, y, cell, 0.42, None, f"{letters.get(row, 'q')}{sub[i]}", fill=fill,
                 code_size=FONT - 1)
    _text(ax, xs[-1] + 0.45, rows["tokens"], "← fed now", size=FONT - 2, ha="left")

    # the new token: embedding at position t - 1, then its query, key and value
    _arrow(ax, (xs[-1], rows["tokens"] - 0.21), (xs[-1], 5.12 + 0.25))
    _box(ax, xs[-1], 5.12, 1.75, 0.5, "embed, position t − 1", "W_q, W_k, W_v",
         fill=new, size=FONT - 2, code_size=CODE_FONT - 1)
    _arrow(ax, (xs[-1], 5.12 - 0.25), (xs[-1], rows["query"] + 0.21))
    for row, x_line in (("keys", 5.55), ("values", 5.8)):
        y_out = 5.12 - 0.1 if row == "keys" else 5.12 + 0.1
        _arrow(ax, (xs[-1] + 0.875, y_out), (x_line, y_out), (x_line, rows[row]),
               (xs[-1] + cell / 2, rows[row]), colour=VERMILLION)
        _text(ax, (xs[-1] + x_line) / 2 + 0.1, rows[row] + 0.14, "append", size=FONT - 3,
              colour=VERMILLION)

    # the one query meets every cached key; the weights sum the cached values
    for i, x in enumerate(xs):
        _arrow(ax, (xs[-1] - 0.1 * (t - 1 - i), rows["query"] - 0.21), (x, rows["keys"] + 0.21),
               lw=0.9, colour=MUTED)
        _arrow(ax, (x, rows["keys"] - 0.21), (x, rows["weights"] + 0.21), lw=0.9)
        _arrow(ax, (x, rows["weights"] - 0.21), (x, rows["values"] + 0.21), lw=0.9)
        _arrow(ax, (x, rows["values"] - 0.21), (xs[2] + (x - xs[2]) * 0.25, 0.95), lw=0.9)
    _text(ax, xs[-1] - 0.45, rows["query"] + 0.16, "score q₅ · kᵢ / √d_k for all t keys;\n"
          "no mask needed: all are in the past", size=FONT - 3, ha="right", colour=MUTED)
    _text(ax, xs[0] - 0.25, (rows["keys"] + rows["weights"]) / 2, "softmax", size=FONT - 3,
          ha="right", colour=MUTED)
    _text(ax, xs[2], 0.78, "Σ αᵢ vᵢ: (B, h, 1, d_k) → W_o, next layers → logits (B, 1, V)\n→ "
          + _code("lm.sample_next") + " → x₆, fed at step t + 1", size=CODE_FONT - 1.5,
          mono=True, va="top", bbox=dict(fc="white", ec="none", pad=1))
    _text(ax, 0.3, 0.22, "Without the cache, step t feeds ids (B, t) and recomputes all t keys "
          "and values.", size=FONT - 3, colour=MUTED, ha="left")
    return fig


# ---------------------------------------------------------------------------------------------
# All of them

DIAGRAMS = {
    "transformer": transformer,
    "soft_lookup": soft_lookup,
    "multi_head": multi_head,
    "masks": masks,
    "memory_to_decoder": memory_to_decoder,
    "kv_cache": kv_cache,
}


def write_all(out: str | Path = "book/figures") -> list[Path]:
    """Draw every diagram and write it to ``out``/NAME.svg; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [save(draw(), out / f"{name}.svg") for name, draw in DIAGRAMS.items()]
