"""Chapter 4 (scaled dot-product attention): the graders of attention with masks, of the entropy
of the attention weights, and of chunked attention.

Masks are bool, True = may attend, broadcastable to the scores (..., T, S)."""
from __future__ import annotations

import math

import torch

from ..attention import causal_mask, masked_softmax, padding_mask, scaled_dot_product_attention
from ..bench import peak_memory, score_matrix_bytes
from ..batching import lengths_mask
from .core import (OFF_BY_ONE, Hint, expect_close, expect_pair, expect_shape, grader,
                   shifted_causal_mask)


def _c4_pad_mask(lengths, S: int) -> torch.Tensor:
    """(B, 1, 1, S) bool padding mask, True at the first lengths[b] positions."""
    return padding_mask(lengths_mask(lengths, S))


def _c4_call(fn, what: str, *args, advice: str = "", **kwargs):
    """Call the reader's function; a crash becomes a Hint that names the input it crashed on."""
    try:
        return fn(*args, **kwargs)
    except (Hint, NotImplementedError):
        raise
    except Exception as e:
        raise Hint(f"on {what}: your function raised {type(e).__name__}: {e}{advice}") from None


def _c4_attention_ref(q, k, v, mask=None, causal=False, scale=None, dim=-1):
    """The book's attention, or (dim=-2) the same with the softmax taken over the queries."""
    if dim == -1:
        return scaled_dot_product_attention(q, k, v, mask=mask, causal=causal, scale=scale)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5                     # (..., T, S)
    if causal:
        c = causal_mask(q.shape[-2], k.shape[-2])
        mask = c if mask is None else mask & c
    mask = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask.expand(scores.shape)
    w = masked_softmax(scores, mask, dim=-2)
    return w @ v, w


def _c4_attention_mistake(got, q, k, v, mask, causal) -> str | None:
    """The name of a plausible mistake whose output matches ``got``, if any."""
    d_k, d_v, T, S = q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2]
    tries = [(dict(scale=1.0), f"the scores were not scaled: divide q k^T by sqrt(d_k) = "
                               f"{d_k ** 0.5:.3g} (here d_k = {d_k})"),
             (dict(scale=1.0 / d_k), f"the scores were divided by d_k = {d_k}; divide by "
                                     f"sqrt(d_k) = {d_k ** 0.5:.3g} instead")]
    if d_v != d_k:
        tries.append((dict(scale=d_v ** -0.5), f"the scores were divided by sqrt(d_v) (d_v = "
                      f"{d_v}, the width of the values); the scale uses d_k = {d_k}, the width "
                      "of the queries and keys"))
    tries.append((dict(dim=-2), "the softmax was taken over the queries (dim -2); each query's "
                                "weights must sum to 1 over the keys, the last dimension"))
    if mask is not None:
        tries.append((dict(mask=~mask), "the mask was read the wrong way round: in this book "
                      "True means 'may attend' (a real token) and False means 'blocked', as in "
                      "F.scaled_dot_product_attention; nn.MultiheadAttention's key_padding_mask "
                      "is the opposite"))
        if causal:
            tries.append((dict(mask=None), "the mask was ignored when causal=True: combine the two "
                          "with mask & causal"))
    if causal:
        tries.append((dict(causal=False), "causal=True was ignored: block every key s > t (the "
                      "future) of query t"))
        future = ~causal_mask(T, S) | torch.eye(T, S, dtype=torch.bool)
        tries.append((dict(causal=False, mask=future if mask is None else mask & future),
                      "the causal mask is the wrong way round: query t may see keys s <= t (the "
                      "lower triangle, torch.tril), not s >= t"))
    for change, hint in tries:
        kw = dict(mask=mask, causal=causal)
        kw.update(change)
        try:
            alt, _ = _c4_attention_ref(q, k, v, **kw)
        except RuntimeError:  # this mistake cannot even be made on these shapes
            continue
        if alt.shape == got.shape and torch.allclose(got, alt.to(got.dtype), atol=1e-6, rtol=1e-5):
            return hint
    return None


