"""Greedy and beam search: beam 1 is greedy; a wide beam finds what brute force finds; the batched
search does what a one-sentence textbook implementation does, stops when nothing can improve, and
by default allows each sentence its source length + 50 tokens."""
import itertools

import pytest
import torch

from attnbook.batching import lengths_mask
from attnbook import BOS_ID, EOS_ID, PAD_ID
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
    mask = lengths_mask(torch.randint(1, S + 1, (B,), generator=g), S)
    return src.masked_fill(~mask, 0), mask


class ToyModel:
    """A stand-in with the encode/decode interface of attnbook's models, whose next-token logits
    are any function ``next_logits(src, prefix) -> (V,)`` of the source and the prefix (tuples of
    ids, the prefix starting with BOS). With a cache, the prefix so far is kept in cache["ys"],
    which the searches reorder with their hypotheses like a Transformer's keys and values."""

    def __init__(self, next_logits):
        self.next_logits = next_logits

    def encode(self, src, src_mask):
        return src.masked_fill(~src_mask, PAD_ID)                       # (B, S)

    def decode(self, ys, memory, src_mask, cache=None):
        n_new = ys.shape[1]
        if cache is not None:                                           # ys: the new tokens only
            ys = cache["ys"] = torch.cat([cache.get("ys", ys[:, :0]), ys], dim=1)
        rows = []
        for y, m in zip(ys.tolist(), memory.tolist()):
            src = tuple(t for t in m if t != PAD_ID)
            rows.append(torch.stack([self.next_logits(src, tuple(y[:t + 1]))
                                     for t in range(len(y) - n_new, len(y))]))
        return torch.stack(rows)                                        # (B, n_new, V)


def random_tree(seed, V=7, scale=2.0):
    """Independent random logits for every (source, prefix). A tiny random Transformer mostly
    repeats one token or stops at once; this model gives searches many outputs and lengths."""
    def next_logits(src, prefix):
        g = torch.Generator().manual_seed(hash((seed, src, prefix)) % 2 ** 62)
        return scale * torch.randn(V, generator=g)
    return ToyModel(next_logits)


def bigram(probs, V=10):
    """Next-token probabilities that depend only on the last token: probs[last] = {token: p};
    the rest of each row is spread evenly over the other tokens (never PAD or BOS)."""
    table = torch.zeros(V, V)
    for last in range(V):
        row = probs.get(last, {})
        rest = [t for t in range(V) if t not in (PAD_ID, BOS_ID, *row)]
        table[last, rest] = (1 - sum(row.values())) / len(rest)
        table[last, list(row)] = torch.tensor(list(row.values()))
    return ToyModel(lambda src, prefix: table[prefix[-1]].log())


def no_eos(model):
    """The same model, but EOS gets a logit of -inf: it never ends a sentence."""
    decode = model.decode

    def decode_without_eos(*args, **kwargs):
        logits = decode(*args, **kwargs)
        logits[..., EOS_ID] = float("-inf")
        return logits
    model.decode = decode_without_eos
    return model


def count_steps(model):
    """Count the calls of model.decode (one per search step with the cache): returns a list
    that grows by one item per call."""
    calls, decode = [], model.decode
    model.decode = lambda *args, **kwargs: (calls.append(1), decode(*args, **kwargs))[1]
    return calls


@pytest.mark.parametrize("seed", range(4))
def test_beam_of_one_is_greedy(seed):
    model = tiny_model(seed)
    src, mask = src_batch(seed)
    for max_len in (8, None):
        assert beam_search(model, src, mask, beam_size=1, max_len=max_len, alpha=0.0) == \
            greedy_decode(model, src, mask, max_len=max_len)


def brute_force(model, src, mask, max_len, alpha, complete=True, V=7):
    """Score every output of fewer than max_len tokens followed by EOS (complete=True), or every
    output of max_len tokens cut there without EOS (complete=False: what beam search returns
    when nothing finished), and return the best (score, tokens)."""
    tokens = [t for t in range(V) if t not in (0, 2, EOS_ID)]  # no PAD, BOS; EOS ends a hypothesis
    best = (float("-inf"), None)
    for n in range(max_len) if complete else [max_len]:
        for hyp in itertools.product(tokens, repeat=n):
            hyp = list(hyp)
            lp = sequence_log_prob(model, src, mask, hyp, complete=complete)
            s = lp / length_penalty(n + 1 if complete else n, alpha)
            best = max(best, (s, hyp), key=lambda x: x[0])
    return best


