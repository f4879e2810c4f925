"""Chapter 5 (multi-head attention): the graders of multi-head self-attention from weight
matrices, of each head's contribution to the output, and of multi-query attention.

Masks: ``key_mask`` is (B, T) bool, True at real tokens; attention masks are True = may attend."""
from __future__ import annotations

import torch

from ..attention import causal_mask, masked_softmax, scaled_dot_product_attention
from ..mha import MultiHeadAttention
from ..batching import lengths_mask
from .core import (OFF_BY_ONE, Hint, expect_close, expect_pair, expect_shape, grader,
                   shifted_causal_mask)


def _ref_mhsa(x, W_q, W_k, W_v, W_o, h, key_mask=None, causal=False, *, scale=None,
              split="heads_first", merge="transpose", flip_mask=False, dim=-1, shift=0):
    """Multi-head self-attention from (d_model, d_model) matrices used as ``x @ W``, no biases.

    The keyword-only switches turn it into typical wrong answers, to name the mistake in a hint:
    ``split``: "heads_first" (right: head i gets columns i*d_k..(i+1)*d_k-1), "no_transpose"
    (view(B, h, T, d_k) of the (B, T, d_model) tensor), "strided" (head i gets every h-th column);
    ``merge``: "transpose" (right) or "no_transpose"; ``scale``: the factor on the scores;
    ``shift``: the diagonal of the causal mask moved by +1 or -1 (see ``core.OFF_BY_ONE``).
    key_mask: (B, T) bool, True at real tokens. Returns out (B, T, d_model), weights (B, h, T, T).
    """
    B, T, d = x.shape
    d_k = d // h

    def split_(t):
        if split == "no_transpose":
            return t.reshape(B, h, T, d_k)
        if split == "strided":
            return t.view(B, T, d_k, h).permute(0, 3, 1, 2)
        return t.view(B, T, h, d_k).transpose(1, 2)                        # (B, h, T, d_k)

    q, k, v = split_(x @ W_q), split_(x @ W_k), split_(x @ W_v)
    scores = q @ k.transpose(-2, -1) * (d_k ** -0.5 if scale is None else scale)  # (B, h, T, T)
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool)
    if key_mask is not None:
        allowed = allowed & (~key_mask if flip_mask else key_mask)[:, None, None, :]
    if causal:
        allowed = allowed & (causal_mask(T) if shift == 0 else shifted_causal_mask(T, shift=shift))
    weights = masked_softmax(scores, allowed.expand(scores.shape), dim=dim)
    heads = weights @ v                                                    # (B, h, T, d_k)
    if merge == "no_transpose":
        concat = heads.reshape(B, T, d)
    else:
        concat = heads.transpose(1, 2).reshape(B, T, d)                    # (B, T, d_model)
    return concat @ W_o, weights


def _mhsa_cases():
    """(description, B, T, d_model, h, lengths or None, causal) for the self-attention graders."""
    return [("d_model=8, h=2, no mask", 2, 5, 8, 2, None, False),
            ("a single head (h=1)", 2, 4, 8, 1, None, False),
            ("d_model=16, h=4 and padding lengths [6, 3, 1]", 3, 6, 16, 4, [6, 3, 1], False),
            ("causal=True, d_model=8, h=2", 2, 5, 8, 2, None, True),
            ("causal=True and padding lengths [5, 2], d_model=12, h=3", 2, 5, 12, 3, [5, 2], True),
            ("a batch of 1 sequence of length 1", 1, 1, 8, 2, None, False),
            ("h = d_model = 4 (every head has d_k = 1)", 2, 3, 4, 4, None, False)]


def _diagnose_mhsa_weights(got, args, kwargs, what):
    """A hint naming the mistake when the weights match a typical wrong answer, else None."""
    x, h = args[0], args[5]
    d, d_k = x.shape[-1], x.shape[-1] // args[5]
    wrong = [(dict(scale=d ** -0.5), "the scores were divided by sqrt(d_model); each head "
              f"compares d_k = d_model / h = {d_k}-dimensional queries and keys, so divide by "
              "sqrt(d_k)"),
             (dict(scale=1.0), "the scores were not scaled; divide q k^T by sqrt(d_k)"),
             (dict(flip_mask=True), "the mask is used the wrong way round: key_mask is True at "
              "real tokens (True means 'may attend')"),
             (dict(dim=-2), "the softmax ran over the queries (dim=-2); each query's weights "
              "must sum to 1 over the keys (dim=-1)"),
             (dict(split="no_transpose"), "the heads were split with view(B, h, T, d_k), which "
              "mixes tokens between heads; split the last dimension instead: "
              "view(B, T, h, d_k).transpose(1, 2)"),
             (dict(split="strided"), "head i got every h-th column (view(B, T, d_k, h)); head i "
              "must get the contiguous columns i*d_k .. (i+1)*d_k - 1: view(B, T, h, d_k)")]
    if h == 1:
        wrong = [w for w in wrong if "split" not in w[0]]
    if kwargs.get("key_mask") is None:
        wrong = [w for w in wrong if "flip_mask" not in w[0]]
    for switches, hint in wrong:
        ref_w = _ref_mhsa(*args, **kwargs, **switches)[1]
        if torch.allclose(got, ref_w, atol=1e-6):
            return f"weights on {what}: {hint}"
    if kwargs.get("causal"):
        plain = dict(kwargs, causal=False)
        if torch.allclose(got, _ref_mhsa(*args, **plain)[1], atol=1e-6):
            return f"weights on {what}: causal=True was ignored; query t may only see keys s <= t"
    return None


