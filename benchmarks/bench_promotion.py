"""Does the promotion rule tell a better model from a worse one? Simulated on planted effects.

    .venv/bin/python benchmarks/bench_promotion.py [--problems 80] [--answers 4] [--reps 1000]

Difficulty model, fitted to real samples: each problem's probability that one answer passes is Beta(a, b), with
(a, b) solved so that the model reproduces the DPO checkpoint's recorded val figures of the larger run
(docs/results/large-24-steps/metrics.json: 20 problems × 16 answers, pass@1 0.119 and pass@16 0.700). A challenger
with a planted effect e has, on every problem, the champion's probability shifted on the logit scale by the one θ
that raises the mean by e. Both answer ``--answers`` times per problem (independent draws: an unchanged model whose
weights moved still draws new answers); per-problem pass@1 = passes / answers.

The rule simulated is the registry's primary test (`models.significance.paired_test`, one-sided sign-flip, α 0.05,
margin 0): promote iff p < α and the effect > margin. Also printed, for comparison, the rule of main at 9a8562d
(promote iff the mean pass@1 is higher, margin 0, 3 problems × 16 answers).

The minimum detectable effect (MDE) is the smallest planted effect of the grid (0.04 … 0.10) promoted with power
≥ 0.8; the t formula (`models.significance.minimum_detectable_effect`) at the no-effect spread is printed beside it.
There is no peer: ``CHECK same_work=ok`` says the simulation does the work it claims (the fitted model reproduces the
recorded figures within Monte-Carlo error, every planted shift raises the mean by its effect), else ``FAIL`` and
exit 1. Last line:
``RESULT false_promotion=<rate at e=0> power_at_mde=<rate at e=MDE> mde=<MDE> problems=<n> answers=<m>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from repeats import check_same_work
from scipy import optimize, special

from models.significance import minimum_detectable_effect, paired_test

RECORDED = Path(__file__).resolve().parents[1] / "docs/results/large-24-steps/metrics.json"


def fit_beta(pass1: float, pass16: float) -> tuple[float, float]:
    """(a, b) of Beta(a, b) with mean ``pass1`` and E[1 - (1 - p)^16] = ``pass16``."""

    def miss(log_s: float) -> float:
        s = np.exp(log_s)
        a, b = pass1 * s, (1 - pass1) * s
        return 1 - np.exp(special.betaln(a, b + 16) - special.betaln(a, b)) - pass16

    log_s = optimize.brentq(miss, np.log(1e-3), np.log(1e3))
    s = float(np.exp(log_s))
    return pass1 * s, (1 - pass1) * s


def shifted(p: np.ndarray, effect: float) -> np.ndarray:
    """``p`` shifted on the logit scale so that its mean rises by ``effect``."""
    if effect == 0:
        return p
    logit = special.logit(np.clip(p, 1e-9, 1 - 1e-9))
    theta = optimize.brentq(lambda t: special.expit(logit + t).mean() - p.mean() - effect, -20, 20)
    return special.expit(logit + theta)


def simulate(a, b, effect, problems, answers, reps, rng, old_rule=False):
    """(promotion rate, per-problem change sd) over ``reps`` evaluations with a fresh set of problems each."""
    promoted, sds = 0, []
    for r in range(reps):
        p = rng.beta(a, b, size=problems)
        champion = rng.binomial(answers, p) / answers
        challenger = rng.binomial(answers, shifted(p, effect)) / answers
        if old_rule:
            promoted += challenger.mean() > champion.mean()
            continue
        t = paired_test(champion, challenger, seed=r)
        promoted += t.significant
        sds.append(t.sd)
    return promoted / reps, (float(np.mean(sds)) if sds else None)


def check_model(a: float, b: float, recorded: dict, rng: np.random.Generator, draws: int = 100_000) -> None:
    """The simulation does the work it claims: drawn from Beta(a, b), 16 answers per problem reproduce the recorded
    pass@1 and pass@16 within 4 Monte-Carlo standard errors, and every planted shift raises the mean by its effect."""
    p = rng.beta(a, b, size=draws)
    passes = rng.binomial(16, p)
    pass1, pass16 = passes.mean() / 16, (passes > 0).mean()
    se1, se16 = np.sqrt(p.var() / draws + 1e-12), np.sqrt(pass16 * (1 - pass16) / draws)
    fits = abs(pass1 - recorded["pass@1"]) < 4 * se1 + 1e-3 and abs(pass16 - recorded["pass@16"]) < 4 * se16 + 1e-3
    gaps = {e: float(shifted(p[:1000], e).mean() - p[:1000].mean()) for e in (0.04, 0.05, 0.06, 0.07, 0.08, 0.10)}
    planted = all(abs(gap - e) < 1e-9 for e, gap in gaps.items())
    check_same_work(
        fits and planted,
        f"the difficulty model's {draws} simulated problems × 16 answers give pass@1 {pass1:.4f} / pass@16 "
        f"{pass16:.4f} (recorded {recorded['pass@1']:.4f} / {recorded['pass@16']:.4f}); planted shifts raise the mean "
        f"by {', '.join(f'{g:+.4f}' for g in gaps.values())}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=80)
    parser.add_argument("--answers", type=int, default=4)
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    recorded = json.loads(RECORDED.read_text())["dpo"]["val"]
    a, b = fit_beta(recorded["pass@1"], recorded["pass@16"])
    print(
        f"difficulty model: Beta({a:.3f}, {b:.3f}) fitted to pass@1 {recorded['pass@1']:.3f}, "
        f"pass@16 {recorded['pass@16']:.3f} ({recorded['n_problems']} val problems × {recorded['n_samples']})"
    )
    rng = np.random.default_rng(args.seed)
    n, m = args.problems, args.answers
    check_model(a, b, recorded, np.random.default_rng(args.seed + 1))
    old_false, _ = simulate(a, b, 0.0, 3, 16, args.reps, rng, old_rule=True)
    old_power, _ = simulate(a, b, 0.05, 3, 16, args.reps, rng, old_rule=True)
    print(
        f"rule of 9a8562d (higher mean wins, 3 problems × 16): unchanged promoted {old_false:.3f}, "
        f"+0.05 {old_power:.3f}"
    )
    rates = {}
    false, sd0 = simulate(a, b, 0.0, n, m, args.reps, rng)
    rates[0.0] = false
    for effect in (0.04, 0.05, 0.06, 0.07, 0.08, 0.10):
        rates[effect] = simulate(a, b, effect, n, m, args.reps, rng)[0]
    print(f"paired sign-flip rule, {n} problems × {m} answers, α 0.05, margin 0, {args.reps} evaluations each:")
    for effect, rate in rates.items():
        se = np.sqrt(rate * (1 - rate) / args.reps)
        print(f"  planted effect {effect:+.2f}: promoted {rate:.3f} (± {se:.3f})")
    detected = [e for e, rate in rates.items() if e > 0 and rate >= 0.8]
    mde = min(detected) if detected else float("nan")
    formula = minimum_detectable_effect(sd0, n)
    print(
        f"MDE (smallest planted effect promoted with power ≥ 0.8): {mde:.2f}; the t formula at the no-effect "
        f"per-problem sd {sd0:.3f} gives {formula:.4f}, optimistic: changes spread more under an effect"
    )
    print(
        f"RESULT false_promotion={rates[0.0]:.3f} power_at_mde={rates.get(mde, float('nan')):.3f} mde={mde:.2f} "
        f"problems={n} answers={m}"
    )


if __name__ == "__main__":
    main()
