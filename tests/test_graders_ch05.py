"""Chapter 5's graders: their references agree with PyTorch, the reference solutions pass, a stub
fails, and plausible wrong answers fail with a hint that names the mistake."""
import pytest
import torch
import torch.nn as nn

from attnbook.batching import lengths_mask
from attnbook.attention import causal_mask, scaled_dot_product_attention
from attnbook.graders import ch05_multi_head_attention as G
from attnbook.mha import MultiHeadAttention
from graderkit import assert_fails, grade, stub  # noqa: F401


# --- the graders' references against PyTorch ---------------------------------------------------

@pytest.mark.parametrize("h", [1, 2, 4])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "both"])
def test_mhsa_reference_equals_nn_multihead_attention(h, masks):
    torch.manual_seed(h)
    B, T, d = 3, 5, 8
    x = torch.randn(B, T, d, dtype=torch.float64)
    W_q, W_k, W_v, W_o = (torch.randn(d, d, dtype=torch.float64) for _ in range(4))
    torch_mha = nn.MultiheadAttention(d, h, bias=False, batch_first=True).double()
    with torch.no_grad():  # nn.Linear computes x @ weight.T, so weight = W.T
        torch_mha.in_proj_weight.copy_(torch.cat([W_q.T, W_k.T, W_v.T]))
        torch_mha.out_proj.weight.copy_(W_o.T)
    real = lengths_mask([5, 3, 1], T)
    key_mask = real if masks in ("padding", "both") else None
    causal = masks in ("causal", "both")
    out, w = G._ref_mhsa(x, W_q, W_k, W_v, W_o, h, key_mask, causal)
    exp, exp_w = torch_mha(x, x, x, key_padding_mask=None if key_mask is None else ~key_mask,
                           attn_mask=~causal_mask(T) if causal else None,
                           average_attn_weights=False)
    torch.testing.assert_close(out, exp)
    torch.testing.assert_close(w, exp_w)


def test_mqa_reference_is_mha_with_one_shared_key_and_value_head():
    torch.manual_seed(0)
    B, T, d, h = 2, 6, 12, 3
    d_k = d // h
    x = torch.randn(B, T, d, dtype=torch.float64)
    W_q, W_o = (torch.randn(d, d, dtype=torch.float64) for _ in range(2))
    W_k, W_v = (torch.randn(d, d_k, dtype=torch.float64) for _ in range(2))
    for causal in (False, True):
        out, w = G._ref_mqa(x, W_q, W_k, W_v, W_o, h, causal)
        exp, exp_w = G._ref_mhsa(x, W_q, W_k.repeat(1, h), W_v.repeat(1, h), W_o, h, causal=causal)
        torch.testing.assert_close(out, exp)
        torch.testing.assert_close(w, exp_w)


def test_head_contributions_reference_adds_up_to_the_output():
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    real = lengths_mask([5, 2], 5)
    with torch.no_grad():
        parts = G._ref_head_contributions(mha, x, real)
        torch.testing.assert_close(parts.sum(1) + mha.W_o.bias, mha(x, key_mask=real)[0])


# --- ex-05-mhsa --------------------------------------------------------------------------------

