"""Multi-query associative recall (attnbook.recall): the task says what it promises, the models
build and train, and their state sizes are what generating them keeps."""
import json

import pytest
import torch

from attnbook import PAD_ID
from attnbook.commands import recall_runs as recall_runs_command
from attnbook.recall import (MIXERS, generation_cost, mqar_batch, recall_accuracy, recall_loss,
                             recall_model, state_numbers, train_recall, vocab_size)
from twice import merged_again, recording


def test_every_query_asks_for_the_value_that_followed_its_key():
    b = mqar_batch(32, n_pairs=5, T=24, n_keys=16, n_values=16,
                   generator=torch.Generator().manual_seed(0))
    assert b.ids.shape == b.targets.shape == b.scored.shape == (32, 24) and b.mask.all()
    filler = 4 + 16 + 16
    for ids, targets, queries in zip(b.ids.tolist(), b.targets.tolist(), b.scored.tolist()):
        pairs = dict(zip(ids[0:10:2], ids[1:10:2]))
        assert len(pairs) == 5 and all(4 <= k < 20 and 20 <= v < 36 for k, v in pairs.items())
        asked = [t for t in range(24) if queries[t]]
        assert len(asked) == 5 and all(t >= 10 for t in asked)          # in the query region
        assert sorted(ids[t] for t in asked) == sorted(pairs)           # every key, once
        assert all(targets[t] == pairs[ids[t]] for t in asked)
        assert all(targets[t] == PAD_ID for t in range(24) if not queries[t])
        assert all(ids[t] == filler for t in range(10, 24) if not queries[t])
    again = mqar_batch(32, 5, 24, 16, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.ids, b.ids)                                  # seeded: the same
    with pytest.raises(ValueError, match="too short"):
        mqar_batch(2, n_pairs=5, T=12)
    with pytest.raises(ValueError, match="n_pairs <= n_keys"):
        mqar_batch(2, n_pairs=20, T=64, n_keys=16)


@pytest.mark.parametrize("kind", MIXERS)
def test_each_model_is_causal_and_its_state_is_what_it_keeps(kind):
    torch.manual_seed(0)
    V = vocab_size(16, 16)
    model = recall_model(kind, V, d_model=32, n_layers=2, h=4, d_state=8).eval()
    b = mqar_batch(3, 4, 20, 16, 16, generator=torch.Generator().manual_seed(1))
    logits = model(b.ids)
    assert logits.shape == (3, 20, V)
    changed = b.ids.clone()
    changed[:, 15:] = 4                                                    # the future only
    torch.testing.assert_close(model(changed)[:, :15], logits[:, :15])
    grows = state_numbers(model, 200) - state_numbers(model, 100)
    attention_layers = {"attention": 2, "hybrid": 1}.get(kind, 0)     # hybrid: the last layer
    assert grows == attention_layers * 2 * 100 * 32                      # keys and values
    fixed = {"linear": 2 * 4 * (8 * 8 + 8), "gated": 2 * 8, "lti": 2 * 32 * 8,
             "selective": 2 * (32 * 8 + 32 * 3)}          # the scan's h, the conv's window
    if kind in fixed:
        assert state_numbers(model, 100) == fixed[kind]
    with pytest.raises(ValueError, match="unknown model"):
        recall_model("mamba-3", V)


def test_attention_learns_to_recall_a_few_pairs():
    """300 steps: two-layer attention starts to find the values (an induction head): more
    than three times the chance of one value in 16 (0.34 where this test was written)."""
    torch.manual_seed(0)
    V = vocab_size(16, 16)
    model = recall_model("attention", V, d_model=32, n_layers=2, h=2)
    losses = train_recall(model, n_pairs=4, T=16, steps=300, n_keys=16, n_values=16, lr=3e-3)
    b = mqar_batch(256, 4, 16, 16, 16, generator=torch.Generator().manual_seed(99))
    assert losses[-1] < losses[0] and recall_loss(model, b).item() < losses[0]
    assert recall_accuracy(model, b) > 3 / 16


def test_generation_cost_counts_the_cache_and_the_state_it_holds():
    """The attention cache holds 2 t d_model numbers after t tokens; the selective layer's state
    d (d_state + d_conv - 1) whatever t; each row a median time of positive seconds."""
    rows = generation_cost("attention", [8, 32], d_model=16, h=2, steps=3)
    assert [r["state_bytes"] for r in rows] == [2 * 8 * 16 * 4, 2 * 32 * 16 * 4]   # float32
    rows += generation_cost("selective", [8, 32], d_model=16, d_state=4, steps=3)
    assert [r["state_bytes"] for r in rows[2:]] == [16 * (4 + 3) * 4] * 2
    assert [(r["mixer"], r["t"]) for r in rows] == [("attention", 8), ("attention", 32),
                                                   ("selective", 8), ("selective", 32)]
    assert all(0 < r["s_per_token"] < 1 for r in rows)
    with pytest.raises(ValueError, match="'attention' or 'selective'"):
        generation_cost("gated", [8])


def test_the_experiments_conv_part_takes_the_convolution_out():
    """recall_runs' "conv" part: the selective and hybrid models of every task with d_conv=1,
    so they keep no window (d x 3 numbers a selective layer fewer than in the "pairs" part)."""
    from attnbook.experiments.recall_runs import TASKS, jobs, run_one
    conv = jobs("conv", [0])
    assert sorted((j["mixer"], j["T"], j["n_pairs"]) for j in conv) == sorted(
        (m, T, n) for m in ("selective", "hybrid") for T, n in TASKS)
    job = next(j for j in conv if j["mixer"] == "selective" and j["T"] == 16)
    without = run_one(job, steps=1)
    with_conv = run_one({**job, "part": "pairs"}, steps=1)
    assert with_conv["state_numbers"] - without["state_numbers"] == 2 * 32 * 3   # 2 layers
    assert with_conv["params"] - without["params"] == 2 * 32 * 3                 # the taps


def test_a_gpu_generation_is_its_own_experiment(tmp_path, monkeypatch):
    """recall_runs --device cuda names the device in the settings and writes experiment
    "recall_gpu", so it never merges into the CPU's file (a GPU is faked: the CPU measures)."""
    seen = []
    monkeypatch.setattr(recall_runs_command, "generation_cost",
                        lambda kind, lengths, device, **kw: seen.append(device) or
                        [{"mixer": kind, "t": t, "s_per_token": 1e-4, "state_bytes": 8}
                         for t in lengths])
    out = tmp_path / "gpu.json"
    saves = recording(monkeypatch)
    assert recall_runs_command.main(["--only", "generation", "--device", "cuda", "--lengths", "8",
                             "--out", str(out)]) == 0
    assert merged_again(saves) == ["recall_gpu"]
    made = json.loads(out.read_text())
    assert made["experiment"] == "recall_gpu" and made["generation_settings"]["device"] == "cuda"
    assert seen == ["cuda", "cuda"] and len(made["generation"]) == 2