def _c4_off_by_one(got, q, k, v, mask) -> str | None:
    """The hint for a causal mask off by one, if ``got`` (..., T, d_v) is attention with the
    diagonal of the causal mask moved by one. Rows that the shifted mask leaves without any key
    are not compared (they may be NaN, zero or uniform)."""
    for shift, hint in OFF_BY_ONE.items():
        shifted = shifted_causal_mask(q.shape[-2], k.shape[-2], shift)            # (T, S)
        allowed = shifted if mask is None else mask & shifted                      # (..., T, S)
        alt, _ = scaled_dot_product_attention(q, k, v, mask=allowed)               # (..., T, d_v)
        live = allowed.any(-1, keepdim=True)                                       # (..., T, 1)
        if alt.shape == got.shape and torch.allclose(torch.where(live, got, alt),
                                                     alt.to(got.dtype), atol=1e-6, rtol=1e-5):
            return hint
    return None


def _c4_sdpa_cases(rnd, g) -> list:
    """The cases of ex-04-sdpa: (what, q, k, v, mask or None, causal)."""
    row_blocked = torch.rand(2, 4, 5, generator=g) < 0.7
    row_blocked[0, 2] = False            # query 2 of sequence 0 sees no key at all
    row_blocked[1, 1] = True
    return [
        ("one sequence: q (4, 8), k (6, 8), v (6, 5)", rnd(4, 8), rnd(6, 8), rnd(6, 5), None,
         False),
        ("a batch: q (2, 4, 8), k (2, 6, 8), v (2, 6, 5)", rnd(2, 4, 8), rnd(2, 6, 8), rnd(2, 6, 5),
         None, False),
        ("heads: q (2, 3, 5, 16), k and v (2, 3, 7, 16) and (2, 3, 7, 4), padding mask "
         "(2, 1, 1, 7) with lengths [7, 4]", rnd(2, 3, 5, 16), rnd(2, 3, 7, 16), rnd(2, 3, 7, 4),
         _c4_pad_mask([7, 4], 7), False),
        ("causal self-attention: q, k, v (2, 3, 6, 8), causal=True", rnd(2, 3, 6, 8),
         rnd(2, 3, 6, 8), rnd(2, 3, 6, 8), None, True),
        ("causal self-attention with padding: q, k, v (2, 2, 6, 8), lengths [6, 3], causal=True",
         rnd(2, 2, 6, 8), rnd(2, 2, 6, 8), rnd(2, 2, 6, 8), _c4_pad_mask([6, 3], 6), True),
        ("a (2, 4, 5) mask in which query 2 of sequence 0 may attend to no key at all",
         rnd(2, 4, 8), rnd(2, 5, 8), rnd(2, 5, 3), row_blocked, False),
        ("large scores: q and k (2, 5, 64) times 30", rnd(2, 5, 64, scale=30.0),
         rnd(2, 5, 64, scale=30.0), rnd(2, 5, 4), None, False),
        ("float32 inputs: q, k, v (2, 4, 8)", rnd(2, 4, 8, dtype=torch.float32),
         rnd(2, 4, 8, dtype=torch.float32), rnd(2, 4, 8, dtype=torch.float32), None, False),
    ]


def _c4_sdpa_case(fn, what, q, k, v, mask, causal) -> None:
    """Run the reader's attention on one case; a Hint for the first thing wrong: the pair, its
    order, shapes and dtype, then (:func:`_c4_explain`) the values."""
    kwargs = {}
    if mask is not None:
        kwargs["mask"] = mask.clone()
    if causal:
        kwargs["causal"] = True
    got = _c4_call(fn, what, q.clone(), k.clone(), v.clone(), **kwargs)
    out_ref, w_ref = scaled_dot_product_attention(q, k, v, mask=mask, causal=causal)
    expect_pair(got, "(out, weights)", what)
    out, w = got
    if (isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor)
            and out_ref.shape != w_ref.shape
            and out.shape == w_ref.shape and w.shape == out_ref.shape):
        raise Hint(f"on {what}: return (out, weights) in that order; you returned the weights "
                   f"{tuple(out.shape)} first and the output {tuple(w.shape)} second")
    expect_shape(out, out_ref.shape, f"out on {what}")
    expect_shape(w, w_ref.shape, f"weights on {what}")
    if out.dtype != q.dtype:
        raise Hint(f"out on {what}: expected dtype {q.dtype} (the dtype of q), got {out.dtype}")
    _c4_explain(what, out, w, out_ref, q, k, v, mask, causal)
    expect_close(out, out_ref, f"out on {what}")
    expect_close(w, w_ref, f"weights on {what}")


