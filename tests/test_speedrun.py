"""The speedrun (attnbook.experiments.speedrun): each row of its ladder is the row above with one
change, the last row is the cpu-speedrun preset, its snapshots leave checkpoint averaging its
window, and the command (tiny) measures, trains, scores and merges."""
import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from attnbook.__main__ import main
from attnbook import store
from attnbook.record import Provenance
from attnbook.experiments.scoring import AVERAGE_LAST, AVERAGE_SPAN
from attnbook.experiments.speedrun import (LADDER, LONGER, PRESET_ROW, REJECTED, against_evening,
                                           config, snapshots, verdicts)
from attnbook.training.recipe import differences, preset
from attnbook.utils import native_bf16
from twice import merged_again, recording

needs_data = pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"),
                                reason="needs the Multi30k files (MULTI30K_DIR)")
SCHEDULE = {"max_steps", "snapshot_steps", "preset"}     # what each row sets besides its change


def test_each_row_is_its_parent_with_one_change():
    assert differences(asdict(config("fit")), asdict(preset("cpu-base"))).keys() <= SCHEDULE
    for name, _, parent, changes, _ in LADDER[1:]:
        diff = set(differences(asdict(config(parent)), asdict(config(name)))) - SCHEDULE
        assert diff == set(changes) and len(diff) == 1, name
    assert asdict(config(PRESET_ROW, seed=2)) == asdict(preset("cpu-speedrun")) | {"seed": 2}
    for name, *_ in REJECTED:           # and each rejected change is one change to the preset
        assert len(differences(asdict(config(name)), asdict(preset("cpu-speedrun")))) == 1


def test_a_longer_row_is_the_run_it_resumes_trained_on():
    for name, _, parent, steps in LONGER:
        assert not differences(asdict(config(name)), asdict(config(parent)))   # resumable
        assert config(name).max_steps == steps > config(parent).max_steps
        window = [s for s in config(name).snapshot_steps + (steps,)
                  if s >= (1 - AVERAGE_SPAN) * steps]
        assert len(window) == AVERAGE_LAST and min(config(name).snapshot_steps) > \
            config(parent).max_steps                   # saved by the resumed run, not before it


@pytest.mark.parametrize("steps", [600, 950, 1100, 1400])
def test_the_snapshots_give_averaging_its_last_five(steps):
    snaps = snapshots(steps)
    assert list(snaps) == sorted(set(snaps)) and snaps[-1] < steps
    window = [s for s in snaps + (steps,) if s >= (1 - AVERAGE_SPAN) * steps]
    assert len(window) == AVERAGE_LAST
    assert all(config(n).snapshot_steps == snapshots(config(n).max_steps) for n, *_ in LADDER)


def test_the_faster_rows_get_more_steps():
    steps = [config(n).max_steps for n, *_ in LADDER[:3]]     # fp32, bf16, a smaller vocabulary
    assert steps == sorted(steps) and len(set(steps)) == len(steps)


def test_a_row_is_kept_when_it_beats_its_kept_parent_over_the_seeds_both_have():
    val = {"fit": 30, "bf16": 33, "vocab4000": 35, "cosine": 34, "cosine-peak5e-3": 34.5}
    runs = [{"row": n, "seed": 0, "val_bleu": v} for n, v in val.items()]
    assert verdicts(runs) == {"fit": True, "bf16": True, "vocab4000": True, "cosine": False,
                              "cosine-peak5e-3": False}      # above its parent, which was not kept
    runs[1]["val_bleu"] = 29                                        # bf16 below fit
    assert verdicts(runs) == {n: n == "fit" for n in val}
    assert verdicts(runs[:1]) == {"fit": True}                      # rows not yet trained: absent
    runs[1]["val_bleu"] = 33
    runs += [{"row": "bf16", "seed": 1, "val_bleu": 40},            # the seeds both rows have
             {"row": "vocab4000", "seed": 1, "val_bleu": 36},       # decide: (35 + 36) / 2 is
             {"row": "bf16", "seed": 2, "val_bleu": 0}]             # below (33 + 40) / 2
    assert verdicts(runs) == {"fit": True, "bf16": True, "vocab4000": False, "cosine": False,
                              "cosine-peak5e-3": False}


