"""The GRU encoder-decoders and additive attention of Part I."""
import pytest
import torch

from attnbook.batching import lengths_mask
from attnbook import BOS_ID, EOS_ID, PAD_ID
from attnbook.rnn import (AdditiveAttention, Encoder, Seq2Seq, masked_softmax,
                          weighted_sum)
from attnbook.decoding import greedy_decode
from attnbook.toy import greedy_tokens_with_attention, make_batch, vocab_size


def padding_mask(lengths, S):
    return lengths_mask(lengths, S)


# --- masked softmax -------------------------------------------------------------------------

def test_masked_softmax_gives_exact_zeros_and_sums_to_one():
    torch.manual_seed(0)
    scores = torch.randn(4, 6) * 10
    mask = padding_mask([6, 3, 1, 5], 6)
    w = masked_softmax(scores, mask)
    assert (w[~mask] == 0).all()          # exactly zero, not just small
    assert (w[mask] > 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(4))
    # the allowed positions get the softmax of the allowed scores alone
    torch.testing.assert_close(w[1, :3], torch.softmax(scores[1, :3], -1))


def test_masked_softmax_row_without_allowed_position_is_zero_not_nan():
    scores = torch.randn(2, 3, requires_grad=True)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    w = masked_softmax(scores, mask)
    assert not torch.isnan(w).any()
    assert (w[1] == 0).all()
    (w * torch.randn(2, 3)).sum().backward()
    assert not torch.isnan(scores.grad).any()


def test_weighted_sum_is_a_convex_combination():
    values = torch.randn(2, 4, 3)
    w = torch.zeros(2, 5, 4)
    w[:, :, 2] = 1.0  # all weight on position 2
    torch.testing.assert_close(weighted_sum(w, values), values[:, None, 2].expand(2, 5, 3))


# --- additive attention ---------------------------------------------------------------------

@pytest.fixture
def attn():
    torch.manual_seed(0)
    return AdditiveAttention(d_query=5, d_key=7, d_attn=6)


def test_additive_attention_shapes_sum_and_mask(attn):
    B, S = 3, 6
    q, keys = torch.randn(B, 5), torch.randn(B, S, 7)
    mask = padding_mask([6, 4, 1], S)
    c, alpha = attn(q, keys, mask)
    assert c.shape == (B, 7) and alpha.shape == (B, S)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(B))
    assert (alpha[~mask] == 0).all()
    assert alpha[2, 0] == 1.0  # one real token: all the weight
    # T queries at once give the same as one at a time
    Q = torch.randn(B, 4, 5)
    C, A = attn(Q, keys, mask)
    assert C.shape == (B, 4, 7) and A.shape == (B, 4, S)
    for t in range(4):
        c_t, a_t = attn(Q[:, t], keys, mask)
        torch.testing.assert_close(C[:, t], c_t)
        torch.testing.assert_close(A[:, t], a_t)


def test_additive_attention_matches_the_formula(attn):
    B, S = 2, 4
    q, keys, values = torch.randn(B, 5), torch.randn(B, S, 7), torch.randn(B, S, 3)
    mask = padding_mask([4, 2], S)
    c, alpha = attn(q, keys, mask, values=values)
    for b in range(B):
        e = torch.stack([attn.v.weight[0] @ torch.tanh(attn.W_q.weight @ q[b]
                                                        + attn.W_k.weight @ keys[b, i])
                         for i in range(S)])
        e[~mask[b]] = float("-inf")
        a = torch.softmax(e, -1)
        torch.testing.assert_close(alpha[b], a)
        torch.testing.assert_close(c[b], a @ values[b])


def test_cached_keys_give_identical_results(attn):
    q, keys = torch.randn(2, 5), torch.randn(2, 4, 7)
    mask = torch.ones(2, 4, dtype=torch.bool)
    kp = attn.project_keys(keys)
    assert kp.shape == (2, 4, 6)
    c1, a1 = attn(q, keys, mask)
    c2, a2 = attn(q, keys, mask, keys_proj=kp)
    assert torch.equal(c1, c2) and torch.equal(a1, a2)


