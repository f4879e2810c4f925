"""Chapter 3 (dot-product attention): the graders of the concat score, the soft look-up and the
soft arg-max."""
from __future__ import annotations

import torch

from ..rnn import AdditiveAttention
from .core import Hint, expect_close, expect_pair, expect_shape, grader


def _c3_concat_score_ref(query, keys, W, v):
    """e_i = tanh([q, k_i] W^T) v, W as nn.Linear stores it, (d_attn, d_q + d_k): query (B, d_q),
    keys (B, S, d_k) -> (B, S)."""
    q = query[:, None, :].expand(-1, keys.shape[1], -1)                 # (B, S, d_q)
    return torch.tanh(torch.cat([q, keys], dim=-1) @ W.T) @ v          # (B, S)


@grader("ex-03-concat-score", target="concat_score")
def check_concat_score(fn):
    """Checks ``concat_score(query, keys, W, v) -> e`` (Luong's concat score, before softmax)."""
    n = 0
    cases = [("query (2, 4), keys (2, 5, 4), W (3, 8)", 2, 5, 4, 4, 3),
             ("query (3, 2), keys (3, 4, 6), W (5, 8) (d_q != d_k)", 3, 4, 2, 6, 5),
             ("a batch of 1 with a single key", 1, 1, 3, 3, 4),
             ("large inputs (tanh saturates)", 2, 3, 4, 4, 3)]
    for k, (what, B, S, d_q, d_k, d_attn) in enumerate(cases):
        scale = 20.0 if k == 3 else 1.0
        query, keys = torch.randn(B, d_q) * scale, torch.randn(B, S, d_k) * scale
        W, v = torch.randn(d_attn, d_q + d_k) / (d_q + d_k) ** 0.5, torch.randn(d_attn)
        ref = _c3_concat_score_ref(query, keys, W, v)
        got = fn(query.clone(), keys.clone(), W.clone(), v.clone())
        expect_shape(got, (B, S), f"the scores on {what} (one score per key)")
        swapped = _c3_concat_score_ref(query, keys, W.roll(d_q, 1), v)  # [k; q] if d_q == d_k
        if d_q == d_k and torch.allclose(got, swapped, atol=1e-5) \
                and not torch.allclose(got, ref, atol=1e-5):
            raise Hint(f"on {what}: you concatenated [k_i; q]; the first d_q = {d_q} columns of W "
                       "act on the query, the last d_k on the key: use torch.cat([q, k_i])")
        if torch.allclose(got, (torch.cat([query[:, None, :].expand(-1, S, -1), keys], -1)
                                @ W.T) @ v, atol=1e-5) and not torch.allclose(got, ref, atol=1e-5):
            raise Hint(f"on {what}: the scores match ([q, k_i] W^T) v without the tanh; apply tanh "
                       "to the hidden layer [q, k_i] W^T before the product with v")
        sums = got.sum(-1)
        if S > 1 and (got >= 0).all() and torch.allclose(sums, torch.ones_like(sums), atol=1e-5):
            raise Hint(f"on {what}: the values are non-negative and sum to 1 over the keys: return "
                       "the scores e_i themselves, before the softmax")
        expect_close(got, ref, f"the scores on {what} (e_i = tanh([q, k_i] W^T) v)")
        n += 1
    # equal to the additive score with W split into [W_q | W_k]
    attn = AdditiveAttention(3, 5, 4)
    query, keys = torch.randn(2, 3), torch.randn(2, 6, 5)
    with torch.no_grad():
        W = torch.cat([attn.W_q.weight, attn.W_k.weight], dim=1)       # (4, 8)
        ref = attn.score(query[:, None, :], attn.project_keys(keys))[:, 0]  # (2, 6)
        got = fn(query, keys, W, attn.v.weight[0].clone())
    expect_close(got, ref, "the scores with W = [W_q | W_k] of an AdditiveAttention (they should "
                 "equal its additive scores)")
    return n + 1


def _c3_soft_lookup_ref(query, keys, values, beta):
    """softmax(beta * cos(q, k_i)) over the S entries: query (B, d_k), keys (B, S, d_k),
    values (B, S, d_v) -> (result (B, d_v), weights (B, S))."""
    q = query / query.norm(dim=-1, keepdim=True)                       # (B, d_k)
    k = keys / keys.norm(dim=-1, keepdim=True)                         # (B, S, d_k)
    cos = torch.einsum("bd,bsd->bs", q, k)                             # (B, S)
    w = torch.softmax(beta * cos, dim=-1)                              # (B, S)
    return torch.einsum("bs,bsv->bv", w, values), w                    # (B, d_v), (B, S)


