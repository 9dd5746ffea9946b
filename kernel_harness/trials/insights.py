"""What the trial tree says about the next step: best, early stop, plateau, regression.

Pure functions of a :class:`TreeState`, so the CLI, the demo and the tests
read the same conclusions.  Every comparison between trials goes through
:mod:`.decisions` (intervals and a noise threshold, side-by-side ratios
first); a trial measured under other conditions than its parent is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import decisions
from .conditions import conditions_of, differences
from .decisions import Comparison
from .model import TreeState, Trial

PLATEAU_LENGTH = 2
#: The noise threshold when no configuration could be read (scripts/config.yaml's default).
DEFAULT_NOISE_THRESHOLD = 0.05


def best_trial(state: TreeState, noise_threshold: float = DEFAULT_NOISE_THRESHOLD) -> Trial | None:
    """The best correct trial: the first one, displaced only by a measurably faster one."""
    return decisions.rank(state, noise_threshold).best


def cached_baseline_us(state: TreeState) -> float | None:
    """The current baseline time: the latest ``baseline-us --refresh``, else the baseline
    time of the earliest result that measured it (not a reused value)."""
    if state.baseline_times:
        return state.baseline_times[-1].baseline_us
    return measured_baseline(state)[0]


def measured_baseline(state: TreeState) -> tuple[float | None, Trial | None]:
    """The baseline time of the earliest result that measured it, and that trial."""
    for trial in state.trials:
        result = trial.result
        if result and result.baseline_us and not result.details.get("baseline_cached"):
            return result.baseline_us, trial
    trial = next((t for t in state.trials if t.result and t.result.baseline_us), None)
    return (trial.result.baseline_us, trial) if trial else (None, None)


@dataclass(frozen=True)
class TreeInsights:
    best: Trial | None
    used: int
    max_trials: int | None
    early_stop: bool
    plateau: bool
    regression_of: str | None  # the latest trial when it is measurably slower than its parent
    advice: tuple[str, ...]
    noise_threshold: float = DEFAULT_NOISE_THRESHOLD
    # each trial with a parent: how it compares with it (absent when either has no timing)
    vs_parent: dict[str, Comparison] = field(default_factory=dict)
    # each trial with a parent: how its measurement conditions differ from the parent's
    condition_changes: dict[str, list[str]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def _is_plateau(state: TreeState, ranking: decisions.Ranking) -> bool:
    """True when the last PLATEAU_LENGTH measured trials did not set a new best."""
    measured = [t for t in state.trials if t.result is not None]
    if len(measured) <= PLATEAU_LENGTH:
        return False
    return not any(t.id in ranking.record_setters for t in measured[-PLATEAU_LENGTH:])


def _regression(state: TreeState, vs_parent: dict[str, Comparison]) -> str | None:
    latest = state.trials[-1] if state.trials else None
    if latest is None or latest.result is None or latest.parent is None:
        return None
    parent_ok = decisions.estimate(state.trial(latest.parent)) is not None
    if parent_ok and decisions.estimate(latest) is None:
        return latest.id  # incorrect (or untimed) where its parent was correct
    comparison = vs_parent.get(latest.id)
    return latest.id if comparison is not None and comparison.verdict == decisions.SLOWER else None


def _parents(state: TreeState, threshold: float) -> tuple[dict[str, Comparison], dict[str, list[str]]]:
    vs_parent: dict[str, Comparison] = {}
    changes: dict[str, list[str]] = {}
    for trial in state.trials:
        parent = state.trial(trial.parent) if trial.parent else None
        if parent is None or trial.result is None:
            continue
        comparison = decisions.compare(trial, parent, threshold)
        if comparison is not None:
            vs_parent[trial.id] = comparison
        if parent.result is not None:
            found = differences(conditions_of(parent.result), conditions_of(trial.result))
            if found:
                changes[trial.id] = found
    return vs_parent, changes


def analyse_tree(state: TreeState, *, max_trials: int | None, early_stop_speedup: float | None,
                 noise_threshold: float = DEFAULT_NOISE_THRESHOLD) -> TreeInsights:
    ranking = decisions.rank(state, noise_threshold)
    best = ranking.best
    used = len(state.trials)
    stop = decisions.early_stop(best, early_stop_speedup)
    plateau = _is_plateau(state, ranking)
    vs_parent, changes = _parents(state, noise_threshold)
    regression = _regression(state, vs_parent)
    notes = [c.detail for c in ranking.challenges if c.basis == decisions.POINTS][-1:]
    advice: list[str] = []
    if stop.fired:
        advice.append(f"Early stop: {stop.detail}. Finalize it.")
    else:
        if stop.detail:
            notes.append(stop.detail)
        if max_trials is not None and used >= max_trials:
            advice.append(f"max_trials ({max_trials}) reached: finalize the best trial and report the speedup.")
    latest_challenge = ranking.challenges[-1] if ranking.challenges else None
    if (latest_challenge is not None and state.trials and latest_challenge.later == state.trials[-1].id
            and latest_challenge.verdict != decisions.FASTER and best is not None):
        advice.append(
            f"{latest_challenge.later} against the best {best.id}: {latest_challenge.verdict}, so {best.id} "
            f"stays best ({latest_challenge.detail})."
        )
    if regression is not None and best is not None:
        advice.append(
            f"{regression} regressed against its parent: save the next trial with --parent {best.id} "
            "(the best trial; trial_manager.py checkout restores its sources)."
        )
    if plateau:
        advice.append(
            f"Plateau: the last {PLATEAU_LENGTH} trials set no new best. Change the algorithm, the data "
            "layout or the fusion instead of sweeping the same knobs."
        )
    if best is None and state.trials:
        advice.append("No correct trial yet: fix correctness before any performance work.")
    for trial_id, found in changes.items():
        if state.trials and trial_id == state.trials[-1].id:
            notes.append(f"{trial_id} was measured under other conditions than its parent ({'; '.join(found)}): "
                         "its comparison with the parent mixes two setups; measure both the same way "
                         "(benchmark_cpu.py ... --against the parent's build).")
    return TreeInsights(
        best=best,
        used=used,
        max_trials=max_trials,
        early_stop=stop.fired,
        plateau=plateau,
        regression_of=regression,
        advice=tuple(advice),
        noise_threshold=noise_threshold,
        vs_parent=vs_parent,
        condition_changes=changes,
        notes=tuple(notes),
    )
