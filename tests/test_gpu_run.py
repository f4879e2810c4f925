"""The GPU call (python -m attnbook gpu_run, tools/gpu_run.sh): its dry run on the CPU, the time
limits of its parts, its deadline, and the step that turns its files into results."""
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from attnbook.experiments import gpu_run
from attnbook.commands import gpu_run as gpu_run_command
from attnbook.benchmarks.suite import SECTIONS
from attnbook.store import figure_provenance, load
from attnbook import record, store
from attnbook.benchmarks.attention import bench_attention
from attnbook.training.recipe import preset
from commandline import run_main
from twice import merged_again

ROOT = Path(__file__).resolve().parents[1]


def dry_call(tmp: Path, *options: str) -> tuple[Path, dict]:
    """A dry run of the call through the script a GPU machine runs: its OUT and summary."""
    out, work = tmp / "out", tmp / "work"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    run = subprocess.run(["bash", str(ROOT / "tools" / "gpu_run.sh"), "--dry-run", *options,
                          "--work", str(work)], env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out, json.loads((out / "gpu_run.json").read_text())


# The dry run runs one of the five benchmark parts through the call: tests/test_bench.py runs
# every section (quick) through the same command, and test_every_benchmark_part_is_its_section
# checks the other parts' command lines; each benchmark part costs a process of its own.
DRY_BENCH = "bench-decoding"
DRY_PARTS = [p for p in gpu_run.PARTS if not p.startswith("bench-") or p == DRY_BENCH]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run of the call: every part but four of the five benchmark sections."""
    return dry_call(tmp_path_factory.mktemp("gpu-call"),
                    *[a for p in DRY_PARTS for a in ("--only", p)])


def saved_again(out: Path, copy: Path) -> list:
    """The call's summary in ``out`` copied to ``copy`` and saved there a second time."""
    shutil.copy2(out / "gpu_run.json", copy)
    summary = json.loads(copy.read_text())
    data = {k: v for k, v in summary.items() if k not in ("experiment", "format", "calls")}
    call = record.Provenance.from_dict(summary["calls"][0])
    return merged_again([((summary["experiment"], copy, data, call), {})])


def test_every_plan_makes_an_experiment_of_the_registry():
    """A call's summary is written as its plan's experiment, and --collect copies it to a file
    that experiment owns: no plan leaves a result file that no experiment made."""
    from attnbook.experiments.registry import EXPERIMENTS
    for name in gpu_run.PLANS:
        experiment = EXPERIMENTS[gpu_run.experiment_of(name)]
        assert experiment.command == "gpu_run"
        if not name.startswith("dry"):
            assert f"gpu/{gpu_run.result_stem(name)}.json" in experiment.result, name
    assert gpu_run.experiment_of("dry-seeds") == gpu_run.experiment_of("seeds") == "gpu_run_seeds"


def test_the_calls_summary_saved_again_is_the_same_file(dry_run, dry_seeds, tmp_path):
    """The call's summary is written through registry.save, whole (no rows): the same call
    saved a second time leaves the file as it was, its record included."""
    assert saved_again(dry_run[0], tmp_path / "full.json") == ["gpu_run"]
    assert saved_again(dry_seeds[0], tmp_path / "seeds.json") == ["gpu_run_seeds"]


def test_dry_run_runs_every_part_within_its_limit(dry_run):
    _, summary = dry_run
    assert summary["dry_run"] is True and list(summary["parts"]) == DRY_PARTS
    for part, rec in summary["parts"].items():
        assert rec["status"] == "ok", (part, rec)
        assert 0 < rec["seconds"] <= rec["limit_s"] == gpu_run.DRY.limits[part]
    assert summary["parts"]["train"]["return_codes"] == [0] * len(gpu_run.DRY_CANDIDATES)
    assert summary["check"]["data"] == {"train": 29000, "val": 1014, "test_2016_flickr": 1000}
    assert summary["check"]["problems"] == []


def test_dry_run_trains_every_candidate_for_its_time_and_keeps_the_curves(dry_run):
    _, summary = dry_run
    runs = summary["candidates"]
    assert set(runs) == set(gpu_run.DRY_CANDIDATES)
    for name, run in runs.items():
        assert run["finished"] and run["steps"] >= 5, name
        assert gpu_run.DRY.train_seconds <= run["train_time_s"] < gpu_run.DRY.train_seconds + 5
        steps = [p["step"] for p in run["curve"]]
        assert steps == sorted(steps) and steps[-1] == run["steps"] and len(steps) >= 2
        assert run["val_loss"] == run["curve"][-1]["val_loss"]
    assert runs["pre-ln"]["config"]["norm_first"] is True
    assert runs["paper"]["config"]["norm_first"] is False
    # the best of each family is the one with the lowest validation loss
    for model, name in summary["best"].items():
        rivals = [r["val_loss"] for r in runs.values() if r["model"] == model]
        assert runs[name]["model"] == model and runs[name]["val_loss"] == min(rivals)
    assert set(summary["best"]) == {"transformer", "gru-additive"}


def test_dry_run_scores_the_best_with_beam_and_greedy_search(dry_run):
    _, summary = dry_run
    scores = summary["scores"]
    assert scores["test_set"] == "test_2016_flickr (16 of 1000 sentences)"
    for name in summary["best"].values():
        got = scores["runs"][name]
        assert set(got) == {"beam 4, alpha 0.6", "greedy"}
        for s in got.values():
            assert 0 <= s["bleu"] <= 100 and s["signature"].startswith("nrefs:1|case:mixed")
            assert len(s["examples"]) == 3
    others = set(summary["candidates"]) - set(summary["best"].values())
    assert {n for n in scores["runs"] if n in others} == others   # then the rest, greedily
    assert all(set(scores["runs"][n]) == {"greedy"} for n in others)


def test_dry_run_writes_few_files_with_provenance_and_no_local_paths(dry_run):
    out, summary = dry_run
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["cpu/decoding.json", "gpu_run.json", "gpu_run.log", "gpu_run.png"]
    (prov,) = summary["calls"]                     # the one provenance record (attnbook.store)
    assert prov["command"] == "python -m attnbook gpu_run --dry-run " + \
        " ".join(f"--only {p}" for p in DRY_PARTS) + " --out OUT"     # the parts it ran
    assert prov["hardware"]["torch"] == torch.__version__
    assert prov["wall_s"] > 0 and prov["cpu_s"] > 0 and len(prov["git_commit"]) == 40
    assert len(prov["load_before"]) == len(prov["load_after"]) == 3
    assert prov["processes"] == len(gpu_run.DRY_CANDIDATES) == \
        prov["extra"]["processes_at_once"]["train"]
    for f in out.rglob("*.json"):
        text = f.read_text()
        assert str(out) not in text and "/tmp/" not in text and str(ROOT) not in text, f
    res = json.loads((out / "cpu" / "decoding.json").read_text())
    assert res["benchmark"] == "decoding" and res["short"] is True and res["quick"] is True
    assert res["calls"][0]["command"].startswith("python -m attnbook benchmarks --only decoding")
    assert (out / "gpu_run.png").stat().st_size > 20_000
    assert figure_provenance(out / "gpu_run.png")["calls"] == summary["calls"]


def test_every_benchmark_part_is_its_section():
    """Each bench-SECTION part runs that section of the suite, short, in OUT (without plots:
    collect draws them), quick in a dry run; and the parts are the suite's sections."""
    assert sorted(p for p in gpu_run.PARTS if p.startswith("bench-")) == \
        sorted(f"bench-{s}" for s in SECTIONS)
    # the whole call's files: one a section and the summary, log and figure; at most 8 come back
    assert len(SECTIONS) + 3 <= 8
    for plan in (gpu_run.DRY, gpu_run.FULL):
        for section in SECTIONS:
            (cmd,) = gpu_run.part_commands(f"bench-{section}", plan, Path("work"))
            assert cmd[:6] == [sys.executable, "-m", "attnbook", "benchmarks", "--only", section]
            assert cmd[cmd.index("--device") + 1] == plan.device == cmd[cmd.index("--out") + 1]
            assert "--short" in cmd and "--no-plots" in cmd and ("--quick" in cmd) == plan.dry


def test_collect_copies_the_files_and_draws_the_benchmark_figures(dry_run, tmp_path):
    out, _ = dry_run
    copied = gpu_run.collect(out, tmp_path / "results", allow_dry=True)
    names = sorted(p.relative_to(tmp_path / "results").as_posix() for p in copied)
    assert names == ["bench/cpu/decoding.json", "gpu/gpu_run_dry.json", "gpu/gpu_run_dry.png"]
    assert (tmp_path / "results" / "bench" / "cpu" / "decoding.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="dry run"):
        gpu_run.collect(out, tmp_path / "results")


def test_collect_refuses_a_file_that_names_a_local_path(tmp_path):
    summary = {"dry_run": False, "plan": {"name": "full", "device": "cuda"},
               "where": "/tmp/x/runs"}
    (tmp_path / "gpu_run.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="names a path"):
        gpu_run.collect(tmp_path, tmp_path / "results")
    with pytest.raises(FileNotFoundError, match="gpu_run.json not found"):
        gpu_run.collect(tmp_path / "nowhere", tmp_path / "results")


def test_a_part_over_its_limit_is_killed_with_what_it_started(tmp_path):
    log = tmp_path / "log"
    # the child starts a grandchild: both must go when the limit passes
    sleeper = [sys.executable, "-c", "import subprocess, sys, time; "
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
               "print('started', flush=True); time.sleep(60)"]
    start = time.perf_counter()
    record = gpu_run.run_processes([sleeper, [sys.executable, "-c", "pass"]], 2.0, log)
    assert time.perf_counter() - start < 20
    assert record["status"] == "timeout" and record["return_codes"][0] != 0
    assert record["return_codes"][1] == 0 and record["limit_s"] == 2.0
    assert "started" in log.read_text()
    gone = subprocess.run(["pgrep", "-f", "time.sleep\\(60\\)"], capture_output=True, text=True)
    assert gone.stdout.strip() == ""
    failed = gpu_run.run_processes([[sys.executable, "-c", "raise SystemExit(3)"]], 10, log)
    assert failed["status"] == "failed" and failed["return_codes"] == [3]


def test_past_the_deadline_every_part_is_skipped_and_the_summary_still_written(tmp_path):
    plan = replace(gpu_run.DRY, minutes=0.2)          # 12 s, less the summary's 15 s
    summary = gpu_run.run_call(plan, tmp_path / "out", tmp_path / "work", None)
    assert {r["status"] for r in summary["parts"].values()} == {"skipped"}
    assert json.loads((tmp_path / "out" / "gpu_run.json").read_text())["parts"] == summary["parts"]
    assert not (tmp_path / "out" / "gpu_run.png").exists()       # no curve, no figure


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_the_full_call_on_a_machine_without_a_gpu_stops_at_the_check(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "work" / "runs").mkdir(parents=True)
    summary = gpu_run.run_call(gpu_run.FULL, tmp_path / "out", tmp_path / "work", None,
                               only=["check", "train"])
    assert summary["parts"]["check"]["status"] == "failed"
    assert summary["parts"]["train"] == {"status": "skipped", "why": "the check failed (see check)"}
    assert any("sees no CUDA GPU" in p for p in summary["check"]["problems"])


def test_the_candidates_are_what_the_plan_says():
    base = preset("gpu-base")
    for name, (model, changes) in gpu_run.CANDIDATES.items():
        cfg = gpu_run.candidate_config(gpu_run.FULL, name)
        assert cfg.model == model and cfg.time_budget_s == gpu_run.FULL.train_seconds
        assert cfg.compile is False and cfg.precision == "auto"     # the race trains eager
        assert cfg.max_steps > 10 ** 5                      # the clock ends the run, not a count
        for key, value in changes.items():
            assert getattr(cfg.arch, key, getattr(cfg, key, None)) == value, (name, key)
    paper = gpu_run.candidate_config(gpu_run.FULL, "paper")       # the paper's schedule
    assert (paper.warmup, paper.peak_lr, paper.arch) == (2000, 512 ** -0.5 * 2000 ** -0.5, base.arch)
    # gpu-base is the race's winner (results/gpu/gpu_run_eager.json), for the steps it trained
    race = load("gpu/gpu_run_eager.json")
    winner = race["candidates"][race["best"]["transformer"]]
    assert {k: getattr(base.arch, k, getattr(base, k, None)) for k in winner["config"]} == \
        {**winner["config"], "compile": False} and not base.compile
    assert abs(base.max_steps - winner["steps"]) < 25 and base.time_budget_s == 0
    assert {m for m, _ in gpu_run.CANDIDATES.values()} == {"transformer", "gru-additive"}


def test_command_line_errors_are_one_line(tmp_path, capsys):
    for argv in (["--out", str(tmp_path), "--collect", str(tmp_path)], [],
                 ["--collect", str(tmp_path / "none")], ["--out", str(tmp_path), "--only", "x"]):
        code, _, err = run_main(gpu_run_command.main, argv, capsys)
        assert code == 2, argv
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, lines)


def test_prepare_data_copies_the_checked_files_and_the_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_run, "git_commit", lambda: ("a" * 40, False))
    files = gpu_run.prepare_data(tmp_path)
    assert sorted(f.name for f in files) == sorted(
        f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in ("de", "en", "fr"))
    assert all(f.parent == tmp_path / "multi30k" and f.stat().st_size > 1000 for f in files)
    assert (tmp_path / "COMMIT").read_text().split() == ["a" * 40, record.src_digest()]
    monkeypatch.setattr(gpu_run, "git_commit", lambda: ("a" * 40, True))
    with pytest.raises(ValueError, match="uncommitted changes"):
        gpu_run.prepare_data(tmp_path / "dirty")


def test_a_recorded_commit_clears_a_stale_gits_uncommitted_changes(tmp_path, monkeypatch):
    """A lent machine's stale .git sees src/ as changed; with src/ the recorded commit's code
    the call's record names that commit and no changes. Without the record the flag stays."""
    monkeypatch.setattr(record, "COMMIT_FILE", tmp_path / "copy" / "COMMIT")
    monkeypatch.setattr(record, "_git", lambda root: ("b" * 40, True))
    monkeypatch.delenv("ATTNBOOK_GIT_COMMIT", raising=False)
    plan = replace(gpu_run.DRY, minutes=0.2)                 # every part skipped: seconds
    call = gpu_run.run_call(plan, tmp_path / "out1", tmp_path / "work1", None)["calls"][0]
    assert call["git_commit"] == "b" * 40 and call["extra"]["uncommitted_changes"] is True
    record.write_commit("c" * 40)
    call = gpu_run.run_call(plan, tmp_path / "out2", tmp_path / "work2", None)["calls"][0]
    assert call["git_commit"] == "c" * 40 and "uncommitted_changes" not in call["extra"]


# --- the benchmarks' GPU paths that a CPU can run ----------------------------------------------

def test_sdpa_backends_are_measured_or_listed_once_as_unavailable():
    res = bench_attention(torch.device("cpu"), quick=True, backends=True)
    names = {r["name"] for r in res["results"]}
    assert {"SDPA math", "SDPA flash"} <= names           # a CPU has these two
    missing = [c for c in res["capped"] if c["name"] in ("SDPA memory-efficient", "SDPA cuDNN")]
    assert len(missing) == 2 and all(c["why"].startswith("unavailable on cpu") for c in missing)
    assert "backends" in res["settings"]
    plain = bench_attention(torch.device("cpu"), quick=True)    # the CPU's default: no backends
    assert not any(r["name"].startswith("SDPA") for r in plain["results"])


def test_the_readme_table_states_the_plan():
    """The README's table of parts quotes each limit and the training time from the plan."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| part | what it does | limit |"):]
    table = table[:table.index("\n\n")]
    rows = {line.split("|")[1].strip(" `"): line.split("|")[-2].strip()
            for line in table.splitlines()[2:]}
    assert rows == {part: f"{limit} s" for part, limit in gpu_run.FULL.limits.items()}
    assert f"each for {gpu_run.FULL.train_seconds:.0f} s of training" in table
    assert "at most nine minutes" in readme and gpu_run.FULL.minutes == 9


def test_the_eager_plan_is_the_full_race_without_compiling_and_fits_its_deadline():
    eager = gpu_run.EAGER
    assert eager.parts == ("check", "train", "score") and not eager.compile
    assert set(eager.candidates) < set(gpu_run.CANDIDATES)
    assert {m for m, _ in eager.candidates.values()} == {"transformer", "gru-additive"}
    for name in eager.candidates:
        cfg = gpu_run.candidate_config(eager, name)
        assert cfg.compile is False and cfg.time_budget_s == eager.train_seconds
    assert eager.limits["train"] > eager.train_seconds
    assert sum(eager.limits[p] for p in eager.parts) + 15 <= 60 * eager.minutes
    assert gpu_run.result_stem("full") == "gpu_run" and gpu_run.result_stem("eager") == "gpu_run_eager"


# --- the seeds plan ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dry_seeds(tmp_path_factory):
    """One dry run of the seeds plan (two seeds of two families, tiny, on the CPU)."""
    return dry_call(tmp_path_factory.mktemp("gpu-seeds"), "--plan", "seeds")


def test_the_seeds_plan_scores_every_run_both_ways_and_bootstraps_the_families(dry_seeds):
    out, summary = dry_seeds
    plan = gpu_run.DRY_SEEDS
    assert summary["dry_run"] is True and list(summary["parts"]) == list(plan.parts)
    assert all(r["status"] == "ok" for r in summary["parts"].values()), summary["parts"]
    assert summary["calls"][0]["command"] == \
        "python -m attnbook gpu_run --dry-run --plan seeds --out OUT"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_run.json", "gpu_run.log", "gpu_run.png",
                                                     "gpu_run_hypotheses.json"]
    runs = summary["scores"]["runs"]
    assert set(runs) == set(plan.candidates) == set(summary["candidates"])
    assert all(set(r) == {"beam 4, alpha 0.6", "greedy"} for r in runs.values())
    hyps = json.loads((out / "gpu_run_hypotheses.json").read_text())
    assert all(len(hyps[n]["beam"]) == len(hyps[n]["greedy"]) == 16 for n in runs)
    assert all(hyps[n]["greedy"][:3] == runs[n]["greedy"]["examples"] for n in runs)
    # every two families, seed with seed, both decodings; each row's BLEU is its run's score
    rows = summary["scores"]["bootstrap"]
    families = list(dict.fromkeys(m for m, _ in plan.candidates.values()))
    assert len(families) >= 2 and set(families) <= set(gpu_run.SEED_FAMILIES)
    assert {(r["a"], r["b"]) for r in rows} == {(a, b) for i, a in enumerate(families)
                                                for b in families[i + 1:]}
    pairs = len(families) * (len(families) - 1) // 2
    assert len(rows) == pairs * 2 * 2 and {r["seed"] for r in rows} == {0, 1}
    for r in rows:
        key = "greedy" if r["decoding"] == "greedy" else "beam 4, alpha 0.6"
        assert r["bleu_a"] == runs[f"{r['a']}-seed{r['seed']}"][key]["bleu"]
        assert r["bleu_b"] == runs[f"{r['b']}-seed{r['seed']}"][key]["bleu"]
        assert 0 < r["p_value"] <= 1 and r["step"] == "end"


def test_the_seeds_plan_races_the_chosen_recipes_and_fits_its_deadline():
    seeds = gpu_run.SEEDS
    assert seeds.score_all and not seeds.compile and seeds.parts == ("check", "train", "score")
    assert sum(seeds.limits[p] for p in seeds.parts) + 15 <= 60 * seeds.minutes
    assert seeds.limits["train"] > seeds.train_seconds
    eager = gpu_run.candidate_config(gpu_run.EAGER, "warmup-400")
    gru = gpu_run.candidate_config(gpu_run.EAGER, "gru-additive-1e-3")
    for name, (model, changes) in seeds.candidates.items():
        cfg = gpu_run.candidate_config(seeds, name)
        assert name == f"{model}-seed{cfg.seed}" and cfg.time_budget_s == seeds.train_seconds
        chosen = gru if model == "gru-additive" else eager   # decoder-only: the Transformer's
        assert (cfg.peak_lr, cfg.warmup, cfg.max_tokens, cfg.arch) == \
            (chosen.peak_lr, chosen.warmup, chosen.max_tokens, chosen.arch)
    assert sorted(c.get("seed") for _, c in seeds.candidates.values()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert gpu_run.result_stem("seeds") == "gpu_run_seeds"


def test_an_alone_plan_trains_its_candidates_one_at_a_time(tmp_path, monkeypatch):
    """select and families give each run the GPU to itself: one training process at a time."""
    calls = []
    monkeypatch.setattr(gpu_run, "run_processes", lambda commands, limit, *a, **k: calls.append(
        (commands, limit)) or {"status": "ok", "return_codes": [0] * len(commands),
                               "limit_s": limit, "seconds": 0.0})
    plan = gpu_run.PLANS["dry-select"]
    (tmp_path / "out").mkdir()
    parts = gpu_run.run_parts(plan, tmp_path / "out", tmp_path / "work", None, only=["train"])
    assert [len(c) for c, _ in calls] == [1] * len(plan.candidates) and len(calls) == 2
    assert [c[0][-1] for c, _ in calls] == list(plan.candidates)          # in the plan's order
    assert parts["train"]["status"] == "ok" and parts["train"]["one_at_a_time"]
    calls.clear()
    gpu_run.run_parts(gpu_run.DRY, tmp_path / "out", tmp_path / "work", None, only=["train"])
    assert [len(c) for c, _ in calls] == [len(gpu_run.DRY.candidates)]     # the race: at once


def test_one_at_a_time_shares_what_is_left_of_the_limit(tmp_path):
    quick = [sys.executable, "-c", "pass"]
    slow = [sys.executable, "-c", "import time; time.sleep(30)"]
    done = gpu_run.run_one_at_a_time([quick, quick], 60, tmp_path / "log")
    assert done["status"] == "ok" and done["return_codes"] == [0, 0] and done["seconds"] < 30
    late = gpu_run.run_one_at_a_time([slow, quick], 2, tmp_path / "log")
    assert late["status"] == "timeout" and late["seconds"] < 10


def test_the_prepared_gpu_plans_fit_their_calls():
    """The calls a GPU session runs at once (issue 38): each plan's parts fit its deadline, and
    every candidate is a valid configuration of gpu-base."""
    for k in range(3):
        plan = gpu_run.PLANS[f"families{k}"]
        assert plan.alone and plan.score_all and plan.device == "cuda"
        assert [m for m, _ in plan.candidates.values()] == list(gpu_run.FAMILIES)
        assert all(c["seed"] == k for _, c in plan.candidates.values())
    for name in ("select", "families0", "seeds", "eager"):        # full: its deadline cuts the last
        plan = gpu_run.PLANS[name]
        assert sum(plan.limits[p] for p in plan.parts) <= plan.minutes * 60 + 60, name
        if plan.alone:            # every run's training fits its share of the train part
            assert plan.train_seconds * len(plan.candidates) < plan.limits["train"]
        for c in plan.candidates:
            gpu_run.candidate_config(plan, c)                 # raises on an invalid one


def test_the_recall_plan_measures_generation_and_collect_takes_its_file(tmp_path):
    """The plan 'recall' (chapter 13's cost of generating on a GPU), dry: the check, then
    recall_runs --only generation in OUT; --collect copies its file to results/gpu/."""
    out = tmp_path / "out"
    assert gpu_run_command.main(["--dry-run", "--plan", "recall", "--out", str(out),
                         "--work", str(tmp_path / "work")]) == 0
    summary = json.loads((out / "gpu_run.json").read_text())
    assert list(summary["parts"]) == ["check", "recall-generation"]
    assert all(p["status"] == "ok" for p in summary["parts"].values())
    made = store.read(out / "recall_generation.json")
    # on the CPU (the dry run) the file is the CPU experiment's kind; on a GPU "recall_gpu"
    assert made["experiment"] == "recall" and made["generation_settings"]["lengths"] == [64, 128]
    assert {(g["mixer"], g["t"]) for g in made["generation"]} == {
        (m, t) for m in ("attention", "selective") for t in (64, 128)}
    copied = gpu_run.collect(out, tmp_path / "results", allow_dry=True)
    assert tmp_path / "results" / "gpu" / "recall_generation.json" in copied
    plan = gpu_run.PLANS["recall"]
    assert sum(plan.limits[p] for p in plan.parts) <= plan.minutes * 60
