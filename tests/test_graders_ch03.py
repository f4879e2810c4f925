"""The graders of chapter 3 pass right answers, and fail stubs and typical mistakes with a
precise hint."""
import pytest
import torch
import torch.nn.functional as F

from attnbook.graders import check_concat_score, check_soft_argmax, check_soft_lookup
from graderkit import assert_passes_and_prints, assert_registered

LABELS = {"ex-03-concat-score": "concat_score",
          "ex-03-soft-lookup": "soft_lookup",
          "ex-03-soft-argmax": "soft_argmax"}


def grade(check, fn):
    return check.grader.grade(fn)


# --- reference solutions (what the notebook's solution cells contain) ------------------------

def concat_score(query, keys, W, v):
    q = query[:, None, :].expand(-1, keys.shape[1], -1)                # (B, S, d_q)
    return torch.tanh(torch.cat([q, keys], dim=-1) @ W.T) @ v         # (B, S)


def concat_score_split(query, keys, W, v):
    """A different correct route: split W into the blocks acting on q and on k."""
    d_q = query.shape[-1]
    hidden = (query @ W[:, :d_q].T)[:, None, :] + keys @ W[:, d_q:].T  # (B, S, d_attn)
    return torch.tanh(hidden) @ v


def soft_lookup(query, keys, values, beta):
    cos = F.cosine_similarity(query[:, None, :], keys, dim=-1)         # (B, S)
    w = torch.softmax(beta * cos, dim=-1)
    return (w[:, :, None] * values).sum(1), w


def soft_argmax(scores, tau):
    w = torch.softmax(scores / tau, dim=-1)
    return w @ torch.arange(scores.shape[-1], dtype=scores.dtype)


# --- registration, right answers, stubs ------------------------------------------------------

def test_graders_are_registered_with_their_targets():
    assert_registered(LABELS)


@pytest.mark.parametrize("check,fn", [(check_concat_score, concat_score),
                                      (check_concat_score, concat_score_split),
                                      (check_soft_lookup, soft_lookup),
                                      (check_soft_argmax, soft_argmax)])
def test_right_answers_pass(check, fn, capsys):
    assert_passes_and_prints(check, fn, capsys)


def not_implemented(*args):
    raise NotImplementedError


@pytest.mark.parametrize("check", [check_concat_score, check_soft_lookup, check_soft_argmax])
def test_not_implemented_stub_fails(check):
    res = grade(check, not_implemented)
    assert not res.passed and "not implemented yet" in res.message


# --- typical mistakes get a precise hint ------------------------------------------------------

def test_concat_score_mistakes():
    def key_first(query, keys, W, v):
        q = query[:, None, :].expand(-1, keys.shape[1], -1)
        return torch.tanh(torch.cat([keys, q], dim=-1) @ W.T) @ v

    res = grade(check_concat_score, key_first)
    assert not res.passed and "[k_i; q]" in res.message

    def no_tanh(query, keys, W, v):
        q = query[:, None, :].expand(-1, keys.shape[1], -1)
        return (torch.cat([q, keys], dim=-1) @ W.T) @ v

    res = grade(check_concat_score, no_tanh)
    assert not res.passed and "without the tanh" in res.message

    def returns_weights(query, keys, W, v):
        return torch.softmax(concat_score(query, keys, W, v), dim=-1)

    res = grade(check_concat_score, returns_weights)
    assert not res.passed and "before the softmax" in res.message

    def wrong_shape(query, keys, W, v):
        return concat_score(query, keys, W, v)[..., None]

    res = grade(check_concat_score, wrong_shape)
    assert not res.passed and "expected shape (2, 5), got (2, 5, 1)" in res.message


def test_soft_lookup_mistakes():
    def raw_dot(query, keys, values, beta):
        w = torch.softmax(beta * torch.einsum("bd,bsd->bs", query, keys), dim=-1)
        return (w[:, :, None] * values).sum(1), w

    res = grade(check_soft_lookup, raw_dot)
    assert not res.passed and "cosine similarity" in res.message

    def ignores_beta(query, keys, values, beta):
        return soft_lookup(query, keys, values, 1.0)

    res = grade(check_soft_lookup, ignores_beta)
    assert not res.passed and "ignore beta" in res.message

    def softmax_over_batch(query, keys, values, beta):
        w = torch.softmax(beta * F.cosine_similarity(query[:, None, :], keys, dim=-1), dim=0)
        return (w[:, :, None] * values).sum(1), w

    res = grade(check_soft_lookup, softmax_over_batch)
    assert not res.passed and "sum to" in res.message

    def naive_exp(query, keys, values, beta):
        e = (beta * F.cosine_similarity(query[:, None, :], keys, dim=-1)).exp()
        w = e / e.sum(-1, keepdim=True)
        return (w[:, :, None] * values).sum(1), w

    res = grade(check_soft_lookup, naive_exp)
    assert not res.passed and "NaN or inf" in res.message

    def mean_of_values(query, keys, values, beta):
        return values.mean(1), soft_lookup(query, keys, values, beta)[1]

    res = grade(check_soft_lookup, mean_of_values)
    assert not res.passed and "the result on" in res.message


def test_soft_argmax_mistakes():
    def times_tau(scores, tau):
        return soft_argmax(scores * tau * tau, tau)   # softmax(scores * tau)

    res = grade(check_soft_argmax, times_tau)
    assert not res.passed and "divide them by tau" in res.message

    def hard_argmax(scores, tau):
        return scores.argmax(-1).to(scores.dtype)

    res = grade(check_soft_argmax, hard_argmax)
    assert not res.passed and "soft arg-max" in res.message

    def hard_argmax_only_small_tau(scores, tau):   # right values where it matters, no gradient
        return soft_argmax(scores, tau).detach()

    res = grade(check_soft_argmax, hard_argmax_only_small_tau)
    assert not res.passed and "no gradient" in res.message

    def returns_weights(scores, tau):
        return torch.softmax(scores / tau, dim=-1)

    res = grade(check_soft_argmax, returns_weights)
    assert not res.passed and "the weights?" in res.message

    def naive_exp(scores, tau):
        e = (scores / tau).exp()
        return (e / e.sum(-1, keepdim=True)) @ torch.arange(scores.shape[-1], dtype=scores.dtype)

    res = grade(check_soft_argmax, naive_exp)
    assert not res.passed and "overflows" in res.message

    def one_based(scores, tau):
        return soft_argmax(scores, tau) + 1

    res = grade(check_soft_argmax, one_based)
    assert not res.passed and "counted from 0" in res.message


def test_graders_leave_the_global_random_state_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    for check, fn in [(check_concat_score, concat_score), (check_soft_lookup, soft_lookup),
                      (check_soft_argmax, soft_argmax)]:
        check.grader.grade(fn)
    assert torch.equal(torch.rand(3), expected)