def _mhsa_off_by_one(weights, args, kwargs) -> str | None:
    """The hint for a causal mask off by one, if ``weights`` (B, h, T, T) are the reference's
    with the causal diagonal moved by one, on every row that still has a key to see (a row
    without one may be NaN, zero or uniform)."""
    for shift, hint in OFF_BY_ONE.items():
        alt = _ref_mhsa(*args, **kwargs, shift=shift)[1]                   # (B, h, T, T)
        live = alt.sum(-1, keepdim=True) > 0                                # (B, h, T, 1)
        if torch.allclose(torch.where(live, weights, alt), alt, atol=1e-6):
            return hint
    return None


def _real_rows_match(out, weights, exp_out, exp_w, key_mask) -> bool:
    """Whether the rows of the real (unpadded) queries match the reference, in the weights
    (B, h, T, T) and in the output (B, T, d_model); key_mask (B, T) is True at real tokens."""
    w, exp = weights.transpose(1, 2)[key_mask], exp_w.transpose(1, 2)[key_mask]  # (n_real, h, T)
    return torch.allclose(w, exp, atol=1e-6) and torch.allclose(out[key_mask], exp_out[key_mask],
                                                                 atol=1e-6)


@grader("ex-05-mhsa", target="multi_head_self_attention")
def check_multi_head_self_attention(fn):
    """Checks ``multi_head_self_attention(x, W_q, W_k, W_v, W_o, h, key_mask=None, causal=False)
    -> (out, weights)`` against a reference on seven inputs.

    The reference blocks padded keys only (key_mask[:, None, None, :]), so a padded query attends
    to the real keys like any other. An answer that also blocks the rows of padded queries (the
    two-sided mask of chapter 4) passes with a note, if those rows are free of NaN: their outputs
    are ignored downstream."""
    n, note = 0, ""
    for what, B, T, d, h, lengths, causal in _mhsa_cases():
        x = torch.randn(B, T, d, dtype=torch.float64)
        Ws = [torch.randn(d, d, dtype=torch.float64) / d ** 0.5 for _ in range(4)]
        key_mask = None if lengths is None else lengths_mask(lengths, T)
        args, kwargs = (x, *Ws, h), dict(key_mask=key_mask, causal=causal)
        exp_out, exp_w = _ref_mhsa(*args, **kwargs)
        got = fn(x.clone(), *(W.clone() for W in Ws), h,
                 key_mask=None if key_mask is None else key_mask.clone(), causal=causal)
        expect_pair(got, "(out, weights)", what)
        out, weights = got
        if isinstance(out, torch.Tensor) and isinstance(weights, torch.Tensor) \
                and out.dim() == 4 and weights.dim() == 3:
            raise Hint(f"on {what}: return (out, weights) in that order: out (B, T, d_model) "
                       "first, then weights (B, h, T, T)")
        expect_shape(weights, (B, h, T, T), f"weights on {what} (x {(B, T, d)}, h={h}: one "
                     "(T, T) matrix per head)")
        expect_shape(out, (B, T, d), f"out on {what}")
        if causal and not torch.allclose(weights, exp_w, atol=1e-6):
            off_by_one = _mhsa_off_by_one(weights, args, kwargs)
            if off_by_one is not None:
                raise Hint(f"weights on {what}: {off_by_one}")
        exact = (torch.allclose(weights, exp_w, atol=1e-6)
                 and torch.allclose(out, exp_out, atol=1e-6))
        if key_mask is not None and not exact and _real_rows_match(out, weights, exp_out, exp_w,
                                                                   key_mask):
            pad = ~key_mask                                                 # (B, T) padded queries
            if not (torch.isfinite(weights.transpose(1, 2)[pad]).all()
                    and torch.isfinite(out[pad]).all()):
                raise Hint(f"on {what}: the rows of padded query positions are NaN; real positions "
                           "match. A padded query whose keys are all blocked has a row of -inf "
                           "scores, and softmax turns it into NaN, which spreads to everything it "
                           "touches: block only the padded keys (key_mask[:, None, None, :]), or "
                           "give such a row zero weights (the book's scaled_dot_product_attention "
                           "does)")
            note = note or (f"rows of padded query positions differ; real positions match "
                            f"(first on {what}). The reference blocks padded keys only, so a "
                            "padded query attends to the real keys like any other; blocking its "
                            "row too is fine: the outputs at padded positions are ignored "
                            "downstream.")
            n += 2
            continue
        if torch.isnan(weights).any():
            raise Hint(f"weights on {what}: NaN; blocked scores must be -inf before the softmax "
                       "and every query here has at least one key it may see")
        hint = None if torch.allclose(weights, exp_w, atol=1e-6) else \
            _diagnose_mhsa_weights(weights, args, kwargs, what)
        if hint:
            raise Hint(hint)
        expect_close(weights, exp_w, f"weights on {what} (head i uses columns i*d_k..(i+1)*d_k-1 "
                     "of W_q and W_k; scores divided by sqrt(d_k))", atol=1e-6)
        n += 1
        mixed = _ref_mhsa(*args, **kwargs, merge="no_transpose")[0]
        if not torch.allclose(mixed, exp_out, atol=1e-6) and torch.allclose(out, mixed, atol=1e-6):
            raise Hint(f"out on {what}: the heads were concatenated with reshape(B, T, d_model) "
                       "straight from (B, h, T, d_k), which mixes tokens; transpose(1, 2) back to "
                       "(B, T, h, d_k) first")
        if torch.allclose(out, _ref_mhsa(*args, **kwargs)[0] @ torch.linalg.inv(Ws[3]), atol=1e-6):
            raise Hint(f"out on {what}: the concatenated heads were not multiplied by W_o")
        expect_close(out, exp_out, f"out on {what} (concat(heads) @ W_o)", atol=1e-6)
        n += 1
    return n, note


