"""The graders of Part I pass right answers, and fail stubs and typical mistakes with a precise
hint."""
import pytest
import torch

from attnbook.graders import (check_bilinear_attention, check_gru_encode,
                              check_masked_softmax)
from graderkit import assert_passes_and_prints, assert_registered

LABELS = {"ex-01-gru-encode": "gru_encode",
          "ex-02-bilinear-attention": "bilinear_attention",
          "ex-02-masked-softmax": "masked_softmax"}


def grade(check, fn):
    return check.grader.grade(fn)


# --- reference solutions (what the notebooks' solution cells contain) -----------------------

def gru_encode(x, mask, cell):
    B, S, _ = x.shape
    h = x.new_zeros(B, cell.hidden_size)
    H = []
    for i in range(S):
        m = mask[:, i, None]
        h = torch.where(m, cell(x[:, i], h), h)
        H.append(torch.where(m, h, torch.zeros_like(h)))
    return torch.stack(H, 1), h


def gru_encode_with_packing(x, mask, cell):
    """A different correct route: nn.GRU with copied weights on a packed sequence."""
    rnn = torch.nn.GRU(cell.input_size, cell.hidden_size, batch_first=True)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        getattr(rnn, name + "_l0").data.copy_(getattr(cell, name))
    lengths = mask.sum(1)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                     enforce_sorted=False)
    out, h_n = rnn(packed)
    H, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return H, h_n[0]


def bilinear_attention(query, keys, mask, W):
    e = ((query @ W)[:, None, :] * keys).sum(-1)
    alpha = torch.softmax(e.masked_fill(~mask, float("-inf")), dim=-1)
    return (alpha[:, :, None] * keys).sum(1), alpha


def masked_softmax(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return w.masked_fill(~mask, 0.0)


# --- registration ---------------------------------------------------------------------------

def test_graders_are_registered_with_their_targets():
    assert_registered(LABELS)


# --- right answers pass, and printing gives one PASS line -------------------------------------

@pytest.mark.parametrize("check,fn", [(check_gru_encode, gru_encode),
                                      (check_gru_encode, gru_encode_with_packing),
                                      (check_bilinear_attention, bilinear_attention),
                                      (check_masked_softmax, masked_softmax)])
def test_right_answers_pass(check, fn, capsys):
    assert_passes_and_prints(check, fn, capsys)


def test_package_masked_softmax_passes_its_grader():
    from attnbook.rnn import masked_softmax as package_version
    assert grade(check_masked_softmax, package_version).passed


# --- stubs fail -------------------------------------------------------------------------------

def not_implemented(*args):
    raise NotImplementedError


@pytest.mark.parametrize("check", [check_gru_encode, check_bilinear_attention,
                                   check_masked_softmax])
def test_not_implemented_stub_fails(check):
    res = grade(check, not_implemented)
    assert not res.passed and "not implemented yet" in res.message


def test_zero_stubs_fail():
    def zeros_encode(x, mask, cell):
        B, S, _ = x.shape
        return x.new_zeros(B, S, cell.hidden_size), x.new_zeros(B, cell.hidden_size)

    def zeros_attention(query, keys, mask, W):
        return keys.new_zeros(keys.shape[0], keys.shape[2]), keys.new_zeros(keys.shape[:2])

    def zeros_softmax(scores, mask):
        return torch.zeros_like(scores)

    for check, fn in [(check_gru_encode, zeros_encode), (check_bilinear_attention, zeros_attention),
                      (check_masked_softmax, zeros_softmax)]:
        res = grade(check, fn)
        assert not res.passed, check.grader.label
        assert "values differ" in res.message or "sum to" in res.message, res.message


# --- typical mistakes get a precise hint ------------------------------------------------------

def test_gru_encode_mistakes():
    def ignores_mask(x, mask, cell):
        h = x.new_zeros(x.shape[0], cell.hidden_size)
        H = []
        for i in range(x.shape[1]):
            h = cell(x[:, i], h)
            H.append(h)
        return torch.stack(H, 1), h

    res = grade(check_gru_encode, ignores_mask)
    assert not res.passed and "padded position" in res.message and "all zeros" in res.message

    def last_position(x, mask, cell):
        H, _ = gru_encode(x, mask, cell)
        return H, H[:, -1]

    res = grade(check_gru_encode, last_position)
    assert not res.passed and "last real token" in res.message and "H[:, -1]" in res.message

    def wrong_shape(x, mask, cell):
        H, h = gru_encode(x, mask, cell)
        return H.transpose(0, 1), h

    res = grade(check_gru_encode, wrong_shape)
    assert not res.passed and "expected shape (3, 5, 4), got (5, 3, 4)" in res.message

    res = grade(check_gru_encode, lambda x, mask, cell: gru_encode(x, mask, cell)[0])
    assert not res.passed and "return a tuple (H, h_last)" in res.message


def test_bilinear_attention_mistakes():
    def ignores_mask(query, keys, mask, W):
        return bilinear_attention(query, keys, torch.ones_like(mask), W)

    res = grade(check_bilinear_attention, ignores_mask)
    assert not res.passed and "must be exactly 0" in res.message and "padded" in res.message

    def softmax_over_batch(query, keys, mask, W):
        e = ((query @ W)[:, None, :] * keys).sum(-1).masked_fill(~mask, float("-inf"))
        alpha = torch.softmax(e, dim=0).nan_to_num(0.0)
        return (alpha[:, :, None] * keys).sum(1), alpha

    res = grade(check_bilinear_attention, softmax_over_batch)
    assert not res.passed and "sum to" in res.message

    def naive_exp(query, keys, mask, W):
        e = ((query @ W)[:, None, :] * keys).sum(-1)
        w = e.exp() * mask
        alpha = w / w.sum(-1, keepdim=True)
        return (alpha[:, :, None] * keys).sum(1), alpha

    res = grade(check_bilinear_attention, naive_exp)
    assert not res.passed and "NaN or inf" in res.message

    def mean_context(query, keys, mask, W):
        return keys.mean(1), bilinear_attention(query, keys, mask, W)[1]

    res = grade(check_bilinear_attention, mean_context)
    assert not res.passed and "context on a full mask" in res.message


def test_masked_softmax_mistakes():
    def nan_on_blocked_row(scores, mask):
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)

    res = grade(check_masked_softmax, nan_on_blocked_row)
    assert not res.passed and "all zeros, not NaN" in res.message

    def small_not_zero(scores, mask):
        return torch.softmax(scores.masked_fill(~mask, -1e4), dim=-1)

    res = grade(check_masked_softmax, small_not_zero)
    assert not res.passed and "exactly 0 weight" in res.message

    def multiply_after(scores, mask):
        return torch.softmax(scores, dim=-1) * mask

    res = grade(check_masked_softmax, multiply_after)
    assert not res.passed and "sum to" in res.message and "before the softmax" in res.message


def test_graders_leave_the_global_random_state_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    check_gru_encode.grader.grade(gru_encode)
    check_bilinear_attention.grader.grade(bilinear_attention)
    check_masked_softmax.grader.grade(masked_softmax)
    assert torch.equal(torch.rand(3), expected)
