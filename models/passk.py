"""Unbiased pass@k estimator.

Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code", §2.1 and Figure 3: with n ≥ k samples
per problem of which c pass, pass@k = E[1 - C(n - c, k) / C(n, k)], computed in the numerically stable product form
1 - prod_{i = n - c + 1}^{n} (1 - k / i).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _check(n: int, c: int, k: int) -> None:
    if n < 0 or c < 0 or k < 0:
        raise ValueError(f"pass@k needs non-negative n, c, k (got n={n}, c={c}, k={k})")
    if k == 0:
        raise ValueError("pass@k needs k ≥ 1")
    if c > n:
        raise ValueError(f"pass@k needs c ≤ n (got c={c}, n={n})")
    if n < k:
        raise ValueError(f"pass@k needs n ≥ k samples (got n={n}, k={k})")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct.

    Raises ValueError when n < k, c > n, k < 1 or any argument is negative.
    """
    _check(n, c, k)
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_per_problem(num_samples: Sequence[int] | int, num_correct: Sequence[int], k: int) -> np.ndarray:
    """pass@k of each problem, shape (P,) float64.

    num_samples: samples per problem, one int for all or a sequence of length P; num_correct: length P.
    Raises ValueError as :func:`pass_at_k`, or when the lengths differ.
    """
    correct = list(num_correct)
    samples = [num_samples] * len(correct) if isinstance(num_samples, int) else list(num_samples)
    if len(samples) != len(correct):
        raise ValueError(f"{len(samples)} sample counts for {len(correct)} problems")
    return np.array([pass_at_k(int(n), int(c), k) for n, c in zip(samples, correct, strict=True)], dtype=np.float64)


def mean_pass_at_k(num_samples: Sequence[int] | int, num_correct: Sequence[int], k: int) -> float:
    """Mean pass@k over problems (the benchmark figure). Raises ValueError for no problems or as above."""
    per_problem = pass_at_k_per_problem(num_samples, num_correct, k)
    if per_problem.size == 0:
        raise ValueError("mean pass@k over zero problems")
    return float(per_problem.mean())