def test_padding_content_cannot_change_the_result(attn):
    """Whatever sits at padded positions, context and real weights are unchanged."""
    q, keys = torch.randn(2, 5), torch.randn(2, 5, 7)
    mask = padding_mask([3, 5], 5)
    c, alpha = attn(q, keys, mask)
    garbage = keys.clone()
    garbage[~mask] = 1e3 * torch.randn_like(garbage[~mask])
    c2, alpha2 = attn(q, garbage, mask)
    torch.testing.assert_close(c2, c)
    torch.testing.assert_close(alpha2, alpha)
    # and extra padding columns change nothing either
    c3, alpha3 = attn(q[:1], torch.cat([keys[:1, :3], torch.randn(1, 4, 7)], 1),
                      padding_mask([3], 7))
    torch.testing.assert_close(c3, c[:1])
    torch.testing.assert_close(alpha3[:, :3], alpha[:1, :3])


@pytest.mark.parametrize("q_shape,k_shape,m_shape,m_dtype,match", [
    ((2, 4), (2, 3, 7), (2, 3), torch.bool, r"query: expected shape \(B, 5\)"),
    ((2, 5), (2, 3, 6), (2, 3), torch.bool, r"keys: expected shape \(2, S, 7\)"),
    ((2, 5), (3, 3, 7), (2, 3), torch.bool, r"keys: expected shape \(2, S, 7\)"),
    ((2, 5), (2, 3, 7), (2, 4), torch.bool, r"mask: expected a bool tensor of shape \(2, 3\)"),
    ((2, 5), (2, 3, 7), (2, 3), torch.float32, r"mask: expected a bool tensor"),
])
def test_additive_attention_shape_errors(attn, q_shape, k_shape, m_shape, m_dtype, match):
    with pytest.raises(ValueError, match=match):
        attn(torch.randn(q_shape), torch.randn(k_shape), torch.ones(m_shape, dtype=m_dtype))


# --- encoder --------------------------------------------------------------------------------

def test_encoder_states_ignore_padding():
    torch.manual_seed(0)
    enc = Encoder(vocab_size=10, d_model=8)
    src = torch.tensor([[4, 5, 6, 7], [8, 9, 0, 0]])
    mask = src != PAD_ID
    H, h_last = enc(src, mask)
    assert H.shape == (2, 4, 8) and h_last.shape == (2, 8)
    assert (H[1, 2:] == 0).all()
    alone_H, alone_last = enc(src[1:, :2], mask[1:, :2])  # the same sequence without padding
    torch.testing.assert_close(H[1:, :2], alone_H)
    torch.testing.assert_close(h_last[1:], alone_last)
    # h_last = [forward state at the last real token; backward state at the first]
    torch.testing.assert_close(h_last[1], torch.cat([H[1, 1, :4], H[1, 0, 4:]]))


@pytest.mark.parametrize("src,mask,match", [
    (torch.tensor([4, 5]), torch.tensor([True, True]), r"expected token ids of shape \(B, L\)"),
    (torch.tensor([[4, 5]]), torch.tensor([[1, 1]]), r"expected dtype torch.bool"),
    (torch.tensor([[4, 5]]), torch.tensor([[True, True, False]]), r"expected shape \(1, 2\)"),
    (torch.tensor([[0, 5]]), torch.tensor([[False, True]]), r"right padding"),
    (torch.tensor([[0, 0]]), torch.tensor([[False, False]]), r"no real token"),
    (torch.tensor([[4.0, 5.0]]), torch.tensor([[True, True]]), r"int64"),
])
def test_encoder_input_errors(src, mask, match):
    with pytest.raises(ValueError, match=match):
        Encoder(10, 8)(src, mask)


