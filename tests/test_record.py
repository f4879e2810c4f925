"""attnbook.record, the provenance of every result: the record of a call, and the commit its
code came from (git's, or a recorded one where a copy of the repository has a stale .git or
none)."""
from attnbook import record
from attnbook.store import HEX40


def test_record_measures_the_call():
    with record.record("python -m attnbook run x --tiny", threads=1, note="n") as call:
        sum(i * i for i in range(10 ** 5))
    assert HEX40.fullmatch(call.git_commit) and call.threads == 1 and call.processes == 1
    assert call.wall_s >= 0 and call.cpu_s >= 0 and len(call.load_before) == 3
    assert call.hardware["torch"] and call.hardware["cpu_capability"] and call.note == "n"
    assert call.date[:2] == "20" and call.extra in ({}, {"uncommitted_changes": True})


def test_under_run_the_record_names_the_command_as_typed(monkeypatch):
    with record.typed_as("python -m attnbook run toy_seeds --tiny"):
        with record.record("python -m attnbook toy_seeds --tiny") as call:
            pass
    assert call.command == "python -m attnbook run toy_seeds --tiny"
    assert call.extra["ran"] == "python -m attnbook toy_seeds --tiny"
    with record.record("python -m attnbook toy_seeds --tiny") as after:
        pass                                                  # outside it: the command's own
    assert after.command == "python -m attnbook toy_seeds --tiny" and "ran" not in after.extra


def test_the_commit_is_gits_while_src_is_clean_else_the_recorded_one_that_holds_the_code(
        tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNBOOK_GIT_COMMIT", raising=False)
    monkeypatch.setattr(record, "COMMIT_FILE", tmp_path / "COMMIT")
    monkeypatch.setattr(record, "_git", lambda root: ("b" * 40, False))
    record.write_commit("c" * 40)
    assert record.recorded_commit() == "c" * 40
    assert record.git_commit() == ("b" * 40, False)             # a clean git wins
    monkeypatch.setattr(record, "_git", lambda root: ("b" * 40, True))   # a stale .git
    assert record.git_commit() == ("c" * 40, False)
    monkeypatch.setattr(record, "_git", lambda root: ("", False))        # no .git at all
    assert record.git_commit() == ("c" * 40, False)
    (tmp_path / "COMMIT").write_text(f"{'c' * 40} {'0' * 64}\n")         # a record of other code
    assert record.recorded_commit() is None and record.git_commit() == ("", False)
    monkeypatch.setattr(record, "_git", lambda root: ("b" * 40, True))
    assert record.git_commit() == ("b" * 40, True)               # the changes stay flagged
    monkeypatch.setenv("ATTNBOOK_GIT_COMMIT", "d" * 40)          # what a parent tells its parts
    assert record.git_commit() == ("d" * 40, False)


def test_the_digest_changes_with_the_code(tmp_path):
    (tmp_path / "src" / "attnbook").mkdir(parents=True)
    (tmp_path / "src" / "attnbook" / "a.py").write_text("x = 1\n")
    before = record.src_digest(tmp_path)
    assert before == record.src_digest(tmp_path) and len(before) == 64
    (tmp_path / "src" / "attnbook" / "a.py").write_text("x = 2\n")
    assert record.src_digest(tmp_path) != before