@needs_data
def test_tiny_speedrun_then_only_merges(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    saves = recording(monkeypatch)
    assert main(["run", "speedrun", "--tiny", "--out", "tiny"]) == 0
    assert merged_again(saves) == ["speedrun"]              # a second identical call: no change
    made = store.read(Path("tiny/speedrun.json"))
    assert made["experiment"] == "speedrun"
    assert Provenance.from_dict(made["calls"][0]).extra["ran"].startswith(
        "python -m attnbook speedrun")
    assert [(r["row"], r["seed"]) for r in made["runs"]] == [("vocab4000", 0), ("steps1600", 0)]
    assert set(made["bench"]) == {"vocab4000"}            # a longer row's steps are the preset's
    assert all(b["s_per_step"] > 0 and b["target_tokens_per_s"] > 0 for b in made["bench"].values())
    fast, longer = (r["config"] for r in made["runs"])
    assert (fast["precision"], fast["arch"]["vocab_size"], fast["max_steps"]) == \
        ("bf16-if-native", 4000, 2)
    assert made["runs"][0]["precision"] == ("bf16" if native_bf16()[0] else "fp32")   # as it ran
    assert longer["max_steps"] == 4 and not differences(fast, longer)
    logged = [json.loads(line)["step"] for line in open("tiny/runs/steps1600_seed0/log.jsonl")]
    assert logged == [2, 4]                 # the parent's evaluation at step 2, then its own
    assert all(0 <= r["test_bleu"] <= 100 and r["train_minutes"] >= 0 for r in made["runs"])
    assert made["summary"]["vocab4000"]["test_bleu"]["n"] == 1
    assert made["kept"] == {"vocab4000": False}          # its parent (bf16) was not trained
    assert made["preset_row"] == PRESET_ROW
    assert {r["row"]: r["parent"] for r in made["ladder"]}["vocab4000"] == "bf16"
    assert {r["row"]: r["resumes"] for r in made["longer"]}["steps1600"] == PRESET_ROW
    assert main(["run", "speedrun", "--tiny", "--out", "tiny", "--only", "vocab4000"]) == 0
    after = store.read(Path("tiny/speedrun.json"))
    assert len(after["calls"]) == 2 and after["calls"][1]["rows"] == ["vocab4000/0"]
    key = lambda r: (r["row"], r["seed"])                                          # noqa: E731
    assert sorted(after["runs"], key=key) == sorted(made["runs"], key=key)   # reused, not trained again


@needs_data
def test_a_longer_row_waits_for_the_run_it_resumes(tmp_path):
    from attnbook.commands.speedrun import main as speedrun
    with pytest.raises(SystemExit, match="train its row first"):
        speedrun(["--rows", "steps2000", "--seeds", "0", "--max-steps", "2", "--no-bench",
                  "--out", os.path.relpath(tmp_path)])


def test_each_row_is_compared_with_the_evening_model_seed_with_seed():
    refs = [f"a dog runs on the beach number {i}" for i in range(20)]
    wrong = [f"a cat sleeps in a house {i}" for i in range(20)]
    evening = [{"seed": k, "hypotheses": refs, "greedy_hypotheses": wrong} for k in (0, 1)]
    runs = [{"row": "vocab4000", "seed": k, "hypotheses": wrong, "greedy_hypotheses": refs}
            for k in (0, 1)] + [{"row": "steps1600", "seed": 1, "hypotheses": refs,
                                 "greedy_hypotheses": refs}]
    rows = {(r["b"], r["seed"], r["decoding"]): r for r in against_evening(runs, evening, refs)}
    assert set(rows) == {(b, k, d) for b, k in (("vocab4000", 0), ("vocab4000", 1),
                                                 ("steps1600", 1)) for d in ("beam", "greedy")}
    assert all(r["a"] == "evening" for r in rows.values())
    beam, greedy = rows["vocab4000", 0, "beam"], rows["vocab4000", 0, "greedy"]
    assert beam["bleu_a"] == 100 and beam["bleu_b"] < 10 and beam["p_value"] < 0.05  # evening better
    assert greedy["bleu_b"] == 100 and greedy["bleu_a"] < 10 and greedy["p_value"] < 0.05
    assert rows["steps1600", 1, "beam"]["bleu_a"] == rows["steps1600", 1, "beam"]["bleu_b"]


def test_a_comparison_with_missing_evening_runs_says_what_to_run(tmp_path, capsys):
    from attnbook.commands.speedrun import main as speedrun
    with pytest.raises(SystemExit):
        speedrun(["--rows", "vocab4000", "--out", "runs", "--evening",
                  os.path.relpath(tmp_path)])
    assert "python -m attnbook run evening" in capsys.readouterr().err
