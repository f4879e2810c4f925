"""Chapter 10's grader: the exact permutation test (check_perm_p)."""
import itertools

import numpy as np

from attnbook.graders import GRADERS


G = GRADERS["ex-10-permutation"]


def reference(a, b):
    pooled, n = list(a) + list(b), len(a)
    diffs = [np.mean([pooled[i] for i in idx]) - np.mean([pooled[i] for i in range(len(pooled)) if i not in idx])
             for idx in itertools.combinations(range(len(pooled)), n)]
    return float(np.mean([d >= np.mean(a) - np.mean(b) - 1e-9 for d in diffs]))


def test_a_correct_test_passes():
    assert G.grade(reference).passed


def test_the_classic_mistakes_are_named():
    def strict(a, b):
        pooled, n = list(a) + list(b), len(a)
        diffs = [np.mean([pooled[i] for i in idx]) - np.mean([pooled[i] for i in range(len(pooled)) if i not in idx])
                 for idx in itertools.combinations(range(len(pooled)), n)]
        return float(np.mean([d > np.mean(a) - np.mean(b) + 1e-9 for d in diffs]))

    def two_sided(a, b):
        pooled, n = list(a) + list(b), len(a)
        diffs = [np.mean([pooled[i] for i in idx]) - np.mean([pooled[i] for i in range(len(pooled)) if i not in idx])
                 for idx in itertools.combinations(range(len(pooled)), n)]
        return float(np.mean([abs(d) >= abs(np.mean(a) - np.mean(b)) - 1e-9 for d in diffs]))

    for fn, words in ((strict, "must count"), (two_sided, "two-sided")):
        result = G.grade(fn)
        assert not result.passed and words in result.message, result.message


def test_a_stub_fails_with_a_hint():
    def stub(a, b):
        raise NotImplementedError
    assert not G.grade(stub).passed
    assert not G.grade(lambda a, b: 0.05).passed                 # the right answer for one case only
    result = G.grade(lambda a, b: [0.05])
    assert not result.passed and "return a number" in result.message
