"""Chapter 12: the decoder-only stack's key/value cache, sampling, and the one-sequence translator."""
import pytest
import torch

from attnbook import BOS_ID, EOS_ID, PAD_ID
from attnbook.batching import make_batch, pad
from attnbook.decoding import beam_search, greedy_decode
from attnbook.lm import (DecoderOnlyTranslator, generate, lm_batches, lm_loss,
                         prompt_target_example, sample_next, token_positions)
from attnbook.training.recipe import MODELS, build_model, forward_logits, override, preset
from attnbook.transformer import SelfAttentionStack, TransformerConfig

V = 23


def cfg(**kw):
    base = dict(vocab_size=V, d_model=16, h=2, d_ff=32, n_layers=2, dropout=0.0, max_len=64)
    return TransformerConfig(**{**base, **kw})


def stack(seed=0, **kw):
    torch.manual_seed(seed)
    return SelfAttentionStack(cfg(**kw), causal=True).eval()


# --- the key/value cache of the decoder-only stack -------------------------------------------

@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_cached_steps_equal_the_full_forward(norm_first, positional):
    model = stack(norm_first=norm_first, positional=positional)
    ids = torch.randint(4, V, (3, 9), generator=torch.Generator().manual_seed(1))
    full = model(ids)                                                    # (B, T, V)
    cache = {}
    parts = [model(ids[:, :4], cache=cache)]                             # a prompt, then 1 by 1
    parts += [model(ids[:, t:t + 1], cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-4)
    assert cache["length"] == 9 and cache["layers"][0]["k"].shape == (3, 2, 9, 8)


def test_cache_with_a_padding_mask_equals_the_full_forward():
    model = stack()
    ids, mask = pad([[BOS_ID, 5, 6, 7, 8, 9], [BOS_ID, 10, 11]])
    full = model(ids, mask)
    cache = {}
    parts = [model(ids[:, :2], mask[:, :2], cache=cache)]
    parts += [model(ids[:, t:t + 1], mask[:, t:t + 1], cache=cache) for t in range(2, 6)]
    got = torch.cat(parts, 1)
    torch.testing.assert_close(got[mask], full[mask], atol=1e-5, rtol=1e-4)
    assert cache["mask"].shape == (2, 6) and torch.equal(cache["mask"], mask)


def test_the_stack_is_causal_and_the_old_interface_still_works():
    model = stack()
    ids = torch.randint(4, V, (2, 6))
    out = model(ids)
    ids2 = ids.clone()
    ids2[:, 4:] = 4
    torch.testing.assert_close(model(ids2)[:, :4], out[:, :4])
    # an int offset and explicit per-token positions agree
    torch.testing.assert_close(model(ids, offset=3),
                               model(ids, positions=torch.arange(3, 9).expand(2, 6)))
    assert not torch.allclose(model(ids, offset=3), out)


# --- language-model data and loss ------------------------------------------------------------

def test_lm_batches_keep_every_sequence_once_and_the_loss_ignores_pad():
    seqs = [[BOS_ID, *range(4, 4 + n), EOS_ID] for n in (3, 1, 7, 2, 5, 4)]
    batches = lm_batches(seqs, max_tokens=20, seed=0)
    rows = sorted(tuple(ids[m].tolist()) for b in batches for ids, m in zip(b.ids, b.mask))
    assert rows == sorted(tuple(s) for s in seqs)
    assert all(b.ids.numel() <= 20 for b in batches)
    for b in batches:     # targets: the next token wherever there is one, PAD (unscored) after
        assert torch.equal(b.targets[:, :-1][b.scored[:, :-1]], b.ids[:, 1:][b.mask[:, 1:]])
        assert torch.equal(b.scored, b.targets != PAD_ID) and b.n_scored == b.mask.sum() - len(b.ids)
    ids, mask = pad(seqs[:3])
    logits = torch.randn(3, ids.shape[1], V)
    manual = torch.cat([torch.nn.functional.cross_entropy(logits[b, :len(s) - 1],
                                                          torch.tensor(s[1:]), reduction="none")
                        for b, s in enumerate(seqs[:3])]).mean()
    torch.testing.assert_close(lm_loss(logits, ids), manual)


# --- sampling --------------------------------------------------------------------------------

def test_sample_next_temperature_and_top_k():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(0))
    logits[:, PAD_ID] = logits[:, BOS_ID] = 100.0           # would win, but are never generated
    allowed = logits.clone()
    allowed[:, [PAD_ID, BOS_ID]] = float("-inf")
    assert torch.equal(sample_next(logits, temperature=0), allowed.argmax(-1))
    assert torch.equal(sample_next(logits, top_k=1, generator=torch.Generator()), allowed.argmax(-1))
    draws = torch.stack([sample_next(logits, top_k=3, generator=torch.Generator().manual_seed(s))
                         for s in range(200)])          # (200, 4)
    top3 = allowed.topk(3, dim=-1).indices
    assert all(set(draws[:, b].tolist()) <= set(top3[b].tolist()) for b in range(4))
    assert all(len(set(draws[:, b].tolist())) > 1 for b in range(4))
    # a low temperature concentrates the samples on the argmax, a high one spreads them
    low = torch.stack([sample_next(logits, 0.05, generator=torch.Generator().manual_seed(s))
                       for s in range(100)])
    high = torch.stack([sample_next(logits, 5.0, generator=torch.Generator().manual_seed(s))
                        for s in range(100)])
    assert (low == allowed.argmax(-1)).float().mean() > 0.95
    assert (high == allowed.argmax(-1)).float().mean() < 0.5


