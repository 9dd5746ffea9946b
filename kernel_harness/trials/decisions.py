"""Is one trial faster than another?  Decided by intervals, the way Criterion.rs does.

A difference counts only when it is statistically significant **and** larger
than the noise threshold (``noise_threshold`` in scripts/config.yaml):

1. side by side first: when the later trial's benchmark timed it against the
   other trial's build (``--against``, the JSON's ``vs_against``), the ratio's
   interval must exclude 1.0 and the ratio differ from 1 by more than the
   threshold;
2. otherwise both speedup intervals (``speedup_ci``): they must separate (the
   later's low above the earlier's high, or its high below the earlier's low)
   and the point estimates differ by more than the threshold;
3. results without an interval (recorded before intervals existed, or timed
   against a cached baseline) fall back to comparing point estimates, as
   before, and say so in a note.

Anything else is "no measurable difference": the earlier trial keeps its place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .conditions import _number, speedup_interval
from .model import TreeState, Trial

FASTER = "faster"
SLOWER = "slower"
SAME = "no measurable difference"

SIDE_BY_SIDE = "side by side (--against)"
INTERVALS = "intervals"
POINTS = "point estimates"


@dataclass(frozen=True)
class Estimate:
    """A correct trial's speedup against the baseline, with its interval when recorded."""

    point: float
    interval: tuple[float, float] | None

    def label(self) -> str:
        if self.interval is None:
            return f"{self.point:.2f}x (no interval)"
        return f"{self.point:.2f}x [{self.interval[0]:.2f}-{self.interval[1]:.2f}]"


@dataclass(frozen=True)
class Comparison:
    later: str
    earlier: str
    verdict: str  # FASTER, SLOWER or SAME: the later trial against the earlier one
    basis: str  # SIDE_BY_SIDE, INTERVALS or POINTS
    detail: str  # one sentence with the numbers

    def to_json(self) -> dict[str, str]:
        return {"against": self.earlier, "verdict": self.verdict, "basis": self.basis, "detail": self.detail}


def estimate(trial: Trial | None) -> Estimate | None:
    """The speedup trials are ranked by, or None for a trial without a correct timed result.

    The interval belongs to the recorded ``speedup`` (baseline and kernel timed
    side by side in one run); a cached-baseline result is ranked by its spot
    ratio, with the interval of that ratio (``speedup_spot_ci``: only a few spot
    rounds, so it is wide, and narrow claims need ``--against``).
    """
    if trial is None or trial.result is None or not trial.result.correct:
        return None
    result = trial.result
    point = result.ranking_speedup
    if point is None:
        return None
    if result.side_by_side_speedup is None:
        interval = speedup_interval(result.details)
    else:
        interval = speedup_interval({"speedup_ci": result.details.get("speedup_spot_ci")})
    return Estimate(point, interval)


def measured_against(trial: Trial, other: Trial) -> dict[str, Any] | None:
    """``trial``'s ``vs_against`` record when it was timed against ``other``'s build, else None.

    A ratio is against a build, so it holds for every trial with that build id
    (branching back saves the best's sources again, as a new trial with the same
    id); without a build id in the record the other build is taken to be the parent.
    """
    vs = trial.result.details.get("vs_against") if trial.result else None
    if not isinstance(vs, dict) or _number(vs.get("ratio")) is None or other.id == trial.id:
        return None
    build_id = vs.get("against_build_id")
    if isinstance(build_id, str) and build_id:
        # a trial saved before build ids were recorded (build_id None) cannot be matched
        return vs if other.build_id == build_id else None
    return vs if other.id == trial.parent else None


def _side_by_side(later: Trial, earlier: Trial, vs: dict[str, Any], threshold: float) -> Comparison:
    ratio = float(vs["ratio"])
    ci = speedup_interval({"speedup_ci": vs.get("ci")})
    if ci is not None:
        significant_up, significant_down = ci[0] > 1.0, ci[1] < 1.0
        numbers = f"ratio {ratio:.3f} [{ci[0]:.3f}-{ci[1]:.3f}]"
    else:  # no interval in the record: the benchmark's own verdict says whether it was significant
        significant_up = significant_down = vs.get("verdict") in (FASTER, SLOWER)
        numbers = f"ratio {ratio:.3f} (benchmark verdict: {vs.get('verdict')})"
    if significant_up and ratio > 1.0 + threshold:
        verdict = FASTER
    elif significant_down and ratio < 1.0 / (1.0 + threshold):
        verdict = SLOWER
    else:
        verdict = SAME
    detail = f"{later.id} vs {earlier.id} side by side: {numbers}, noise threshold {threshold:.0%}: {verdict}"
    return Comparison(later.id, earlier.id, verdict, SIDE_BY_SIDE, detail)


