"""Multi-head attention against nn.MultiheadAttention, and positional encodings."""
import math

import pytest
import torch
import torch.nn as nn

from attnbook.batching import lengths_mask
from attnbook.attention import to_torch_mask
from attnbook.mha import MultiHeadAttention
from attnbook.positional import (LearnedPositionalEncoding, SinusoidalPositionalEncoding,
                                 sinusoidal_encoding)
from attnbook.torch_twins import attention_from_torch


def pair(d_model, h, seed=0):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(d_model, h, batch_first=True).double()
    ours = attention_from_torch(MultiHeadAttention(d_model, h).double(), ref)
    return ours, ref


@pytest.mark.parametrize("h", [1, 2, 4, 8])
@pytest.mark.parametrize("need_weights", [False, True])
def test_self_attention_equals_torch_with_padding_and_causal(h, need_weights):
    ours, ref = pair(16, h)
    B, T = 3, 6
    x = torch.randn(B, T, 16, dtype=torch.float64, requires_grad=True)
    real = lengths_mask([6, 4, 1], T)     # (B, T)
    for causal in (False, True):
        out, w = ours(x, key_mask=real, causal=causal, need_weights=need_weights)
        attn_mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.bool) if causal else None
        exp, exp_w = ref(x, x, x, key_padding_mask=to_torch_mask(real), attn_mask=attn_mask,
                         need_weights=True, average_attn_weights=False)
        torch.testing.assert_close(out, exp)
        if need_weights:
            torch.testing.assert_close(w, exp_w)
        g1 = torch.autograd.grad(out.sum(), [x, *ours.parameters()])
        g2 = torch.autograd.grad(exp.sum(), [x, ref.in_proj_weight, ref.in_proj_bias,
                                             ref.out_proj.weight, ref.out_proj.bias])
        torch.testing.assert_close(g1[0], g2[0])
        torch.testing.assert_close(torch.cat([g1[1], g1[3], g1[5]]), g2[1])  # W_q, W_k, W_v


def test_cross_attention_equals_torch():
    ours, ref = pair(12, 3, seed=1)
    x, ctx = torch.randn(2, 4, 12, dtype=torch.float64), torch.randn(2, 7, 12, dtype=torch.float64)
    real = lengths_mask([7, 3], 7)
    out, _ = ours(x, ctx, key_mask=real)
    exp, _ = ref(x, ctx, ctx, key_padding_mask=~real)
    torch.testing.assert_close(out, exp)


def test_parameter_count_does_not_depend_on_heads():
    counts = {h: sum(p.numel() for p in MultiHeadAttention(64, h).parameters()) for h in (1, 2, 4, 8, 16)}
    assert set(counts.values()) == {4 * 64 * 64 + 4 * 64}


def test_padding_keys_do_not_change_the_output():
    ours, _ = pair(8, 2)
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    real = torch.tensor([[True, True, True, False, False]])
    y = x.clone()
    y[0, 3:] = 100.0
    a, _ = ours(x, key_mask=real)
    b, _ = ours(y, key_mask=real)
    torch.testing.assert_close(a[0, :3], b[0, :3])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="not divisible by h=3"):
        MultiHeadAttention(16, 3)
    m = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"expected x \(B, T, 16\)"):
        m(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"key_mask must be a \(2, 5\) bool tensor"):
        m(torch.randn(2, 5, 16), key_mask=torch.ones(2, 5))