def argmax_decode(model, prompt, n):
    ys = prompt
    for _ in range(n):
        logits = model(ys)[:, -1]
        logits[:, [PAD_ID, BOS_ID]] = float("-inf")
        ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], 1)
    return ys[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize("seed", range(3))
def test_generate_greedy_reproducible_and_cached(seed):
    model = stack(seed)
    prompt = torch.tensor([[BOS_ID, 5, 6]])
    greedy = argmax_decode(model, prompt, 10)
    greedy = greedy[:greedy.index(EOS_ID)] if EOS_ID in greedy else greedy
    assert generate(model, prompt, 10, top_k=1) == [greedy]
    assert generate(model, prompt, 10, temperature=0) == [greedy]
    assert generate(model, prompt, 10, temperature=1e-4,
                    generator=torch.Generator().manual_seed(seed)) == [greedy]
    batch = prompt.repeat(4, 1)
    a = generate(model, batch, 10, generator=torch.Generator().manual_seed(7))
    b = generate(model, batch, 10, generator=torch.Generator().manual_seed(7))
    c = generate(model, batch, 10, generator=torch.Generator().manual_seed(7), use_cache=False)
    assert a == b == c
    assert len({tuple(r) for r in a}) > 1          # sampling at temperature 1 varies


def test_generate_stops_at_eos():
    model = stack(0)
    model.out = torch.nn.Linear(16, V)                  # an output layer that always says EOS
    with torch.no_grad():
        model.out.weight.zero_()
        model.out.bias.fill_(-10.0)
        model.out.bias[EOS_ID] = 10.0
    prompt = torch.tensor([[BOS_ID, 5], [BOS_ID, 6]])
    assert generate(model, prompt, 5, top_k=1) == [[], []]
    assert generate(model, prompt, 5, generator=torch.Generator().manual_seed(0)) == [[], []]


# --- translation as one sequence -------------------------------------------------------------

def test_prompt_target_example():
    inp, tgt = prompt_target_example([7, 8, 9], [10, 11])
    assert inp == [BOS_ID, 7, 8, 9, EOS_ID, 10, 11]
    assert tgt == [PAD_ID, PAD_ID, PAD_ID, PAD_ID, 10, 11, EOS_ID]
    mask = torch.tensor([[True, True, False, True, False, True]])
    assert token_positions(mask).tolist() == [[0, 1, 2, 2, 3, 3]]


def translator(seed=0, **kw):
    torch.manual_seed(seed)
    return DecoderOnlyTranslator(cfg(**kw)).eval()


SRC = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
TGT = [[15, 16], [17, 18, 19, 20, 21], [22]]


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_translator_logits_equal_the_unpadded_sequence(positional):
    model = translator(positional=positional)
    b = make_batch(SRC, TGT)
    logits = model(b.src, b.src_mask, b.tgt_in, b.tgt_mask)                # (B, T, V)
    assert logits.shape == (3, b.tgt_in.shape[1], V)
    for i, (s, t) in enumerate(zip(SRC, TGT)):
        inp, target = prompt_target_example(s, t)
        alone = model.stack(torch.tensor([inp]))[0]                        # no padding at all
        real = torch.tensor(target) != PAD_ID
        torch.testing.assert_close(logits[i, :len(t) + 1], alone[real], atol=1e-5, rtol=1e-4)
        one = make_batch([s], [t])                                          # and alone as a batch
        torch.testing.assert_close(model(one.src, one.src_mask, one.tgt_in)[0],
                                   logits[i, :len(t) + 1], atol=1e-5, rtol=1e-4)


def test_translator_with_cache_equals_without():
    model = translator(1, norm_first=True)
    b = make_batch(SRC, TGT)
    memory = model.encode(b.src, b.src_mask)
    full = model.decode(b.tgt_in, memory, b.src_mask)
    cache = {}
    parts = [model.decode(b.tgt_in[:, :1], memory, b.src_mask, cache=cache)]
    parts += [model.decode(b.tgt_in[:, t:t + 1], memory, b.src_mask, cache=cache)
              for t in range(1, b.tgt_in.shape[1])]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-4)