def _ref_head_contributions(mha, x, key_mask=None):
    """(B, h, T, d_model): head i's output times its own d_k columns of W_o (no bias)."""
    B, T, d = x.shape
    h, d_k = mha.h, mha.d_k
    q, k, v = (mha.split_heads(W(x)) for W in (mha.W_q, mha.W_k, mha.W_v))  # (B, h, T, d_k)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    heads, _ = scaled_dot_product_attention(q, k, v, mask=mask)             # (B, h, T, d_k)
    W_o = mha.W_o.weight.view(d, h, d_k)                                   # (out, head, d_k)
    return torch.einsum("bhtk,dhk->bhtd", heads, W_o)


@grader("ex-05-head-contributions", target="head_contributions")
def check_head_contributions(fn):
    """Checks ``head_contributions(mha, x, key_mask=None) -> (B, h, T, d_model)``."""
    n = 0
    cases = [("d_model=8, h=2, no mask", 2, 5, 8, 2, None),
             ("a single head (h=1)", 2, 4, 8, 1, None),
             ("d_model=16, h=4 and padding lengths [6, 3, 1]", 3, 6, 16, 4, [6, 3, 1]),
             ("a batch of 1 sequence of length 1", 1, 1, 12, 3, None),
             ("d_model=12, h=3 and padding lengths [2, 5]", 2, 5, 12, 3, [2, 5])]
    for what, B, T, d, h, lengths in cases:
        mha = MultiHeadAttention(d, h).double()
        with torch.no_grad():
            mha.W_o.bias.normal_()          # a visible bias, so that adding it is noticed
        x = torch.randn(B, T, d, dtype=torch.float64)
        key_mask = None if lengths is None else lengths_mask(lengths, T)
        with torch.no_grad():
            exp = _ref_head_contributions(mha, x, key_mask)
            full = mha(x, key_mask=key_mask)[0]
            got = fn(mha, x.clone(), key_mask=None if key_mask is None else key_mask.clone())
        expect_shape(got, (B, h, T, d), f"the contributions on {what} (one (T, d_model) "
                     "contribution per head)")
        if got.dtype != torch.float64:
            raise Hint(f"on {what}: x is float64, the contributions came back as {got.dtype}")
        total = got.sum(1) + mha.W_o.bias
        if torch.allclose(got.sum(1), full, atol=1e-8) and h > 1:
            raise Hint(f"on {what}: the contributions sum to the full output including the bias "
                       "of W_o; leave the bias out (it belongs to no head), so that "
                       "contributions.sum(1) + mha.W_o.bias == mha(x)[0]")
        if torch.allclose(got.sum(1) - (h - 1) * mha.W_o.bias, full, atol=1e-8) and h > 1:
            raise Hint(f"on {what}: every head's contribution includes the bias of W_o; leave it "
                       "out (it belongs to no head)")
        if not torch.allclose(total, full, atol=1e-8):
            diff = (total - full).abs().max().item()
            raise Hint(f"on {what}: contributions.sum(1) + mha.W_o.bias should equal "
                       f"mha(x, key_mask=key_mask)[0]; largest difference {diff:.3g}. Head i's "
                       "output (B, T, d_k) goes through columns i*d_k..(i+1)*d_k-1 of "
                       "mha.W_o.weight (nn.Linear stores it as (out, in), so x @ weight.T)")
        n += 1
        expect_close(got, exp, f"the contributions on {what} (they sum correctly, but the "
                     "split between heads is wrong: head i uses only its own d_k columns of "
                     "mha.W_o.weight)", atol=1e-8)
        n += 1
    return n


