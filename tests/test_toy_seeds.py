"""python -m attnbook toy_seeds: Part I's runs with several seeds, as the chapters make seed 0.

Tiny scale (a few steps): the numbers mean nothing, but the code path is the chapters' own, so
the same seed must give the same numbers, bit for bit.
"""
import json
import math
from pathlib import Path

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from attnbook import store
from attnbook.experiments import toy_seeds
from attnbook.commands import toy_seeds as toy_seeds_command
from attnbook.store import Result
from attnbook.record import Provenance
from attnbook.reproduce import NotReproduced
from attnbook.plotting import plot_accuracy_spread
from attnbook.rnn import Seq2Seq
from attnbook.toy import (PART1, accuracy_by_length, check_stored_run, copy_alignment,
                          greedy_tokens_with_attention, make_batch, reversal_alignment, run_difference,
                          train_toy, vocab_size)
from attnbook.utils import deterministic, made_on_this_machine, versions

ROOT = Path(__file__).resolve().parents[1]
TASK, LENGTHS, D_MODEL = PART1["task"], PART1["lengths"], PART1["d_model"]
N = toy_seeds.TINY["n_per_length"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The command at tiny scale: seed 0, every run and the timing."""
    folder = tmp_path_factory.mktemp("toy_seeds")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        assert toy_seeds_command.main(["--results", "out", "--tiny", "--seeds", "0"]) == 0
    return json.loads((folder / "out" / "toy_seeds.json").read_text())


def test_the_json_has_every_run_and_names_its_making(tiny):
    (call,) = tiny["calls"]                        # its provenance record (attnbook.store)
    assert tiny["scale"] == "tiny" and tiny["seeds"] == [0] and call["threads"] == 1
    assert call["command"] == "python -m attnbook toy_seeds --results out --tiny --seeds 0"
    assert call["date"] and call["wall_s"] > 0 and call["cpu_s"] > 0 and call["load_before"]
    assert call["hardware"]["torch"] == torch.__version__ and len(call["git_commit"]) == 40
    assert [(r["name"], r["seed"]) for r in tiny["runs"]] == \
        [(name, 0) for name in toy_seeds.RUNS]
    for r in tiny["runs"]:
        assert r["length"] == LENGTHS and len(r["exact"]) == len(r["token"]) == len(LENGTHS)
        assert all(0 <= a <= 1 for a in r["exact"] + r["token"]) and r["final_loss"] > 0
        assert r["steps"] == toy_seeds.TINY["steps"]
        attention = toy_seeds.RUNS[r["name"]]["model"].get("attention")   # None: not a GRU
        assert ("alignment" in r) == bool(attention)
        assert ("by_position" in r) == (attention is False)
    assert set(tiny["spread"]) == set(toy_seeds.RUNS)
    assert set(tiny["predict_cost"]["ms_per_step"]) == set(toy_seeds.COST)
    assert tiny["settings"]["task"] == TASK and tiny["settings"]["lengths"] == LENGTHS


def test_the_same_seed_gives_the_same_run_and_another_seed_another(tiny):
    stored = next(r for r in tiny["runs"] if r["name"] == "dot-600")
    again = toy_seeds.run("dot-600", 0, tiny=True)
    for key in ("exact", "token", "final_loss", "loss_blocks", "alignment", "params"):
        assert again[key] == stored[key], key
    assert toy_seeds.run("dot-600", 1, tiny=True)["final_loss"] != stored["final_loss"]


def test_seed_0_is_the_chapters_code_path(tiny):
    """Chapter 1's cells for the model without attention and chapter 3's for the dot score, at the
    command's tiny scale, give the numbers the command stored for seed 0."""
    steps = toy_seeds.TINY["steps"]
    stored = {r["name"]: r for r in tiny["runs"]}
    # chapter 1 (and 2): deterministic(0), the model, train_toy, accuracy_by_length
    deterministic(0)
    plain = Seq2Seq(vocab_size(TASK["n_symbols"]), d_model=D_MODEL, attention=False)
    history = train_toy(plain, **TASK, **(PART1["train"] | {"steps": steps}))
    res_plain = accuracy_by_length(plain, LENGTHS, n_symbols=TASK["n_symbols"],
                                   task=TASK["task"], n_per_length=N)
    assert run_difference(stored["no-attention"], res_plain, history) == 0.0
    # chapter 3: the score model, then its attention statistics computed inline
    deterministic(0)
    model = Seq2Seq(vocab_size(TASK["n_symbols"]), d_model=D_MODEL, attention=True, score="dot")
    history = train_toy(model, **TASK, **(PART1["train"] | {"steps": steps}))
    res = accuracy_by_length(model, LENGTHS, n_symbols=TASK["n_symbols"], task=TASK["task"],
                             n_per_length=N)
    L = PART1["alignment"]["length"]
    test = make_batch(toy_seeds.TINY["n_alignment"], L, L, TASK["n_symbols"],
                      generator=torch.Generator().manual_seed(PART1["alignment"]["seed"]))
    offset = torch.arange(L)[None, :] - (L - 1 - torch.arange(L))[:, None]
    _, weights = greedy_tokens_with_attention(model, test.src, test.src_mask, max_len=L + 1)
    w = weights[:, :L]
    offset = offset[: w.shape[1]]   # untrained outputs stop early; a no-op in the chapters
    inline = {"largest": w.max(-1).values.mean().item(),
              "diagonal": (w * (offset == 0)).sum(-1).mean().item(),
              "neighbour": (w * (offset == 1)).sum(-1).mean().item(),
              "band": (w * (offset.abs() <= 1)).sum(-1).mean().item()}
    assert run_difference(stored["dot-600"], res, history, inline) == 0.0
    assert reversal_alignment(model, TASK["n_symbols"], n=toy_seeds.TINY["n_alignment"]) == inline


def test_run_difference_sees_a_change():
    stored = {"length": [2, 4], "exact": [1.0, 0.5], "token": [1.0, 0.75], "final_loss": 0.5,
              "alignment": {"band": 0.9}}
    acc = {"length": [2, 4], "exact": [1.0, 0.5], "token": [1.0, 0.75]}
    assert run_difference(stored, acc, [0.5] * 60, {"band": 0.9}) == 0.0
    assert run_difference(stored, acc | {"exact": [1.0, 0.25]}, [0.5] * 60) == 0.25
    assert run_difference(stored, acc, [0.5] * 60, {"band": 0.8}) == pytest.approx(0.1)
    assert math.isinf(run_difference(stored, acc | {"length": [2, 6]}, [0.5] * 60))


def stored_seeds(hardware: dict) -> Result:
    """A toy_seeds.json of three seeds of 'additive' (exact match 1.0, 0.9, 0.8 at 2 symbols:
    the seeds are at most 0.2 apart) made by one call on ``hardware``."""
    runs = [{"name": "additive", "seed": s, "length": [2], "exact": [1.0 - 0.1 * s],
             "token": [1.0], "final_loss": 0.5} for s in (0, 1, 2)]
    call = Provenance(command="python -m attnbook run toy_seeds", git_commit="0" * 40, date="d",
                      hardware=hardware)
    return Result(store.result("toy_seeds", {"runs": runs}, call), Path("toy_seeds.json"))


def test_a_stale_file_fails_on_its_own_arithmetic():
    """Made with this machine's arithmetic: the same run is identical, and any difference, even
    one far inside the seeds' spread, means the file is stale."""
    result = stored_seeds(versions())
    acc, history = {"length": [2], "exact": [1.0], "token": [1.0]}, [0.5] * 50
    same = check_stored_run(result, "additive", acc, history)
    assert same.distance == 0.0 and same.tolerance.rule.startswith("exact")
    with pytest.raises(NotReproduced, match=r"exact@2 is 0.99 here and 1 in toy_seeds.json.*"
                                            r"changed since: remake it with `python -m attnbook "
                                            r"run toy_seeds --only additive`"):
        check_stored_run(result, "additive", acc | {"exact": [0.99]}, history)


@pytest.mark.parametrize("elsewhere", [{"cpu_capability": "NOT-THIS-ONE"}, {"cpu": "another processor"},
                                       {"cpu_capability": None}, {"torch": "2.0.0"}])
def test_elsewhere_a_run_may_differ_by_three_times_the_seeds_spread(elsewhere):
    """Made on another arithmetic (another vector kernel set, processor or PyTorch; or not
    recorded): a run within 3 x the largest distance between the seeds (0.2) passes and says by
    which rule; beyond it, the error names both machines and the command."""
    result = stored_seeds(versions() | elsewhere)
    acc, history = {"length": [2], "exact": [0.45], "token": [1.0]}, [0.5] * 50
    near = check_stored_run(result, "additive", acc, history)
    assert near.distance == pytest.approx(0.55) and near.quantity == "exact@2"
    assert near.tolerance.value == pytest.approx(0.6) and "3 x the largest difference between " \
        "two of its seeds in exact, 0.2 (seeds 0, 1, 2)" in near.tolerance.rule
    assert str(near) == "0.55 apart at most, within the tolerance (exact@2: 0.6)"
    with pytest.raises(NotReproduced, match=r"0.65 apart, beyond the tolerance 0.6 .* It was "
                                            r"made on .*; this machine is .*run toy_seeds"):
        check_stored_run(result, "additive", acc | {"exact": [0.35]}, history)
    with pytest.raises(NotReproduced, match="final_loss is 0.7 here"):   # each kind its own
        check_stored_run(result, "additive", acc, [0.7] * 50)           # spread: 0 for the loss


def test_made_on_this_machine():
    env = versions()
    assert made_on_this_machine({"environment": env})
    assert not made_on_this_machine({"environment": env | {"torch": "0.1"}})
    assert not made_on_this_machine({"environment": env | {"cpu_capability": "NOT-THIS-ONE"}})
    assert not made_on_this_machine({"environment": env | {"isa_caps": {"X": "1"}}})
    assert not made_on_this_machine({"environment": {k: v for k, v in env.items()
                                                     if k != "cpu_capability"}})
    assert not made_on_this_machine({})


def test_the_spread_figure_draws_a_band_and_every_seed(tiny):
    import matplotlib.pyplot as plt

    runs = [r for r in tiny["runs"] if r["name"] == "no-attention"]
    ax = plot_accuracy_spread({"no attention": runs}, metrics=("exact", "token"))
    assert len(ax.lines) == 2 * len(runs) and len(ax.collections) == 2
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    with pytest.raises(ValueError, match="metric"):
        plot_accuracy_spread({"x": runs}, metrics=("bleu",))
    plt.close("all")


def test_help_and_one_line_errors(capsys, tmp_path, monkeypatch):
    with pytest.raises(SystemExit) as e:
        toy_seeds_command.main(["--help"])
    assert e.value.code == 0 and "--results" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    for argv in (["--results", "out", "--seeds", "0", "0"],
                 ["--results", "out", "--runs", "gpt"],
                 ["--results", str(tmp_path / "out")],
                 ["--results", "out", "--steps", "5"],
                 []):
        with pytest.raises(SystemExit) as e:
            toy_seeds_command.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2, argv
        assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_the_committed_result_is_complete_and_names_no_local_paths():
    path = ROOT / "results" / "cpu" / "toy_seeds.json"
    text = path.read_text()
    result = json.loads(text)
    assert "/work/" not in text and "/home/" not in text and "/tmp/" not in text
    first = result["calls"][0]                     # its provenance record (attnbook.store)
    assert first["command"].startswith("python -m attnbook.toy_seeds --results results/cpu")   # as made
    assert result["scale"] == "full" and result["seeds"] == [0, 1, 2] and first["threads"] == 1
    assert first["wall_s"] > 0 and first["hardware"]["cpu_threads"] == 1
    assert {k: v for k, v in result["settings"].items() if k in PART1} == PART1
    assert [(r["name"], r["seed"]) for r in result["runs"]] == \
        [(name, seed) for name in toy_seeds.RUNS for seed in (0, 1, 2)]
    for r in result["runs"]:
        spec = toy_seeds.RUNS[r["name"]]
        assert r["steps"] == spec["steps"] and r["length"] == LENGTHS
        assert len(r["loss_blocks"]) == spec["steps"] // toy_seeds.BLOCK
        assert r.get("lr", PART1["train"]["lr"]) == spec.get("lr", PART1["train"]["lr"])
    assert set(result["predict_cost"]["ms_per_step"]) == set(toy_seeds.COST)


def test_merge_puts_runs_into_the_file_and_keeps_the_rest(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = ["--results", "out", "--tiny", "--seeds", "0", "--no-timing"]
    assert toy_seeds_command.main([*base, "--runs", "no-attention", "additive"]) == 0
    before = json.loads((tmp_path / "out" / "toy_seeds.json").read_text())
    assert toy_seeds_command.main([*base, "--runs", "copy"]) == 0          # merged by key
    after = json.loads((tmp_path / "out" / "toy_seeds.json").read_text())
    assert [(r["name"], r["seed"]) for r in after["runs"]] == \
        [("no-attention", 0), ("additive", 0), ("copy", 0)]
    assert after["runs"][:2] == before["runs"]
    assert after["calls"][0] == before["calls"][0]
    assert list(after["run_specs"]) == list(after["spread"]) == ["no-attention", "additive", "copy"]
    assert after["run_specs"]["copy"]["task"] == "copy"
    call = after["calls"][1]
    assert call["rows"] == ["copy/0"] and call["command"].endswith("--runs copy")
    assert set(after["runs"][2]["alignment"]) == {"largest", "diagonal", "left", "right", "band"}
    # merging a run again replaces it, and the second call is recorded too
    assert toy_seeds_command.main([*base, "--runs", "copy"]) == 0
    again = json.loads((tmp_path / "out" / "toy_seeds.json").read_text())
    timeless = [[{k: v for k, v in r.items() if k not in ("train_seconds", "ms_per_step")}
                 for r in result["runs"]] for result in (again, after)]
    assert timeless[0] == timeless[1] and len(again["calls"]) == 3
    # other seeds or another scale than the file's: one line each, before anything is trained
    for argv in (["--results", "out", "--tiny", "--seeds", "0", "1", "--no-timing"],
                 ["--results", "out", "--seeds", "0", "--no-timing"]):   # full scale
        assert toy_seeds_command.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert "differ from those of the file" in err, err
    assert json.loads((tmp_path / "out" / "toy_seeds.json").read_text()) == again


def test_copy_alignment_reads_the_main_diagonal_and_its_two_neighbours():
    deterministic(0)
    model = Seq2Seq(vocab_size(TASK["n_symbols"]), d_model=16, attention=True)
    train_toy(model, **(TASK | {"task": "copy"}), **(PART1["train"] | {"steps": 2}))
    a = copy_alignment(model, TASK["n_symbols"], length=6, n=8)
    assert a["band"] == pytest.approx(a["diagonal"] + a["left"] + a["right"])
    L = 6
    test = make_batch(8, L, L, TASK["n_symbols"], task="copy",
                      generator=torch.Generator().manual_seed(5))
    _, w = greedy_tokens_with_attention(model, test.src, test.src_mask, max_len=L + 1)
    w = w[:, :L]
    rows = torch.arange(w.shape[1])
    assert a["diagonal"] == pytest.approx(w[:, rows, rows].mean().item())
    assert a["left"] == pytest.approx(w[:, rows[1:], rows[1:] - 1].sum(-1).mean().item() / w.shape[1])
