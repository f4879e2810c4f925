"""Chapter 10 (a fair race): the grader of the exact permutation test.

``perm_p(a, b)`` is the one-sided exact permutation test that the values ``a`` (e.g. the BLEU of
one model's seeds) are larger than the values ``b``: over every way of choosing ``len(a)`` of
the pooled values as the first group, the share whose difference of means (first group minus
the rest) is at least the observed ``mean(a) - mean(b)``. The package's version is
:func:`attnbook.utils.permutation_p`."""
from __future__ import annotations

import itertools
import math

from ..utils import permutation_p
from .core import Hint, grader


def _c10_mistake(a, b, got) -> str:
    """Name the classic mistake whose answer ``got`` is."""
    pooled, n = list(a) + list(b), len(a)
    observed = sum(a) / n - sum(b) / len(b)
    diffs = [sum(pooled[i] for i in idx) / n - (sum(pooled) - sum(pooled[i] for i in idx)) / len(b)
             for idx in itertools.combinations(range(len(pooled)), n)]
    wrong = {
        "strict": sum(d > observed + 1e-9 for d in diffs) / len(diffs),
        "two-sided": sum(abs(d) >= abs(observed) - 1e-9 for d in diffs) / len(diffs),
        "count": sum(d >= observed - 1e-9 for d in diffs),
    }
    if math.isclose(got, wrong["strict"]) and not math.isclose(got, permutation_p(a, b)):
        return ("; the observed split itself must count: use >= (at least the observed "
                "difference), not >, or complete separation gets p = 0")
    if math.isclose(got, wrong["two-sided"]):
        return ("; that is the two-sided test (|difference|): the question is one-sided, whether "
                "a is larger, so compare the signed difference")
    if math.isclose(got, wrong["count"]):
        return "; that is the number of splits: divide by the number of splits, comb(n_a + n_b, n_a)"
    return ""


@grader("ex-10-permutation", target="perm_p")
def check_perm_p(fn) -> int:
    cases = [("three seeds above three", [35.9, 36.3, 35.5], [32.8, 33.0, 32.9]),
             ("three seeds below three", [22.9, 23.4, 23.6], [24.4, 25.3, 26.0]),
             ("overlapping seeds", [30.1, 31.5, 29.0], [30.5, 29.8, 30.9]),
             ("four against three", [1.0, 2.0, 3.0, 4.0], [0.5, 2.5, 1.5]),
             ("ties: equal values", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]),
             ("one value against two", [5.0], [1.0, 2.0])]
    for what, a, b in cases:
        try:
            got = fn(list(a), list(b))
        except NotImplementedError:
            raise
        except Exception as e:
            raise Hint(f"on {what} (a = {a}, b = {b}): your function raised "
                       f"{type(e).__name__}: {e}") from None
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise Hint(f"on {what}: return a number (the p-value), got {type(got).__name__}") from None
        want = permutation_p(a, b)
        if not math.isclose(got, want, abs_tol=1e-9):
            raise Hint(f"on {what} (a = {a}, b = {b}): p = {got:.4f}, expected {want:.4f}"
                       + _c10_mistake(a, b, got))
    return len(cases)
