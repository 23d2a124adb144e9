"""Alternating repeats and the same-work check shared by the benchmarks (issue 21: same work, ≥ 3 alternating repeats,
the figure with its spread).

A benchmark times each side once per repeat; the order reverses every other repeat (A B, B A, A B, ...), so the side
that meets a repeat first (cold caches, allocator warm-up, a burst of load from elsewhere) alternates. The figure is
the median over repeats, printed with its range.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable


def alternate(sides: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run every side once per repeat, in reversed order every other repeat, and print each measurement.

    Args:
        sides: name → a callable doing that side's work once and returning its figure (seconds, or a rate).
        repeats: passes over all sides (≥ 1; the benchmarks default to 3).

    Returns:
        name → the figures in repeat order (one per repeat).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    figures: dict[str, list[float]] = {name: [] for name in sides}
    for rep in range(repeats):
        order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
        for name in order:
            figures[name].append(sides[name]())
            print(f"repeat {rep}: {name:12s} {figures[name][-1]:10.3f}", flush=True)
    return figures


def spread(name: str, values: list[float], unit: str) -> float:
    """Print ``<name> median <m> <unit>, range <min>–<max> over <n> repeats`` and return the median."""
    median = statistics.median(values)
    low, high = min(values), max(values)
    print(f"{name:12s} median {median:10.3f} {unit}, range {low:.3f}–{high:.3f} over {len(values)} repeats")
    return median


def check_same_work(same: bool, what: str) -> None:
    """Print ``CHECK same_work=ok <what>``, or ``CHECK same_work=FAIL <what>`` and exit with status 1."""
    print(f"CHECK same_work={'ok' if same else 'FAIL'} {what}", flush=True)
    if not same:
        sys.exit(1)
