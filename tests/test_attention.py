"""The book's attention function against PyTorch's, masks, and fully masked rows."""
import pytest
import torch
import torch.nn.functional as F

from attnbook.batching import lengths_mask
from attnbook.attention import (causal_mask, masked_softmax, padding_mask,
                                scaled_dot_product_attention, to_torch_mask)


def rand(*shape, dtype=torch.float64, g=None):
    return torch.randn(*shape, dtype=dtype, generator=g, requires_grad=True)


@pytest.mark.parametrize("seed", range(6))
def test_matches_pytorch_sdpa_forward_and_backward(seed):
    g = torch.Generator().manual_seed(seed)
    B, h = torch.randint(1, 4, (2,), generator=g).tolist()
    T, S = torch.randint(1, 9, (2,), generator=g).tolist()
    d_k, d_v = torch.randint(1, 17, (2,), generator=g).tolist()
    q, k, v = rand(B, h, T, d_k, g=g), rand(B, h, S, d_k, g=g), rand(B, h, S, d_v, g=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    mask = padding_mask(lengths_mask(lengths, S))    # (B, 1, 1, S)
    # For T != S PyTorch's causal mask is aligned top-left and the book's bottom-right (the
    # queries are the last T positions), so the causal comparison is made where they agree.
    for causal in ((False, True) if T == S else (False,)):
        m = mask if not causal else mask & causal_mask(T, S)
        ours, w = scaled_dot_product_attention(q, k, v, mask=mask, causal=causal)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        ok = m.any(-1, keepdim=True).expand(B, h, T, 1)   # rows with at least one visible key
        torch.testing.assert_close(ours * ok, ref.nan_to_num(0) * ok)
        assert torch.allclose(w.sum(-1)[ok[..., 0]], torch.ones(()).double())
        gq, gk, gv = torch.autograd.grad((ours * ok).sum(), (q, k, v))
        rq, rk, rv = torch.autograd.grad((ref.nan_to_num(0) * ok).sum(), (q, k, v))
        for a, b in ((gq, rq), (gk, rk), (gv, rv)):
            torch.testing.assert_close(a, b)


def test_causal_flag_equals_pytorch_is_causal():
    g = torch.Generator().manual_seed(0)
    q, k, v = rand(2, 3, 7, 8, g=g), rand(2, 3, 7, 8, g=g), rand(2, 3, 7, 5, g=g)
    ours, _ = scaled_dot_product_attention(q, k, v, causal=True)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_blocked_positions_get_exactly_zero_weight_and_do_not_leak():
    g = torch.Generator().manual_seed(1)
    q, k, v = rand(2, 4, 6, g=g), rand(2, 5, 6, g=g), rand(2, 5, 3, g=g)
    mask = torch.tensor([[True, True, True, False, False], [True] * 5])[:, None, :]  # (B, 1, S)
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert (w[0, :, 3:] == 0).all()
    v2 = v.detach().clone()
    v2[0, 3:] = 1e6                                   # change what sits at the padding
    out2, _ = scaled_dot_product_attention(q, k, v2, mask=mask)
    torch.testing.assert_close(out, out2)


def test_fully_masked_rows_give_zeros_not_nan():
    scores = torch.randn(2, 3, 4, requires_grad=True)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[0, 1] = False
    w = masked_softmax(scores, mask)
    assert not torch.isnan(w).any() and (w[0, 1] == 0).all()
    torch.testing.assert_close(w[1].sum(-1), torch.ones(3))
    w.sum().backward()
    assert not torch.isnan(scores.grad).any()
    q, k, v = torch.randn(1, 2, 4), torch.randn(1, 3, 4), torch.randn(1, 3, 5)
    out, _ = scaled_dot_product_attention(q, k, v, mask=torch.zeros(1, 2, 3, dtype=torch.bool))
    assert (out == 0).all()


def test_multihead_attention_mask_convention_is_the_opposite():
    """nn.MultiheadAttention's key_padding_mask is True where keys are IGNORED."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 1, batch_first=True, bias=False).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    real = torch.tensor([[True, True, True, False, False], [True] * 5])
    _, w_torch = mha(x, x, x, key_padding_mask=to_torch_mask(real))
    W_q, W_k, W_v = mha.in_proj_weight.chunk(3)
    _, w_ours = scaled_dot_product_attention(x @ W_q.T, x @ W_k.T, x @ W_v.T, mask=padding_mask(real, heads=False))
    torch.testing.assert_close(w_ours, w_torch)
    assert (w_torch[0, :, 3:] == 0).all()


def test_causal_mask_shapes():
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_bad_shapes_and_masks_are_named():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    with pytest.raises(ValueError, match="same width d_k: q has 4, k has 3"):
        scaled_dot_product_attention(q, torch.randn(2, 5, 3), v)
    with pytest.raises(ValueError, match="same length S: k has 5, v has 4"):
        scaled_dot_product_attention(q, k, torch.randn(2, 4, 6))
    with pytest.raises(ValueError, match="does not broadcast"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        masked_softmax(torch.randn(2, 5), torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"\(B, S\) bool padding mask"):
        padding_mask(torch.ones(2, 3, 4, dtype=torch.bool))
