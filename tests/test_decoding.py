"""Greedy and beam search: beam 1 is greedy; a wide beam finds what brute force finds."""
import itertools

import pytest
import torch

from attnbook import EOS_ID
from attnbook.decoding import beam_search, greedy_decode, length_penalty, sequence_log_prob
from attnbook.transformer import Transformer, TransformerConfig


def tiny_model(seed, V=7):
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(vocab_size=V, d_model=16, h=2, d_ff=32, n_layers=1,
                                          dropout=0.0, max_len=32)).eval()
    return model


def src_batch(seed, B=3, S=5, V=7):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    mask = torch.arange(S)[None] < torch.randint(1, S + 1, (B,), generator=g)[:, None]
    return src.masked_fill(~mask, 0), mask


@pytest.mark.parametrize("seed", range(4))
def test_beam_of_one_is_greedy(seed):
    model = tiny_model(seed)
    src, mask = src_batch(seed)
    assert beam_search(model, src, mask, beam_size=1, max_len=8, alpha=0.0) == \
        greedy_decode(model, src, mask, max_len=8)


def brute_force(model, src, mask, max_len, alpha, V=7):
    """Score every output of up to max_len tokens (complete with EOS, or cut at max_len)."""
    tokens = [t for t in range(V) if t not in (0, 2, EOS_ID)]  # no PAD, BOS; EOS ends a hypothesis
    best = (float("-inf"), None)
    for n in range(max_len + 1):
        for hyp in itertools.product(tokens, repeat=n):
            hyp = list(hyp)
            if n < max_len:
                s = sequence_log_prob(model, src, mask, hyp, complete=True) / length_penalty(n + 1, alpha)
            else:
                s = sequence_log_prob(model, src, mask, hyp, complete=False) / length_penalty(n, alpha)
            best = max(best, (s, hyp), key=lambda x: x[0])
    return best


# seeds where greedy search misses the optimum, so that the comparison means something
@pytest.mark.parametrize("seed,alpha", [(1, 0.0), (2, 0.0), (3, 0.0), (7, 0.6), (8, 1.0)])
def test_wide_beam_finds_the_brute_force_optimum(seed, alpha):
    model = tiny_model(seed)
    src, mask = src_batch(seed, B=1)
    best_score, best_hyp = brute_force(model, src, mask, max_len=3, alpha=alpha)
    if alpha == 0.0:
        g = greedy_decode(model, src, mask, max_len=3)[0]
        assert g != best_hyp and sequence_log_prob(model, src, mask, g, len(g) < 3) < best_score
    hyps, scores = beam_search(model, src, mask, beam_size=64, max_len=3, alpha=alpha,
                               return_scores=True)
    assert hyps[0] == best_hyp
    assert scores[0] == pytest.approx(best_score, abs=1e-4)


def test_beam_is_at_least_as_good_as_greedy_on_average():
    gains = []
    for seed in range(6):
        model = tiny_model(seed)
        src, mask = src_batch(seed, B=4)
        for b in range(4):
            s, m = src[b:b + 1], mask[b:b + 1]
            g = greedy_decode(model, s, m, max_len=6)[0]
            k = beam_search(model, s, m, beam_size=5, max_len=6, alpha=0.0)[0]
            gains.append(sequence_log_prob(model, s, m, k, len(k) < 6) -
                         sequence_log_prob(model, s, m, g, len(g) < 6))
    assert sum(gains) > 0 and max(gains) > 0.1  # beam finds better outputs, at least sometimes
    assert min(gains) > -0.5                    # and is never much worse


def test_batched_beam_equals_one_sentence_at_a_time():
    model = tiny_model(5)
    src, mask = src_batch(5, B=4)
    together = beam_search(model, src, mask, beam_size=3, max_len=6)
    alone = [beam_search(model, src[b:b + 1], mask[b:b + 1], beam_size=3, max_len=6)[0] for b in range(4)]
    assert together == alone


def test_bad_beam_size():
    model = tiny_model(0)
    src, mask = src_batch(0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, mask, beam_size=0)


