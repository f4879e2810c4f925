"""Chapter 7 (positional encoding): the graders of the sinusoidal table and of rotary position
embeddings (RoPE)."""
from __future__ import annotations

import torch

from ..positional import sinusoidal_encoding
from .core import Hint, expect_close, expect_shape, grader


def _ch07_table(T: int, d_model: int, base: float = 10000.0, *, start: int = 0,
                two_j: bool = True, layout: str = "interleaved") -> torch.Tensor:
    """Sinusoidal table and its typical mistakes (positions from ``start``, exponent j instead of
    2j, sines and cosines swapped or in two halves), in float64, for the hints."""
    p = torch.arange(start, start + T, dtype=torch.float64)[:, None]            # (T, 1)
    j = torch.arange(d_model // 2, dtype=torch.float64)
    omega = base ** (-(2 * j if two_j else j) / d_model)                      # (d_model/2,)
    sin, cos = torch.sin(p * omega), torch.cos(p * omega)                     # (T, d_model/2)
    if layout == "halves":
        return torch.cat([sin, cos], dim=1)
    first, second = (cos, sin) if layout == "swapped" else (sin, cos)
    return torch.stack([first, second], dim=-1).reshape(T, d_model)


@grader("ex-07-sinusoid-table", target="sinusoid_table")
def check_sinusoid_table(fn):
    """Checks ``sinusoid_table(T, d_model, base=10000.0) -> (T, d_model) float32``."""
    n = 0
    mistakes = [
        (dict(layout="halves"), "all the sines come first and then all the cosines; interleave "
         "them: column 2j holds sin(p * omega_j) and column 2j+1 holds cos(p * omega_j)"),
        (dict(layout="swapped"), "sine and cosine are swapped: column 2j is sin(p * omega_j), "
         "column 2j+1 is cos(p * omega_j) (so row 0 is [0, 1, 0, 1, ...])"),
        (dict(start=1), "the positions start at 1; they start at 0, so row 0 is [0, 1, 0, 1, ...]"),
        (dict(two_j=False), "the frequencies are wrong: omega_j = base ** (-2j / d_model) for "
         "pair j = 0 .. d_model/2 - 1 (the exponent has 2j, not j)"),
    ]
    cases = [("T=10, d_model=8", 10, 8, None), ("T=1, d_model=2", 1, 2, None),
             ("T=50, d_model=32", 50, 32, None), ("T=7, d_model=6, base=100.0", 7, 6, 100.0),
             ("T=20, d_model=16, base=10.0", 20, 16, 10.0)]
    for what, T, d_model, base in cases:
        got = fn(T, d_model) if base is None else fn(T, d_model, base=base)
        b = 10000.0 if base is None else base
        expect_shape(got, (T, d_model), f"sinusoid_table for {what}")
        if got.dtype != torch.float32:
            raise Hint(f"sinusoid_table for {what}: expected dtype torch.float32, got {got.dtype}")
        expected = sinusoidal_encoding(T, d_model, base=b)
        if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
            for kwargs, message in mistakes:
                if T > 1 and torch.allclose(got.double(), _ch07_table(T, d_model, b, **kwargs),
                                            atol=1e-4, rtol=1e-4):
                    raise Hint(f"sinusoid_table for {what}: {message}")
            if base is not None and torch.allclose(got, sinusoidal_encoding(T, d_model),
                                                   atol=1e-4, rtol=1e-4):
                raise Hint(f"sinusoid_table for {what}: the result is the table for base "
                           f"10000; use the `base` argument (omega_j = base ** (-2j / d_model))")
            expect_close(got, expected, f"sinusoid_table for {what} (rows are positions "
                         "p = 0..T-1, column 2j = sin(p * omega_j), column 2j+1 = cos(p * omega_j))",
                         atol=1e-4, rtol=1e-4)
        n += 1
    try:
        fn(4, 5)
    except ValueError:
        n += 1
    except Exception as e:
        raise Hint(f"sinusoid_table(4, 5): an odd d_model has no sin/cos pairs; raise a ValueError "
                   f"that says so, not {type(e).__name__}: {e}") from None
    else:
        raise Hint("sinusoid_table(4, 5): an odd d_model has no sin/cos pairs; raise a ValueError "
                   "that says so instead of returning a table")
    return n


def _ch07_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0, *,
               sign: float = 1.0, two_j: bool = True, halves: bool = False) -> torch.Tensor:
    """Rotary position embedding: rotate each pair (2j, 2j+1) of the last dimension of x (..., T, d)
    by the angle positions[t] * omega_j, omega_j = base ** (-2j / d). The keyword arguments give
    typical mistakes (the wrong direction, exponent j, the pairs (j, j + d/2)), for the hints."""
    d = x.shape[-1]
    j = torch.arange(d // 2, dtype=torch.float64)
    omega = base ** (-(2 * j if two_j else j) / d)                            # (d/2,)
    angle = sign * positions.to(torch.float64)[:, None] * omega               # (T, d/2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    xd = x.double()
    x1, x2 = (xd[..., :d // 2], xd[..., d // 2:]) if halves else (xd[..., 0::2], xd[..., 1::2])
    r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos                         # (..., T, d/2)
    out = torch.cat([r1, r2], -1) if halves else torch.stack([r1, r2], -1).flatten(-2)
    return out.to(x.dtype)


@grader("ex-07-rope", target="apply_rope")
def check_apply_rope(fn):
    """Checks ``apply_rope(x, positions)``: x (..., T, d), positions (T,) -> (..., T, d)."""
    n = 0
    shapes = [("x of shape (T, d) = (5, 8)", (5, 8)), ("x of shape (B, T, d) = (2, 6, 4)", (2, 6, 4)),
              ("x of shape (B, h, T, d) = (2, 3, 7, 16)", (2, 3, 7, 16)),
              ("x of shape (B, h, T, d) = (1, 1, 1, 2)", (1, 1, 1, 2))]
    for what, shape in shapes:
        x = torch.randn(shape)
        positions = torch.arange(shape[-2])
        x_before = x.clone()
        got = fn(x, positions)
        expect_shape(got, shape, f"apply_rope on {what}")
        if got.dtype != x.dtype:
            raise Hint(f"apply_rope on {what}: expected dtype {x.dtype} (the dtype of x), got {got.dtype}")
        if not torch.equal(x, x_before):
            raise Hint(f"apply_rope on {what}: x was changed in place; return a new tensor and "
                       "leave the input alone (the caller may still need the unrotated vectors)")
        n += 1
    x = torch.randn(2, 3, 10, 16)
    positions = torch.arange(10) * 3
    got = fn(x, positions)
    norms_in, norms_out = x.norm(dim=-1), got.norm(dim=-1)
    if not torch.allclose(norms_in, norms_out, atol=1e-4, rtol=1e-4):
        k = int((norms_in - norms_out).abs().flatten().argmax())
        raise Hint(f"apply_rope on x (2, 3, 10, 16) at positions 0, 3, ..., 27: a rotation keeps "
                   f"the length of every vector, but one of length {norms_in.flatten()[k]:.4f} "
                   f"came back with length {norms_out.flatten()[k]:.4f}. Rotate each pair "
                   "(x_2j, x_2j+1); do not add the sinusoids to x")
    n += 1
    x = torch.randn(3, 4, 8)
    got = fn(x, torch.zeros(4, dtype=torch.long))
    if not torch.allclose(got, x, atol=1e-5):
        ignored = torch.allclose(got, _ch07_rope(x, torch.arange(4)), atol=1e-4)
        raise Hint("apply_rope with positions [0, 0, 0, 0]: every rotation angle is "
                   "0 * omega_j = 0, so the vectors must come back unchanged; they did not"
                   + (". `positions` was ignored (the result is that of positions 0..T-1); rotate "
                      "row t by the angle positions[t] * omega_j" if ignored else ""))
    n += 1
    d = 16
    q, k = torch.randn(d), torch.randn(d)
    for t, s in [(3, 7), (10, 2), (5, 5)]:
        scores = []
        for c in (0, 4, 25):
            qt = fn(q[None], torch.tensor([t + c]))[0]
            ks = fn(k[None], torch.tensor([s + c]))[0]
            scores.append(float(qt @ ks))
        if max(scores) - min(scores) > 1e-3 * (1 + abs(scores[0])):
            raise Hint(f"q at position t and k at position s: the score q.k after rotation must "
                       f"depend only on the offset s - t = {s - t}, but (t, s) = ({t}, {s}), "
                       f"({t + 4}, {s + 4}), ({t + 25}, {s + 25}) gave {scores[0]:.4f}, "
                       f"{scores[1]:.4f}, {scores[2]:.4f}. Rotate by positions[t] * omega_j, "
                       "the same rule for queries and keys")
        n += 1
    x = torch.randn(2, 5, 8)
    for what, positions in [("positions 7, 8, 9, 10, 11", torch.arange(7, 12)),
                            ("positions 0, 2, 4, 6, 8", torch.arange(0, 10, 2)),
                            ("positions 4, 3, 2, 1, 0", torch.arange(4, -1, -1))]:
        got = fn(x, positions)
        expected = _ch07_rope(x, positions)
        if torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
            n += 1
            continue
        mistakes = [
            (_ch07_rope(x, torch.arange(5)), "`positions` was ignored (the result is that of "
             "positions 0..T-1); rotate row t by the angle positions[t] * omega_j"),
            (_ch07_rope(x, positions, sign=-1.0), "each pair is rotated the wrong way: "
             "x'_2j = x_2j cos(a) - x_2j+1 sin(a) and x'_2j+1 = x_2j sin(a) + x_2j+1 cos(a), "
             "with a = positions[t] * omega_j"),
            (_ch07_rope(x, positions, halves=True), "dimension j is paired with j + d/2 (the "
             "'rotate half' layout of some libraries); the book pairs (2j, 2j+1), like the columns "
             "of the sinusoidal table"),
            (_ch07_rope(x, positions, two_j=False), "the frequencies are wrong: omega_j = "
             "10000 ** (-2j / d) for pair j (the exponent has 2j, not j)"),
        ]
        for wrong, message in mistakes:
            if torch.allclose(got, wrong, atol=1e-4, rtol=1e-4):
                raise Hint(f"apply_rope on x (2, 5, 8) at {what}: {message}")
        expect_close(got, expected, f"apply_rope on x (2, 5, 8) at {what}", atol=1e-4, rtol=1e-4)
    return n

