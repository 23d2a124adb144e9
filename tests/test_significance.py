"""The promotion rule's statistics: hand-computed values, scipy cross-checks, and calibration by simulation."""

import math

import numpy as np
import pytest
from scipy import stats

from models.significance import minimum_detectable_effect, paired_interval, paired_test, sign_flip_pvalue


def test_exact_sign_flip_by_hand():
    # nonzero changes 0.25, 0.5, -0.25 (sum 0.5); the 8 sign patterns sum to
    # 0.5, 1.0, -0.5, 0.0, 0.0, 0.5, -1.0, -0.5: three are >= 0.5, so p = 3/8
    p, method = sign_flip_pvalue([0.25, 0.5, 0.0, -0.25])
    assert p == 3 / 8 and method == "exact sign-flip (2^3 patterns)"
    assert sign_flip_pvalue([0.0, 0.0, 0.0])[0] == 1.0  # no problem changed: no evidence
    assert sign_flip_pvalue([1.0] * 6)[0] == 1 / 64  # six problems all better: only the observed pattern
    # a margin shifts the changes: 0.1 each above a margin of 0.1 is no evidence at all
    assert sign_flip_pvalue([0.1] * 6, margin=0.1)[0] == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sign_flip_equals_scipy_permutation_test(seed):
    rng = np.random.default_rng(seed)
    small = rng.choice([-0.5, -0.25, 0.0, 0.25, 0.5, 0.75], size=12)
    ref = stats.permutation_test(
        (small,), np.sum, permutation_type="samples", alternative="greater", n_resamples=np.inf
    ).pvalue
    assert sign_flip_pvalue(small)[0] == pytest.approx(ref, abs=1e-12)
    large = rng.choice([-0.5, -0.25, 0.0, 0.25, 0.5, 0.75], size=80)
    ref = stats.permutation_test(
        (large,), np.sum, permutation_type="samples", alternative="greater", n_resamples=200_000, rng=seed
    ).pvalue
    p, method = sign_flip_pvalue(large, seed=seed)
    assert method == "sign-flip (20000 random patterns)"
    assert abs(p - ref) < 4 * math.sqrt(ref * (1 - ref) / 20_000) + 1e-4


def test_interval_is_the_t_interval_and_never_zero_width():
    d = np.tile([0.25, 0.5, 0.0, -0.25, 0.75, 0.25, 0.0, 0.5], 5)  # 40 problems: the t half-width 0.11 > floor 0.088
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
    assert paired_interval(d) == pytest.approx((ci.low, ci.high))
    # 8 problems: the floor 1 - 0.025**(1/8) = 0.369 is wider than the t half-width (0.27) and is used
    low, high = paired_interval(d[:8])
    assert high - d[:8].mean() == pytest.approx(1 - 0.025 ** (1 / 8))
    # no problem changed among 20: the Clopper-Pearson bound 1 - 0.025**(1/20) = 0.1684 on each side
    low, high = paired_interval([0.0] * 20)
    assert high == pytest.approx(1 - 0.025 ** (1 / 20)) and low == pytest.approx(-high)
    assert high == pytest.approx(0.16843, abs=1e-5)


def test_minimum_detectable_effect_by_hand():
    # (t_0.95,79 + t_0.80,79) * 0.25 / sqrt(80) = (1.66437 + 0.84622) * 0.25 / 8.94427
    assert minimum_detectable_effect(0.25, 80) == pytest.approx((1.66437 + 0.84622) * 0.25 / math.sqrt(80), abs=1e-4)
    with pytest.raises(ValueError):
        minimum_detectable_effect(0.25, 1)


def test_paired_test_reports_clusters_and_significance():
    before = [0.0, 0.25, 0.5, 0.0, 0.25, 0.0, 0.5, 0.25]
    after = [0.5, 0.5, 0.75, 0.25, 0.5, 0.25, 0.75, 0.5]
    families = ["a", "a", "b", "b", "c", "c", "d", "d"]
    t = paired_test(before, after, clusters=families)
    assert t.effect == pytest.approx(0.28125) and t.n == 8 and t.n_discordant == 8
    assert t.p_value == 1 / 256 and t.significant
    assert t.n_clusters == 4 and t.cluster_p == 1 / 16  # four families, all better
    assert not paired_test(before, after, margin=0.3).significant
    with pytest.raises(ValueError):
        paired_test([0.0], [0.0, 1.0])


def test_no_change_is_rarely_significant_and_a_real_gain_is_found():
    """Calibration on planted effects (a small version of benchmarks/bench_promotion.py): problems of varying
    difficulty, 4 answers per problem and checkpoint; no effect → p < 0.05 in at most 5% (+ noise), +0.15 → found."""
    rng = np.random.default_rng(0)
    p = rng.beta(0.5, 2.0, size=80)
    false, found = 0, 0
    reps = 300
    for _ in range(reps):
        before = rng.binomial(4, p) / 4
        same = rng.binomial(4, p) / 4
        better = rng.binomial(4, np.clip(p + 0.15, 0, 1)) / 4
        false += paired_test(before, same).significant
        found += paired_test(before, better).significant
    assert false / reps <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)
    assert found / reps >= 0.9