@pytest.mark.parametrize("score", [None, "additive", "dot"])
def test_gru_models_share_the_decoding_interface(score):
    """The same greedy and beam search decode the GRU models of Part I-II (chapter 9's harness)."""
    from attnbook import rnn
    torch.manual_seed(0)
    kwargs = {} if score is None else {"attention": True, "score": score}
    model = rnn.Seq2Seq(7, d_model=16, **kwargs).eval()
    src, mask = src_batch(3)
    ours = greedy_decode(model, src, mask, max_len=6)
    tokens = rnn.greedy_decode(model, src, mask, max_len=6).tolist()   # Part I's own loop
    theirs = [row[:row.index(EOS_ID)] if EOS_ID in row else [t for t in row if t != 0] for row in tokens]
    assert ours == theirs
    assert beam_search(model, src, mask, beam_size=1, max_len=6, alpha=0.0) == ours
    assert len(beam_search(model, src, mask, beam_size=3, max_len=6)) == 3


# ---- the key/value cache: the same logits and outputs as re-running the whole prefix ----

def cached_models():
    from attnbook.rnn import Seq2Seq
    torch.manual_seed(0)
    models = {f"transformer-{pos}-{'pre' if nf else 'post'}":
              Transformer(TransformerConfig(vocab_size=11, d_model=16, h=2, d_ff=32, n_layers=2,
                                            dropout=0.0, max_len=40, norm_first=nf,
                                            positional=pos))
              for nf in (False, True) for pos in ("sinusoidal", "learned")}
    models["gru"] = Seq2Seq(11, 16, attention=False)
    models["gru-additive"] = Seq2Seq(11, 16, attention=True, score="additive")
    models["gru-dot"] = Seq2Seq(11, 16, attention=True, score="dot")
    return {k: m.eval() for k, m in models.items()}


@pytest.mark.parametrize("name", list(cached_models()))
def test_cached_decode_gives_the_logits_of_the_full_prefix(name):
    model = cached_models()[name]
    src, mask = src_batch(5, B=3, S=6, V=11)
    tgt = torch.randint(4, 11, (3, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        memory = model.encode(src, mask)
        full = model.decode(tgt, memory, mask)                         # (B, T, V)
        cache = {}
        # the first call takes two tokens at once, the rest one each: any split must work
        steps = [model.decode(tgt[:, :2], memory, mask, cache=cache)]
        steps += [model.decode(tgt[:, t:t + 1], memory, mask, cache=cache) for t in range(2, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    if name.startswith("transformer"):
        assert cache["length"] == 7 and cache["layers"][0]["self"]["k"].shape == (3, 2, 7, 8)


@pytest.mark.parametrize("name", list(cached_models()))
def test_cached_search_equals_uncached(name):
    model = cached_models()[name]
    src, mask = src_batch(6, B=4, S=6, V=11)
    for k in (1, 3):
        a = beam_search(model, src, mask, beam_size=k, max_len=9, return_scores=True)
        b = beam_search(model, src, mask, beam_size=k, max_len=9, return_scores=True,
                        use_cache=False)
        assert a[0] == b[0]
        torch.testing.assert_close(torch.tensor(a[1]), torch.tensor(b[1]), atol=1e-4, rtol=1e-4)
    assert greedy_decode(model, src, mask, max_len=9) == \
        greedy_decode(model, src, mask, max_len=9, use_cache=False)


def test_cache_rows_follow_their_hypotheses():
    from attnbook.decoding import _select_rows
    cache = {"length": 3, "layers": [{"self": {"k": torch.arange(4.)[:, None]}}],
             "prepared": (torch.arange(4.), torch.arange(4.) * 2)}
    _select_rows(cache, torch.tensor([2, 2, 0, 1]))
    assert cache["length"] == 3
    assert cache["layers"][0]["self"]["k"].squeeze(1).tolist() == [2., 2., 0., 1.]
    assert cache["prepared"][1].tolist() == [4., 4., 0., 2.]


def test_min_len_fixes_the_output_length():
    model = tiny_model(5)                      # a model that emits EOS at once
    src, mask = src_batch(5, B=3)
    for out in (greedy_decode(model, src, mask, max_len=12, min_len=12),
                beam_search(model, src, mask, beam_size=3, max_len=12, min_len=12)):
        assert [len(o) for o in out] == [12, 12, 12]
    assert min(len(o) for o in greedy_decode(model, src, mask, max_len=12)) < 12  # EOS otherwise