# seeds where greedy search misses the optimum, so that the comparison means something
@pytest.mark.parametrize("seed,alpha", [(1, 0.0), (2, 0.0), (3, 0.0), (7, 0.6), (8, 1.0)])
def test_wide_beam_finds_the_brute_force_optimum(seed, alpha):
    model = tiny_model(seed)
    src, mask = src_batch(seed, B=1)
    best_score, best_hyp = brute_force(model, src, mask, max_len=3, alpha=alpha)
    assert greedy_decode(model, src, mask, max_len=3)[0] != best_hyp
    hyps, scores = beam_search(model, src, mask, beam_size=64, max_len=3, alpha=alpha,
                               return_scores=True)
    assert hyps[0] == best_hyp
    assert scores[0] == pytest.approx(best_score, abs=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_when_nothing_finishes_the_best_cut_hypothesis_is_returned(alpha):
    model = no_eos(tiny_model(1))
    src, mask = src_batch(1, B=1)
    best_score, best_hyp = brute_force(model, src, mask, max_len=3, alpha=alpha, complete=False)
    hyps, scores = beam_search(model, src, mask, beam_size=64, max_len=3, alpha=alpha,
                               return_scores=True)
    assert hyps[0] == best_hyp and len(best_hyp) == 3
    assert scores[0] == pytest.approx(best_score, abs=1e-4)


# ---- a plain reference: one sentence, Python lists, the textbook algorithm ----

def stop_rule(best_finished, best_alive_lp, t, max_len, alpha):
    """Nothing alive can beat the best finished hypothesis: log-probs only fall, and the length
    penalty is at most length_penalty(max_len + 1)."""
    return best_finished >= best_alive_lp / length_penalty(max_len + 1, alpha)


@torch.no_grad()
def next_log_probs(model, src, mask, prefix, min_len=0):
    """log p(next token | src, prefix) for one sentence: a list of V floats."""
    ys = torch.tensor([[BOS_ID, *prefix]])
    logits = model.decode(ys, model.encode(src, mask), mask)[0, -1].float()  # (V,)
    logits[[PAD_ID, BOS_ID]] = float("-inf")
    if len(prefix) < min_len:
        logits[EOS_ID] = float("-inf")
    return torch.log_softmax(logits, -1).tolist()


def reference_beam(model, src, mask, k, max_len, alpha, stop=stop_rule, min_len=0):
    """Beam search for one sentence (src: (1, S)) -> (tokens, score). alive: (tokens, log-prob)
    pairs; finished: (tokens without EOS, penalised score) pairs, best first."""
    alive, finished = [([], 0.0)], []
    for t in range(1, max_len + 1):
        candidates = [(tokens + [w], lp + p) for tokens, lp in alive
                      for w, p in enumerate(next_log_probs(model, src, mask, tokens, min_len))
                      if p > float("-inf")]
        candidates = sorted(candidates, key=lambda c: -c[1])[:2 * k]
        finished += [(tokens[:-1], lp / length_penalty(t, alpha))
                     for tokens, lp in candidates[:k] if tokens[-1] == EOS_ID]
        finished = sorted(finished, key=lambda f: -f[1])[:k]
        alive = [c for c in candidates if c[0][-1] != EOS_ID][:k]
        if finished and stop(finished[0][1], alive[0][1], t, max_len, alpha):
            break
    if finished:
        return finished[0]
    tokens, lp = alive[0]
    return tokens, lp / length_penalty(len(tokens), alpha)


def assert_same(batched, reference):
    (hyps, scores), (ref_hyps, ref_scores) = batched, reference
    assert list(hyps) == list(ref_hyps)
    assert list(scores) == pytest.approx(list(ref_scores), abs=1e-4)


MODELS = {"tiny": tiny_model, "tree": random_tree}


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("kind,seed,alpha", [("tiny", 1, 0.0), ("tiny", 3, 1.0), ("tiny", 7, 0.6),
                                             ("tree", 1, 0.0), ("tree", 2, 0.6), ("tree", 4, 1.0),
                                             ("tree", 5, 1.0), ("tree", 7, 0.6), ("tree", 8, 0.0)])
def test_batched_search_equals_the_reference(k, kind, seed, alpha):
    model = MODELS[kind](seed)
    src, mask = src_batch(seed, B=4)
    ref = [reference_beam(model, src[b:b + 1], mask[b:b + 1], k, 8, alpha) for b in range(4)]
    for use_cache in (True, False):
        assert_same(beam_search(model, src, mask, beam_size=k, max_len=8, alpha=alpha,
                                return_scores=True, use_cache=use_cache), tuple(zip(*ref)))
    greedy = greedy_decode(model, src, mask, max_len=8)
    assert any(g != r[0] for g, r in zip(greedy, ref))       # the beam changes something


def test_min_len_in_the_reference():
    model = random_tree(5)
    src, mask = src_batch(5, B=4)
    ref = [reference_beam(model, src[b:b + 1], mask[b:b + 1], 3, 8, 0.6, min_len=3)
           for b in range(4)]
    assert_same(beam_search(model, src, mask, beam_size=3, max_len=8, alpha=0.6, min_len=3,
                            return_scores=True), tuple(zip(*ref)))
    assert min(len(r[0]) for r in ref) >= 3
    assert min(len(h) for h in beam_search(model, src, mask, beam_size=3, max_len=8)) < 3


# alpha = 0: EOS at once (p = .3) is beaten by 4 EOS (p = .65 * .9), found at step 2.
# alpha = 1: EOS at once (p = .5) is beaten, thanks to its length penalty, by 4 5 6 7 8 EOS
# (p = .37 * .99 ** 5), found at step 6; the penalty of a short output must not stop it sooner.
STOP_CASES = {0.0: ({BOS_ID: {EOS_ID: .3, 4: .65}, 4: {EOS_ID: .9}}, [4]),
              1.0: ({BOS_ID: {EOS_ID: .5, 4: .37}, 4: {5: .99}, 5: {6: .99}, 6: {7: .99},
                     7: {8: .99}, 8: {EOS_ID: .99}}, [4, 5, 6, 7, 8])}


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_search_stops_when_nothing_alive_can_win(alpha):
    probs, answer = STOP_CASES[alpha]
    model = bigram(probs)
    src, mask = torch.tensor([[4, 5]]), torch.tensor([[True, True]])
    steps = count_steps(model)
    hyps, scores = beam_search(model, src, mask, beam_size=3, max_len=20, alpha=alpha,
                               return_scores=True)
    assert hyps == [answer]
    assert len(steps) == len(answer) + 1        # it stopped when the answer finished, not at 20
    never = lambda *args: False                 # noqa: E731  all 20 steps
    assert_same((hyps, scores), tuple(zip(reference_beam(model, src, mask, 3, 20, alpha, never))))
    assert beam_search(model, src, mask, beam_size=3, max_len=40, alpha=alpha) == hyps
    # stopping sooner would be wrong: as soon as something finished (alpha = 0), or bounding
    # with the penalty of the next length instead of the largest one (alpha > 0)
    too_soon = (lambda *a: True) if alpha == 0 else \
        (lambda fin, lp, t, max_len, alpha: fin >= lp / length_penalty(t + 1, alpha))
    assert reference_beam(model, src, mask, 3, 20, alpha, too_soon)[0] == []


def test_default_max_len_is_the_source_length_plus_50():
    model = no_eos(tiny_model(4))
    src, mask = src_batch(4, B=4)
    lengths = [int(m.sum()) + 50 for m in mask]
    assert len(set(lengths)) > 1                 # a padded batch: the limits differ
    assert [len(h) for h in greedy_decode(model, src, mask)] == lengths
    assert [len(h) for h in beam_search(model, src, mask, beam_size=2)] == lengths
    assert [len(h) for h in greedy_decode(model, src, mask, max_len=7)] == [7] * 4
    limits = torch.tensor([3, 9, 1, 4])          # or one limit per sentence
    assert [len(h) for h in beam_search(model, src, mask, beam_size=2, max_len=limits)] == \
        limits.tolist()


def test_beam_is_at_least_as_good_as_greedy_on_average():
    gains = []
    for seed in range(6):
        model = random_tree(seed)
        src, mask = src_batch(seed, B=4)
        greedy = greedy_decode(model, src, mask, max_len=8)
        _, scores = beam_search(model, src, mask, beam_size=5, max_len=8, alpha=0.0,
                                return_scores=True)
        gains += [score - sequence_log_prob(model, src[b:b + 1], mask[b:b + 1], g)
                  for b, (g, score) in enumerate(zip(greedy, scores)) if len(g) < 8]
    assert len(gains) > 12                      # greedy finished, so both are complete outputs
    assert sum(gains) > 0 and max(gains) > 0.1  # beam finds better outputs, at least sometimes
    assert min(gains) > -0.5                    # and is never much worse


@pytest.mark.parametrize("max_len,alpha", [(6, 0.6), (None, 0.6), (None, 0.0)])
def test_batched_beam_equals_one_sentence_at_a_time(max_len, alpha):
    model = random_tree(5)
    src, mask = src_batch(5, B=4)
    together = beam_search(model, src, mask, beam_size=3, max_len=max_len, alpha=alpha,
                           return_scores=True)
    alone = [beam_search(model, src[b:b + 1], mask[b:b + 1], beam_size=3, max_len=max_len,
                         alpha=alpha, return_scores=True) for b in range(4)]
    assert_same(together, ([a[0][0] for a in alone], [a[1][0] for a in alone]))


def test_bad_beam_size():
    model = tiny_model(0)
    src, mask = src_batch(0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, mask, beam_size=0)
    with pytest.raises(ValueError, match="alpha"):        # the stopping rule needs alpha >= 0
        beam_search(model, src, mask, alpha=-0.5)
    with pytest.raises(ValueError, match="max_len"):
        beam_search(model, src, mask, max_len=0)


@pytest.mark.parametrize("score", [None, "additive", "dot"])
def test_gru_models_share_the_decoding_interface(score):
    """The same greedy and beam search decode the GRU models of Part I-II (chapter 9's harness)."""
    from attnbook import rnn
    torch.manual_seed(0)
    kwargs = {} if score is None else {"attention": True, "score": score}
    model = rnn.Seq2Seq(7, d_model=16, **kwargs).eval()
    src, mask = src_batch(3)
    ours = greedy_decode(model, src, mask, max_len=6)
    assert ours == greedy_decode(model, src, mask, max_len=6, use_cache=False)
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
