"""pass@k: edge cases, the k = 1 closed form, and a brute-force count over all k-subsets."""

import itertools
from math import comb

import pytest

from models.passk import mean_pass_at_k, pass_at_k, pass_at_k_per_problem


def brute_force(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,k", [(1, 1), (5, 3), (16, 16), (20, 7)])
def test_no_correct_sample_gives_zero(n, k):
    assert pass_at_k(n, 0, k) == 0.0


@pytest.mark.parametrize("n,k", [(1, 1), (5, 3), (16, 16)])
def test_all_correct_gives_one(n, k):
    assert pass_at_k(n, n, k) == 1.0


@pytest.mark.parametrize("n,c,k", [(10, 8, 3), (16, 1, 16), (5, 3, 3)])
def test_fewer_wrong_than_k_gives_one(n, c, k):
    assert n - c < k
    assert pass_at_k(n, c, k) == 1.0


@pytest.mark.parametrize("n,c", [(1, 0), (1, 1), (10, 3), (16, 5), (200, 37)])
def test_k1_is_the_pass_rate(n, c):
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


@pytest.mark.parametrize("n", range(1, 9))
def test_equals_brute_force_over_all_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_hand_computed_value_and_closed_form():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # a large n where the binomials are huge: the product form matches the exact rational value
    n, c, k = 1000, 3, 100
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), rel=1e-12)


@pytest.mark.parametrize("n,c,k", [(3, 1, 4), (5, 6, 1), (-1, 0, 1), (5, -1, 1), (5, 1, 0), (5, 1, -2)])
def test_invalid_arguments_raise(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_and_per_problem():
    per = pass_at_k_per_problem([4, 4, 10], [1, 0, 10], 2)
    assert per.shape == (3,)
    assert per.tolist() == pytest.approx([0.5, 0.0, 1.0])
    assert mean_pass_at_k([4, 4, 10], [1, 0, 10], 2) == pytest.approx(0.5)
    assert mean_pass_at_k(4, [1, 0], 2) == pytest.approx(0.25)  # one n for every problem
    with pytest.raises(ValueError):
        mean_pass_at_k([4, 4], [1], 2)
    with pytest.raises(ValueError):
        mean_pass_at_k([], [], 1)
    with pytest.raises(ValueError):
        mean_pass_at_k([4, 1], [1, 0], 2)  # second problem has n < k
