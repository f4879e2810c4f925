"""The one registry of experiments and ``python -m attnbook run``: every committed result file
belongs to exactly one experiment, ``--list`` names each with its file and cost, and every
experiment with a tiny run makes its result in the one format through the command."""
import json
import os
import re
import sys
from pathlib import Path

import pytest

from attnbook import store
from attnbook.record import Provenance
from attnbook.__main__ import main
from attnbook.experiments.registry import EXPERIMENTS
from commandline import run_main
from twice import merged_again, recording

ROOT = Path(__file__).resolve().parents[1]
needs_data = pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"),
                                reason="needs the Multi30k files (MULTI30K_DIR)")


def test_every_result_file_belongs_to_exactly_one_experiment():
    owners = {}
    for e in EXPERIMENTS.values():
        for relative in e.result:
            owners.setdefault(relative, []).append(e.name)
    committed = {p.relative_to(ROOT / "results").as_posix()
                 for p in (ROOT / "results").rglob("*.json")}
    assert committed <= set(owners) and all(len(v) == 1 for v in owners.values())
    for relative in committed:               # and the file says which experiment made it
        assert json.loads((ROOT / "results" / relative).read_text())["experiment"] == \
            owners[relative][0]


def test_list_names_every_experiment_its_file_and_cost(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["run", "--list"]) == 0
    out = capsys.readouterr().out
    for e in EXPERIMENTS.values():
        assert e.name in out and all(f"results/{r}" in out for r in e.result)
    assert "toy_seeds" in out and "CPU-min" in out and "min of training" in out
    assert out.count("cost ") == out.count("full run: python -m attnbook ") == out.count("rows: ") == len(EXPERIMENTS)
    # the key of each experiment that merges, as its value holds it
    assert "runs, one per (name, seed); a merge keeps seeds, scale" in out
    assert "variants, one per (variant); a merge keeps preset, test_set" in out
    assert all(e.rows for e in EXPERIMENTS.values() if e.only and e.name != "bench")
    block = out[out.index("head_ablation_cpu_tiny "):].split("\n")[:4]   # one call a seed
    assert "variants: seeds 0 1 2" in block[2] and "seed{seed}" in block[1]


def test_every_merge_goes_through_the_rows_of_the_registry():
    """The key of a result file's rows is written down once (registry.ROWS): no experiment
    calls store.merge itself."""
    import ast
    for path in (ROOT / "src" / "attnbook").rglob("*.py"):
        if path.name == "registry.py" or path.name == "store.py":
            continue
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr == "merge"
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == "store"]
        assert not calls, f"{path.name} calls store.merge; use registry.ROWS[...].merge"


@pytest.mark.parametrize("argv,message", [
    (["run", "nope"], "invalid choice: 'nope'"),
    (["run", "sweep", "--seeds", "0"], "sweep takes no seeds"),
    (["run", "base", "--only", "x"], "base has no parts to run alone"),
    (["run", "toy_seeds", "--seeds", "0"], "--seeds without --only would merge other seeds "
                                           "into every part of results/cpu/toy_seeds.json"),
    (["run"], "give an experiment's NAME, or --list"),
    (["run", "recall", "--only", "pairs", "--only", "state"], "one --only KEY per call (got "
                                                              "pairs, state)"),
])
def test_mistakes_are_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)                     # where results/ is
    status, _, err = run_main(main, argv, capsys)
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err


SAVES: list = []          # what the commands gave registry.save in the running test (twice.py)


@pytest.fixture(autouse=True)
def saves_recorded(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "SAVES", recording(monkeypatch))


def tiny(name: str, out: str = "tiny", *more) -> dict:
    """Run NAME tiny into ./out (the tests chdir to a temporary folder); its result(s), after
    checking that the same call merged a second time leaves each of its files unchanged."""
    SAVES.clear()
    assert main(["run", name, "--tiny", "--out", out, *more]) == 0
    assert merged_again(SAVES) == [name]
    return {p.relative_to(out).as_posix(): store.read(p) for p in Path(out).rglob("*.json")
            if p.parent.name != "runs" and "runs" not in p.relative_to(out).parts
            and p.name not in ("metrics.json", "config.json")}


def check(result: dict, name: str, command: str) -> None:
    """The result of experiment ``name``, its last call recorded as typed (python -m attnbook
    run ...), with the experiment's own ``command`` that it ran."""
    assert result["experiment"] == name and result["format"] == store.FORMAT
    call = Provenance.from_dict(result["calls"][-1])
    assert call.command.startswith(f"python -m attnbook run {name} --tiny --out tiny")
    assert store.HEX40.fullmatch(call.git_commit) and call.extra["ran"].startswith(command)
    assert call.wall_s >= 0 and call.cpu_s >= 0 and call.hardware["torch"] and call.date


