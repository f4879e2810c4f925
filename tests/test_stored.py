"""The trained models stored in the package (attnbook.training.runs.load_stored): they load safely,
refuse a changed file, and translate as the committed results say they do."""
import shutil

import pytest

from attnbook.bleu import bleu
from attnbook.data import load_multi30k
from attnbook.decoding import translate
from attnbook.experiments.store import load
from attnbook.training.runs import (STORED, STORED_MODELS, MissingRunFile, RunError,
                                    load_stored)


def test_the_stored_models_are_small_and_named():
    assert set(STORED_MODELS) == {p.name for p in STORED.iterdir() if p.is_dir()}
    size = {name: sum(f.stat().st_size for f in (STORED / name).iterdir()) for name in STORED_MODELS}
    assert 0 < size["cpu-tiny"] + size["cpu-base"] < 15 * 2 ** 20    # the two translators: ~15 MB
    assert sum(size.values()) < 17 * 10 ** 6                        # with the explorer's GRU


def test_cpu_tiny_translates_as_the_leaderboard_says():
    """The stored weights (float16) give the committed test BLEU of the leaderboard's run."""
    model, tok, cfg = load_stored("cpu-tiny", "cpu")
    run = next(r for r in load("cpu/board.json")["runs"]
               if r["model"] == "transformer" and r["seed"] == 0)
    test = load_multi30k("test_2016_flickr")
    hyps = translate(model, tok, [s for s, _ in test], beam_size=cfg.beam_size, alpha=cfg.length_alpha)
    score = bleu(hyps, [t for _, t in test])
    assert score["signature"] == run["bleu_signature"]
    assert abs(score["bleu"] - run["test_bleu"]) <= 0.1, (score["bleu"], run["test_bleu"])


def test_gru_additive_translates_as_the_leaderboard_says():
    """The stored GRU with additive attention (float16) gives the committed test BLEU of the
    leaderboard's seed 0 run, whose attention the Bahdanau explorer shows."""
    model, tok, cfg = load_stored("gru-additive", "cpu")
    run = next(r for r in load("cpu/board.json")["runs"]
               if r["model"] == "gru-additive" and r["seed"] == 0)
    assert (cfg.model, cfg.seed, cfg.max_steps, cfg.peak_lr) == ("gru-additive", 0, 1200, run["peak_lr"])
    test = load_multi30k("test_2016_flickr")
    hyps = translate(model, tok, [s for s, _ in test], beam_size=cfg.beam_size, alpha=cfg.length_alpha)
    score = bleu(hyps, [t for _, t in test])
    assert score["signature"] == run["bleu_signature"]
    assert abs(score["bleu"] - run["test_bleu"]) <= 0.1, (score["bleu"], run["test_bleu"])


def test_cpu_base_translates_as_its_committed_result_says():
    """The stored cpu-base model (the mean of its last five snapshots, float16) gives the test
    BLEU of results/cpu/cpu_base.json."""
    model, tok, cfg = load_stored("cpu-base", "cpu")
    base = load("cpu/cpu_base.json")
    test = load_multi30k("test_2016_flickr")
    hyps = translate(model, tok, [s for s, _ in test], beam_size=cfg.beam_size, alpha=cfg.length_alpha)
    score = bleu(hyps, [t for _, t in test])
    assert score["signature"] == base["bleu_signature"]
    assert abs(score["bleu"] - base["test_bleu"]) <= 0.1, (score["bleu"], base["test_bleu"])


def test_a_changed_or_missing_file_is_refused(tmp_path):
    copy = tmp_path / "cpu-tiny"
    shutil.copytree(STORED / "cpu-tiny", copy)
    data = bytearray((copy / "weights.pt").read_bytes())
    data[len(data) // 2] ^= 1
    (copy / "weights.pt").write_bytes(bytes(data))
    with pytest.raises(RunError, match="sha256 differs"):
        load_stored("cpu-tiny", "cpu", folder=copy)
    shutil.copy(STORED / "cpu-tiny" / "weights.pt", copy / "weights.pt")
    assert load_stored("cpu-tiny", "cpu", folder=copy)[2].model == "transformer"   # restored: loads
    (copy / "tokenizer.model").unlink()
    with pytest.raises(MissingRunFile, match="tokenizer.model is missing"):
        load_stored("cpu-tiny", "cpu", folder=copy)
    with pytest.raises(RunError, match="no stored model 'cpu-huge'"):
        load_stored("cpu-huge")
