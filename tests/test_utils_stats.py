"""attnbook.utils.permutation_p: the exact one-sided permutation test chapter 10 uses."""
import itertools
import math
import random

import pytest

from attnbook.utils import permutation_p


def test_complete_separation_gives_the_smallest_p():
    assert permutation_p([3, 4, 5], [0, 1, 2]) == pytest.approx(1 / math.comb(6, 3))
    assert permutation_p([5, 6, 7, 8, 9], [0, 1, 2, 3, 4]) == pytest.approx(1 / math.comb(10, 5))


def test_the_other_direction_is_certain():
    assert permutation_p([0, 1, 2], [3, 4, 5]) == 1.0


def test_it_counts_splits_like_a_brute_force_over_labels():
    rng = random.Random(0)
    a, b = [rng.gauss(1, 1) for _ in range(4)], [rng.gauss(0, 1) for _ in range(3)]
    pooled, obs = a + b, sum(a) / 4 - sum(b) / 3
    perms = list(itertools.permutations(pooled))
    brute = sum(sum(p[:4]) / 4 - sum(p[4:]) / 3 >= obs - 1e-9 for p in perms) / len(perms)
    assert permutation_p(a, b) == pytest.approx(brute)


def test_an_empty_group_is_refused():
    with pytest.raises(ValueError, match="at least one value"):
        permutation_p([], [1.0])