def test_odd_d_model_is_refused():
    with pytest.raises(ValueError, match="even"):
        Encoder(10, 7)


# --- the two seq2seq models -----------------------------------------------------------------

@pytest.fixture
def batch():
    return make_batch(5, 1, 7, n_symbols=6, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("attention", [False, True])
def test_seq2seq_shapes(batch, attention):
    torch.manual_seed(0)
    model = Seq2Seq(vocab_size(6), d_model=16, attention=attention)
    logits, alphas = model.forward_with_attention(batch.src, batch.src_mask, batch.tgt_in)
    B, S = batch.src.shape
    T = batch.tgt_in.shape[1]
    assert logits.shape == (B, T, vocab_size(6))
    if attention:
        assert alphas.shape == (B, T, S)
        torch.testing.assert_close(alphas.sum(-1), torch.ones(B, T))
        assert (alphas.masked_select(~batch.src_mask[:, None, :]) == 0).all()
    else:
        assert alphas is None


@pytest.mark.parametrize("attention", [False, True])
def test_teacher_forcing_equals_step_by_step(batch, attention):
    torch.manual_seed(0)
    model = Seq2Seq(vocab_size(6), d_model=16, attention=attention)
    logits, alphas = model.forward_with_attention(batch.src, batch.src_mask, batch.tgt_in)
    H, h_last = model.encoder(batch.src, batch.src_mask)
    memory = model.decoder.prepare(H, h_last, batch.src_mask)
    s = h_last
    for t in range(batch.tgt_in.shape[1]):
        logit, s, alpha = model.decoder.step(batch.tgt_in[:, t], s, memory)
        torch.testing.assert_close(logit, logits[:, t], atol=1e-5, rtol=1e-4)
        if attention:
            torch.testing.assert_close(alpha, alphas[:, t])


def test_plain_decoder_sees_the_source_only_through_one_vector(batch):
    """Change every encoder state except the summary: the plain decoder's output is unchanged,
    the attention decoder's output changes."""
    torch.manual_seed(0)
    for attention in (False, True):
        model = Seq2Seq(vocab_size(6), d_model=16, attention=attention)
        H, h_last = model.encoder(batch.src, batch.src_mask)
        a = model.decoder(batch.tgt_in, H, h_last, batch.src_mask)[0]
        b = model.decoder(batch.tgt_in, torch.randn_like(H), h_last, batch.src_mask)[0]
        assert torch.allclose(a, b) == (not attention)


def test_greedy_decode_on_the_gru_with_and_without_cache(batch):
    """The book's one greedy decoder runs the GRU: the cached recurrence (one step per token) and
    the uncached one (the whole prefix again at every step) give the same outputs, which stop at
    EOS and never contain PAD or BOS."""
    torch.manual_seed(0)
    for attention in (False, True):
        model = Seq2Seq(vocab_size(6), d_model=16, attention=attention).eval()
        out = greedy_decode(model, batch.src, batch.src_mask, max_len=9)
        assert out == greedy_decode(model, batch.src, batch.src_mask, max_len=9, use_cache=False)
        assert len(out) == batch.src.shape[0] and all(len(row) <= 9 for row in out)
        assert not {PAD_ID, BOS_ID, EOS_ID} & {t for row in out for t in row}


def test_greedy_tokens_attention_is_the_attention_of_the_search(batch):
    """Teacher forcing on the model's own greedy output gives back its argmaxes, and the weights
    of that pass are those of the step-by-step search, computed here with decoder.step."""
    torch.manual_seed(1)
    model = Seq2Seq(vocab_size(6), d_model=16, attention=True).eval()
    tokens, weights = greedy_tokens_with_attention(model, batch.src, batch.src_mask,
                                                   max_len=6)   # (B, L), (B, L, S)
    B, L = tokens.shape
    assert L <= 6 and weights.shape == (B, L, batch.src.shape[1])
    assert (weights.masked_select(~batch.src_mask[:, None, :]) == 0).all()
    for row in tokens.tolist():                      # after a sentence's EOS comes only PAD
        if EOS_ID in row:
            assert all(t == PAD_ID for t in row[row.index(EOS_ID) + 1:])
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID), tokens[:, :-1]], 1)
    banned = torch.tensor([PAD_ID, BOS_ID])          # the search never chooses PAD or BOS
    logits = model(batch.src, batch.src_mask, tgt_in).index_fill(-1, banned, float("-inf"))
    still_going = torch.cat([torch.ones(B, 1, dtype=torch.bool),
                             (tokens[:, :-1] != EOS_ID).cumprod(1).bool()], 1)   # (B, L)
    assert torch.equal(logits.argmax(-1)[still_going], tokens[still_going])
    with torch.no_grad():  # the search, one step at a time, feeding back its own choice
        H, h_last = model.encoder(batch.src, batch.src_mask)
        memory = model.decoder.prepare(H, h_last, batch.src_mask)
        s, y, alphas = h_last, torch.full((B,), BOS_ID), []
        for _ in range(L):
            step_logits, s, alpha = model.decoder.step(y, s, memory)  # (B, V), (B, d), (B, S)
            y = step_logits.index_fill(-1, banned, float("-inf")).argmax(-1)
            alphas.append(alpha)
    stepped = torch.stack(alphas, 1)                                 # (B, L, S)
    assert torch.allclose(weights[still_going], stepped[still_going], atol=1e-6)
    plain = Seq2Seq(vocab_size(6), 16).eval()
    assert greedy_tokens_with_attention(plain, batch.src, batch.src_mask, 4)[1] is None


