"""The convolutional translator (attnbook.conv.ConvS2S): shapes and errors, a causal decoder, a
padded sentence reading as it would alone, an incremental decoder equal to the whole pass, the
book's searches on it, and a model that learns."""
import pytest
import torch

from attnbook import BOS_ID, EOS_ID
from attnbook.batching import lengths_mask
from attnbook.conv import ConvS2S, GatedConv, layers_like
from attnbook.decoding import beam_search, greedy_decode
from attnbook.training.recipe import build_model, preset

V = 11


def model(seed=0, n_layers=2, kernel=3):
    torch.manual_seed(seed)
    return ConvS2S(V, d_model=16, n_layers=n_layers, kernel=kernel, max_len=40).eval()


def batch(seed=0, B=3, S=6, T=5):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    mask = lengths_mask(torch.tensor([S, S - 2, 1])[:B], S)
    tgt = torch.randint(4, V, (B, T), generator=g)
    return src.masked_fill(~mask, 0), mask, tgt


def test_shapes_and_a_clear_error_for_a_wrong_target():
    m = model()
    src, mask, tgt = batch()
    logits, attention = m.forward_with_attention(src, mask, tgt)
    torch.testing.assert_close(m(src, mask, tgt), logits)          # the one pass, two returns
    assert logits.shape == (3, 5, V) and len(attention) == 2
    assert attention[0].shape == (3, 5, 6)
    torch.testing.assert_close(attention[1].sum(-1), torch.ones(3, 5))
    assert (attention[0][1, :, 4:] == 0).all()                     # no weight on padding
    with pytest.raises(ValueError, match=r"tgt_in: expected shape \(3, T\)"):
        m(src, mask, tgt[:2])
    with pytest.raises(ValueError, match="differ"):
        m.encode(src, mask[:, :3])
    with pytest.raises(ValueError, match="odd for the encoder"):
        GatedConv(8, 2, causal=False)


def test_the_decoder_is_causal():
    m = model()
    src, mask, tgt = batch()
    changed = tgt.clone()
    changed[:, 3:] = (changed[:, 3:] + 1 - 4) % (V - 4) + 4       # other tokens from position 3 on
    a, b = m(src, mask, tgt), m(src, mask, changed)
    torch.testing.assert_close(a[:, :3], b[:, :3])                 # positions 0..2 cannot see them
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_a_padded_sentence_reads_as_it_would_alone():
    m = model()
    src, mask, tgt = batch()
    together = m(src, mask, tgt)
    for i in range(3):
        n = int(mask[i].sum())
        alone = m(src[i:i + 1, :n], mask[i:i + 1, :n], tgt[i:i + 1])
        torch.testing.assert_close(together[i:i + 1], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", [1, 3, 5])
def test_incremental_decoding_equals_the_whole_pass(kernel):
    m = model(kernel=kernel)
    src, mask, tgt = batch()
    memory = m.encode(src, mask)
    whole = m.decode(tgt, memory, mask)
    cache, steps = {}, []
    for t in range(tgt.shape[1]):                                   # one token at a time
        steps.append(m.decode(tgt[:, t:t + 1], memory, mask, cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-5, rtol=1e-5)
    cache = {}                                                      # or two, then three
    parts = [m.decode(tgt[:, :2], memory, mask, cache=cache), m.decode(tgt[:, 2:], memory, mask, cache=cache)]
    torch.testing.assert_close(torch.cat(parts, 1), whole, atol=1e-5, rtol=1e-5)


def test_the_books_searches_decode_it():
    m = model(seed=3)
    src, mask, _ = batch(seed=3)
    cached = greedy_decode(m, src, mask, max_len=8)
    assert cached == greedy_decode(m, src, mask, max_len=8, use_cache=False)
    assert beam_search(m, src, mask, beam_size=1, max_len=8) == cached   # beam 1 is greedy
    wide = beam_search(m, src, mask, beam_size=4, max_len=8)
    assert len(wide) == 3 and all(len(h) <= 8 for h in wide)


def test_it_learns_to_copy():
    """Copying a source of 3 to 6 symbols: a few hundred steps of Adam reach (nearly) every token."""
    torch.manual_seed(0)
    m = ConvS2S(V, d_model=32, n_layers=2, kernel=3, max_len=40)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)

    def sample(B=32):
        lengths = torch.randint(3, 7, (B,), generator=g)
        mask = lengths_mask(lengths, 6)
        src = torch.randint(4, V, (B, 6), generator=g).masked_fill(~mask, 0)
        eos = torch.zeros(B, 1, dtype=torch.long)
        tgt = torch.cat([src, eos], 1)
        tgt[torch.arange(B), lengths] = EOS_ID
        tgt_in = torch.cat([torch.full((B, 1), BOS_ID), tgt[:, :-1]], 1)
        return src, mask, tgt_in, tgt

    for _ in range(300):
        src, mask, tgt_in, tgt = sample()
        logits = m(src, mask, tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt, ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    src, mask, tgt_in, tgt = sample(200)
    with torch.no_grad():
        pred = m(src, mask, tgt_in).argmax(-1)
    real = tgt != 0
    assert (pred[real] == tgt[real]).float().mean() > 0.95


def test_the_recipe_builds_it_the_transformers_size():
    cfg = preset("smoke", "conv")
    conv = build_model(cfg)
    assert isinstance(conv, ConvS2S) and conv.embed.weight is conv.out.weight       # tied
    assert layers_like(662_528, 128) == 3               # cpu-tiny's Transformer, outside embeddings
    assert layers_like(0, 64) == 1
