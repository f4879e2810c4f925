"""The trained models stored in the package (attnbook.training.runs.load_stored): they load safely,
refuse a changed file, and translate as the committed results say they do."""
import shutil

import pytest

from attnbook.bleu import bleu
from attnbook.data import load_multi30k
from attnbook.decoding import translate
from attnbook.store import load
from attnbook.training.runs import (STORED, STORED_MODELS, MissingRunFile, RunError,
                                    load_stored)


def test_the_stored_models_are_small_and_named():
    assert set(STORED_MODELS) == {p.name for p in STORED.iterdir() if p.is_dir()}
    size = {name: sum(f.stat().st_size for f in (STORED / name).iterdir()) for name in STORED_MODELS}
    assert 0 < size["cpu-tiny"] + size["cpu-base"] < 15 * 2 ** 20    # the two translators: ~15 MB
    assert sum(size.values()) < 17 * 10 ** 6                        # with the explorer's GRU


def committed(name: str) -> dict:
    """The committed record of a stored model: its leaderboard run (seed 0), or cpu_base.json."""
    if name == "cpu-base":
        return load("cpu/cpu_base.json")
    model = "transformer" if name == "cpu-tiny" else name
    return next(r for r in load("cpu/board.json")["runs"] if r["model"] == model and r["seed"] == 0)


def test_the_stored_models_are_the_runs_their_records_name():
    for name in STORED_MODELS:
        cfg = load_stored(name, "cpu")[2]
        if name != "cpu-base":
            assert (cfg.seed, cfg.max_steps, cfg.peak_lr) == (0, 1200, committed(name)["peak_lr"])
        else:
            assert cfg.preset == "cpu-base"


# cpu-tiny is scored by chapter 9 (a hidden check: its beam-4 BLEU on all 1,000 test sentences
# within 0.1 of the leaderboard's seed 0), which make test runs too: not translated twice.
@pytest.mark.parametrize("name", sorted(set(STORED_MODELS) - {"cpu-tiny"}))
def test_a_stored_model_translates_as_its_committed_result_says(name):
    """The stored weights (float16) give the committed test BLEU within 0.1: the explorer's
    gru-additive (the leaderboard's seed 0) and cpu-base's average of five snapshots."""
    model, tok, cfg = load_stored(name, "cpu")
    record = committed(name)
    test = load_multi30k("test_2016_flickr")
    hyps = translate(model, tok, [s for s, _ in test], beam_size=cfg.beam_size, alpha=cfg.length_alpha)
    score = bleu(hyps, [t for _, t in test])
    assert score["signature"] == record["bleu_signature"]
    assert abs(score["bleu"] - record["test_bleu"]) <= 0.1, (score["bleu"], record["test_bleu"])


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
