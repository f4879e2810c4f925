"""The book's Transformer: equal to nn.Transformer with copied weights, causal, padding-blind."""
from dataclasses import replace

import pytest
import torch
import torch.nn as nn

from attnbook.batching import lengths_mask
from attnbook.mha import MultiHeadAttention
from attnbook.torch_twins import (TorchTransformer, attention_from_torch, attention_to_torch,
                                  torch_encoder, torch_transformer, transformer_from_torch)
from attnbook.transformer import SelfAttentionStack, Transformer, TransformerConfig

CFG = dict(vocab_size=50, d_model=16, h=4, d_ff=32, n_layers=2, dropout=0.0, max_len=64)


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 50, (3, 7), generator=g)
    tgt = torch.randint(4, 50, (3, 5), generator=g)
    src_mask = lengths_mask([7, 4, 2])
    tgt_mask = lengths_mask([5, 3, 1])
    return src.masked_fill(~src_mask, 0), src_mask, tgt.masked_fill(~tgt_mask, 0), tgt_mask


@pytest.mark.parametrize("norm_first", [False, True])
def test_equals_nn_transformer_with_copied_weights(norm_first):
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**CFG, norm_first=norm_first)).double()
    ref = torch_transformer(model)
    src, src_mask, tgt, tgt_mask = batch()
    ours = model(src, src_mask, tgt, tgt_mask)                              # (B, T, V)
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.bool)
    hidden = ref(model.embed_tokens(src), model.embed_tokens(tgt), tgt_mask=causal,
                 src_key_padding_mask=~src_mask, tgt_key_padding_mask=~tgt_mask,
                 memory_key_padding_mask=~src_mask)
    theirs = model.out(hidden)
    torch.testing.assert_close(ours[tgt_mask], theirs[tgt_mask])
    g1 = torch.autograd.grad(ours[tgt_mask].sum(), model.encoder[0].self_attn.W_q.weight)[0]
    g2 = torch.autograd.grad(theirs[tgt_mask].sum(), ref.encoder.layers[0].self_attn.in_proj_weight)[0]
    torch.testing.assert_close(g1, g2[:16])


def test_future_target_tokens_do_not_change_earlier_logits():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**CFG)).eval()
    src, src_mask, tgt, tgt_mask = batch()
    a = model(src, src_mask, tgt)
    tgt2 = tgt.clone()
    tgt2[:, 3:] = 7
    b = model(src, src_mask, tgt2)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_padded_source_positions_are_ignored():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**CFG)).eval()
    src, src_mask, tgt, tgt_mask = batch()
    src2 = src.clone()
    src2[~src_mask] = 9
    torch.testing.assert_close(model(src, src_mask, tgt), model(src2, src_mask, tgt))


def parameter_formula(V, d, h, d_ff, N, norm_first, tied=True):
    attn = 4 * d * d + 4 * d
    ff = 2 * d * d_ff + d_ff + d
    enc = attn + ff + 2 * 2 * d
    dec = 2 * attn + ff + 3 * 2 * d
    return V * d * (1 if tied else 2) + N * (enc + dec) + (2 * 2 * d if norm_first else 0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_parameter_count_of_the_base_model_matches_the_formula(norm_first):
    cfg = TransformerConfig(vocab_size=37000, norm_first=norm_first)   # the paper's base model
    n = sum(p.numel() for p in Transformer(cfg).parameters())
    assert n == parameter_formula(37000, 512, 8, 2048, 6, norm_first)
    assert 60e6 < n < 66e6  # "65M" in Table 3 of the paper, which counts a little differently


def test_weight_tying_and_bad_input():
    model = Transformer(TransformerConfig(**CFG))
    assert model.out.weight is model.embed.weight
    untied = Transformer(TransformerConfig(**{**CFG, "tie_embeddings": False}))
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters()) == 50 * 16
    src, src_mask, tgt, _ = batch()
    with pytest.raises(ValueError, match="int64 tensor of token ids"):
        model(src.float(), src_mask, tgt)
    with pytest.raises(ValueError, match="differ"):
        model(src, src_mask[:, :3], tgt)


def test_self_attention_stack_causal_and_bidirectional():
    torch.manual_seed(0)
    cfg = TransformerConfig(**CFG)
    ids = torch.randint(4, 50, (2, 6))
    changed = ids.clone()
    changed[:, 4:] = 5
    lm = SelfAttentionStack(cfg, causal=True).eval()
    torch.testing.assert_close(lm(ids)[:, :4], lm(changed)[:, :4])      # the future is invisible
    tagger = SelfAttentionStack(cfg, causal=False, n_out=3).eval()
    assert tagger(ids).shape == (2, 6, 3)
    assert not torch.allclose(tagger(ids)[:, :4], tagger(changed)[:, :4])  # ... or visible
    assert lm.out.weight is lm.embed.weight


def test_without_positions_self_attention_is_permutation_equivariant():
    torch.manual_seed(0)
    model = SelfAttentionStack(TransformerConfig(**{**CFG, "positional": "none"}), causal=False).eval()
    ids = torch.randint(4, 50, (1, 6))
    perm = torch.randperm(6)
    torch.testing.assert_close(model(ids)[:, perm], model(ids[:, perm]))
    with pytest.raises(ValueError, match="unknown positional"):
        SelfAttentionStack(TransformerConfig(**{**CFG, "positional": "rope"}), causal=False)


