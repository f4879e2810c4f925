"""attnbook.experiments.store, the one results format: the record of a call, merge by key (a mismatch is one
line and writes nothing), the loader; attnbook.experiments.convert, the old files re-expressed without a
number changed; and every file under results/ carrying the provenance record."""
import json
import subprocess
from pathlib import Path

import pytest

from attnbook.experiments import store
from attnbook.experiments.convert import EXPERIMENT_OF, convert, split
from attnbook.experiments.store import FORMAT, HEX40, Provenance, ResultError

ROOT = Path(__file__).resolve().parents[1]
CONVERTED_FROM = "91add26eb00cc1611986444edb283e5d5b85cc23"  # before the conversion


def leaves(o):
    if isinstance(o, dict):
        for v in o.values():
            yield from leaves(v)
    elif isinstance(o, list):
        for v in o:
            yield from leaves(v)
    else:
        yield o


def test_record_measures_the_call():
    with store.record("python -m attnbook run x --tiny", threads=1, note="n") as call:
        sum(i * i for i in range(10 ** 5))
    assert HEX40.fullmatch(call.git_commit) and call.threads == 1 and call.processes == 1
    assert call.wall_s >= 0 and call.cpu_s >= 0 and len(call.load_before) == 3
    assert call.hardware["torch"] and call.note == "n" and call.date[:2] == "20"


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
    with pytest.raises(ResultError, match="convert it first"):
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


def old_version(relative: str) -> dict | None:
    try:
        text = subprocess.run(["git", "-C", str(ROOT), "show",
                               f"{CONVERTED_FROM}:results/{relative}"], capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return json.loads(text)


# Keys renamed by hand after the conversion (each says so in its call's note): exercise labels follow
# the chapter numbers, and the chapters after 9 moved up by one when chapter 9 was split in two.
RENAMED = {"cpu/exercises.json": {"ex-10-whole-sequence-loss": "ex-12-whole-sequence-loss"}}


@pytest.mark.parametrize("relative", sorted(EXPERIMENT_OF))
def test_conversion_keeps_every_number(relative):
    """The file as committed before the conversion, and as it is now: the data keys are equal,
    and every value of the old file (the provenance's too) is found in the new one."""
    old = old_version(relative)
    if old is None:
        pytest.skip("no git history here")
    for before, after in RENAMED.get(relative, {}).items():     # keys renamed since, by hand
        old = json.loads(json.dumps(old).replace(json.dumps(before), json.dumps(after)))
    now = json.loads((ROOT / "results" / relative).read_text())
    data, calls = split(old)
    now_data = {k: v for k, v in now.items() if k not in ("experiment", "format", "calls")}
    if len(now["calls"]) > len(calls):      # a later call merged rows in (python -m attnbook run
        # NAME --only KEY): every old row and value is still there, in its place; only the sums
        # over all rows are recomputed
        old_data = {k: v for k, v in data.items() if k not in RECOMPUTED}
        if relative in REMADE:         # rows a later call made again, under the same key
            rows, by = REMADE[relative]
            key = lambda r: "/".join(str(r[f]) for f in by)            # noqa: E731 (store's key)
            remade = {k for c in now["calls"][len(calls):] for k in c["rows"]}
            made_now = {key(r): r for r in now_data[rows]}
            old_data[rows] = [made_now[key(r)] if key(r) in remade else r for r in old_data[rows]]
        assert contained(old_data, now_data) and set(data) <= set(now_data)
        assert all(c.get("rows") for c in now["calls"][len(calls):])
    else:     # the same data, but for keys added to it since (ADDED: not measurements)
        assert contained(data, now_data) and drop(now_data, ADDED) == drop(data, ADDED)
        assert set(map(json.dumps, leaves(old))) <= set(map(json.dumps, leaves(now)))
    assert convert(now, relative) is now               # converting again changes nothing


# Keys written beside a file's data after its call: the sacreBLEU signature of exercises.json's
# BLEU scores (issue 37), which its command now writes but did not then.
ADDED = {"bleu_signature"}


def drop(value, keys):
    """``value`` without the dict keys ``keys``, at any depth."""
    if isinstance(value, dict):
        return {k: drop(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [drop(v, keys) for v in value]
    return value


RECOMPUTED = {"train_time_s_sum"}    # sums over every row, rewritten when rows are merged in
# Files whose rows a later call made again (store.merge replaces a row of the same key): the data
# key of the rows and the fields of their key. board.json's seven models were scored again,
# greedy as well as beam search, and some of their runs trained again (its last call's note).
REMADE = {"cpu/board.json": ("runs", ("model", "peak_lr", "seed"))}


def contained(old, new) -> bool:
    """Whether ``new`` holds all of ``old``: the same scalars, a dict's keys (and maybe more),
    a list's items first, in order (and maybe more items after them, or more keys in each)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and contained(v, new[k]) for k, v in old.items())
    if isinstance(old, list):
        return isinstance(new, list) and len(new) >= len(old) and all(map(contained, old, new))
    return old == new


def test_every_result_file_carries_the_provenance_record():
    files = sorted((ROOT / "results").rglob("*.json"))
    assert {f.relative_to(ROOT / "results").as_posix() for f in files} >= set(EXPERIMENT_OF)
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