@grader("ex-03-soft-lookup", target="soft_lookup")
def check_soft_lookup(fn):
    """Checks ``soft_lookup(query, keys, values, beta) -> (result, weights)`` (cosine addressing)."""
    n = 0
    cases = [("query (2, 3), keys (2, 4, 3), values (2, 4, 5), beta = 1", 2, 4, 3, 5, 1.0),
             ("a batch of 1 with a single entry, beta = 2", 1, 1, 3, 2, 2.0),
             ("query (3, 4), keys (3, 6, 4), values (3, 6, 1), beta = 10", 3, 6, 4, 1, 10.0),
             ("beta = 1000 (almost a hard look-up)", 2, 5, 3, 2, 1000.0)]
    for what, B, S, d_k, d_v, beta in cases:
        query = torch.randn(B, d_k)
        keys = torch.randn(B, S, d_k) * torch.rand(B, S, 1).mul(4).add(0.5)  # norms 0.5x..4.5x
        values = torch.randn(B, S, d_v)
        r_ref, w_ref = _c3_soft_lookup_ref(query, keys, values, beta)
        got = fn(query.clone(), keys.clone(), values.clone(), beta)
        expect_pair(got, "(result, weights)", what)
        result, w = got
        expect_shape(w, (B, S), f"the weights on {what} (one weight per entry)")
        expect_shape(result, (B, d_v), f"the result on {what} (one value-sized vector)")
        if torch.isnan(w).any() or torch.isinf(w).any():
            raise Hint(f"on {what}: the weights contain NaN or inf; use torch.softmax, which "
                       "subtracts the maximum before exp()")
        sums = w.sum(-1)
        if not torch.allclose(sums, torch.ones(B), atol=1e-5):
            b = int((sums - 1).abs().argmax())
            raise Hint(f"on {what}: the weights of query {b} sum to {sums[b].item():.4f}, not 1: "
                       "take the softmax over the entries (the last dimension)")
        dot = torch.softmax(beta * torch.einsum("bd,bsd->bs", query, keys), -1)
        if S > 1 and torch.allclose(w, dot, atol=1e-5) and not torch.allclose(w, w_ref, atol=1e-5):
            raise Hint(f"on {what}: the weights match a softmax of beta * (q . k_i), the raw dot "
                       "product; the look-up compares directions: divide q and each k_i by their "
                       "norms (cosine similarity) first")
        unsharp = _c3_soft_lookup_ref(query, keys, values, 1.0)[1]
        if beta != 1 and S > 1 and torch.allclose(w, unsharp, atol=1e-5):
            raise Hint(f"on {what}: the weights ignore beta; multiply the cosine similarities by "
                       "beta before the softmax")
        expect_close(w, w_ref, f"the weights on {what} (softmax of beta * cos(q, k_i))")
        n += 1
        expect_close(result, r_ref, f"the result on {what} (sum_i w_i v_i)")
        n += 1
    return n


def _c3_soft_argmax_ref(scores, tau):
    """sum_i softmax(scores / tau)_i * i: scores (..., S) -> (...,), positions counted from 0."""
    w = torch.softmax(scores / tau, dim=-1)                            # (..., S)
    pos = torch.arange(scores.shape[-1], dtype=scores.dtype)           # (S,)
    return (w * pos).sum(-1)                                           # (...,)


@grader("ex-03-soft-argmax", target="soft_argmax")
def check_soft_argmax(fn):
    """Checks ``soft_argmax(scores, tau) -> expected position under softmax(scores / tau)``."""
    n = 0
    base = torch.tensor([0.5, 2.0, -1.0, 1.0, 0.0])
    cases = [("scores [0.5, 2, -1, 1, 0], tau = 1", base, 1.0),
             ("the same scores, tau = 0.25", base, 0.25),
             ("the same scores, tau = 100 (almost uniform)", base, 100.0),
             ("the same scores, tau = 0.001 (almost the arg-max)", base, 0.001),
             ("scores of shape (3, 7), tau = 0.5", torch.randn(3, 7), 0.5),
             ("scores of shape (2, 4, 6), tau = 2", torch.randn(2, 4, 6), 2.0),
             ("a single score, tau = 1", torch.tensor([3.0]), 1.0)]
    for what, scores, tau in cases:
        ref = _c3_soft_argmax_ref(scores, tau)
        got = fn(scores.clone(), tau)
        if isinstance(got, torch.Tensor) and got.shape == scores.shape and scores.shape[-1] > 1:
            raise Hint(f"for {what}: you returned a tensor of the shape of the scores "
                       f"{tuple(scores.shape)}, the weights? Return the expected position "
                       f"sum_i alpha_i * i, one number per row: shape {tuple(ref.shape)}")
        expect_shape(got, ref.shape, f"the soft arg-max for {what}")
        if torch.isnan(got).any():
            raise Hint(f"for {what}: NaN; exp(scores / tau) overflows for small tau. Use "
                       "torch.softmax, which subtracts the maximum first")
        wrong_tau = _c3_soft_argmax_ref(scores, 1.0 / tau)
        if tau != 1 and torch.allclose(got, wrong_tau, atol=1e-4) \
                and not torch.allclose(got, ref, atol=1e-4):
            raise Hint(f"for {what}: you multiplied the scores by tau; divide them by tau: a "
                       "small temperature must sharpen the weights towards the arg-max")
        one_based = ref + 1
        if torch.allclose(got, one_based, atol=1e-4):
            raise Hint(f"for {what}: positions are counted from 0, like tensor indices: the "
                       "position of the first score is 0, not 1")
        expect_close(got, ref, f"the soft arg-max for {what}", atol=1e-4)
        n += 1
    # it must be differentiable: a gradient reaches the scores
    scores = torch.randn(2, 5, requires_grad=True)
    out = fn(scores, 1.0)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise Hint("no gradient reaches the scores (the result does not require grad): build it "
                   "from torch.softmax and a weighted sum, not argmax, .item() or numpy")
    out.sum().backward()
    if scores.grad is None or scores.grad.abs().max() == 0:
        raise Hint("the gradient with respect to the scores is zero: a hard arg-max is not "
                   "differentiable; weight the positions by softmax(scores / tau)")
    expect_close(scores.grad, torch.autograd.grad(_c3_soft_argmax_ref(scores, 1.0).sum(),
                                                  scores)[0],
                 "the gradient of sum(soft_argmax(scores, 1.0)) with respect to the scores")
    return n + 1