def test_decode_returns_cross_attention_weights():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**CFG)).eval()
    src, src_mask, tgt, tgt_mask = batch()
    memory = model.encode(src, src_mask)
    logits, cross = model.decode_with_attention(tgt, memory, src_mask, tgt_mask)
    torch.testing.assert_close(logits, model.decode(tgt, memory, src_mask, tgt_mask))
    assert len(cross) == CFG["n_layers"] and cross[0].shape == (3, 4, 5, 7)     # (B, h, T, S)
    for w in cross:
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 5))
        assert (w.permute(0, 2, 1, 3)[~src_mask[:, None, None, :].expand(3, 5, 4, 7)] == 0).all()


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_decoder_only_stack_equals_nn_transformer_encoder_with_a_causal_mask(norm_first):
    torch.manual_seed(0)
    model = SelfAttentionStack(TransformerConfig(**CFG, norm_first=norm_first), causal=True)
    model = model.double().eval()
    ids, mask = torch.randint(4, 50, (3, 6)), lengths_mask([6, 4, 2])
    x = model.pos(model.embed(ids) * CFG["d_model"] ** 0.5)            # (B, T, d_model)
    causal = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.bool)  # True = hidden
    theirs = torch_encoder(model)(x, mask=causal, src_key_padding_mask=~mask, is_causal=True)
    ours = model.hidden(ids, mask)
    torch.testing.assert_close(ours[mask], theirs[mask])


@pytest.mark.parametrize("norm_first", [False, True])
def test_torch_transformer_wrapper_computes_the_book_model(norm_first):
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**CFG, norm_first=norm_first)).double().eval()
    ref = TorchTransformer(model.cfg).double().load_from_book(model).eval()
    src, src_mask, tgt, tgt_mask = batch()
    torch.testing.assert_close(model(src, src_mask, tgt, tgt_mask)[tgt_mask],
                               ref(src, src_mask, tgt, tgt_mask)[tgt_mask])
    model.encoder[0].ff.linear1.bias.data += 0.1              # a twin is a copy, not a view
    assert not torch.allclose(model(src, src_mask, tgt)[tgt_mask], ref(src, src_mask, tgt)[tgt_mask])


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_bridge_copies_pytorch_weights_into_the_book_model_too(norm_first):
    """torch -> book: a fresh book model given an nn.Transformer's weights computes what that
    nn.Transformer computes; and book -> torch -> book gives back every weight exactly."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**CFG, norm_first=norm_first)).double().eval()
    twin = torch_transformer(model)
    for p in twin.parameters():                                # PyTorch's own, other weights
        p.data = torch.randn_like(p)
    torch.manual_seed(1)
    mine = Transformer(TransformerConfig(**CFG, norm_first=norm_first)).double().eval()
    transformer_from_torch(mine, twin)
    src, src_mask, tgt, tgt_mask = batch()
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.bool)
    theirs = mine.out(twin(mine.embed_tokens(src), mine.embed_tokens(tgt), tgt_mask=causal,
                           src_key_padding_mask=~src_mask, tgt_key_padding_mask=~tgt_mask,
                           memory_key_padding_mask=~src_mask))
    torch.testing.assert_close(mine(src, src_mask, tgt, tgt_mask)[tgt_mask], theirs[tgt_mask])
    back = transformer_from_torch(Transformer(TransformerConfig(**CFG, norm_first=norm_first)).double(),
                                  torch_transformer(model))
    back.embed.load_state_dict(model.embed.state_dict())
    back.pos.load_state_dict(model.pos.state_dict())
    a, b = model.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_one_attention_layer_crosses_the_bridge_both_ways():
    torch.manual_seed(0)
    mine, theirs = MultiHeadAttention(16, 4).double(), nn.MultiheadAttention(16, 4).double()
    attention_to_torch(mine, theirs)
    back = attention_from_torch(MultiHeadAttention(16, 4).double(), theirs)
    assert all(torch.equal(p, q) for p, q in zip(mine.parameters(), back.parameters()))
    torch.testing.assert_close(theirs.in_proj_weight[16:32], mine.W_k.weight, rtol=0, atol=0)
    with pytest.raises(ValueError, match="same d_model and h"):
        attention_from_torch(MultiHeadAttention(16, 2), nn.MultiheadAttention(16, 4))


def test_the_learned_table_starts_at_the_configured_scale():
    from attnbook.training.recipe import build_model, override, preset
    torch.manual_seed(0)
    small = Transformer(TransformerConfig(**{**CFG, "positional": "learned"}))
    large = Transformer(TransformerConfig(**{**CFG, "positional": "learned", "learned_std": 0.7}))
    assert abs(small.pos.embedding.weight.std().item() - 0.02) < 0.005
    assert abs(large.pos.embedding.weight.std().item() - 0.7) < 0.1
    cfg = override(preset("smoke"), positional="learned", learned_std=0.5)   # the recipe passes it on
    assert abs(build_model(cfg).pos.embedding.weight.std().item() - 0.5) < 0.1


def test_config_d_k_reaches_every_attention_layer():
    base = TransformerConfig(vocab_size=20, d_model=16, h=4, d_ff=32, n_layers=2, dropout=0.0)
    narrow = Transformer(replace(base, d_k=2))
    layers = [m for m in narrow.modules() if isinstance(m, MultiHeadAttention)]
    assert len(layers) == 6 and all(m.d_k == 2 and m.d_v == 4 for m in layers)
    assert all(m.d_k == 4 for m in Transformer(base).modules() if isinstance(m, MultiHeadAttention))
    src, tgt = torch.randint(4, 20, (2, 5)), torch.randint(4, 20, (2, 4))
    ones = lambda x: torch.ones_like(x, dtype=torch.bool)  # noqa: E731
    assert narrow(src, ones(src), tgt, ones(tgt)).shape == (2, 4, 20)
