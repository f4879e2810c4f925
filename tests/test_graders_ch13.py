"""Chapter 13's grader: the online-softmax step passes as written in the book, and each classic
mistake fails with the hint that names it."""
import pytest

from attnbook.graders import GRADERS
from attnbook.graders.ch13_beyond_attention import MISTAKES, _c12_reference

G = GRADERS["ex-13-online-softmax"]


def test_the_reference_passes():
    assert G.grade(lambda *a: _c12_reference(*a)).passed


@pytest.mark.parametrize("kw,hint", MISTAKES, ids=[next(iter(kw)) for kw, _ in MISTAKES])
def test_each_mistake_is_named(kw, hint):
    result = G.grade(lambda *a: _c12_reference(*a, **kw))
    assert not result.passed and hint in result.message


def test_the_nan_of_a_query_with_no_key_yet_is_named():
    result = G.grade(lambda *a: _c12_reference(*a, guard=False))
    assert not result.passed and "exp(-inf + inf) is NaN" in result.message


def test_a_wrong_return_is_a_hint_not_a_crash():
    result = G.grade(lambda m, l, acc, s, v: (m, l))
    assert not result.passed and "return a tuple (m, l, acc)" in result.message
