"""Padding, masks and token-budget batches: shapes, the mask convention, nothing lost."""
import pytest
import torch

from attnbook import BOS_ID, EOS_ID, PAD_ID
from attnbook.batching import (BatchingError, SeqBatch, TranslationBatches, make_batch, pad,
                               token_batches)


def test_pad_shapes_and_mask_convention():
    ids, mask = pad([[5, 6, 7], [8], [9, 10]])
    assert ids.shape == mask.shape == (3, 3) and ids.dtype == torch.long and mask.dtype == torch.bool
    assert ids.tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID], [9, 10, PAD_ID]]
    assert mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert (ids[~mask] == PAD_ID).all()


def test_pad_rejects_empty_input():
    with pytest.raises(BatchingError, match="empty list"):
        pad([])
    with pytest.raises(BatchingError, match="sequence 1 is empty"):
        pad([[4], []])


def test_make_batch_adds_bos_and_eos():
    b = make_batch([[5, 6], [7]], [[8, 9, 10], [11]])
    assert b.src.shape == (2, 2) and b.tgt_in.shape == b.tgt_out.shape == (2, 4)
    assert b.tgt_in.tolist() == [[BOS_ID, 8, 9, 10], [BOS_ID, 11, PAD_ID, PAD_ID]]
    assert b.tgt_out.tolist() == [[8, 9, 10, EOS_ID], [11, EOS_ID, PAD_ID, PAD_ID]]
    assert b.tgt_mask.sum().item() == b.n_tgt_tokens == 6
    # teacher forcing: the decoder input is the output shifted right by one
    assert torch.equal(b.tgt_in[:, 1:][b.tgt_mask[:, 1:]], b.tgt_out[:, :-1][b.tgt_mask[:, 1:]])
    with pytest.raises(BatchingError, match="2 source sequences but 1 target"):
        make_batch([[5], [6]], [[7]])


def test_token_batches_cover_every_example_once_within_budget():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 40, (500,), generator=g).tolist()
    batches = token_batches(lengths, max_tokens=200, seed=3)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(500))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 200
    # bucketing: within a batch lengths are close (they come from a sorted run)
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 5


def test_token_batches_are_reproducible_and_shuffled():
    lengths = [i % 17 + 1 for i in range(300)]
    assert token_batches(lengths, 100, seed=1) == token_batches(lengths, 100, seed=1)
    assert token_batches(lengths, 100, seed=1) != token_batches(lengths, 100, seed=2)
    ordered = token_batches(lengths, 100, shuffle=False)
    firsts = [lengths[b[0]] for b in ordered]
    assert firsts == sorted(firsts)


def test_overlong_example_is_an_error_not_dropped():
    with pytest.raises(BatchingError, match="example 2 needs 50 tokens, more than max_tokens=40"):
        token_batches([3, 4, 50, 5], max_tokens=40)
    with pytest.raises(BatchingError, match="must be positive"):
        token_batches([3], max_tokens=0)


def test_translation_batches_epochs():
    src = [[4 + (i % 7)] * (1 + i % 9) for i in range(100)]
    tgt = [[5] * (1 + i % 5) for i in range(100)]
    data = TranslationBatches(src, tgt, max_tokens=64, seed=0)
    epoch1, epoch2 = list(data), list(data)
    assert len(epoch1) == len(data)
    for epoch in (epoch1, epoch2):
        assert sorted(i for b in epoch for i in b.index.tolist()) == list(range(100))
        for b in epoch:
            assert b.src.numel() <= 64 and b.tgt_in.numel() <= 64
            for row, i in enumerate(b.index.tolist()):    # each row holds the right example
                assert b.src[row][b.src_mask[row]].tolist() == src[i]
                assert b.tgt_out[row][b.tgt_mask[row]].tolist() == tgt[i] + [EOS_ID]
    assert [b.index.tolist() for b in epoch1] != [b.index.tolist() for b in epoch2]


def test_translation_batches_reject_bad_input():
    with pytest.raises(BatchingError, match="aligned"):
        TranslationBatches([[4]], [[5], [6]], max_tokens=10)
    with pytest.raises(BatchingError, match="target sequence 1 is empty"):
        TranslationBatches([[4], [5]], [[6], []], max_tokens=10)
    with pytest.raises(BatchingError, match="more than max_tokens"):
        TranslationBatches([[4] * 20], [[5]], max_tokens=10)


# --- SeqBatch: one sequence per example ---------------------------------------------------------

def seq_batches():
    """One batch of every maker of batches of one sequence per example, by name."""
    from attnbook import beyond, lm, recall, tasks

    g = lambda: torch.Generator().manual_seed(0)                          # noqa: E731
    return {"neighbour": tasks.make_neighbour_batch(4, g()),
            "lookback": tasks.make_lookback_task(2, 6)(8, g()),
            "caesar": tasks.make_caesar_copy_task(3, 5)(4, g()),
            "reversal": beyond.reversal_batch(4, 1, 5, 6, g()),
            "recall": recall.mqar_batch(4, 2, 8, 8, 8, generator=g()),
            "lm": lm.lm_batches([[BOS_ID, 5, 6, EOS_ID], [BOS_ID, 7, EOS_ID]], max_tokens=64)[0]}


def test_every_batch_of_one_sequence_per_example_is_a_seqbatch_with_the_books_masks():
    for name, b in seq_batches().items():
        assert isinstance(b, SeqBatch), name
        assert b.ids.dtype == b.targets.dtype == torch.long, name
        assert not (b.scored & ~b.mask).any(), f"{name}: a scored position must be a real token"
        assert (b.ids[~b.mask] == PAD_ID).all() and b.n_scored > 0, name
    made = seq_batches()
    assert not made["neighbour"].scored[:, :2].any() and made["neighbour"].mask.all()
    assert (made["lookback"].targets[made["lookback"].scored] == 0).any()  # 0: a class here
    assert made["reversal"].positions is not None and made["lm"].positions is None


def test_a_seqbatch_with_a_wrong_shape_or_a_non_boolean_mask_says_so():
    ids = torch.full((2, 5), 4)
    real = torch.ones(2, 5, dtype=torch.bool)
    SeqBatch(ids, ids, real, real)                                        # fine
    with pytest.raises(BatchingError, match=r"targets has shape \(2, 4\) but ids has \(2, 5\)"):
        SeqBatch(ids, ids[:, :4], real, real)
    with pytest.raises(BatchingError, match=r"positions has shape \(5,\)"):
        SeqBatch(ids, ids, real, real, positions=torch.arange(5))
    with pytest.raises(BatchingError, match="ids must be \\(B, L\\)"):
        SeqBatch(ids[0], ids[0], real[0], real[0])
    with pytest.raises(BatchingError, match="mask and scored must be bool"):
        SeqBatch(ids, ids, real.long(), real)
    moved = SeqBatch(ids, ids, real, real).to("cpu")
    assert moved.positions is None and torch.equal(moved.ids, ids)
