"""Chapter 8: the whole Transformer through the from-scratch attention, and the chapter's graders."""
import pytest
import torch

import attnbook.mha as mha_module
from attnbook.batching import lengths_mask
from attnbook.graders import GRADERS
from attnbook.mha import MultiHeadAttention
from attnbook.transformer import Transformer, TransformerConfig

CFG = dict(vocab_size=30, d_model=16, h=4, d_ff=32, n_layers=2, dropout=0.0, max_len=32)


def batch():
    g = torch.Generator().manual_seed(0)
    src_mask = lengths_mask([7, 4, 1])     # (B, S)
    tgt_mask = lengths_mask([5, 2, 3])     # (B, T)
    src = torch.randint(4, 30, (3, 7), generator=g).masked_fill(~src_mask, 0)
    tgt = torch.randint(4, 30, (3, 5), generator=g).masked_fill(~tgt_mask, 0)
    return src, src_mask, tgt, tgt_mask


def logits_and_grad(model, src, src_mask, tgt, tgt_mask):
    out = model(src, src_mask, tgt, tgt_mask)                                # (B, T, V)
    loss = out[tgt_mask].logsumexp(-1).sum()
    grad = torch.autograd.grad(loss, model.encoder[0].self_attn.W_q.weight)[0]
    return out.detach(), grad


@pytest.mark.parametrize("norm_first", [False, True])
def test_whole_model_gives_the_same_logits_with_the_from_scratch_attention(norm_first, monkeypatch):
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**CFG, norm_first=norm_first)).double().eval()
    args = batch()
    fused_out, fused_grad = logits_and_grad(model, *args)

    calls = {"scratch": 0, "fused": 0}
    scratch_fn = mha_module.scaled_dot_product_attention
    fused_fn = torch.nn.functional.scaled_dot_product_attention

    def counting_scratch(*a, **k):
        calls["scratch"] += 1
        return scratch_fn(*a, **k)

    def counting_fused(*a, **k):
        calls["fused"] += 1
        return fused_fn(*a, **k)

    forward = MultiHeadAttention.forward

    def forward_from_scratch(self, *a, **k):       # every attention layer asks for its weights
        k["need_weights"] = True
        return forward(self, *a, **k)

    monkeypatch.setattr(mha_module, "scaled_dot_product_attention", counting_scratch)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_fused)
    monkeypatch.setattr(MultiHeadAttention, "forward", forward_from_scratch)
    scratch_out, scratch_grad = logits_and_grad(model, *args)
    # 2 layers: 2 encoder self-attentions + 2 x (decoder self- and cross-attention)
    assert calls == {"scratch": 6, "fused": 0}
    _, _, _, tgt_mask = args
    torch.testing.assert_close(scratch_out[tgt_mask], fused_out[tgt_mask])
    torch.testing.assert_close(scratch_grad, fused_grad)


def test_the_fused_path_is_the_default(monkeypatch):
    model = Transformer(TransformerConfig(**CFG)).eval()
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    model(*batch())
    assert len(calls) == 6


# --- graders --------------------------------------------------------------------------------------

def grade(label, obj):
    return GRADERS[label].grade(obj)


def test_pre_ln_block_grader_accepts_the_reference():
    def pre_ln_encoder_block(block, x, src_mask):
        x = x + block.self_attn(block.norm1(x), key_mask=src_mask)[0]
        return x + block.ff(block.norm2(x))

    result = grade("ex-08-pre-ln-block", pre_ln_encoder_block)
    assert result.passed, result.message


def test_pre_ln_block_grader_rejects_a_stub():
    def pre_ln_encoder_block(block, x, src_mask):
        raise NotImplementedError

    assert "not implemented yet" in grade("ex-08-pre-ln-block", pre_ln_encoder_block).message


@pytest.mark.parametrize("wrong,expected", [
    (lambda b, x, m: b.norm2((y := b.norm1(x + b.self_attn(x, key_mask=m)[0])) + b.ff(y)),
     "this is post-LN"),
    (lambda b, x, m: b.ff(b.norm2(b.self_attn(b.norm1(x), key_mask=m)[0])),
     "residual connections are missing"),
    (lambda b, x, m: (y := x + b.self_attn(b.norm1(x))[0]) + b.ff(b.norm2(y)),
     "pass src_mask"),
    (lambda b, x, m: (y := x + b.self_attn(b.norm2(x), key_mask=m)[0]) + b.ff(b.norm1(y)),
     "LayerNorms are swapped"),
    (lambda b, x, m: b.norm2((y := x + b.self_attn(b.norm1(x), key_mask=m)[0]) + b.ff(b.norm2(y))),
     "normalised at the end"),
])
def test_pre_ln_block_grader_names_the_mistake(wrong, expected):
    result = grade("ex-08-pre-ln-block", wrong)
    assert not result.passed and expected in result.message, result.message


def test_pre_ln_block_grader_rejects_in_place_updates():
    def in_place(block, x, src_mask):
        x += block.self_attn(block.norm1(x), key_mask=src_mask)[0]
        x += block.ff(block.norm2(x))
        return x

    result = grade("ex-08-pre-ln-block", in_place)
    assert not result.passed and "in place" in result.message


def reference_params(V, d_model, h, d_ff, N, tied=True, norm_first=False):
    attn = 4 * d_model * d_model + 4 * d_model
    ff = 2 * d_model * d_ff + d_ff + d_model
    ln = 2 * d_model
    return (V * d_model * (1 if tied else 2) + N * (attn + ff + 2 * ln + 2 * attn + ff + 3 * ln)
            + (2 * ln if norm_first else 0))


def test_param_count_grader_accepts_the_reference_and_rejects_a_stub():
    result = grade("ex-08-param-count", reference_params)
    assert result.passed, result.message

    def stub(V, d_model, h, d_ff, N, tied=True, norm_first=False):
        raise NotImplementedError

    assert "not implemented yet" in grade("ex-08-param-count", stub).message


def no_biases(V, d_model, h, d_ff, N, tied=True, norm_first=False):
    return reference_params(V, d_model, h, d_ff, N, tied, norm_first) - N * (12 * d_model + 2 * (d_ff + d_model))


def tied_twice(V, d_model, h, d_ff, N, tied=True, norm_first=False):
    return reference_params(V, d_model, h, d_ff, N, False, norm_first)


def no_cross(V, d_model, h, d_ff, N, tied=True, norm_first=False):
    return reference_params(V, d_model, h, d_ff, N, tied, norm_first) - N * (4 * d_model ** 2 + 6 * d_model)


def no_final_norms(V, d_model, h, d_ff, N, tied=True, norm_first=False):
    return reference_params(V, d_model, h, d_ff, N, tied, False)


def per_head(V, d_model, h, d_ff, N, tied=True, norm_first=False):
    return reference_params(V, d_model, h, d_ff, N, tied, norm_first) + (h - 1) * 7


def as_float(V, d_model, h, d_ff, N, tied=True, norm_first=False):
    return float(reference_params(V, d_model, h, d_ff, N, tied, norm_first))


@pytest.mark.parametrize("wrong,expected", [
    (no_biases, "biases are missing"),
    (tied_twice, "counted twice"),
    (no_cross, "cross-attention"),
    (no_final_norms, "final LayerNorm"),
    (per_head, "expected"),
    (as_float, "Python int"),
])
def test_param_count_grader_names_the_mistake(wrong, expected):
    result = grade("ex-08-param-count", wrong)
    assert not result.passed and expected in result.message, result.message
