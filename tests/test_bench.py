"""The cost measurements of chapter 4: score-matrix size, timing, peak memory."""
import math

import pytest
import torch
import torch.nn.functional as F

from attnbook import attention as book
from attnbook.bench import (attention_cost, attention_inputs, peak_memory, score_matrix_bytes,
                            time_call)


def test_score_matrix_bytes():
    assert score_matrix_bytes(1, 1, 10) == 400
    assert score_matrix_bytes(2, 8, 128, 64) == 2 * 8 * 128 * 64 * 4
    assert score_matrix_bytes(1, 1, 10, dtype=torch.float16) == 200
    assert score_matrix_bytes(1, 1, 10, dtype=torch.float64) == 800


def test_attention_inputs_shapes_and_global_rng_untouched():
    state = torch.random.get_rng_state()
    q, k, v = attention_inputs(5, 7, B=2, h=3, d_k=4, d_v=6)
    assert (q.shape, k.shape, v.shape) == ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6))
    assert torch.equal(state, torch.random.get_rng_state())
    assert torch.equal(attention_inputs(5, seed=1)[0], attention_inputs(5, seed=1)[0])


def test_peak_memory_counts_temporaries_not_what_existed_before():
    x = torch.ones(500, 500)                              # 1 MB that exists before the call
    assert peak_memory(lambda: x.sum()) < 10_000
    # y = x + 1 (1 MB) is alive while z = y * 2 (1 MB) is made: 2 MB at the peak, freed after
    peak = peak_memory(lambda: ((x + 1) * 2).sum())
    assert 2_000_000 <= peak < 2_100_000


def test_peak_memory_of_attention_shows_the_score_matrix():
    q, k, v = attention_inputs(256, B=1, h=2, d_k=16)
    scores = score_matrix_bytes(1, 2, 256)
    ours = peak_memory(lambda q, k, v: book.scaled_dot_product_attention(q, k, v)[0], q, k, v)
    assert ours >= 2 * scores                 # the scores and the weights are both (T, T)
    assert peak_memory(F.scaled_dot_product_attention, q, k, v) < scores / 2


def test_time_call_and_attention_cost():
    calls = []
    seconds = time_call(lambda: calls.append(1), repeats=3, warmup=2, min_time=0.0)
    assert 0 <= seconds < 1 and len(calls) == 5
    with pytest.raises(ValueError, match="at least 1"):
        time_call(lambda: None, repeats=0)
    threads = torch.get_num_threads()
    rows = attention_cost({"sdpa": F.scaled_dot_product_attention}, [32, 64], h=2, d_k=8,
                          repeats=1, num_threads=1)
    assert torch.get_num_threads() == threads
    assert [(r["name"], r["T"]) for r in rows] == [("sdpa", 32), ("sdpa", 64)]
    assert all(r["seconds"] > 0 and r["peak_bytes"] > 0 for r in rows)
    assert rows[1]["score_bytes"] == 2 * 64 * 64 * 4 == 4 * rows[0]["score_bytes"]
    assert math.isfinite(rows[0]["seconds"])
