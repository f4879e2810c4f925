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


# --- the selective state-space step and the scan's combine -----------------------------------

from attnbook.graders.ch13_beyond_attention import (  # noqa: E402
    COMBINE_MISTAKES, SSM_MISTAKES, _combine_reference, _ssm_reference)
from attnbook.ssm import combine, discretize  # noqa: E402

STEP, COMBINE = GRADERS["ex-13-selective-step"], GRADERS["ex-13-combine"]


def package_step(h, u, delta, A, b, c):
    """The step as attnbook.ssm computes it (discretize, then one step of selective_scan)."""
    Abar, bbar = discretize(delta, A, b[:, None, :])
    h = Abar * h + bbar * u[..., None]
    return h, (h * c[:, None, :]).sum(-1)


def test_the_selective_step_passes_as_the_package_computes_it():
    assert STEP.grade(package_step).passed and STEP.grade(_ssm_reference).passed


@pytest.mark.parametrize("how,hint", SSM_MISTAKES, ids=[how for how, _ in SSM_MISTAKES])
def test_each_selective_step_mistake_is_named(how, hint):
    result = STEP.grade(lambda *a: _ssm_reference(*a, how=how))
    assert not result.passed and hint in result.message


def test_the_combine_of_the_package_passes_and_each_mistake_is_named():
    assert COMBINE.grade(combine).passed
    for how, hint in COMBINE_MISTAKES:
        result = COMBINE.grade(lambda x, y, how=how: _combine_reference(x, y, how))
        assert not result.passed and hint in result.message, how
    result = COMBINE.grade(lambda x, y: x)
    assert not result.passed and "the combined" in result.message