def _ref_mqa(x, W_q, W_k, W_v, W_o, h, causal=False, scale=None):
    """Multi-query attention: h query heads, one key head and one value head shared by all."""
    B, T, d = x.shape
    d_k = d // h
    q = (x @ W_q).view(B, T, h, d_k).transpose(1, 2)                       # (B, h, T, d_k)
    k, v = (x @ W_k)[:, None], (x @ W_v)[:, None]                          # (B, 1, T, d_k)
    heads, weights = scaled_dot_product_attention(q, k, v, causal=causal,
                                                  scale=scale)             # (B, h, T, d_k)
    return heads.transpose(1, 2).reshape(B, T, d) @ W_o, weights


@grader("ex-05-multi-query", target="multi_query_attention")
def check_multi_query_attention(fn):
    """Checks ``multi_query_attention(x, W_q, W_k, W_v, W_o, h, causal=False) -> (out, weights)``."""
    n = 0
    cases = [("d_model=8, h=2", 2, 5, 8, 2, False),
             ("d_model=16, h=4, causal=True", 2, 6, 16, 4, True),
             ("a single head (h=1): the same as ordinary attention", 2, 4, 8, 1, False),
             ("a batch of 1 sequence of length 1, h=3", 1, 1, 12, 3, False),
             ("d_model=12, h=6 (d_k=2), causal=True", 3, 4, 12, 6, True)]
    for what, B, T, d, h, causal in cases:
        d_k = d // h
        x = torch.randn(B, T, d, dtype=torch.float64)
        W_q, W_o = (torch.randn(d, d, dtype=torch.float64) / d ** 0.5 for _ in range(2))
        W_k, W_v = (torch.randn(d, d_k, dtype=torch.float64) / d ** 0.5 for _ in range(2))
        exp_out, exp_w = _ref_mqa(x, W_q, W_k, W_v, W_o, h, causal)
        got = fn(x.clone(), W_q.clone(), W_k.clone(), W_v.clone(), W_o.clone(), h, causal=causal)
        expect_pair(got, "(out, weights)", what)
        out, weights = got
        expect_shape(weights, (B, h, T, T), f"weights on {what} (W_k and W_v are "
                     f"({d}, {d_k}): one key and one value head, shared by all {h} query heads)")
        expect_shape(out, (B, T, d), f"out on {what}")
        if not torch.allclose(weights, exp_w, atol=1e-6):
            if causal and torch.allclose(weights, _ref_mqa(x, W_q, W_k, W_v, W_o, h)[1], atol=1e-6):
                raise Hint(f"weights on {what}: causal=True was ignored")
            if h > 1 and torch.allclose(weights, _ref_mqa(x, W_q, W_k, W_v, W_o, h, causal,
                                                          scale=d ** -0.5)[1], atol=1e-6):
                raise Hint(f"weights on {what}: the scores were divided by sqrt(d_model); the "
                           f"queries and keys have d_k = {d_k} dimensions, so divide by sqrt(d_k)")
            raise Hint(f"weights on {what}: expected softmax(q_i k^T / sqrt(d_k)) for each query "
                       f"head i (q_i = columns i*d_k..(i+1)*d_k-1 of x @ W_q, k = x @ W_k, "
                       f"d_k = {d_k}); largest difference "
                       f"{(weights - exp_w).abs().max().item():.3g}")
        n += 1
        expect_close(out, exp_out, f"out on {what} (each head sums the shared values v = x @ W_v "
                     "with its own weights; concatenate the heads, then @ W_o)", atol=1e-6)
        n += 1
    return n