def _c4_explain(what, out, w, out_ref, q, k, v, mask, causal) -> None:
    """A Hint naming why ``out`` (..., T, d_v) and ``w`` (..., T, S) differ from the reference,
    if a known reason fits: a causal mask off by one, NaN (a fully blocked row, or overflow), a
    plausible mistake, or weight on a blocked key."""
    allowed = torch.ones(w.shape, dtype=torch.bool)                      # (..., T, S)
    if mask is not None:
        allowed = allowed & mask
    if causal:
        allowed = allowed & causal_mask(q.shape[-2], k.shape[-2])
    empty = ~allowed.any(-1)                                             # (..., T) fully masked rows
    if causal and not torch.allclose(out, out_ref, atol=1e-5, rtol=1e-4):
        off_by_one = _c4_off_by_one(out, q, k, v, mask)
        if off_by_one is not None:
            raise Hint(f"on {what}: {off_by_one}")
    if torch.isnan(out).any() or torch.isnan(w).any():
        bad = torch.isnan(w).any(-1) | torch.isnan(out).any(-1)
        idx = tuple(torch.nonzero(bad)[0].tolist())
        if empty[idx]:
            raise Hint(f"on {what}: NaN in query row {idx}, whose keys are all blocked. The "
                       "softmax of a row of -inf is 0/0 = NaN; return all-zero weights and "
                       "a zero output for such a row (NaN would spread to everything that "
                       "touches it, even multiplied by 0)")
        raise Hint(f"on {what}: NaN in query row {idx}. Large scores overflow exp(); use "
                   "torch.softmax, which subtracts each row's maximum first")
    if torch.allclose(out, out_ref, atol=1e-5, rtol=1e-4):
        return
    mistake = _c4_attention_mistake(out, q, k, v, mask, causal)
    if mistake is not None:
        raise Hint(f"on {what}: {mistake}")
    if (w[~allowed] != 0).any():
        idx = tuple(torch.nonzero(~allowed & (w != 0))[0].tolist())
        if empty[idx[:-1]]:
            raise Hint(f"on {what}: query row {list(idx[:-1])} may attend to no key, so "
                       f"its weights must all be 0, got {w[idx].item():.3g} at key "
                       f"{idx[-1]}. A large negative fill value such as -1e9 makes such "
                       "a row uniform, attending to padding; give it zero weights")
        raise Hint(f"on {what}: weights{list(idx)} belongs to a blocked key and must be "
                   f"exactly 0, got {w[idx].item():.3g}; set blocked scores to -inf "
                   "before the softmax")


def _c4_sdpa_gradients(fn, rnd) -> None:
    """Gradients flow back to q, k and v as they do through the reference."""
    what = ("the gradients of (out * g).sum() for causal attention with padding, q, k, v "
            "(2, 2, 6, 8)")
    q, k, v = (rnd(2, 2, 6, 8).requires_grad_() for _ in range(3))
    mask = _c4_pad_mask([6, 3], 6)
    out, _ = _c4_call(fn, what, q, k, v, mask=mask.clone(), causal=True)
    upstream = rnd(*out.shape)
    if not out.requires_grad:
        raise Hint(f"on {what}: out does not require grad; do not use torch.no_grad(), .detach() "
                   "or .data inside the function, or nothing can be trained through it")
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v), allow_unused=True)
    out_ref, _ = scaled_dot_product_attention(q, k, v, mask=mask, causal=True)
    refs = torch.autograd.grad((out_ref * upstream).sum(), (q, k, v))
    for name, got_g, ref_g in zip("qkv", grads, refs):
        if got_g is None:
            raise Hint(f"on {what}: no gradient reaches {name}; it must take part in the "
                       "computation through differentiable operations")
        expect_close(got_g, ref_g, f"the gradient with respect to {name} on {what}")


@grader("ex-04-sdpa", target="scaled_dot_product_attention")
def check_scaled_dot_product_attention(fn):
    """Checks ``scaled_dot_product_attention(q, k, v, mask=None, causal=False) -> (out, weights)``
    on 2-, 3- and 4-dimensional inputs, padding and causal masks, a fully masked row, large
    scores, float32, and the gradients."""
    g = torch.Generator().manual_seed(4)

    def rnd(*shape, dtype=torch.float64, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)

    cases = _c4_sdpa_cases(rnd, g)
    for case in cases:
        _c4_sdpa_case(fn, *case)
    _c4_sdpa_gradients(fn, rnd)
    return len(cases) + 1