def test_tiny_toy_seeds_then_only_merges_by_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made = tiny("toy_seeds", "tiny", "--seeds", "0")
    check(made["toy_seeds.json"], "toy_seeds", "python -m attnbook toy_seeds --results tiny")
    assert main(["run", "toy_seeds", "--tiny", "--out", "tiny", "--seeds", "0",
                 "--only", "copy"]) == 0
    merged = store.read(Path("tiny/toy_seeds.json"))
    assert [c["rows"] for c in merged["calls"]] == [None, ["copy/0"]]
    # another seed set is refused in one line, and the file is left as it was
    before = Path("tiny/toy_seeds.json").read_text()
    assert main(["run", "toy_seeds", "--tiny", "--out", "tiny", "--seeds", "1", "--only",
                 "copy"]) == 2
    assert Path("tiny/toy_seeds.json").read_text() == before


def test_tiny_arithmetics(tmp_path, monkeypatch):
    """Three workers, each in its environment: their arithmetic is what the caps say."""
    monkeypatch.chdir(tmp_path)
    made = tiny("arithmetics")["arithmetics.json"]
    check(made, "arithmetics", "python -m attnbook arithmetics --results tiny")
    rows = {a["name"]: a for a in made["arithmetics"]}
    assert list(rows) == ["native", "avx2", "plain"]
    assert rows["plain"]["made_with"]["cpu_capability"] == "DEFAULT"
    assert rows["plain"]["made_with"]["isa_caps"] == {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                                                      "ONEDNN_MAX_CPU_ISA": "SSE41"}
    assert set(rows["native"]["last_bits"]) == {"matrix product", "softmax", "sum"}
    assert not any(rows["native"]["last_bits"].values()) and not rows["plain"]["native_bf16"]
    assert any(rows["plain"]["last_bits"].values())        # the plain kernels round otherwise
    assert all(a["gflops"]["fp32"] > 0 and a["gflops"]["bf16"] > 0 for a in rows.values())
    assert [r["run"] for r in rows["avx2"]["runs"]] == made["runs"]
    assert set(rows["native"]["runs"][0]["kinds"]) == {"exact", "token", "final_loss"}
    assert set(rows["native"]["runs"][1]["kinds"]) == {"exact", "token", "final_loss", "align"}
    assert store.figure_provenance(Path("tiny/arithmetics.png"))["calls"] == made["calls"]


