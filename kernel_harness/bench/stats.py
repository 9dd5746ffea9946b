"""Timing statistics, kept apart from running (as ``torch.utils.benchmark``
separates ``Timer`` from ``Measurement``).

Times are per call, in nanoseconds, grouped by round.  Baseline and kernel
rounds alternate (ABAB...), so a slow phase of the machine hits both; the
speedup's confidence interval resamples whole rounds (a percentile
bootstrap), which keeps each round's baseline/kernel pairing and so the
drift cancellation.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy

NOISY_IQR_FRACTION = 0.10


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass
class Measurement:
    """Per-call times of one function, by round."""

    label: str
    rounds: list[list[int]] = field(default_factory=list)

    @property
    def times_ns(self) -> list[int]:
        return [t for r in self.rounds for t in r]

    @property
    def count(self) -> int:
        return sum(len(r) for r in self.rounds)

    def _sorted_us(self) -> list[float]:
        return sorted(t / 1e3 for t in self.times_ns)

    @property
    def median_us(self) -> float:
        return _quantile(self._sorted_us(), 0.5)

    @property
    def iqr_us(self) -> float:
        s = self._sorted_us()
        return _quantile(s, 0.75) - _quantile(s, 0.25)

    @property
    def min_us(self) -> float:
        s = self._sorted_us()
        return s[0] if s else float("nan")

    @property
    def noisy(self) -> bool:
        return self.count > 0 and self.iqr_us > NOISY_IQR_FRACTION * self.median_us

    def summary(self) -> dict[str, float | int | bool]:
        return {
            "median_us": self.median_us,
            "iqr_us": self.iqr_us,
            "min_us": self.min_us,
            "calls": self.count,
            "rounds": len(self.rounds),
            "noisy": self.noisy,
        }


@dataclass(frozen=True)
class Speedup:
    value: float
    ci_low: float | None
    ci_high: float | None
    confidence: float
    paired: float | None = None

    @property
    def includes_one(self) -> bool:
        return self.ci_low is not None and self.ci_high is not None and self.ci_low <= 1.0 <= self.ci_high

    def verdict(self) -> str:
        if self.ci_low is None:
            return "no interval (cached baseline)"
        if self.includes_one:
            return "no measurable difference"
        return "kernel faster" if self.value > 1.0 else "kernel slower"


def speedup(baseline: Measurement, kernel: Measurement, *, confidence: float = 0.95,
            resamples: int = 2000, seed: int = 0) -> Speedup:
    """baseline median / kernel median over all calls, with a bootstrap interval that
    resamples paired rounds (a baseline round and the kernel round next to it).

    Resampling pairs keeps what the ABAB order bought: a burst of load that slowed
    one pair is drawn with both of its sides.  ``paired`` (the median over pairs of
    the per-pair ratio) is reported alongside as a drift-robust cross-check.
    """
    value = baseline.median_us / kernel.median_us
    pairs = [(b, k) for b, k in zip(baseline.rounds, kernel.rounds, strict=False) if b and k]
    if not pairs:
        return Speedup(value, None, None, confidence)
    ratios = numpy.array([statistics.median(b) / statistics.median(k) for b, k in pairs])
    paired = float(numpy.median(ratios))
    if len(pairs) < 3:
        return Speedup(value, None, None, confidence, paired)
    n = min(min(len(b), len(k)) for b, k in pairs)
    base = numpy.array([b[:n] for b, _ in pairs], dtype=numpy.float64)
    kern = numpy.array([k[:n] for _, k in pairs], dtype=numpy.float64)
    rng = numpy.random.default_rng(seed)
    picks = rng.integers(0, len(pairs), size=(resamples, len(pairs)))
    boot = (numpy.median(base[picks].reshape(resamples, -1), axis=1)
            / numpy.median(kern[picks].reshape(resamples, -1), axis=1))
    tail = (1.0 - confidence) / 2
    low, high = numpy.quantile(boot, [tail, 1 - tail])
    return Speedup(value, float(low), float(high), confidence, paired)