def _c4_entropy_ref(d_k: int, scale: float, S: int, n: int = 50_000) -> float:
    """Mean entropy (nats) of softmax(scale * q . k_s) over S keys, q and k_s i.i.d. N(0, 1).

    Given q, the S dot products q . k_s are independent N(0, |q|^2), and |q|^2 is chi-square with
    d_k degrees of freedom, so the scores can be drawn directly (no (n, S, d_k) tensor).
    """
    norm2 = torch.distributions.Chi2(torch.tensor(float(d_k), dtype=torch.float64)).sample((n, 1))
    e = scale * norm2.sqrt() * torch.randn(n, S, dtype=torch.float64)   # (n, S)
    logw = torch.log_softmax(e, dim=-1)
    return float(-(logw.exp() * logw).sum(-1).mean())


@grader("ex-04-attention-entropy", target="attention_entropy")
def check_attention_entropy(fn):
    """Checks ``attention_entropy(d_k, scaled=True, n=1000, S=32) -> float`` against the exact
    distribution, within a tolerance much wider than the sampling noise of n queries."""
    cases = [(4, True, 2000, 32), (4, False, 2000, 32), (64, True, 2000, 32),
             (64, False, 2000, 32), (256, False, 1000, 32), (16, True, 2000, 8)]
    n_checks = 0
    for d_k, scaled, n, S in cases:
        what = f"attention_entropy(d_k={d_k}, scaled={scaled}, n={n}, S={S})"
        got = _c4_call(fn, what, d_k, scaled=scaled, n=n, S=S)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (float, int)):
            raise Hint(f"{what}: return the mean entropy as one Python float (use .item()), got "
                       f"{type(got).__name__}" + (f" of shape {tuple(got.shape)}"
                                                  if isinstance(got, torch.Tensor) else ""))
        got = float(got)
        scale = d_k ** -0.5 if scaled else 1.0
        ref = _c4_entropy_ref(d_k, scale, S)
        tol = 0.05 + 0.03 * ref
        if math.isnan(got):
            raise Hint(f"{what}: got NaN. Without the scaling some weights underflow to exactly 0, "
                       "and 0 * log(0) = 0 * (-inf) = NaN; a zero weight contributes 0 to the "
                       "entropy: use torch.special.xlogy(w, w), or log_softmax for log(w)")
        if S != 32 and abs(got - _c4_entropy_ref(d_k, scale, 32)) <= tol < abs(got - ref):
            raise Hint(f"{what}: got {got:.3f}, the value for 32 keys; use S={S} keys per query")
        if got > math.log(S) + 1e-6:
            raise Hint(f"{what}: got {got:.4f}, more than ln(S) = {math.log(S):.4f}, the entropy "
                       "of uniform weights and the largest possible. Use the natural logarithm, "
                       "and average over the queries (do not sum)")
        if got < -1e-9:
            raise Hint(f"{what}: got {got:.4f}; an entropy is never negative: "
                       "H = -sum_s w_s log w_s")
        if abs(got - ref) <= tol:
            n_checks += 1
            continue
        other = _c4_entropy_ref(d_k, 1.0 if scaled else d_k ** -0.5, S)
        if abs(got - other) <= tol:
            other_name = "without" if scaled else "with"
            raise Hint(f"{what}: got {got:.3f}, which is the value {other_name} the scaling "
                       f"(expected about {ref:.3f}). " +
                       ("Divide the scores by sqrt(d_k) when scaled=True" if scaled else
                        "With scaled=False use the raw dot products q . k"))
        if scaled and abs(got - _c4_entropy_ref(d_k, 1.0 / d_k, S)) <= tol:
            raise Hint(f"{what}: got {got:.3f}, expected about {ref:.3f}: the scores seem divided "
                       f"by d_k = {d_k} instead of sqrt(d_k) = {d_k ** 0.5:.3g}")
        if ref > 0.5 and abs(got * math.log(2) - ref) <= tol:
            raise Hint(f"{what}: got {got:.3f}, expected about {ref:.3f}: that is the entropy in "
                       "bits; use the natural logarithm (torch.log), which gives nats")
        raise Hint(f"{what}: expected about {ref:.3f} (within {tol:.3f}: q and each of the S keys "
                   f"drawn with i.i.d. N(0, 1) components), got {got:.3f}")
    return n_checks