def test_tiny_exercises(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check(tiny("exercises")["exercises.json"], "exercises", "python -m attnbook exercise_runs")


def test_tiny_beyond(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check(tiny("beyond", "tiny", "--seeds", "0")["beyond.json"], "beyond",
          "python -m attnbook beyond_runs")


def test_tiny_recall_then_only_merges_by_key(tmp_path, monkeypatch):
    """The state part (every fixed-state model at two more sizes), then the generation costs
    merged in, then the state part again: its rows replace theirs, the generation stays, and
    each call is appended with the parts it made."""
    monkeypatch.chdir(tmp_path)
    made = tiny("recall", "tiny", "--seeds", "0", "--only", "state")["recall.json"]
    check(made, "recall", "python -m attnbook recall_runs")
    assert main(["run", "recall", "--tiny", "--out", "tiny", "--seeds", "0",
                 "--only", "generation"]) == 0
    made = store.read(Path("tiny/recall.json"))
    runs = made["runs"]
    assert len(runs) == 8 and {r["part"] for r in runs} == {"state"}
    assert all(0 <= r["accuracy"] <= 1 and r["state_numbers"] > 0 for r in runs)
    small = {r["mixer"]: r["state_numbers"] for r in runs if r["d_state"] == 2 or r["h"] == 8}
    large = {r["mixer"]: r["state_numbers"] for r in runs if r["d_state"] >= 16 or r["h"] == 1}
    assert all(large[m] > small[m] for m in ("lti", "selective", "linear"))
    gen = {(g["mixer"], g["t"]): g["state_bytes"] for g in made["generation"]}
    assert gen[("attention", 16)] == 2 * gen[("attention", 8)]            # the cache grows
    assert gen[("selective", 16)] == gen[("selective", 8)]                # the state does not
    assert [c["rows"] for c in made["calls"]] == [["state"], ["generation"]]
    assert main(["run", "recall", "--tiny", "--out", "tiny", "--seeds", "0",
                 "--only", "state"]) == 0
    merged = store.read(Path("tiny/recall.json"))
    assert len(merged["runs"]) == 8 and merged["generation"] == made["generation"]
    assert [c["rows"] for c in merged["calls"]] == [["state"], ["generation"], ["state"]]


def test_tiny_bench(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check(tiny("bench")["cpu/decoding.json"], "bench", "python -m attnbook benchmarks")


@needs_data
def test_tiny_ablations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check(tiny("ablations", "tiny", "--seeds", "0")["ablations.json"], "ablations",
          "python -m attnbook ablations")


@needs_data
def test_tiny_sweep_and_board(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check(tiny("sweep")["sweep.json"], "sweep", "python -m attnbook translators sweep")
    check(tiny("board")["board.json"], "board", "python -m attnbook translators board")
    # --only MODEL adds a model's runs to both files: the old rows, choices and summaries stay
    for name in ("sweep", "board"):
        before = store.read(Path(f"tiny/{name}.json"))
        assert main(["run", name, "--tiny", "--out", "tiny", "--only", "conv"]) == 0
        after = store.read(Path(f"tiny/{name}.json"))
        added = after["runs"][len(before["runs"]):]
        assert after["runs"][:len(before["runs"])] == before["runs"] and len(after["calls"]) == 2
        assert added and all(r["model"] == "conv" for r in added)
        assert after["calls"][1]["rows"] == [f"conv/{r['peak_lr']}/{r['seed']}" for r in added]
        key = "chosen_peak_lr" if name == "sweep" else "summary_test_bleu"
        assert set(after[key]) == {"transformer", "conv"} and after[key]["transformer"] == before[key]["transformer"]
    assert all("conv" in e and "transformer" in e for e in after["examples"])
    # a sweep at another preset and rates, under its own name
    made = tiny("sweep_base")["sweep_base.json"]
    check(made, "sweep_base", "python -m attnbook translators sweep")
    assert sorted(r["peak_lr"] for r in made["runs"]) == [2e-3, 4e-3] and made["preset"] == "smoke"
    assert set(made["chosen_peak_lr"]) == {"gru-additive"}
    made = tiny("base")["cpu_base.json"]
    check(made, "base", "python -m attnbook translators base")
    assert {r["config"]["max_steps"] for r in made["runs"]} == {2} and made["preset"] == "cpu-base"


@needs_data
def test_tiny_evening_then_only_merges(tmp_path, monkeypatch):
    """evening trains two models at cpu-base (tiny), scores both decoders, bootstraps the pair;
    --only runs one model again (its finished run and scores are reused) and merges it in,
    keeping the other model's runs and the pair's bootstrap."""
    monkeypatch.chdir(tmp_path)
    made = tiny("evening")["evening.json"]
    check(made, "evening", "python -m attnbook evening")
    assert [(r["model"], r["seed"]) for r in made["runs"]] == [("transformer", 0), ("gru-additive", 0)]
    assert all(r["config"]["preset"] == "cpu-base" and r["config"]["max_steps"] == 2
               and r["threads"] == 2 for r in made["runs"])
    assert {(b["a"], b["b"], b["decoding"]) for b in made["bootstrap"]} == {
        ("transformer", "gru-additive", "beam"), ("transformer", "gru-additive", "greedy")}
    assert all(0 < b["p_value"] <= 1 and b["step"] == "end" for b in made["bootstrap"])
    assert made["summary"]["gru-additive"]["test_bleu"]["n"] == 1
    assert main(["run", "evening", "--tiny", "--out", "tiny", "--only", "transformer"]) == 0
    after = store.read(Path("tiny/evening.json"))
    assert sorted(map(str, after["runs"])) == sorted(map(str, made["runs"]))
    assert after["calls"][1]["rows"] == ["transformer/0"] and len(after["calls"]) == 2
    assert after["bootstrap"] == made["bootstrap"] and after["summary"] == made["summary"]


def test_evening_gives_the_gru_the_transformers_minutes_not_its_steps():
    from attnbook.experiments.evening import STEPS, evening_jobs
    from attnbook.training.recipe import PEAK_LR, preset
    (t, _), (g, folder) = evening_jobs(["transformer", "gru-additive"], [1], Path("runs/x"))
    base = preset("cpu-base")
    assert (t.max_steps, t.snapshot_steps, t.seed) == (base.max_steps, base.snapshot_steps, 1)
    assert g.max_steps == STEPS["gru-additive"] > base.max_steps and folder == Path("runs/x/gru-additive_seed1")
    shift = g.max_steps - base.max_steps          # the same snapshots, counted back from the end
    assert g.snapshot_steps == tuple(s + shift for s in base.snapshot_steps)
    assert g.peak_lr == PEAK_LR["cpu-base"]["gru-additive"] and g.arch == preset("cpu-base", "gru-additive").arch
    (tiny_g, _), = evening_jobs(["gru-additive"], [0], Path("runs/x"), steps=2)
    assert tiny_g.max_steps == 2 and tiny_g.snapshot_steps == ()


@needs_data
def test_tiny_timing_then_what_measures_its_run(tmp_path, monkeypatch):
    """timing_2threads trains a tiny run (its metrics become the result); head_ablation,
    head_ablation_cpu_tiny and score_scales measure that run, tiny."""
    monkeypatch.chdir(tmp_path)
    made = tiny("timing_2threads")
    check(made["cpu_tiny_transformer_2threads.json"], "timing_2threads",
          "python -m attnbook train --preset smoke")
    assert made["cpu_tiny_transformer_2threads.json"]["steps"] == 2
    check(tiny("score_scales")["score_scales.json"], "score_scales",
          "python -m attnbook score_scales")
    check(tiny("head_ablation")["head_ablation.json"], "head_ablation",
          "python -m attnbook head_ablation")
    made = tiny("head_ablation_cpu_tiny", "tiny", "--seeds", "0")
    check(made["head_ablation_cpu_tiny/seed0.json"], "head_ablation_cpu_tiny",
          "python -m attnbook head_ablation")


# Experiments whose call is the GPU call: its dry run runs in tests/test_gpu_run.py, in a process
# of its own, and the call writes its summary through registry.save, whole; the test there saves
# the full plan's summary again. The eager plan's is written by the same function.
MERGED_TWICE_ELSEWHERE = {"gpu_run_eager": "the full plan's summary (tests/test_gpu_run.py)"}


def test_every_tiny_run_is_merged_twice_by_a_test():
    """Each experiment with a tiny run has a test that runs it and merges its call a second
    time (tests/twice.py): here through tiny(), elsewhere `merged_again(saves) == [...]` (or
    `saved_again`, the GPU call's)."""
    checked = set()
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        text = path.read_text()
        if path.name == "test_registry.py":
            checked |= set(re.findall(r'\btiny\("(\w+)"', text))
        for m in re.finditer(r"(?:merged|saved)_again\(.*\) == \[([^\]]*)\]", text):
            checked |= set(re.findall(r'"(\w+)"', m.group(1)))
    want = {name for name, e in EXPERIMENTS.items() if e.tiny}
    assert want - set(MERGED_TWICE_ELSEWHERE) <= checked, sorted(want - checked)
    assert checked <= set(EXPERIMENTS) and len(want) >= 20


# --- the commands the prose shows -----------------------------------------------------------

def _prose():
    """(page, text) of every prose page: book/*.md, the README, the notebooks' markdown."""
    import json as _json
    root = Path(__file__).resolve().parents[1]
    pages = [(p.relative_to(root).as_posix(), p.read_text()) for p in sorted((root / "book").glob("*.md"))]
    pages.append(("README.md", (root / "README.md").read_text()))
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        cells = _json.loads(nb.read_text())["cells"]
        pages.append((f"notebooks/{nb.name}", "\n".join("".join(c["source"]) for c in cells
                                                         if c["cell_type"] == "markdown")))
    return pages


def test_the_prose_rebuilds_committed_results_only_through_the_registry():
    """A committed result is rebuilt with `python -m attnbook run NAME` (its arguments live in
    the registry, once); a page that writes an experiment's full command into results/cpu,
    results/gpu or results/bench by hand would drift from it."""
    import re
    commands = {e.command for e in EXPERIMENTS.values()}
    by_hand = re.compile(r"python -m attnbook (\w+)[^\n`]*--(?:out|results) results/(?:cpu|gpu|bench)")
    named = re.compile(r"python -m attnbook run (?!--)([\w-]+)")
    found = []
    for page, text in _prose():
        found += [f"{page}: {m.group(0)}" for m in by_hand.finditer(text) if m.group(1) in commands]
        found += [f"{page}: unknown experiment {m.group(1)!r}" for m in named.finditer(text)
                  if m.group(1) not in EXPERIMENTS and m.group(1) != "NAME"]
    assert not found, "\n".join(found)


def test_an_experiment_without_a_tiny_run_says_so(capsys, monkeypatch):
    from attnbook.experiments import registry
    monkeypatch.setitem(registry.EXPERIMENTS, "long", registry.Experiment(
        "long", "gpu_run", ("gpu/long.json",), "nowhere", ("--out", "OUT"), seeds_flag="",
        needs="a GPU"))
    assert main(["run", "long", "--tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: long has no tiny run (it needs a GPU)") and err.count("\n") == 1


def test_the_gpu_calls_tiny_run_is_its_dry_run():
    """tests/test_gpu_run.py runs the dry run itself, through tools/gpu_run.sh as a GPU machine
    would; here only that `run gpu_run --tiny` asks for it."""
    assert EXPERIMENTS["gpu_run"].argv(tiny_out="tiny") == ["--dry-run", "--out", "tiny"]
