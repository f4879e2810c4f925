"""attnbook.experiments.score_scales: the statistics of attention scores that chapter 4 reports."""
import json
import math
import os
from pathlib import Path

import pytest
import torch

from attnbook.batching import make_batch
from attnbook.training.recipe import build_model, override, preset
from attnbook.experiments.scales import STATS, score_statistics, width_sweep
from attnbook.commands.score_scales import main
from attnbook.transformer import Transformer, TransformerConfig

def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = TransformerConfig(**{**dict(vocab_size=30, d_model=16, h=2, d_ff=32, n_layers=1,
                                      dropout=0.0), **kw})
    return Transformer(cfg)


def test_statistics_equal_a_direct_computation_of_the_first_layers_scores():
    model = tiny().eval()
    b = make_batch([[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14]])
    row = score_statistics(model, [b])[0]
    assert (row["name"], row["kind"], row["layer"]) == ("encoder.0.self_attn", "encoder self", 1)
    assert row["d_k"] == 8
    with torch.no_grad():                      # the encoder's first self-attention, by hand
        x = model.embed_tokens(b.src)                                   # (B, S, d_model)
        mha = model.encoder[0].self_attn
        q, k = mha.split_heads(mha.W_q(x)), mha.split_heads(mha.W_k(x))  # (B, h, S, d_k)
        dot = q @ k.transpose(-2, -1)                                   # (B, h, S, S)
    pairs = (b.src_mask[:, :, None] & b.src_mask[:, None, :])[:, None].expand_as(dot)
    real_q = q.transpose(1, 2)[b.src_mask]                               # (n_real, h, d_k)
    assert row["var_q"] == pytest.approx(real_q.double().var(unbiased=False).item(), abs=1e-4)
    assert row["var_dot"] == pytest.approx(dot[pairs].double().var(unbiased=False).item(), abs=1e-4)
    assert row["var_scaled"] == pytest.approx(row["var_dot"] / 8, rel=1e-3)
    # within-row variance: the first sentence has 4 real keys, the second 2
    rows = [dot[0, :, :, :4], dot[1, :, :2, :2]]
    within = torch.cat([(r / math.sqrt(8)).double().var(-1, unbiased=False).flatten()
                        for r in rows])
    assert row["row_var_scaled"] == pytest.approx(within.mean().item(), abs=1e-4)


def test_padding_is_left_out():
    # two sentences measured in one padded batch give the statistics of two unpadded batches
    model = tiny()
    short, long = ([5, 6, 7], [8, 9]), ([4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15])
    together = score_statistics(model, [make_batch([short[0], long[0]], [short[1], long[1]])])
    apart = score_statistics(model, [make_batch([short[0]], [short[1]]),
                                     make_batch([long[0]], [long[1]])])
    for t, a in zip(together, apart):
        assert t["name"] == a["name"]
        assert [t[s] for s in STATS] == pytest.approx([a[s] for s in STATS], abs=2e-4), t["name"]
    # and padding would have changed them: Var(k) over all key positions differs
    b = make_batch([short[0], long[0]], [short[1], long[1]])
    b.src_mask[:] = True
    assert score_statistics(model, [b])[0]["var_k"] != pytest.approx(together[0]["var_k"], abs=2e-4)


def test_unscaled_scores_grow_with_the_width_and_scaled_ones_do_not():
    rows = width_sweep(d_ks=(8, 64), n_layers=2)
    narrow, wide = rows[:6], rows[6:]
    for n, w in zip(narrow, wide):
        assert n["name"] == w["name"] and (n["d_k"], w["d_k"]) == (8, 64)
        assert 8 * 0.6 < w["var_dot"] / n["var_dot"] < 8 * 1.6
        assert 0.6 < w["var_scaled"] / n["var_scaled"] < 1.6
        assert 0.25 < n["var_q"] < 0.6       # nn.Linear's initialisation: about 1/3, not 1


def test_models_without_attention_are_refused():
    with pytest.raises(ValueError, match="no MultiHeadAttention"):
        score_statistics(build_model(override(preset("smoke", model="gru"), vocab_size=20)), [])


@pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k files")
def test_the_command_writes_trained_and_initialised_statistics(tmp_path, monkeypatch, capsys):
    """The command on a run folder, as it made results/cpu/score_scales.json from cpu-base: here a
    smoke run trained in seconds (one block each side: 3 attention modules)."""
    from attnbook.commands.train import train
    monkeypatch.chdir(tmp_path)
    train(preset("smoke"), Path("runs/smoke"), progress=False)
    out = tmp_path / "scales.json"
    assert main(["--run", "runs/smoke", "--average", "1", "--sentences", "16",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["calls"][0]["command"] == ("python -m attnbook score_scales --run runs/smoke --average 1 "
                                 f"--sentences 16 --out {out}")
    names = ["encoder.0.self_attn", "decoder.0.self_attn", "decoder.0.cross_attn"]
    for part in ("trained", "initialised"):
        assert [r["name"] for r in result[part]] == names
        assert all(set(STATS) <= set(r) and r["d_k"] == 16 for r in result[part])
        assert all(math.isfinite(r[k]) and r[k] >= 0 for r in result[part] for k in STATS)
    # training moved the weights: the trained statistics are not the initialised ones
    assert [r["var_q"] for r in result["trained"]] != [r["var_q"] for r in result["initialised"]]
    capsys.readouterr()
    assert main(["--run", "runs/none", "--out", str(out)]) == 2   # a folder that is not a run
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "is not a run folder" in err


def test_the_committed_result_is_complete_and_names_no_local_paths():
    path = Path(__file__).resolve().parents[1] / "results" / "cpu" / "score_scales.json"
    text = path.read_text()
    result = json.loads(text)
    assert "/work/" not in text and "/home/" not in text
    assert result["calls"][0]["command"].startswith("python -m attnbook.score_scales --run runs/")   # as made
    for part in ("trained", "initialised"):
        assert [r["name"] for r in result[part]] == [r["name"] for r in result["trained"]]
        assert all(set(STATS) <= set(r) and r["d_k"] == 48 for r in result[part])