def _by_intervals(later: Trial, earlier: Trial, a: Estimate, b: Estimate, threshold: float) -> Comparison:
    assert a.interval is not None and b.interval is not None
    change = a.point / b.point - 1.0
    if a.interval[0] > b.interval[1] and change > threshold:
        verdict = FASTER
    elif a.interval[1] < b.interval[0] and -change / (1.0 + change) > threshold:
        verdict = SLOWER
    else:
        verdict = SAME
    why = "" if verdict != SAME else (
        " (the intervals overlap)" if a.interval[0] <= b.interval[1] and a.interval[1] >= b.interval[0]
        else f" (the difference, {change:+.1%}, is within the noise threshold {threshold:.0%})")
    detail = f"{later.id} {a.label()} vs {earlier.id} {b.label()}: {verdict}{why}"
    return Comparison(later.id, earlier.id, verdict, INTERVALS, detail)


def _by_points(later: Trial, earlier: Trial, a: Estimate, b: Estimate) -> Comparison:
    verdict = FASTER if a.point > b.point else SLOWER if a.point < b.point else SAME
    missing = " and ".join(t.id for t, e in ((later, a), (earlier, b)) if e.interval is None)
    detail = (f"{later.id} {a.point:.2f}x vs {earlier.id} {b.point:.2f}x compared by point estimates: "
              f"{missing} has no speedup interval (recorded before intervals existed, or timed against "
              "a cached --baseline-us); rerun without --baseline-us, or with --against, to decide by interval")
    return Comparison(later.id, earlier.id, verdict, POINTS, detail)


def compare(later: Trial, earlier: Trial, threshold: float) -> Comparison | None:
    """``later`` against ``earlier``; None when either has no correct timed result."""
    a, b = estimate(later), estimate(earlier)
    if a is None or b is None:
        return None
    vs = measured_against(later, earlier)
    if vs is not None:
        return _side_by_side(later, earlier, vs, threshold)
    if a.interval is not None and b.interval is not None:
        return _by_intervals(later, earlier, a, b, threshold)
    return _by_points(later, earlier, a, b)


@dataclass(frozen=True)
class Ranking:
    best: Trial | None
    # each measured trial after the first, compared with the best standing when it came
    challenges: tuple[Comparison, ...]
    # ids of the trials that became best at their turn, in order
    record_setters: tuple[str, ...]


def rank(state: TreeState, threshold: float) -> Ranking:
    """Walk the trials in order: a later trial displaces the best only when it is FASTER.

    Ties and "no measurable difference" keep the earlier trial, so a noisy point
    estimate never takes the lead on its own.
    """
    best: Trial | None = None
    challenges: list[Comparison] = []
    setters: list[str] = []
    for trial in state.trials:
        if estimate(trial) is None:
            continue
        if best is None:
            best = trial
            setters.append(trial.id)
            continue
        comparison = compare(trial, best, threshold)
        assert comparison is not None
        challenges.append(comparison)
        if comparison.verdict == FASTER:
            best = trial
            setters.append(trial.id)
    return Ranking(best, tuple(challenges), tuple(setters))


@dataclass(frozen=True)
class EarlyStop:
    fired: bool
    detail: str | None


def early_stop(best: Trial | None, threshold_speedup: float | None) -> EarlyStop:
    """Fires only when the best's interval lies entirely above ``early_stop_speedup``."""
    value = estimate(best)
    if best is None or value is None or threshold_speedup is None:
        return EarlyStop(False, None)
    if value.interval is not None:
        low = value.interval[0]
        fired = low > threshold_speedup
        if fired:
            return EarlyStop(True, f"{best.id}'s interval lies above early_stop_speedup "
                                   f"{threshold_speedup:g}x (low {low:.2f}x)")
        if value.point > threshold_speedup:
            return EarlyStop(False, f"{best.id} reads {value.point:.2f}x but its interval goes down to "
                                    f"{low:.2f}x, below early_stop_speedup {threshold_speedup:g}x: not an early stop")
        return EarlyStop(False, None)
    if value.point > threshold_speedup:
        # a point estimate alone cannot show that the speedup is above the bar: a busy
        # machine read 53.9x for a kernel whose quiet value is ~9x
        return EarlyStop(False, f"{best.id} reads {value.point:.2f}x > early_stop_speedup {threshold_speedup:g}x, "
                                "but its result has no interval, so that is not an early stop: record the "
                                "benchmark's JSON (result --from-json --force) so its interval can decide")
    return EarlyStop(False, None)