def test_seq2seq_tgt_shape_error(batch):
    model = Seq2Seq(vocab_size(6), d_model=16)
    with pytest.raises(ValueError, match=r"tgt_in: expected shape \(5, T\)"):
        model(batch.src, batch.src_mask, batch.tgt_in[:2])


# --- Luong's multiplicative scores (chapter 3) ---------------------------------------------

from attnbook.rnn import LuongAttention, ScoredAttention  # noqa: E402


@pytest.mark.parametrize("kind", ["dot", "general"])
def test_luong_attention_shapes_sum_and_mask(kind):
    torch.manual_seed(0)
    attn = LuongAttention(d_query=5, d_key=5, kind=kind)
    assert isinstance(attn, ScoredAttention)
    B, S = 3, 6
    q, keys = torch.randn(B, 5), torch.randn(B, S, 5)
    mask = padding_mask([6, 4, 1], S)
    c, alpha = attn(q, keys, mask)
    assert c.shape == (B, 5) and alpha.shape == (B, S)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(B))
    assert (alpha[~mask] == 0).all()      # exactly zero, not just small
    assert alpha[2, 0] == 1.0
    Q, values = torch.randn(B, 4, 5), torch.randn(B, S, 3)
    C, A = attn(Q, keys, mask, values=values)
    assert C.shape == (B, 4, 3) and A.shape == (B, 4, S)
    torch.testing.assert_close(A.sum(-1), torch.ones(B, 4))
    assert (A.masked_select(~mask[:, None, :]) == 0).all()
    for t in range(4):
        torch.testing.assert_close(A[:, t], attn(Q[:, t], keys, mask)[1])


