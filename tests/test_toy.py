"""The toy transduction task: its batches, its loss, its training loop and its evaluation."""
import pytest
import torch

from attnbook import BOS_ID, EOS_ID, PAD_ID
import attnbook.toy as toy
from attnbook.batching import lengths_mask, pad, translation_loss
from attnbook.rnn import Seq2Seq
from attnbook.toy import (SYMBOL_OFFSET, accuracy_by_length, cpu_threads, make_batch,
                          to_symbols, train_toy, vocab_size)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("task", ["reverse", "copy"])
def test_batch_fields_follow_the_book_convention(task):
    b = make_batch(50, 1, 9, n_symbols=7, task=task, generator=gen())
    B, S = b.src.shape
    assert B == 50 and S <= 9
    for t in (b.src, b.tgt_in, b.tgt_out):
        assert t.dtype == torch.long
    assert b.src_mask.dtype == b.tgt_mask.dtype == torch.bool
    assert b.src_mask.shape == (B, S)
    assert b.tgt_in.shape == b.tgt_out.shape == b.tgt_mask.shape == (B, S + 1)
    lengths = b.src_mask.sum(1)
    assert lengths.min() >= 1 and lengths.max() <= 9
    for i in range(B):
        L = int(lengths[i])
        src = b.src[i, :L].tolist()
        assert all(SYMBOL_OFFSET <= s < SYMBOL_OFFSET + 7 for s in src)
        assert b.src_mask[i].tolist() == [True] * L + [False] * (S - L)
        assert b.src[i, L:].eq(PAD_ID).all()
        target = src[::-1] if task == "reverse" else src
        assert b.tgt_out[i].tolist() == target + [EOS_ID] + [PAD_ID] * (S - L)
        assert b.tgt_in[i].tolist() == [BOS_ID] + target + [PAD_ID] * (S - L)
        assert b.tgt_mask[i].tolist() == [True] * (L + 1) + [False] * (S - L)


def test_lengths_cover_the_range_and_fixed_length_batches():
    b = make_batch(2000, 3, 8, n_symbols=5, generator=gen())
    assert sorted(set(b.src_mask.sum(1).tolist())) == [3, 4, 5, 6, 7, 8]
    fixed = make_batch(10, 6, 6, n_symbols=5, generator=gen())
    assert fixed.src.shape == (10, 6) and fixed.src_mask.all()
    # every symbol is used, and nothing else
    assert set(b.src[b.src_mask].tolist()) == set(range(SYMBOL_OFFSET, SYMBOL_OFFSET + 5))


def test_generator_makes_batches_reproducible():
    a = make_batch(8, 1, 5, 4, generator=gen(3))
    b = make_batch(8, 1, 5, 4, generator=gen(3))
    c = make_batch(8, 1, 5, 4, generator=gen(4))
    assert all(torch.equal(x, y) for x, y in zip(vars(a).values(), vars(b).values()))
    assert not torch.equal(a.src, c.src) or not torch.equal(a.src_mask, c.src_mask)


@pytest.mark.parametrize("kwargs", [dict(min_len=0, max_len=3), dict(min_len=5, max_len=4),
                                    dict(n_symbols=0), dict(task="sort")])
def test_bad_arguments_raise(kwargs):
    args = dict(batch_size=4, min_len=1, max_len=3, n_symbols=5, task="reverse") | kwargs
    with pytest.raises(ValueError):
        make_batch(**args)


def test_pad_helper():
    ids, mask = pad([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    with pytest.raises(ValueError):
        pad([[5], []])


def test_to_symbols():
    assert to_symbols(torch.tensor([4, 5, 29, 30, 2, 3, 0])) == \
        ["a", "b", "z", "#26", "<s>", "</s>", "<pad>"]


def test_vocab_size_reserves_special_ids():
    assert vocab_size(10) == 14
    assert SYMBOL_OFFSET == 4


def test_the_loss_ignores_padding():
    torch.manual_seed(0)
    b = make_batch(6, 2, 7, 5, generator=gen())
    logits = torch.randn(*b.tgt_out.shape, vocab_size(5))
    loss = translation_loss(logits, b.tgt_out)
    changed = logits.clone()
    changed[~b.tgt_mask] = 100 * torch.randn_like(changed[~b.tgt_mask])
    torch.testing.assert_close(translation_loss(changed, b.tgt_out), loss)
    # and equals the plain mean over the real positions
    ref = torch.nn.functional.cross_entropy(logits[b.tgt_mask], b.tgt_out[b.tgt_mask])
    torch.testing.assert_close(loss, ref)


def test_training_learns_a_short_task_and_evaluation_sees_it():
    torch.manual_seed(0)
    model = Seq2Seq(vocab_size(4), d_model=32, attention=True)
    before = accuracy_by_length(model, [1, 2, 3], n_symbols=4, n_per_length=100)
    history = train_toy(model, steps=300, n_symbols=4, min_len=1, max_len=3, batch_size=32,
                        lr=5e-3, seed=0)
    assert len(history) == 300 and all(isinstance(x, float) for x in history)
    assert sum(history[-20:]) / 20 < 0.3 * sum(history[:20]) / 20
    after = accuracy_by_length(model, [1, 2, 3], n_symbols=4, n_per_length=100)
    assert after["length"] == [1, 2, 3]
    assert min(after["exact"]) > 0.9, after
    assert max(before["exact"]) < 0.5, before
    assert not model.training  # left in eval mode


def test_accuracy_by_length_is_consistent():
    torch.manual_seed(1)
    model = Seq2Seq(vocab_size(6), d_model=16)
    res = accuracy_by_length(model, [2, 5], n_symbols=6, n_per_length=50)
    assert set(res) == {"length", "exact", "token"}
    for e, t in zip(res["exact"], res["token"]):
        assert 0.0 <= e <= t <= 1.0  # an exact match has every token right
    # same seed, same test set, same numbers
    assert accuracy_by_length(model, [2, 5], n_symbols=6, n_per_length=50) == res


def test_accuracy_by_length_scores_a_perfect_model_as_perfect(monkeypatch):
    """With greedy decoding replaced by an oracle, both accuracies are exactly 1."""
    def oracle(model, src, src_mask, max_len):
        L = int(src_mask.sum(1)[0])
        return [row[:max_len] for row in src[:, :L].flip(1).tolist()]   # ids without EOS

    monkeypatch.setattr(toy, "greedy_decode", oracle)
    res = accuracy_by_length(Seq2Seq(vocab_size(3), 8), [1, 4], n_symbols=3, n_per_length=20)
    assert res["exact"] == [1.0, 1.0] and res["token"] == [1.0, 1.0]


def test_cpu_threads_restores_the_setting():
    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError):
        with cpu_threads(1):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with cpu_threads(None):
        assert torch.get_num_threads() == before


def test_lengths_mask_marks_the_first_lengths_positions():
    m = lengths_mask(torch.tensor([3, 1, 0]), 4)
    assert m.tolist() == [[True, True, True, False], [True, False, False, False], [False] * 4]
    assert lengths_mask([2, 5]).shape == (2, 5)                      # L defaults to the longest
    b = make_batch(16, 1, 7, 5, generator=gen(3))
    assert torch.equal(b.src_mask, b.src != PAD_ID)                  # the toy batches use it
    assert torch.equal(b.tgt_mask, b.tgt_out != PAD_ID)