@grader("ex-04-chunked-attention", target="chunked_attention")
def check_chunked_attention(fn):
    """Checks ``chunked_attention(q, k, v, mask=None, chunk_size=64) -> out``: the same output as
    the book's attention for several chunk sizes and masks, and a peak memory well below that of
    the full score matrix."""
    g = torch.Generator().manual_seed(4)

    def rnd(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    blocked = torch.rand(2, 10, 12, generator=g) < 0.7
    blocked[1, 3] = False                       # query 3 of sequence 1 sees no key at all
    cases = [
        ("q (2, 3, 10, 8), k and v (2, 3, 12, 8) and (2, 3, 12, 5), chunk_size=4 (10 is not a "
         "multiple of 4)", rnd(2, 3, 10, 8), rnd(2, 3, 12, 8), rnd(2, 3, 12, 5), None, 4),
        ("the same shapes with a (2, 1, 1, 12) padding mask (lengths [12, 5]), chunk_size=3",
         rnd(2, 3, 10, 8), rnd(2, 3, 12, 8), rnd(2, 3, 12, 5), _c4_pad_mask([12, 5], 12), 3),
        ("q (2, 10, 8), k and v (2, 12, 8), a (2, 10, 12) mask in which query 3 of sequence 1 "
         "sees no key, chunk_size=4", rnd(2, 10, 8), rnd(2, 12, 8), rnd(2, 12, 8), blocked, 4),
        ("chunk_size=64, larger than T=10", rnd(2, 10, 8), rnd(2, 12, 8), rnd(2, 12, 8), None, 64),
        ("chunk_size=1", rnd(2, 10, 8), rnd(2, 12, 8), rnd(2, 12, 8), _c4_pad_mask([12, 7], 12)[:, 0],
         1),
    ]
    n = 0
    for what, q, k, v, mask, c in cases:
        kwargs = {"chunk_size": c}
        if mask is not None:
            kwargs["mask"] = mask.clone()
        advice = ""
        if mask is not None and mask.shape[-2] == 1:
            advice = (f". The mask has shape {tuple(mask.shape)}: its query dimension has size 1 "
                      "and broadcasts over all T queries, so mask[..., i:i + chunk_size, :] is "
                      "empty for i > 0. Slice it only where mask.shape[-2] == T, or first expand "
                      "it to (..., T, S) (a view: no copy)")
        got = _c4_call(fn, what, q.clone(), k.clone(), v.clone(), advice=advice, **kwargs)
        ref, _ = scaled_dot_product_attention(q, k, v, mask=mask)
        if isinstance(got, tuple):
            raise Hint(f"on {what}: return only the output tensor out (..., T, d_v), not a tuple")
        if (isinstance(got, torch.Tensor) and got.dim() == ref.dim()
                and got.shape[-2] < ref.shape[-2]):
            raise Hint(f"on {what}: out has {got.shape[-2]} query rows, expected T = "
                       f"{ref.shape[-2]}; the last chunk may be shorter than chunk_size and must "
                       "not be dropped (range(0, T, chunk_size) visits every chunk)")
        expect_shape(got, ref.shape, f"out on {what}")
        if torch.isnan(got).any():
            raise Hint(f"on {what}: NaN in the output. A query whose keys are all blocked must get "
                       "a zero output (the book's attention function already does this)")
        if not torch.allclose(got, ref, atol=1e-6, rtol=1e-5):
            mistake = _c4_attention_mistake(got, q, k, v, mask, False)
            if mistake is not None:
                raise Hint(f"on {what}: {mistake}")
        expect_close(got, ref, f"out on {what}")
        n += 1

    # Memory: one chunk of scores at a time, never the whole (B, h, T, S) matrix.
    B, h, T, d_k = 1, 2, 1024, 32
    q, k, v = rnd(B, h, T, d_k, dtype=torch.float32), rnd(B, h, T, d_k, dtype=torch.float32), \
        rnd(B, h, T, d_k, dtype=torch.float32)
    what = f"q, k, v of shape {(B, h, T, d_k)} (float32), chunk_size=64"
    full = score_matrix_bytes(B, h, T)
    try:
        peak = peak_memory(fn, q, k, v, chunk_size=64)
    except (Hint, NotImplementedError):
        raise
    except Exception as e:
        raise Hint(f"on {what}: your function raised {type(e).__name__}: {e}") from None
    if peak > full / 2:
        raise Hint(f"on {what}: the call used {peak / 2**20:.1f} MiB at its peak, while the full "
                   f"(B, h, T, S) score matrix takes {full / 2**20:.1f} MiB. Compute the scores of "
                   "one chunk of queries at a time, q[..., i:i + chunk_size, :] against all keys, "
                   "so that only a (chunk_size, S) block exists at any moment")
    expect_close(fn(q, k, v, chunk_size=64), scaled_dot_product_attention(q, k, v)[0], f"out on {what}")
    return n + 1