def test_sinusoidal_values_and_linear_shift():
    pe = sinusoidal_encoding(50, 16)
    assert pe.shape == (50, 16)
    assert pe[3, 0].item() == pytest.approx(math.sin(3)) and pe[3, 1].item() == pytest.approx(math.cos(3))
    assert pe[7, 4].item() == pytest.approx(math.sin(7 / 10000 ** (4 / 16)), abs=1e-6)
    # PE(p + k) = M_k PE(p) for a fixed block-diagonal rotation M_k, the same for every p
    k, d = 5, 16
    M = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        w = 1.0 / 10000 ** (2 * i / d)
        c, s_ = math.cos(k * w), math.sin(k * w)
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, -s_], [s_, c]], dtype=torch.float64)
    torch.testing.assert_close((pe[:40].double() @ M).float(), pe[k:40 + k], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_encoding(4, 7)


def test_positional_modules():
    x = torch.zeros(2, 6, 8)
    sin = SinusoidalPositionalEncoding(8, max_len=4)
    torch.testing.assert_close(sin(x)[0], sinusoidal_encoding(6, 8))       # extends past max_len
    torch.testing.assert_close(sin(x[:, :2], offset=3)[0], sinusoidal_encoding(5, 8)[3:])
    learned = LearnedPositionalEncoding(8, max_len=6)
    assert learned(x).shape == (2, 6, 8)
    with pytest.raises(ValueError, match="max_len=6"):
        learned(torch.zeros(1, 7, 8))


def test_key_width_apart_from_value_width():
    """d_k set alone (Table 3, row B): q and k are h slices of width d_k, v of width d_model / h,
    scores divided by sqrt(d_k); the fused and the from-scratch paths agree, with a cache too."""
    torch.manual_seed(0)
    B, T, S, d_model, h, d_k = 2, 3, 5, 16, 4, 2
    m = MultiHeadAttention(d_model, h, d_k=d_k).eval()
    assert m.W_q.weight.shape == m.W_k.weight.shape == (h * d_k, d_model)
    assert m.W_v.weight.shape == (d_model, d_model) and (m.d_k, m.d_v) == (2, 4)
    x, ctx = torch.randn(B, T, d_model), torch.randn(B, S, d_model)
    mask = lengths_mask(torch.tensor([5, 3]), S)                        # (B, S)
    out, w = m(x, ctx, key_mask=mask, need_weights=True)
    q = m.W_q(x).view(B, T, h, d_k).transpose(1, 2)                     # (B, h, T, d_k)
    k = m.W_k(ctx).view(B, S, h, d_k).transpose(1, 2)                   # (B, h, S, d_k)
    v = m.W_v(ctx).view(B, S, h, 4).transpose(1, 2)                     # (B, h, S, d_v)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(d_k)).masked_fill(~mask[:, None, None], -math.inf)
    ref = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d_model)
    torch.testing.assert_close(w, scores.softmax(-1))
    torch.testing.assert_close(out, m.W_o(ref))
    torch.testing.assert_close(m(x, ctx, key_mask=mask)[0], out)       # the fused kernel
    cache, steps = {}, []                                               # causal self-attention,
    for t in range(T):                                                  # one token at a time
        steps.append(m(x[:, t:t + 1], causal=True, cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, 1), m(x, causal=True)[0])
    assert MultiHeadAttention(d_model, h).d_k == 4                      # the default: d_model / h
    with pytest.raises(ValueError, match="d_k must be at least 1"):
        MultiHeadAttention(d_model, h, d_k=0)
    with pytest.raises(ValueError, match="d_k = d_model / h"):
        attention_from_torch(m, nn.MultiheadAttention(d_model, h, batch_first=True))


def test_recording_keeps_the_weights_inside_the_block_and_clears_them_after():
    from attnbook.mha import MultiHeadAttention, attention_modules, recording
    torch.manual_seed(0)
    model = torch.nn.Sequential(MultiHeadAttention(8, 2), MultiHeadAttention(8, 2))
    x = torch.randn(3, 5, 8)                                        # (B, T, d_model)
    mods = attention_modules(model)
    assert list(mods) == ["0", "1"]
    with recording(mods):
        model[0](x)
        w, key_mask = mods["0"].last
        assert w.shape == (3, 2, 5, 5) and key_mask is None
        assert torch.allclose(w.sum(-1), torch.ones(3, 2, 5))     # each row a distribution
        assert mods["1"].last is None                               # not run yet
    assert all(not m.record and m.last is None for m in mods.values())
    with pytest.raises(ValueError):
        with recording(mods):
            model[0](torch.randn(3, 5, 7))                          # a wrong width
    assert all(not m.record and m.last is None for m in mods.values())


def test_scaling_heads_multiplies_each_heads_output_before_w_o():
    from attnbook.mha import scaling_heads
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    seen = {}
    hook = mha.W_o.register_forward_pre_hook(lambda _, args: seen.update(heads=args[0]))
    intact = mha(x)[0]
    heads = seen["heads"]                                  # (B, T, d_model): 4 heads of 4 side by side
    scale = torch.tensor([1.0, 0.0, 0.5, 1.0])
    with scaling_heads(mha, scale):
        scaled = mha(x)[0]
    hook.remove()
    expect = mha.W_o(heads * scale.repeat_interleave(4))
    assert torch.allclose(scaled, expect, atol=1e-6) and not torch.allclose(scaled, intact)
    assert torch.equal(mha(x)[0], intact)                  # the hook is gone after the block
    with pytest.raises(ValueError, match=r"scale must have shape \(4,\)"):
        with scaling_heads(mha, torch.ones(3)):
            pass