def test_luong_dot_matches_a_hand_computation():
    attn = LuongAttention(3, 3, kind="dot")
    assert list(attn.parameters()) == []
    q = torch.tensor([[1.0, 0.0, 2.0]])                                   # (1, 3)
    keys = torch.tensor([[[1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [2.0, 0.0, 1.0], [9.0, 9.0, 9.0]]])
    values = torch.tensor([[[1.0], [2.0], [3.0], [100.0]]])               # (1, 4, 1)
    mask = torch.tensor([[True, True, True, False]])
    c, alpha = attn(q, keys, mask, values=values)
    e = torch.tensor([1.0, 2.0, 4.0])                                     # q . k_i by hand
    a = torch.exp(e) / torch.exp(e).sum()
    torch.testing.assert_close(alpha[0], torch.cat([a, torch.zeros(1)]))
    torch.testing.assert_close(c[0], (a * torch.tensor([1.0, 2.0, 3.0])).sum()[None])


def test_luong_general_with_identity_equals_dot():
    torch.manual_seed(0)
    general, dot = LuongAttention(6, 6, kind="general"), LuongAttention(6, 6, kind="dot")
    assert general.W_k.weight.shape == (6, 6)
    with torch.no_grad():
        general.W_k.weight.copy_(torch.eye(6))
    q, keys, mask = torch.randn(2, 3, 6), torch.randn(2, 5, 6), padding_mask([5, 2], 5)
    for got, want in zip(general(q, keys, mask), dot(q, keys, mask)):
        torch.testing.assert_close(got, want)


def test_luong_general_is_the_bilinear_form_and_caches_keys():
    torch.manual_seed(0)
    attn = LuongAttention(d_query=4, d_key=7, kind="general")
    W = attn.W_k.weight                                                   # (d_query, d_key)
    q, keys, mask = torch.randn(2, 4), torch.randn(2, 5, 7), padding_mask([5, 3], 5)
    c, alpha = attn(q, keys, mask)
    e = torch.einsum("bq,qk,bsk->bs", q, W, keys).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(alpha, torch.softmax(e, -1))
    kp = attn.project_keys(keys)
    assert kp.shape == (2, 5, 4)
    c2, alpha2 = attn(q, keys, mask, keys_proj=kp)
    assert torch.equal(c, c2) and torch.equal(alpha, alpha2)
    with pytest.raises(ValueError, match=r"keys_proj: expected shape \(2, 5, 4\)"):
        attn(q, keys, mask, keys_proj=keys)


def test_luong_attention_argument_errors():
    with pytest.raises(ValueError, match="d_query == d_key"):
        LuongAttention(4, 6, kind="dot")
    with pytest.raises(ValueError, match="kind must be one of"):
        LuongAttention(4, 4, kind="concat")
    attn = LuongAttention(4, 4)
    with pytest.raises(ValueError, match=r"query: expected shape \(B, 4\)"):
        attn(torch.randn(2, 3), torch.randn(2, 5, 4), torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask: expected a bool tensor"):
        attn(torch.randn(2, 4), torch.randn(2, 5, 4), torch.ones(2, 5))


@pytest.mark.parametrize("score", ["dot", "general"])
def test_seq2seq_with_luong_scores(batch, score):
    torch.manual_seed(0)
    model = Seq2Seq(vocab_size(6), d_model=16, attention=True, score=score)
    assert isinstance(model.decoder.attention, LuongAttention)
    assert model.decoder.attention.kind == score
    logits, alphas = model.forward_with_attention(batch.src, batch.src_mask, batch.tgt_in)
    B, S = batch.src.shape
    T = batch.tgt_in.shape[1]
    assert logits.shape == (B, T, vocab_size(6)) and alphas.shape == (B, T, S)
    torch.testing.assert_close(alphas.sum(-1), torch.ones(B, T))
    assert (alphas.masked_select(~batch.src_mask[:, None, :]) == 0).all()
    # teacher forcing equals step by step, as for the additive score
    H, h_last = model.encoder(batch.src, batch.src_mask)
    memory = model.decoder.prepare(H, h_last, batch.src_mask)
    s = h_last
    for t in range(T):
        logit, s, alpha = model.decoder.step(batch.tgt_in[:, t], s, memory)
        torch.testing.assert_close(logit, logits[:, t], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(alpha, alphas[:, t])


def test_seq2seq_default_score_is_additive_and_unchanged():
    torch.manual_seed(0)
    a = Seq2Seq(vocab_size(6), d_model=16, attention=True)
    torch.manual_seed(0)
    b = Seq2Seq(vocab_size(6), d_model=16, attention=True, score="additive")
    assert isinstance(a.decoder.attention, AdditiveAttention)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_seq2seq_score_argument_errors():
    with pytest.raises(ValueError, match="score must be one of"):
        Seq2Seq(10, 8, attention=True, score="cosine")
    with pytest.raises(ValueError, match="needs attention=True"):
        Seq2Seq(10, 8, attention=False, score="dot")
    with pytest.raises(ValueError, match="d_attn"):
        Seq2Seq(10, 8, attention=True, d_attn=4, score="dot")


def test_forward_returns_logits_and_forward_with_attention_adds_the_weights(batch):
    """One return shape per method: a model's forward (and decode) returns the logits, whatever
    the model; the *_with_attention methods return (logits, weights)."""
    import inspect

    from attnbook.conv import ConvS2S
    from attnbook.lm import DecoderOnlyTranslator
    from attnbook.transformer import Transformer, TransformerConfig
    for cls in (Seq2Seq, Transformer, ConvS2S, DecoderOnlyTranslator):
        for method in (cls.forward, cls.decode):
            assert not {"return_attention", "need_weights"} & set(inspect.signature(method).parameters)
    assert all(hasattr(cls, "forward_with_attention") for cls in (Seq2Seq, Transformer, ConvS2S))
    torch.manual_seed(0)
    V = vocab_size(6)
    gru = Seq2Seq(V, 16, attention=True)
    tr = Transformer(TransformerConfig(vocab_size=V, d_model=16, h=2, d_ff=32, n_layers=2,
                                       dropout=0.0, max_len=32))
    for model in (gru, Seq2Seq(V, 16), tr):
        logits = model(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_mask)
        assert isinstance(logits, torch.Tensor) and logits.shape == (*batch.tgt_in.shape, V)
    logits, alphas = gru.forward_with_attention(batch.src, batch.src_mask, batch.tgt_in)
    assert alphas.shape == (*batch.tgt_in.shape, batch.src.shape[1])
    assert Seq2Seq(V, 16).forward_with_attention(batch.src, batch.src_mask, batch.tgt_in)[1] is None
    logits2, cross = tr.eval().forward_with_attention(batch.src, batch.src_mask, batch.tgt_in,
                                                      batch.tgt_mask)
    assert len(cross) == 2 and cross[0].shape == (batch.src.shape[0], 2, batch.tgt_in.shape[1],
                                                  batch.src.shape[1])
    torch.testing.assert_close(logits2, tr(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_mask))


def test_width_like_gives_the_gru_of_the_transformers_size():
    """Chapter 10's equal-size GRU: width_like picks the width (a multiple of 16) whose count
    outside the embeddings and the output layer is nearest the target, and the recipe's
    gru-additive-wide is that model at the Transformer's count outside its embeddings."""
    from attnbook.rnn import width_like
    from attnbook.training.recipe import build_model, preset
    from attnbook.transformer import Transformer

    def inside(m):
        return sum(p.numel() for n, p in m.named_parameters()
                   if "embed" not in n and not n.startswith("decoder.out"))

    for target in (50_000, 300_000, 662_528):
        d = width_like(target)
        assert d % 16 == 0
        gap = abs(inside(Seq2Seq(2, d, attention=True)) - target)
        for other in (d - 16, d + 16):
            if other > 0:
                assert gap <= abs(inside(Seq2Seq(2, other, attention=True)) - target)
    cfg = preset("smoke", "gru-additive-wide")
    model = build_model(cfg)
    outside = sum(p.numel() for n, p in Transformer(cfg.arch).named_parameters() if "embed" not in n)
    assert isinstance(model, Seq2Seq) and model.d_model == width_like(outside)
