"""attnbook.store, the one results format: merge by key (a mismatch is one line and writes
nothing), the loader; and every file under results/ carrying the provenance record
(attnbook.record)."""
import json
import shutil
from pathlib import Path

import pytest

from attnbook import store
from attnbook.experiments.registry import EXPERIMENTS
from attnbook.record import Provenance
from attnbook.store import FORMAT, HEX40, ResultError

ROOT = Path(__file__).resolve().parents[1]


def one(rows, command="c", settings=None):
    call = Provenance(command=command, git_commit="0" * 40, date="d", hardware={})
    return store.result("toy", {"settings": settings or {"a": 1}, "runs": rows}, call)


def test_merge_replaces_by_key_keeps_the_rest_and_appends_the_call():
    old = one([{"name": "x", "seed": 0, "v": 1}, {"name": "x", "seed": 1, "v": 2}], "first")
    new = one([{"name": "x", "seed": 1, "v": 5}, {"name": "y", "seed": 0, "v": 7}], "second")
    out = store.merge(old, new, "runs", by=("name", "seed"), same=("settings",))
    assert [(r["name"], r["seed"], r["v"]) for r in out["runs"]] == [("x", 0, 1), ("x", 1, 5),
                                                                     ("y", 0, 7)]
    assert [c["command"] for c in out["calls"]] == ["first", "second"]
    assert out["calls"][1]["rows"] == ["x/1", "y/0"]
    assert old["runs"][1]["v"] == 2                     # the old result is not changed


def test_merge_by_dict_keys_and_by_parts():
    old = {**one([]), "parts": {"a": 1, "b": 2}, "p": {"k": 1}, "q": {"k": 2}}
    new = {**one([]), "parts": {"b": 3}, "q": {"k": 4}}
    assert store.merge(old, new, "parts")["parts"] == {"a": 1, "b": 3}
    out = store.merge(old, new, "", by=("p", "q"))
    assert out["p"] == {"k": 1} and out["q"] == {"k": 4} and out["calls"][1]["rows"] == ["q"]


def test_merge_refuses_other_settings_in_one_line_and_writes_nothing(tmp_path, capsys):
    path = store.write(tmp_path / "r.json", one([{"name": "x", "seed": 0}]))
    before = path.read_text()
    with pytest.raises(ResultError) as e:
        store.merge(store.read(path), one([], settings={"a": 2}), "runs", by=("name", "seed"),
                    same=("settings",))
    assert "\n" not in str(e.value) and "settings differ" in str(e.value)
    assert path.read_text() == before
    with pytest.raises(ResultError, match="the experiment's own result file"):
        store.merge({"runs": []}, one([]), "runs", by=("name",))


def test_load_gives_the_data_the_calls_and_the_rebuild_command(tmp_path, monkeypatch):
    res = store.merge(one([{"name": "x", "seed": 0}], "python -m a"),
                      one([{"name": "y", "seed": 0}], "python -m b"), "runs", by=("name", "seed"))
    store.write(tmp_path / "results" / "cpu" / "r.json", res)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    r = store.load("cpu/r.json")
    assert r["runs"][1]["name"] == "y" and "calls" not in r and r.experiment == "toy"
    assert r.rebuild == "python -m a\npython -m b" and r.calls[0].git_commit == "0" * 40
    with pytest.raises(FileNotFoundError, match="results/cpu/none.json not found"):
        store.load("cpu/none.json")                    # a MissingResult: a ResultError too
    (tmp_path / "results" / "cpu" / "old.json").write_text('{"command": "x"}')
    with pytest.raises(ResultError, match="not in the results format"):
        store.load("cpu/old.json")


def test_every_result_file_carries_the_provenance_record():
    files = sorted((ROOT / "results").rglob("*.json"))
    assert len(files) >= len(EXPERIMENTS)
    for f in files:
        res = json.loads(f.read_text())
        assert res["format"] == FORMAT and res["experiment"], f
        for call in res["calls"]:
            p = Provenance.from_dict(call)
            assert HEX40.fullmatch(p.git_commit), (f, p.command)
            assert p.command.startswith(("python -m attnbook", "torchrun")) and p.date and \
                p.hardware["torch"], f


def test_every_figure_under_results_carries_the_record_of_its_result():
    """A figure (PNG or SVG) drawn from a result file has that file's provenance in its
    metadata: results/cpu/head_ablation.svg, results/bench/cpu/*.png."""
    figures = [f for f in (ROOT / "results").rglob("*") if f.suffix in (".png", ".svg")]
    assert len(figures) >= 5
    for f in figures:
        carried = store.figure_provenance(f)
        res = json.loads(f.with_suffix(".json").read_text())
        assert carried == {k: res[k] for k in ("experiment", "format", "calls")}, f
        assert all(HEX40.fullmatch(c["git_commit"]) for c in carried["calls"]), f


def test_find_looks_above_the_working_folder_then_in_the_installed_package(tmp_path, monkeypatch):
    """A notebook opened on its own runs in a folder with no results/ above it: the committed
    results come with the package (setup.py copies results/ into the wheel: store.SHIPPED)."""
    shipped = tmp_path / "site-packages" / "attnbook" / "results"
    (shipped / "cpu").mkdir(parents=True)
    (shipped / "cpu" / "r.json").write_text("{}")
    monkeypatch.setattr(store, "SHIPPED", (shipped,))
    alone = tmp_path / "colab" / "content"
    alone.mkdir(parents=True)
    monkeypatch.chdir(alone)
    assert store.find("cpu/r.json") == shipped / "cpu" / "r.json"
    assert store.find("cpu/none.json") is None
    (tmp_path / "colab" / "results" / "cpu").mkdir(parents=True)       # results the reader made
    (tmp_path / "colab" / "results" / "cpu" / "r.json").write_text("{}")
    assert store.find("cpu/r.json") == tmp_path / "colab" / "results" / "cpu" / "r.json"
    with pytest.raises(store.MissingResult, match="nor in the installed package; reinstall"):
        store.load("cpu/none.json")


def test_a_wheel_of_the_package_carries_every_committed_result(tmp_path):
    """What the set-up cell installs: setup.py copies results/ into attnbook/results/ of the
    wheel, beside the stored models, so that store.find finds them outside a clone."""
    import subprocess
    import sys
    import zipfile

    tree = tmp_path / "tree"
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes((ROOT / name).read_bytes())
    for folder in ("src", "results"):
        shutil.copytree(ROOT / folder, tree / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "wheel"), str(tree)], check=True, capture_output=True)
    names = set(zipfile.ZipFile(next((tmp_path / "wheel").glob("attnbook-*.whl"))).namelist())
    committed = {f"attnbook/results/{p.relative_to(ROOT / 'results').as_posix()}"
                 for p in (ROOT / "results").rglob("*") if p.is_file()}
    assert committed and committed <= names
    assert "attnbook/stored/cpu-tiny/weights.pt" in names and "attnbook/store.py" in names
