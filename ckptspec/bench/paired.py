"""Paired, interleaved comparison of two savers: the order of the rounds, and the ratio with its interval.

A comparison of A (the baseline) with B (the change) runs its rounds in pairs, in the order A B B A A B ...
(`abba_order`), so that a runner that speeds up or slows down during the run weighs on both sides alike. Each pair
gives one ratio B / A (`paired_ratios`); the comparison is the median of those ratios with a bootstrap interval
(`compare_paired`: the median of resampled pairs, `level` of them between the bounds, a fixed seed so that the same
rounds always give the same interval). A verdict reads the interval, not the median: a slowdown is shown when the
whole interval lies above the threshold (`Paired.above`), so noise that moves the median alone does not fail.

Pure Python, no torch: the reports read stored rounds with it.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["LEVEL", "RESAMPLES", "Paired", "abba_order", "compare_paired", "median_ratio", "paired_ratios"]

LEVEL = 0.9
RESAMPLES = 2000


def abba_order(pairs: int) -> list[tuple[str, str]]:
    """The order of each pair's two rounds: ("A", "B") for even pairs, ("B", "A") for odd ones."""
    if pairs < 1:
        raise ValueError(f"a paired comparison needs at least 1 pair, not {pairs}")
    return [("A", "B") if i % 2 == 0 else ("B", "A") for i in range(pairs)]


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """b[i] / a[i] for each pair; ValueError when the sides differ in length or a baseline round is not positive."""
    if len(a) != len(b):
        raise ValueError(f"paired rounds differ in number: {len(a)} baseline, {len(b)} changed")
    if not a:
        raise ValueError("no paired rounds")
    if any(x <= 0 for x in a):
        raise ValueError("a baseline round took no time: its ratio is undefined")
    return [y / x for x, y in zip(a, b, strict=True)]


def median_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """median(b) / median(a): how a floor divides (median by median, never by the fastest round)."""
    med_a = statistics.median(a)
    if med_a <= 0:
        raise ValueError("the reference's median is not positive")
    return statistics.median(b) / med_a


@dataclass(frozen=True)
class Paired:
    """A paired comparison: the median of the pairs' ratios and its bootstrap interval at `level`."""

    ratio: float
    low: float
    high: float
    pairs: int
    level: float = LEVEL

    def above(self, threshold: float) -> bool:
        """The whole interval lies above `threshold`: a slowdown beyond it is shown, not guessed."""
        return self.low > threshold

    def below(self, threshold: float) -> bool:
        """The whole interval lies below `threshold` (an improvement, read as 1 / threshold)."""
        return self.high < threshold

    def text(self) -> str:
        return f"{self.ratio:.3f}x [{self.low:.3f}, {self.high:.3f}]"

    def as_dict(self) -> dict:
        return asdict(self)


def compare_paired(
    a: Sequence[float], b: Sequence[float], level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
) -> Paired:
    """The paired comparison of rounds `a` (baseline) and `b` (change), pair i being (a[i], b[i])."""
    if not 0 < level < 1:
        raise ValueError(f"interval level {level} is not between 0 and 1")
    ratios = paired_ratios(a, b)
    rng = random.Random(seed)
    n = len(ratios)
    medians = sorted(statistics.median(rng.choices(ratios, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    low = medians[int(tail * (resamples - 1))]
    high = medians[round((1 - tail) * (resamples - 1))]
    centre = statistics.median(ratios)
    return Paired(centre, min(low, centre), max(high, centre), n, level)
