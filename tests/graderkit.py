"""Helpers shared by the grader tests: grade a function, expect a failure with a given hint."""
from attnbook.graders import GRADERS


def grade(label, fn):
    return GRADERS[label].grade(fn)


def assert_fails(label, fn, *fragments):
    """The grader of ``label`` must fail ``fn`` with a hint that contains every fragment."""
    result = grade(label, fn)
    assert not result.passed, f"{label} passed a wrong answer"
    for fragment in fragments:
        assert fragment in result.message, f"{fragment!r} not in hint: {result.message}"
    return result.message


def stub(*args, **kwargs):
    raise NotImplementedError("write it")


def assert_registered(labels: dict) -> None:
    """Every exercise label has a grader for the name the notebook defines."""
    for label, target in labels.items():
        assert label in GRADERS and GRADERS[label].target == target


def assert_passes_and_prints(check, fn, capsys) -> None:
    """``check`` passes ``fn``, and calling it prints one PASS line."""
    result = check.grader.grade(fn)
    assert result.passed, result.message
    check(fn)
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"[PASS] {check.grader.label}: `{check.grader.target}` passed")
