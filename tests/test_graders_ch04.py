"""Chapter 4's graders: the reference passes, a stub fails, and plausible wrong answers fail with a
hint that names the mistake."""
import math

import pytest
import torch

from attnbook import attention as book
from graderkit import assert_fails, grade, stub  # noqa: F401


# --- ex-04-sdpa: scaled_dot_product_attention(q, k, v, mask=None, causal=False) -> (out, w) ----

def sdpa(q, k, v, mask=None, causal=False, *, scale=None, fill=float("-inf"), dim=-1,
         flip_mask=False, safe_rows=True, causal_ignored=False, softmax=torch.softmax):
    """The reference solution; the keyword-only switches turn it into typical wrong answers."""
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(d_k) if scale is None else scale)
    allowed = torch.ones_like(scores, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & (~mask if flip_mask else mask)
    if causal and not causal_ignored:
        T, S = scores.shape[-2:]
        allowed = allowed & torch.ones(T, S, dtype=torch.bool).tril()
    scores = scores.masked_fill(~allowed, fill)
    if safe_rows:
        has_key = allowed.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~has_key, 0.0)
        weights = softmax(scores, dim=dim) * allowed
    else:
        weights = softmax(scores, dim=dim)
    return weights @ v, weights


def test_sdpa_reference_passes():
    result = grade("ex-04-sdpa", sdpa)
    assert result.passed, result.message
    assert grade("ex-04-sdpa", lambda q, k, v, mask=None, causal=False:
                 book.scaled_dot_product_attention(q, k, v, mask, causal)).passed


def test_sdpa_stub_fails():
    assert_fails("ex-04-sdpa", stub, "not implemented yet", "scaled_dot_product_attention")


@pytest.mark.parametrize("wrong,fragments", [
    (lambda q, k, v, mask=None, causal=False: sdpa(q, k, v, mask, causal, scale=1.0),
     ["not scaled", "sqrt(d_k)"]),
    (lambda q, k, v, mask=None, causal=False: sdpa(q, k, v, mask, causal, scale=1 / q.shape[-1]),
     ["divided by d_k"]),
    (lambda q, k, v, mask=None, causal=False: sdpa(q, k, v, mask, causal,
                                                    scale=v.shape[-1] ** -0.5),
     ["sqrt(d_v)"]),
    (lambda q, k, v, mask=None, causal=False: sdpa(q, k, v, mask, causal, flip_mask=True),
     ["wrong way round", "True means 'may attend'"]),
    (lambda q, k, v, mask=None, causal=False: sdpa(q, k, v, mask, causal, dim=-2),
     ["over the queries"]),
    (lambda q, k, v, mask=None, causal=False: sdpa(q, k, v, mask, causal, safe_rows=False),
     ["NaN", "all blocked", "zero"]),
    (lambda q, k, v, mask=None, causal=False: sdpa(q, k, v, mask, causal, fill=-1e9,
                                                    safe_rows=False),
     ["may attend to no key", "-1e9"]),
    (lambda q, k, v, mask=None, causal=False: sdpa(q, k, v, mask, causal, causal_ignored=True),
     ["causal=True was ignored"]),
    (lambda q, k, v, mask=None, causal=False: tuple(reversed(sdpa(q, k, v, mask, causal))),
     ["(out, weights) in that order"]),
    (lambda q, k, v, mask=None, causal=False: sdpa(q.detach(), k.detach(), v.detach(), mask,
                                                    causal),
     ["does not require grad"]),
])
def test_sdpa_wrong_answers_get_a_precise_hint(wrong, fragments):
    assert_fails("ex-04-sdpa", wrong, *fragments)


def test_sdpa_naive_exp_overflows_with_a_hint():
    def exp_over_sum(x, dim):       # a softmax that does not subtract the maximum first
        e = x.exp()
        return e / e.sum(dim, keepdim=True)
    assert_fails("ex-04-sdpa", lambda q, k, v, mask=None, causal=False:
                 sdpa(q, k, v, mask, causal, softmax=exp_over_sum), "NaN", "torch.softmax")


def shifted_causal(shift, **switches):
    """Attention whose causal mask is torch.tril(..., diagonal=shift) instead of diagonal=0."""
    def fn(q, k, v, mask=None, causal=False):
        if causal:
            T, S = q.shape[-2], k.shape[-2]
            c = torch.ones(T, S, dtype=torch.bool).tril(S - T + shift)
            mask = c if mask is None else mask & c
        return sdpa(q, k, v, mask, **switches)
    return fn


@pytest.mark.parametrize("wrong,fragments", [
    (shifted_causal(1), ["off by one", "lets position t see t + 1", "diagonal=1"]),
    (shifted_causal(1, safe_rows=False), ["off by one", "see t + 1"]),
    (shifted_causal(-1), ["blocks the diagonal", "must see itself", "diagonal=-1"]),
    (shifted_causal(-1, safe_rows=False), ["blocks the diagonal", "must see itself"]),  # NaN row 0
    (shifted_causal(-1, fill=-1e9, safe_rows=False), ["blocks the diagonal"]),  # uniform row 0
])
def test_sdpa_causal_mask_off_by_one_is_named(wrong, fragments):
    message = assert_fails("ex-04-sdpa", wrong, *fragments)
    assert "-inf" not in message and "overflow" not in message  # the -inf are already there


# --- ex-04-attention-entropy: attention_entropy(d_k, scaled=True, n=1000, S=32) -> float -------

