"""Paired significance for two checkpoints measured on the same problems: the statistics of the promotion rule.

The unit of evidence is the problem: ``d_i = after_i - before_i`` is the change of one problem's score (e.g. its
pass@1 from m answers), the problems are a sample of the population the claim is about, and both checkpoints answered
the same problems with the same seeds (common random numbers), so the pairing removes the problems' difficulty.

- :func:`sign_flip_pvalue`: the one-sided randomisation test of Fisher (1935) for paired data: under H0 the
  distribution of ``d_i - margin`` is symmetric about 0, so every sign pattern is equally likely. Exact (every pattern
  enumerated) when at most 16 problems differ from the margin, else 20,000 random patterns with the (1 + hits)/(1 + R)
  correction (Phipson & Smyth 2010). Valid at any n, with ties and bounded scores (Good 2005, *Permutation,
  Parametric and Bootstrap Tests of Hypotheses* §3.1.2); cross-checked against ``scipy.stats.permutation_test``.
- :func:`paired_interval`: the paired t interval of the mean change, never narrower than the Clopper–Pearson
  (1934) bound for "no problem differs": with 0 of n problems discordant the data still allow a fraction
  ``1 - (a/2)^(1/n)`` of unseen problems to differ by up to the score's range, so a zero-width interval is never
  reported.
- :func:`minimum_detectable_effect`: the smallest true mean change a one-sided paired test at level ``alpha``
  detects with probability ``power`` (Cohen 1988 §2.4, t quantiles): ``(t_{1-a} + t_{power}) · sd / sqrt(n)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EXACT_MAX = 16  # at most 2**16 sign patterns are enumerated
RESAMPLES = 20_000


def _diffs(before: Sequence[float], after: Sequence[float]) -> np.ndarray:
    a = np.asarray(before, dtype=np.float64)
    b = np.asarray(after, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores need the same problems: shapes {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("a paired comparison over zero problems")
    return b - a


def sign_flip_pvalue(diffs: Sequence[float], margin: float = 0.0, seed: int = 0) -> tuple[float, str]:
    """One-sided p-value of H0 "mean change ≤ margin" against H1 "mean change > margin".

    Args:
        diffs: per-problem changes ``after - before``, shape (P,).
        margin: the change H1 must exceed (score units); a negative margin gives a non-inferiority test.
        seed: the random patterns' seed (used only when more than 16 problems differ from the margin).
    Returns:
        (p in (0, 1], method: ``"exact sign-flip (2^k patterns)"`` or ``"sign-flip (20000 random patterns)"``).
    Raises:
        ValueError: no problems.
    """
    x = np.asarray(diffs, dtype=np.float64) - margin
    if x.size == 0:
        raise ValueError("a paired comparison over zero problems")
    x = x[np.abs(x) > 1e-12]  # a zero keeps its value under every flip
    observed = x.sum()
    tol = 1e-9 * max(1.0, float(np.abs(x).sum()))
    k = x.size
    if k <= EXACT_MAX:
        patterns = ((np.arange(2**k)[:, None] >> np.arange(k)) & 1) * 2 - 1  # (2^k, k) of ±1
        sums = patterns @ x
        return float(np.mean(sums >= observed - tol)), f"exact sign-flip (2^{k} patterns)"
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(RESAMPLES, k))
    hits = int(np.sum(signs @ x >= observed - tol))
    return (1 + hits) / (1 + RESAMPLES), f"sign-flip ({RESAMPLES} random patterns)"


def paired_interval(diffs: Sequence[float], confidence: float = 0.95, score_range: float = 1.0) -> tuple[float, float]:
    """Two-sided interval of the mean change: the paired t interval, widened to at least ± the Clopper–Pearson
    bound ``score_range · (1 - ((1 - confidence) / 2) ** (1 / n))`` (see the module docstring).

    Raises:
        ValueError: no problems, or ``confidence`` not in (0, 1).
    """
    from scipy.stats import t

    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        raise ValueError("a paired comparison over zero problems")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n, mean = d.size, float(d.mean())
    floor = score_range * (1.0 - ((1.0 - confidence) / 2.0) ** (1.0 / n))
    half = 0.0
    if n >= 2:
        half = float(t.ppf(0.5 + confidence / 2.0, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
    half = max(half, floor)
    return mean - half, mean + half


def minimum_detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest true mean change a one-sided paired test at ``alpha`` detects with probability ``power``, for
    per-problem changes of standard deviation ``sd`` over ``n`` problems (score units).

    Raises:
        ValueError: n < 2, sd < 0, or alpha / power outside (0, 1).
    """
    from scipy.stats import t

    if n < 2 or sd < 0 or not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"need n >= 2, sd >= 0, alpha and power in (0, 1); got n={n}, sd={sd}, {alpha}, {power}")
    return float((t.ppf(1 - alpha, n - 1) + t.ppf(power, n - 1)) * sd / math.sqrt(n))


@dataclass(frozen=True)
class PairedTest:
    """One pre-registered paired comparison (all figures in score units; ``p_value`` one-sided).

    effect: mean change ``after - before``; low/high: `paired_interval` at ``confidence``; sd: standard deviation of
    the per-problem changes; mde: `minimum_detectable_effect` at this sd, n, alpha and power 0.8; n_discordant:
    problems whose score changed; cluster_p / n_clusters: the same test on the mean change of each cluster
    (family), so a gain carried by one family's correlated problems shows; None without clusters.
    """

    n: int
    effect: float
    margin: float
    alpha: float
    p_value: float
    method: str
    low: float
    high: float
    confidence: float
    sd: float
    mde: float
    n_discordant: int
    cluster_p: float | None
    n_clusters: int | None

    @property
    def significant(self) -> bool:
        """p < alpha and the effect exceeds the margin."""
        return self.p_value < self.alpha and self.effect > self.margin


def paired_test(
    before: Sequence[float],
    after: Sequence[float],
    margin: float = 0.0,
    alpha: float = 0.05,
    clusters: Sequence[str] | None = None,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedTest:
    """The one-sided paired sign-flip test of "``after`` beats ``before`` by more than ``margin``".

    Args:
        before, after: one score per problem in [0, 1] (e.g. pass@1 from m answers), same problems, shape (P,).
        clusters: one label per problem (its family) for the cluster check, or None.
    Raises:
        ValueError: the lengths differ, P = 0, or ``clusters`` has another length.
    """
    d = _diffs(before, after)
    p, method = sign_flip_pvalue(d, margin, seed)
    low, high = paired_interval(d, confidence)
    sd = float(d.std(ddof=1)) if d.size >= 2 else 0.0
    mde = minimum_detectable_effect(sd, int(d.size), alpha) if d.size >= 2 else float("nan")
    cluster_p = n_clusters = None
    if clusters is not None:
        if len(clusters) != d.size:
            raise ValueError(f"{len(clusters)} cluster labels for {d.size} problems")
        labels = sorted(set(clusters))
        means = [float(d[[c == label for c in clusters]].mean()) for label in labels]
        cluster_p, n_clusters = sign_flip_pvalue(means, margin, seed)[0], len(labels)
    return PairedTest(
        n=int(d.size),
        effect=float(d.mean()),
        margin=margin,
        alpha=alpha,
        p_value=p,
        method=method,
        low=low,
        high=high,
        confidence=confidence,
        sd=sd,
        mde=mde,
        n_discordant=int(np.sum(np.abs(d) > 1e-12)),
        cluster_p=cluster_p,
        n_clusters=n_clusters,
    )