def test_the_book_decoders_work_on_the_translator_unchanged():
    model = translator(2)
    b = make_batch(SRC, TGT)
    g = greedy_decode(model, b.src, b.src_mask, max_len=6)
    assert g == greedy_decode(model, b.src, b.src_mask, max_len=6, use_cache=False)
    for i, s in enumerate(SRC):   # a sentence alone gives what it gives in the batch
        one = make_batch([s], [[4]])
        assert greedy_decode(model, one.src, one.src_mask, max_len=6) == [g[i]]
    bs = beam_search(model, b.src, b.src_mask, beam_size=3, max_len=6)
    assert bs == beam_search(model, b.src, b.src_mask, beam_size=3, max_len=6, use_cache=False)
    assert beam_search(model, b.src, b.src_mask, beam_size=1, max_len=6, alpha=0.0) == g


def test_translator_learns_to_copy():
    """On a copy task of random symbols 4..9 the loss falls far below what a model that does not
    read the prompt can reach (about ln 6 = 1.8 per symbol): the target attends to the source."""
    torch.manual_seed(0)
    model = DecoderOnlyTranslator(cfg(d_model=32, d_ff=64)).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(150):
        src = [torch.randint(4, 10, (int(torch.randint(2, 5, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(16)]
        b = make_batch(src, src)
        loss = torch.nn.functional.cross_entropy(
            model(b.src, b.src_mask, b.tgt_in, b.tgt_mask).reshape(-1, V), b.tgt_out.reshape(-1),
            ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[:10]) / 10 > 1.5 and sum(losses[-10:]) / 10 < 1.0


def test_decoder_only_in_the_training_harness():
    assert "decoder-only" in MODELS                              # on chapter 10's board
    c = override(preset("smoke", "decoder-only"), vocab_size=20)
    model = build_model(c)
    assert isinstance(model, DecoderOnlyTranslator) and len(model.stack.blocks) == 2 * c.arch.n_layers
    b = make_batch([[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14, 15]])
    logits = forward_logits(model, b)
    assert logits.shape == (2, b.tgt_in.shape[1], 20)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