def entropy(d_k, scaled=True, n=1000, S=32, *, ignore_scaled=False, log=torch.log,
            reduce="mean", safe=True, scale_by_dk=False):
    q = torch.randn(n, d_k)
    k = torch.randn(n, S, d_k)
    scores = torch.einsum("nd,nsd->ns", q, k)
    if scaled and not ignore_scaled:
        scores = scores / (d_k if scale_by_dk else math.sqrt(d_k))
    if safe:
        log_w = torch.log_softmax(scores, dim=-1)
        w = log_w.exp()
        log_w = log_w if log is torch.log else log_w / math.log(2)
    else:
        w = torch.softmax(scores, dim=-1)
        log_w = log(w)
    h = -(w * log_w).sum(-1)
    return (h.mean() if reduce == "mean" else h.sum()).item()


def test_entropy_reference_passes():
    result = grade("ex-04-attention-entropy", entropy)
    assert result.passed, result.message


def test_entropy_stub_fails():
    assert_fails("ex-04-attention-entropy", stub, "not implemented yet", "attention_entropy")


@pytest.mark.parametrize("wrong,fragments", [
    (lambda d_k, scaled=True, n=1000, S=32: entropy(d_k, scaled, n, S, ignore_scaled=True),
     ["without the scaling", "Divide the scores by sqrt(d_k)"]),
    (lambda d_k, scaled=True, n=1000, S=32: entropy(d_k, scaled, n, S, scale_by_dk=True),
     ["divided by d_k"]),
    (lambda d_k, scaled=True, n=1000, S=32: entropy(d_k, scaled, n, S, safe=False),
     ["NaN", "0 * log(0)", "xlogy"]),
    (lambda d_k, scaled=True, n=1000, S=32: entropy(d_k, scaled, n, S, log=torch.log2),
     ["more than ln(S)"]),
    (lambda d_k, scaled=True, n=1000, S=32: entropy(d_k, scaled, n, S, reduce="sum"),
     ["more than ln(S)", "average over the queries"]),
    (lambda d_k, scaled=True, n=1000, S=32: -entropy(d_k, scaled, n, S), ["never negative"]),
    (lambda d_k, scaled=True, n=1000, S=32: entropy(d_k, scaled, n, 32), ["use S=8"]),
    (lambda d_k, scaled=True, n=1000, S=32: torch.tensor([entropy(d_k, scaled, n, S)] * 2),
     ["one Python float"]),
])
def test_entropy_wrong_answers_get_a_precise_hint(wrong, fragments):
    assert_fails("ex-04-attention-entropy", wrong, *fragments)


def test_entropy_in_bits_is_named_when_it_stays_below_ln_s():
    def bits_if_small(d_k, scaled=True, n=1000, S=32):
        h = entropy(d_k, scaled, n, S)
        return h / math.log(2) if h / math.log(2) <= math.log(S) else h
    assert_fails("ex-04-attention-entropy", bits_if_small, "in bits", "natural logarithm")


# --- ex-04-chunked-attention: chunked_attention(q, k, v, mask=None, chunk_size=64) -> out -------

def chunked(q, k, v, mask=None, chunk_size=64, *, slice_mask_always=False, drop_last=False,
            full_scores_first=False, scale=None, flip_mask=False):
    T = q.shape[-2]
    if flip_mask and mask is not None:
        mask = ~mask
    if full_scores_first:   # "chunks", but after building the whole (..., T, S) score matrix
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            mask = mask.expand(scores.shape)
        return torch.cat([book.masked_softmax(scores[..., i:i + chunk_size, :],
                                              None if mask is None else
                                              mask[..., i:i + chunk_size, :]) @ v
                          for i in range(0, T, chunk_size)], dim=-2)
    stop = T - T % chunk_size if drop_last else T
    outs = []
    for i in range(0, stop, chunk_size):
        m = mask
        if mask is not None and (slice_mask_always or mask.shape[-2] != 1):
            m = mask[..., i:i + chunk_size, :]
        out, _ = book.scaled_dot_product_attention(q[..., i:i + chunk_size, :], k, v, mask=m,
                                                   scale=scale)
        outs.append(out)
    return torch.cat(outs, dim=-2)


def test_chunked_reference_passes():
    result = grade("ex-04-chunked-attention", chunked)
    assert result.passed, result.message


def test_chunked_stub_fails():
    assert_fails("ex-04-chunked-attention", stub, "not implemented yet", "chunked_attention")


@pytest.mark.parametrize("wrong,fragments", [
    (lambda q, k, v, mask=None, chunk_size=64: chunked(q, k, v, mask, chunk_size,
                                                       slice_mask_always=True),
     ["your function raised", "size 1", "expand"]),
    (lambda q, k, v, mask=None, chunk_size=64: chunked(q, k, v, mask, chunk_size, drop_last=True),
     ["last chunk"]),
    (lambda q, k, v, mask=None, chunk_size=64: chunked(q, k, v, mask, chunk_size,
                                                       full_scores_first=True),
     ["MiB at its peak", "full (B, h, T, S) score matrix takes 8.0 MiB"]),
    (lambda q, k, v, mask=None, chunk_size=64: chunked(q, k, v, mask, chunk_size, scale=1.0),
     ["not scaled"]),
    (lambda q, k, v, mask=None, chunk_size=64: chunked(q, k, v, mask, chunk_size, flip_mask=True),
     ["wrong way round"]),
    (lambda q, k, v, mask=None, chunk_size=64: book.scaled_dot_product_attention(q, k, v, mask),
     ["not a tuple"]),
])
def test_chunked_wrong_answers_get_a_precise_hint(wrong, fragments):
    assert_fails("ex-04-chunked-attention", wrong, *fragments)


def test_graders_leave_the_global_random_state_alone():
    state = torch.random.get_rng_state()
    grade("ex-04-attention-entropy", entropy)
    grade("ex-04-sdpa", sdpa)
    assert torch.equal(state, torch.random.get_rng_state())
