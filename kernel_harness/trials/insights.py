"""What the trial tree says about the next step: best, early stop, plateau, regression.

Pure functions of a :class:`TreeState`, so the CLI, the demo and the tests
read the same conclusions.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import TreeState, Trial

PLATEAU_LENGTH = 2


def best_trial(state: TreeState) -> Trial | None:
    """The fastest correct trial by its side-by-side ratio (TrialResult.ranking_speedup;
    ties go to the earlier one)."""
    candidates = [t for t in state.trials if t.result and t.result.correct and t.result.ranking_speedup]
    if not candidates:
        return None
    return max(candidates, key=lambda t: (t.result.ranking_speedup, -t.number))


def cached_baseline_us(state: TreeState) -> float | None:
    """The baseline time of the earliest result that measured it (not a reused value)."""
    for trial in state.trials:
        result = trial.result
        if result and result.baseline_us and not result.details.get("baseline_cached"):
            return result.baseline_us
    return next((t.result.baseline_us for t in state.trials if t.result and t.result.baseline_us), None)


@dataclass(frozen=True)
class TreeInsights:
    best: Trial | None
    used: int
    max_trials: int | None
    early_stop: bool
    plateau: bool
    regression_of: str | None  # the latest trial when it is slower than its parent
    advice: tuple[str, ...]


def _speedup(trial: Trial | None) -> float | None:
    if trial is None or trial.result is None or not trial.result.correct:
        return None
    return trial.result.ranking_speedup


def _is_plateau(state: TreeState) -> bool:
    """True when the last PLATEAU_LENGTH measured trials did not set a new best."""
    measured = [t for t in state.trials if t.result is not None]
    if len(measured) <= PLATEAU_LENGTH:
        return False
    best_before = None
    improved_at: list[bool] = []
    for trial in measured:
        speedup = _speedup(trial)
        improved = speedup is not None and (best_before is None or speedup > best_before)
        improved_at.append(improved)
        if improved:
            best_before = speedup
    return not any(improved_at[-PLATEAU_LENGTH:])


def analyse_tree(state: TreeState, *, max_trials: int | None, early_stop_speedup: float | None) -> TreeInsights:
    best = best_trial(state)
    used = len(state.trials)
    early = bool(best and early_stop_speedup is not None and best.result.ranking_speedup > early_stop_speedup)
    plateau = _is_plateau(state)
    latest = state.trials[-1] if state.trials else None
    regression = None
    if latest is not None and latest.result is not None and latest.parent is not None:
        parent = state.trial(latest.parent)
        latest_speed, parent_speed = _speedup(latest), _speedup(parent)
        if parent_speed is not None and (latest_speed is None or latest_speed < parent_speed):
            regression = latest.id
    advice: list[str] = []
    if early:
        advice.append(
            f"Early stop: {best.id} reached {best.result.ranking_speedup:.2f}x > early_stop_speedup "
            f"{early_stop_speedup:g}x. Finalize it."
        )
    elif max_trials is not None and used >= max_trials:
        advice.append(f"max_trials ({max_trials}) reached: finalize the best trial and report the speedup.")
    if regression is not None and best is not None:
        advice.append(
            f"{regression} regressed against its parent: save the next trial with --parent {best.id} "
            "(the best trial)."
        )
    if plateau:
        advice.append(
            f"Plateau: the last {PLATEAU_LENGTH} trials set no new best. Change the algorithm, the data "
            "layout or the fusion instead of sweeping the same knobs."
        )
    if best is None and state.trials:
        advice.append("No correct trial yet: fix correctness before any performance work.")
    return TreeInsights(
        best=best,
        used=used,
        max_trials=max_trials,
        early_stop=early,
        plateau=plateau,
        regression_of=regression,
        advice=tuple(advice),
    )
