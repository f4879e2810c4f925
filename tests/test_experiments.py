"""Chapter 9's experiments: extending a run, attention entropy, the sweep and the seeded board."""
import json
import math
import os
from pathlib import Path
from dataclasses import replace

import pytest
import torch

from attnbook.batching import make_batch
from attnbook.experiments.scoring import output_stats, repeats
from attnbook.commands.translators import main
from attnbook.experiments.translators import summarise
from attnbook.commands import ablations as ablations_command
from twice import merged_again, recording
from attnbook.training.recipe import build_model, differences, override, preset
from attnbook.training.runs import load_checkpoint
from attnbook.commands.train import attention_entropy, train

needs_data = pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k files")


@needs_data
def test_extending_a_run_equals_training_it_that_long(tmp_path):
    # the schedule does not depend on the total number of steps, so 12 steps + 8 more is 20 steps
    cfg = replace(preset("smoke"), eval_every=4)
    train(replace(cfg, max_steps=12), tmp_path / "ext", progress=False, evaluate=False)
    train(replace(cfg, max_steps=20), tmp_path / "ext", resume=True, progress=False, evaluate=False)
    train(replace(cfg, max_steps=20), tmp_path / "full", progress=False, evaluate=False)
    a = load_checkpoint(tmp_path / "ext" / "checkpoint.pt")["model"]
    b = load_checkpoint(tmp_path / "full" / "checkpoint.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(line)["step"] for line in (tmp_path / "ext" / "log.jsonl").read_text().splitlines()]
    assert steps == [4, 8, 12, 16, 20]
    # but another recipe is another run: resuming with it is refused
    with pytest.raises(ValueError, match="another configuration"):
        train(replace(cfg, max_steps=24, peak_lr=1e-3), tmp_path / "ext", resume=True, progress=False)


def test_attention_entropy_of_uniform_attention_is_log_of_the_visible_keys():
    cfg = override(preset("smoke"), n_layers=2, vocab_size=20)
    model = build_model(cfg)
    with torch.no_grad():   # W_q = 0: every score is the same, so the weights are uniform
        for name, p in model.named_parameters():
            if "W_q" in name:
                p.zero_()
    b = make_batch([[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14]])
    ent = attention_entropy(model, b)
    assert sorted(ent) == ["decoder.0.cross_attn", "decoder.0.self_attn", "decoder.1.cross_attn",
                           "decoder.1.self_attn", "encoder.0.self_attn", "encoder.1.self_attn"]
    # encoder: sentence 1 sees 4 keys at each of its 4 positions, sentence 2 sees 2 at 2
    assert ent["encoder.0.self_attn"] == pytest.approx((4 * math.log(4) + 2 * math.log(2)) / 6, abs=1e-4)
    # causal decoder self-attention: position t sees t + 1 keys (targets: BOS + 3, BOS + 1)
    dec = [math.log(t + 1) for t in range(4)] + [math.log(t + 1) for t in range(2)]
    assert ent["decoder.1.self_attn"] == pytest.approx(sum(dec) / 6, abs=1e-4)
    # cross-attention: every real target position sees its sentence's source
    assert ent["decoder.0.cross_attn"] == pytest.approx((4 * math.log(4) + 2 * math.log(2)) / 6, abs=1e-4)
    # a trained-looking model (random weights) is below the uniform bound, and GRUs have none
    assert attention_entropy(build_model(cfg), b)["encoder.0.self_attn"] < math.log(4)
    assert attention_entropy(build_model(replace(cfg, model="gru-additive")), b) == {}


def test_degenerate_outputs_are_detected():
    assert repeats("Five people in winter winter winter jackets .")
    assert repeats("A man wearing hats , wearing hats , wearing a coat .")
    assert not repeats("A man in a blue shirt is standing in front of a building .")
    assert not repeats("A man in a blue shirt and a man in a red shirt sit in a park .")
    assert repeats("Two dogs play in the snow snow snow .")
    stats = output_stats(["a dog runs", "a a a a a a a a a a a a"], ["a dog runs", "a cat"])
    assert stats == {"too_long_frac": 0.5, "repeats_frac": 0.5, "length_ratio": 3.0}
    s = summarise([30.0, 32.0, 34.0])
    assert s["mean"] == 32.0 and s["std"] == 2.0 and (s["min"], s["max"], s["n"]) == (30.0, 34.0, 3)


@needs_data
def test_sweep_and_board_commands(tmp_path, monkeypatch):
    import attnbook.experiments.translators as ex
    saves = recording(monkeypatch)
    # smoke's peak rates are 3e-3: the board reuses the sweep's runs at that rate
    monkeypatch.setattr(ex, "SWEEP_LRS", {"transformer": (3e-3, 1e-2), "gru": (3e-3,)})
    monkeypatch.setattr(ex, "SNAPSHOTS", (6, 10, 20))
    monkeypatch.chdir(tmp_path)                            # paths relative to the repository
    common = ["--preset", "smoke", "--models", "transformer", "gru", "--jobs", "1",
              "--sentences", "6", "--results", "results"]
    assert main(["sweep", "--max-steps", "10", "--out", "sweep", *common]) == 0
    sweep = json.loads((tmp_path / "results" / "sweep.json").read_text())
    runs = {(r["model"], r["peak_lr"]): r for r in sweep["runs"]}
    assert sorted(runs) == [("gru", 3e-3), ("transformer", 3e-3), ("transformer", 1e-2)]
    best = min((r for r in sweep["runs"] if r["model"] == "transformer"), key=lambda r: r["val_loss"])
    assert sweep["chosen_peak_lr"] == {"transformer": best["peak_lr"], "gru": 3e-3}
    assert runs[("gru", 3e-3)]["val_bleu"] >= 0
    r = runs[("transformer", 3e-3)]
    assert r["val_bleu"] >= 0 and 0 <= r["too_long_frac"] <= 1
    assert r["val_loss_shuffled_sources"] > 0 and r["log"][-1]["step"] == 10
    assert set(r["log"][-1]["attention_entropy"]) >= {"encoder.0.self_attn", "decoder.0.cross_attn"}
    call = sweep["calls"][0]                       # its provenance record (attnbook.store)
    assert call["hardware"]["cpu_threads"] == 1 and call["threads"] == 1 and call["processes"] == 1
    assert str(tmp_path) not in json.dumps(sweep)          # no absolute paths in the results
    assert sweep["train_time_s_sum"] == pytest.approx(sum(r["train_time_s"] for r in sweep["runs"]))
    with pytest.raises(SystemExit):                        # and none may be given
        main(["sweep", "--out", str(tmp_path / "sweep"), "--results", "results"])

    # the board continues the sweep's 10-step seed-0 runs (snapshots at 6, 10 and the last step)
    assert main(["board", "--seeds", "0", "1", "--out", "board", "--reuse", "sweep", *common]) == 0
    board = json.loads((tmp_path / "results" / "board.json").read_text())
    assert len(board["runs"]) == 4 and {r["seed"] for r in board["runs"]} == {0, 1}
    for r in board["runs"]:   # BLEU against budget for the models of BUDGET_MODELS
        steps = ["6", "10", "20"] if r["model"] in ex.BUDGET_MODELS else ["20"]
        assert list(r["bleu_at_step"]) == steps and r["train_flops_per_token"] > 0
    first = lambda run: (run / "log.jsonl").read_text().splitlines()[0]  # noqa: E731 (has a time)
    for m in ("transformer", "gru"):
        assert first(tmp_path / "board" / f"{m}_lr0.003_seed0_steps20") == \
            first(tmp_path / "sweep" / f"{m}_lr0.003_seed0_steps10")
    t = [r for r in board["runs"] if r["model"] == "transformer"]
    assert board["summary_test_bleu"]["transformer"]["20"]["n"] == 2
    assert board["summary_test_bleu"]["transformer"]["20"]["mean"] == \
        pytest.approx(sum(r["test_bleu"] for r in t) / 2, abs=0.01)
    assert board["examples"][0]["index"] == 0 and "gru" in board["examples"][0]
    # scores are kept in each run folder: a second call reads them instead of decoding again
    scores = sorted((tmp_path / "board").glob("*/score_score_board_run.json"))
    assert len(scores) == 4
    stamps = [f.stat().st_mtime_ns for f in scores]
    assert main(["board", "--seeds", "0", "1", "--out", "board", *common]) == 0
    again = json.loads((tmp_path / "results" / "board.json").read_text())
    assert again["runs"] == board["runs"] and [f.stat().st_mtime_ns for f in scores] == stamps

    # greedy as well as beam search at every step, and the seconds each step had cost
    for r in board["runs"]:
        assert list(r["greedy_bleu_at_step"]) == list(r["bleu_at_step"]) == list(r["train_s_at_step"])
        assert r["train_s_at_step"]["20"] == r["train_time_s"] and r["steps"] == 20
        assert sorted(r["train_s_at_step"].values()) == list(r["train_s_at_step"].values())
        assert "hypotheses" not in r and "hypotheses_at_step" not in r
    # the paired bootstrap: the two models, seed with seed, at the steps both were scored
    pairs = {(b["a"], b["b"], b["seed"], b["step"], b["decoding"]) for b in board["bootstrap"]}
    assert pairs == {("transformer", "gru", s, "20", d) for s in (0, 1) for d in ("beam", "greedy")}
    for b in board["bootstrap"]:
        r = {m: next(r for r in board["runs"] if (r["model"], r["seed"]) == (m, b["seed"]))
             for m in (b["a"], b["b"])}
        key = "bleu_at_step" if b["decoding"] == "beam" else "greedy_bleu_at_step"
        assert (b["bleu_a"], b["bleu_b"]) == (r[b["a"]][key]["20"], r[b["b"]][key]["20"])
        assert 0 < b["p_value"] <= 1 and b["ci_a"] >= 0

    # a longer board (--max-steps, --name) continues the board's runs: its first steps are
    # theirs, so its BLEU at their last step is theirs, and the scores of the shorter runs
    # are not taken for the longer ones
    assert main(["board", "--seeds", "0", "--max-steps", "24", "--models", "transformer",
                 "--out", "board", "--reuse", "board", "--name", "board_long", "--jobs", "1",
                 "--preset", "smoke", "--sentences", "6", "--results", "results"]) == 0
    long = json.loads((tmp_path / "results" / "board_long.json").read_text())
    assert long["experiment"] == "board_long" and len(long["runs"]) == 1
    assert merged_again(saves) == ["board", "board_long", "sweep"]   # each file's last call, again
    r, short = long["runs"][0], next(r for r in board["runs"] if r["model"] == "transformer"
                                     and r["seed"] == 0)
    assert r["steps"] == 24 and list(r["bleu_at_step"]) == ["6", "10", "20", "24"]
    for key in ("bleu_at_step", "greedy_bleu_at_step", "train_s_at_step"):
        assert {k: r[key][k] for k in short[key]} == short[key]
    assert long["bootstrap"] == []                            # one model: nothing to compare


def test_checkpoint_averaging_is_the_mean_of_the_weights(tmp_path):
    from attnbook.training.runs import average_checkpoints, save_checkpoint
    cfg = override(preset("smoke"), vocab_size=30)
    models = [build_model(cfg) for _ in range(3)]
    for i, m in enumerate(models):
        torch.manual_seed(i)
        for p in m.parameters():
            torch.nn.init.normal_(p)
        save_checkpoint(tmp_path / f"c{i}.pt", model=m.state_dict(), step=i, elapsed=0.0)
    avg = average_checkpoints([tmp_path / f"c{i}.pt" for i in range(3)])
    for k, v in models[0].state_dict().items():
        mean = sum(m.state_dict()[k].double() for m in models) / 3
        assert avg[k].dtype == v.dtype and torch.allclose(avg[k].double(), mean, atol=1e-6), k
    # one checkpoint: its own weights, exactly
    one = average_checkpoints([tmp_path / "c1.pt"])
    assert all(torch.equal(one[k], v) for k, v in models[1].state_dict().items())
    # weights of another model (another size) are refused, and so is an empty list
    save_checkpoint(tmp_path / "other.pt", model=build_model(override(cfg, d_model=16)).state_dict())
    with pytest.raises(ValueError, match="other parameters"):
        average_checkpoints([tmp_path / "c0.pt", tmp_path / "other.pt"])
    with pytest.raises(ValueError, match="no checkpoints"):
        average_checkpoints([])


@needs_data
def test_base_command_chooses_on_validation_and_scores_every_snapshot(tmp_path, monkeypatch):
    import attnbook.experiments.scoring as scoring
    import attnbook.experiments.translators as ex
    small = dict(d_model=32, h=2, d_ff=64, n_layers=1, vocab_size=1000, max_tokens=1024,
                 warmup=5, eval_every=5, beam_size=2, peak_lr=3e-3)
    monkeypatch.setattr(ex, "BASE_CANDIDATES", {
        "a": dict(small, max_steps=12, snapshot_steps=(3, 6, 8, 10)),
        "b": dict(small, d_model=16, max_steps=10, snapshot_steps=(5,))})
    monkeypatch.setattr(scoring, "AVERAGE_LAST", 3)
    monkeypatch.setattr(scoring, "AVERAGE_SPAN", 0.5)          # a: steps 6 to 12, the last 3 of them
    monkeypatch.chdir(tmp_path)
    args = ["base", "--out", "base", "--results", "results", "--jobs", "1", "--threads", "1",
            "--sentences", "8"]
    assert main(args) == 0
    res = json.loads((tmp_path / "results" / "cpu_base.json").read_text())
    runs = {r["candidate"]: r for r in res["runs"]}
    assert sorted(runs) == ["a", "b"]
    # the curve: snapshots before the averaging window, and the last checkpoint
    assert [s["step"] for s in runs["a"]["snapshots"]] == [3, 6, 12]
    assert [s["step"] for s in runs["b"]["snapshots"]] == [10]     # 5 is in b's window
    minutes = [s["train_minutes"] for s in runs["a"]["snapshots"]]
    assert minutes == sorted(minutes) and minutes[-1] > 0
    # averages of the last k of the window (8, 10, 12), the one with the lowest validation loss
    assert [a["steps"] for a in runs["a"]["averages"]] == [[12], [10, 12], [8, 10, 12]]
    assert [a["last_k"] for a in runs["b"]["averages"]] == [1, 2]
    for r in runs.values():
        assert r["chosen_last_k"] == min(r["averages"], key=lambda a: a["val_loss"])["last_k"]
    # k = 1 is the last checkpoint: its validation loss is the curve's last point's
    assert runs["a"]["averages"][0]["val_loss"] == runs["a"]["snapshots"][-1]["val_loss"]
    assert res["chosen"] == max(res["runs"], key=lambda r: r["val_bleu"])["candidate"]
    assert res["test_bleu"] == runs[res["chosen"]]["test_bleu"]
    assert res["bleu_signature"].startswith("nrefs:1")
    # the chosen average decoded greedily too; the translations themselves are not kept
    assert all(0 <= r["greedy_test_bleu"] <= 100 and "greedy_hypotheses" not in r
               and "hypotheses" not in r for r in res["runs"])
    assert [e["index"] for e in res["examples"]] == [0]          # 8 sentences: only index 0
    # a second call trains nothing again and reads the cached scores
    assert main(args) == 0
    assert json.loads((tmp_path / "results" / "cpu_base.json").read_text())["runs"] == res["runs"]


@needs_data
def test_a_run_loads_with_its_last_snapshots_averaged(tmp_path, capsys):
    from attnbook.commands.evaluate import main as evaluate
    from attnbook.training.runs import RunError, average_checkpoints, load_run
    cfg = replace(preset("smoke"), max_steps=12, eval_every=6, snapshot_steps=(4, 8, 10))
    train(cfg, tmp_path / "run", progress=False, evaluate=False)
    run = tmp_path / "run"
    last, _, _ = load_run(run, "cpu")
    avg, _, _ = load_run(run, "cpu", average=3)           # steps 8, 10 and the checkpoint's 12
    want = average_checkpoints([run / "snapshots" / "step_8.pt", run / "snapshots" / "step_10.pt",
                                run / "checkpoint.pt"])
    assert all(torch.equal(avg.state_dict()[k], want[k]) for k in want)
    assert not all(torch.equal(avg.state_dict()[k], last.state_dict()[k]) for k in want)
    with pytest.raises(RunError, match=r"cannot average the last 5 snapshots .* has 4 \(steps 4, 8, 10, 12\)"):
        load_run(run, "cpu", average=5)
    # the commands take --average, and a run without enough snapshots is a one-line error
    assert evaluate([str(run), "--sentences", "4", "--average", "3"]) == 0
    assert evaluate([str(run), "--sentences", "4", "--average", "9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot average the last 9 snapshots") and "\n" not in err


@needs_data
def test_ablations_change_one_thing_and_summarise_the_seeds(tmp_path, monkeypatch):
    from attnbook import store
    monkeypatch.chdir(tmp_path)
    assert ablations_command.main(["--out", "abl", "--results", "results", "--variants", "base", "heads-8",
                           "--seeds", "0", "1", "--steps", "3", "--sentences", "4",
                           "--jobs", "1"]) == 0
    res = json.loads((tmp_path / "results" / "ablations.json").read_text())
    base, heads = res["variants"]
    assert [v["variant"] for v in res["variants"]] == ["base", "heads-8"]
    assert heads["parameters"] == base["parameters"]         # more heads, same width: same size
    configs = {}
    for name in ("base", "heads-8"):
        for seed in (0, 1):
            (folder,) = (tmp_path / "abl" / name).glob(f"*seed{seed}*")
            configs[name, seed] = json.loads((folder / "metrics.json").read_text())["config"]
    assert differences(configs["base", 0], configs["heads-8", 0]) == {"h": (4, 8)}
    assert differences(configs["base", 0], configs["base", 1]) == {"seed": (0, 1)}
    assert configs["heads-8", 0]["arch"]["h"] == 8                 # saved nested
    for v in res["variants"]:
        assert [r["seed"] for r in v["runs"]] == [0, 1] and v["test_bleu"]["n"] == 2
        assert v["test_bleu"]["mean"] == pytest.approx(sum(r["test_bleu"] for r in v["runs"]) / 2, abs=0.01)
        for r in v["runs"]:
            assert r["val_perplexity"] == pytest.approx(math.exp(r["val_loss"]), rel=1e-3)
    assert str(tmp_path) not in json.dumps(res)
    assert [c["command"] for c in res["calls"]] == ["python -m attnbook ablations --out abl --results "
                                                    "results --variants base heads-8 --seeds 0 1 "
                                                    "--steps 3 --sentences 4 --jobs 1"]
    # a call adds a variant, in the table's order, and keeps the first call's variants as they were
    assert ablations_command.main(["--out", "abl", "--results", "results", "--variants", "heads-1",
                           "--seeds", "0", "1", "--steps", "3", "--sentences", "4", "--jobs", "1"]) == 0
    merged = json.loads((tmp_path / "results" / "ablations.json").read_text())
    assert [v["variant"] for v in merged["variants"]] == ["base", "heads-1", "heads-8"]
    made_by = store.Result(merged, Path("ablations.json"))
    assert [made_by.calls.index(made_by.call_of(v["variant"])) for v in merged["variants"]] == \
        [0, 1, 0] and len(merged["calls"]) == 2
    assert merged["calls"][1]["command"].endswith("--variants heads-1 --seeds 0 1 --steps 3 "
                                                  "--sentences 4 --jobs 1")
    assert merged["variants"][0] == res["variants"][0] and merged["variants"][2] == res["variants"][1]
    assert merged["train_time_s_sum"] == pytest.approx(
        sum(r["train_time_s"] for v in merged["variants"] for r in v["runs"]), abs=0.2)
    # another test set: one line, exit status 2, before anything is trained; the file untouched
    before = (tmp_path / "results" / "ablations.json").read_text()
    assert ablations_command.main(["--out", "abl", "--results", "results", "--variants", "d-k-8",
                           "--seeds", "0", "--steps", "3", "--sentences", "5", "--jobs", "1"]) == 2
    assert not list((tmp_path / "abl").glob("d-k-8*"))
    assert (tmp_path / "results" / "ablations.json").read_text() == before


def test_ablations_merge_replaces_by_variant_and_refuses_another_setting():
    from attnbook import store
    from attnbook.record import Provenance
    from attnbook.experiments.ablations import merged
    from attnbook.experiments.registry import ROWS

    def merge(old, new):                      # as registry.save merges a call into the file
        return merged(ROWS["ablations"].merge(old, new), old)
    run = {"seed": 0, "test_bleu": 30.0, "train_time_s": 10.0}

    def result(command, variants, **kw):
        call = Provenance(command=command, git_commit="0" * 40, date="d", hardware={})
        return store.result("ablations", {"preset": "cpu-tiny", "test_set": "t (4 sentences)",
                                          **kw, "variants": variants}, call)

    old = result("first", [{"variant": "base", "runs": [run], "call": 0},
                           {"variant": "heads-8", "runs": [run], "call": 0}])
    new = result("second", [{"variant": "heads-8", "runs": [dict(run, train_time_s=5.0)]},
                            {"variant": "d-k-8", "runs": [run]}])
    out = merge(old, new)
    assert [c["command"] for c in out["calls"]] == ["first", "second"]
    assert out["calls"][1]["rows"] == ["heads-8", "d-k-8"]
    made_by = store.Result(out, Path("ablations.json"))
    assert [(v["variant"], made_by.calls.index(made_by.call_of(v["variant"])))
            for v in out["variants"]] == [("base", 0), ("heads-8", 1),
                                                                     ("d-k-8", 1)]
    assert out["train_time_s_sum"] == 25.0
    with pytest.raises(store.ResultError, match="preset differ") as e:
        merge(old, result("third", [], preset="cpu-base"))
    assert "\n" not in str(e.value)


def test_the_board_continues_only_finished_runs(tmp_path):
    """A shorter run still training (a checkpoint, no metrics yet) is not continued: its
    checkpoint is not yet its last step, so the longer run starts from scratch instead."""
    from attnbook.experiments.translators import board_jobs, run_name
    import attnbook.experiments.translators as ex
    cfg = preset("smoke", "transformer")
    short = tmp_path / "reuse" / run_name(replace(cfg, seed=0, max_steps=ex.SNAPSHOTS[0]))
    short.mkdir(parents=True)
    (short / "checkpoint.pt").write_bytes(b"")                 # mid-way: no metrics.json
    jobs = board_jobs("smoke", ["transformer"], [0], tmp_path / "out", tmp_path / "reuse",
                      max_steps=ex.SNAPSHOTS[0] + 10)
    assert len(jobs) == 1 and not jobs[0][1].exists()          # nothing copied: trained afresh