def mhsa(x, W_q, W_k, W_v, W_o, h, key_mask=None, causal=False):
    B, T, d = x.shape
    split = lambda t: t.view(B, T, h, d // h).transpose(1, 2)  # noqa: E731
    mask = None if key_mask is None else key_mask[:, None, None, :]
    heads, w = scaled_dot_product_attention(split(x @ W_q), split(x @ W_k), split(x @ W_v),
                                            mask=mask, causal=causal)
    return heads.transpose(1, 2).reshape(B, T, d) @ W_o, w


def wrong_mhsa(**switches):
    def fn(x, W_q, W_k, W_v, W_o, h, key_mask=None, causal=False):
        return G._ref_mhsa(x, W_q, W_k, W_v, W_o, h, key_mask, causal, **switches)
    return fn


def test_mhsa_reference_passes_and_stub_fails():
    result = grade("ex-05-mhsa", mhsa)
    assert result.passed, result.message
    assert_fails("ex-05-mhsa", stub, "not implemented yet", "multi_head_self_attention")


@pytest.mark.parametrize("wrong,fragments", [
    (wrong_mhsa(scale=1.0), ["not scaled", "sqrt(d_k)"]),
    (lambda x, *a, key_mask=None, causal=False:
     G._ref_mhsa(x, *a, key_mask, causal, scale=x.shape[-1] ** -0.5), ["sqrt(d_model)"]),
    (wrong_mhsa(flip_mask=True), ["wrong way round", "True at real tokens"]),
    (wrong_mhsa(dim=-2), ["over the queries"]),
    (wrong_mhsa(split="no_transpose"), ["view(B, h, T, d_k)", "view(B, T, h, d_k).transpose(1, 2)"]),
    (wrong_mhsa(split="strided"), ["every h-th column"]),
    (wrong_mhsa(merge="no_transpose"), ["concatenated", "transpose(1, 2) back"]),
    (lambda *a, key_mask=None, causal=False: mhsa(*a, key_mask=key_mask), ["causal=True was ignored"]),
    (lambda x, W_q, W_k, W_v, W_o, h, key_mask=None, causal=False:
     mhsa(x, W_q, W_k, W_v, torch.eye(x.shape[-1], dtype=x.dtype), h, key_mask, causal),
     ["not multiplied by W_o"]),
    (lambda *a, **k: tuple(reversed(mhsa(*a, **k))), ["(out, weights) in that order"]),
    (lambda *a, **k: mhsa(*a, **k)[0], ["return a tuple (out, weights)"]),
    (lambda *a, **k: (mhsa(*a, **k)[0], mhsa(*a, **k)[1].mean(1)), ["weights", "one (T, T) matrix per head"]),
])
def test_mhsa_wrong_answers_get_a_precise_hint(wrong, fragments):
    assert_fails("ex-05-mhsa", wrong, *fragments)


def mhsa_two_sided(x, W_q, W_k, W_v, W_o, h, key_mask=None, causal=False, *, fill=None):
    """Also blocks the rows of padded queries (the two-sided mask of chapter 4): with the book's
    attention those rows get zero weights; with ``fill`` and a plain softmax, -1e9 makes them
    uniform and -inf makes them NaN."""
    if key_mask is None:
        return mhsa(x, W_q, W_k, W_v, W_o, h, key_mask, causal)
    B, T, d = x.shape
    split = lambda t: t.view(B, T, h, d // h).transpose(1, 2)  # noqa: E731
    q, k, v = split(x @ W_q), split(x @ W_k), split(x @ W_v)
    mask = key_mask[:, None, None, :] & key_mask[:, None, :, None]       # (B, 1, T, T)
    if causal:
        mask = mask & causal_mask(T)
    if fill is None:
        heads, w = scaled_dot_product_attention(q, k, v, mask=mask)
    else:
        scores = (q @ k.transpose(-2, -1) / (d // h) ** 0.5).masked_fill(~mask, fill)
        w = scores.softmax(-1)
        heads = w @ v
    return heads.transpose(1, 2).reshape(B, T, d) @ W_o, w


@pytest.mark.parametrize("fill", [None, -1e9])
def test_mhsa_that_also_blocks_padded_queries_passes_with_a_note(fill):
    result = grade("ex-05-mhsa", lambda *a, **k: mhsa_two_sided(*a, **k, fill=fill))
    assert result.passed, result.message
    assert "passed 14 checks. Note:" in result.message
    assert "rows of padded query positions differ" in result.message
    assert "real positions match" in result.message


def test_mhsa_reference_passes_without_a_note():
    assert "Note" not in grade("ex-05-mhsa", mhsa).message


@pytest.mark.parametrize("wrong,fragments", [
    (lambda *a, **k: mhsa_two_sided(*a, **k, fill=float("-inf")),
     ["rows of padded query positions are NaN", "real positions match", "block only the padded keys"]),
    (wrong_mhsa(shift=1), ["off by one", "lets position t see t + 1"]),
    (wrong_mhsa(shift=-1), ["blocks the diagonal", "must see itself"]),
])
def test_mhsa_padded_rows_and_off_by_one_get_a_precise_hint(wrong, fragments):
    assert_fails("ex-05-mhsa", wrong, *fragments)


def test_mhsa_off_by_one_with_a_plain_softmax_is_named_not_nan():
    def diagonal_blocked(x, W_q, W_k, W_v, W_o, h, key_mask=None, causal=False):
        B, T, d = x.shape
        split = lambda t: t.view(B, T, h, d // h).transpose(1, 2)  # noqa: E731
        q, k, v = split(x @ W_q), split(x @ W_k), split(x @ W_v)
        scores = q @ k.transpose(-2, -1) / (d // h) ** 0.5
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
        if causal:                   # query 0 sees no key: its row of weights is NaN
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(-1), float("-inf"))
        w = scores.softmax(-1)
        return (w @ v).transpose(1, 2).reshape(B, T, d) @ W_o, w
    message = assert_fails("ex-05-mhsa", diagonal_blocked, "blocks the diagonal")
    assert "NaN" not in message


def test_mhsa_that_blocks_only_query_rows_still_fails():
    def rows_only(x, W_q, W_k, W_v, W_o, h, key_mask=None, causal=False):
        if key_mask is None:
            return mhsa(x, W_q, W_k, W_v, W_o, h, key_mask, causal)
        B, T, d = x.shape
        split = lambda t: t.view(B, T, h, d // h).transpose(1, 2)  # noqa: E731
        heads, w = scaled_dot_product_attention(split(x @ W_q), split(x @ W_k), split(x @ W_v),
                                                mask=key_mask[:, None, :, None], causal=causal)
        return heads.transpose(1, 2).reshape(B, T, d) @ W_o, w
    assert_fails("ex-05-mhsa", rows_only, "weights on")


# --- ex-05-head-contributions -------------------------------------------------------------------

def contributions(mha, x, key_mask=None):
    return G._ref_head_contributions(mha, x, key_mask)


def test_head_contributions_reference_passes_and_stub_fails():
    result = grade("ex-05-head-contributions", contributions)
    assert result.passed, result.message
    assert_fails("ex-05-head-contributions", stub, "not implemented yet", "head_contributions")


def rows_instead_of_columns(mha, x, key_mask=None):
    B, T, d = x.shape
    q, k, v = (mha.split_heads(W(x)) for W in (mha.W_q, mha.W_k, mha.W_v))
    mask = None if key_mask is None else key_mask[:, None, None, :]
    heads, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    return torch.einsum("bhtk,hkd->bhtd", heads, mha.W_o.weight.view(mha.h, mha.d_k, d))


@pytest.mark.parametrize("wrong,fragments", [
    (lambda m, x, key_mask=None: contributions(m, x, key_mask) + m.W_o.bias,
     ["every head's contribution includes the bias"]),
    (lambda m, x, key_mask=None: contributions(m, x, key_mask) + m.W_o.bias / m.h,
     ["including the bias", "leave the bias out"]),
    (lambda m, x, key_mask=None: contributions(m, x, key_mask).sum(1, keepdim=True)
     .expand(-1, m.h, -1, -1) / m.h, ["they sum correctly", "its own d_k columns"]),
    (lambda m, x, key_mask=None: contributions(m, x, None), ["largest difference"]),
    (rows_instead_of_columns, ["columns i*d_k..(i+1)*d_k-1 of mha.W_o.weight"]),
    (lambda m, x, key_mask=None: contributions(m, x, key_mask).sum(1), ["expected shape"]),
    (lambda m, x, key_mask=None: contributions(m, x, key_mask).float(), ["float64"]),
])
def test_head_contributions_wrong_answers_get_a_precise_hint(wrong, fragments):
    assert_fails("ex-05-head-contributions", wrong, *fragments)


# --- ex-05-multi-query -------------------------------------------------------------------------

def mqa(x, W_q, W_k, W_v, W_o, h, causal=False):
    return G._ref_mqa(x, W_q, W_k, W_v, W_o, h, causal)


def test_multi_query_reference_passes_and_stub_fails():
    result = grade("ex-05-multi-query", mqa)
    assert result.passed, result.message
    assert_fails("ex-05-multi-query", stub, "not implemented yet", "multi_query_attention")


@pytest.mark.parametrize("wrong,fragments", [
    (lambda *a, causal=False: mqa(*a), ["causal=True was ignored"]),
    (lambda x, *a, causal=False: G._ref_mqa(x, *a, causal, scale=x.shape[-1] ** -0.5),
     ["sqrt(d_model)"]),
    (lambda x, W_q, W_k, W_v, W_o, h, causal=False: mqa(x, W_q, W_k, W_v, W_o, h, causal)[0],
     ["return a tuple (out, weights)"]),
    (lambda x, W_q, W_k, W_v, W_o, h, causal=False:
     (mqa(x, W_q, W_k, W_v, W_o, h, causal)[0], mqa(x, W_q, W_k, W_v, W_o, h, causal)[1][:, 0]),
     ["one key and one value head, shared by all"]),
    (lambda x, W_q, W_k, W_v, W_o, h, causal=False:
     (mqa(x, W_q, W_k, W_v, torch.eye(x.shape[-1], dtype=x.dtype), h, causal)[0],
      mqa(x, W_q, W_k, W_v, W_o, h, causal)[1]), ["out on", "@ W_o"]),
])
def test_multi_query_wrong_answers_get_a_precise_hint(wrong, fragments):
    assert_fails("ex-05-multi-query", wrong, *fragments)
