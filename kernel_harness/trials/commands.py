"""The trial manager's commands as functions returning JSON-ready payloads.

``scripts/trial_manager.py`` parses arguments and prints; everything it does
is here so tests call the same code.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..baseline import load_baseline
from ..config import OPTIONAL_KEYS, load_config
from ..errors import CheckFailed, HarnessError, UsageError
from ..portability.status import unrun_change_warning
from . import refresh
from .checkout import checkout as checkout_trial
from .conditions import conditions_of
from .finalize import finalize_tree
from .insights import analyse_tree, best_trial, cached_baseline_us, measured_baseline
from .model import TreeState, TrialResult
from .results import build_result, json_build_id, result_from_benchmark_json
from .store import TrialStore


def _loaded(name: str, trials_root: Path | None) -> tuple[TrialStore, TreeState, list[str]]:
    store = TrialStore(name, trials_root)
    state = store.load()
    warning = store.baseline_warning(state)
    return store, state, [warning] if warning else []


def init(name: str, baseline_file: Path, *, force: bool, trials_root: Path | None = None) -> dict[str, Any]:
    store = TrialStore(name, trials_root)
    state, archived = store.init(baseline_file, force=force)
    return {
        "name": name,
        "directory": str(store.directory),
        "baseline": asdict(state.baseline),
        "archived_previous": str(archived) if archived else None,
        "warnings": [],
    }


def save(name: str, kernel_dir: Path, *, strategy: str, parent: str | None, trials_root: Path | None = None) -> dict[str, Any]:
    store, _, warnings = _loaded(name, trials_root)
    outcome = store.save(kernel_dir, strategy=strategy, parent=parent)
    warnings += list(outcome.warnings)
    warnings += [f"An interrupted earlier save was kept at {p}." for p in outcome.interrupted_moved]
    return {
        "name": name,
        "trial_id": outcome.trial.id,
        "parent": outcome.trial.parent,
        "strategy": outcome.trial.strategy,
        "files": list(outcome.trial.files),
        "sources_sha256": outcome.trial.sources_sha256,
        "directory": str(store.trial_sources_dir(outcome.trial.id)),
        "warnings": warnings,
    }


def result(
    name: str,
    trial_id: str,
    *,
    correctness: str | None,
    speedup: float | None,
    baseline_us: float | None,
    kernel_us: float | None,
    from_json: Path | None,
    force: bool,
    accept_unreliable: bool = False,
    trials_root: Path | None = None,
) -> dict[str, Any]:
    store, state, warnings = _loaded(name, trials_root)
    if from_json is not None:
        if correctness is not None or any(v is not None for v in (speedup, baseline_us, kernel_us)):
            raise HarnessError("Pass either --from-json or --correctness/--speedup/--baseline_us/--kernel_us, not both.")
        record = result_from_benchmark_json(from_json, accept_unreliable=accept_unreliable)
        warnings += _check_build(store, state, trial_id, record, from_json)
    else:
        if correctness is None:
            raise HarnessError("Pass --correctness pass|fail (with the timings), or --from-json FILE.")
        record = build_result(
            correct=correctness == "pass", speedup=speedup, baseline_us=baseline_us,
            kernel_us=kernel_us, source="cli",
        )
    trial = store.record_result(trial_id, record, force=force)
    if record.accepted_unreliable:
        warnings.append(f"{trial.id}'s result was recorded although the benchmark marked it unreliable "
                        "(--accept-unreliable); status shows it as such.")
    parent_dir = store.trial_sources_dir(trial.parent) if trial.parent else None  # issue 24:
    unrun = unrun_change_warning(store.trial_sources_dir(trial.id), parent_dir,  # a change to a tier that
                                 record.details.get("tier_evidence"))  # did not run records noise
    if unrun:
        warnings.append(unrun)
    return {"name": name, "trial_id": trial.id, "result": asdict(record),
            "conditions": conditions_of(record).to_json(), "build_id": store.trial_build_id(trial),
            "warnings": warnings}


def _check_build(store: TrialStore, state: TreeState, trial_id: str, record: TrialResult, path: Path) -> list[str]:
    """Refuse a benchmark JSON of another build than the trial's saved sources."""
    trial = state.trial(trial_id)
    if trial is None:
        return []  # record_result names the unknown id
    measured = json_build_id(record.details)
    if measured is None:
        return [] if "kernel_build" not in record.details else [
            f"{path} names no build id (kernel_build), so it could not be matched with {trial_id}'s sources."]
    expected = store.trial_build_id(trial)
    if expected is None:
        return [f"{trial_id}'s saved build.toml could not be read, so the build {measured} that {path} "
                "measured could not be matched with its sources."]
    if measured != expected:
        owner = next((t.id for t in state.trials if store.trial_build_id(t) == measured), None)
        hint = (f"It is {owner}'s build: record it there (result {store.name} {owner} --from-json ...)"
                if owner else "No saved trial has that build: save the sources it was built from as a new "
                "trial, or rebuild and reinstall this trial's sources (trial_manager.py checkout) and benchmark again")
        raise UsageError(
            f"--from-json: {path} measured the build {measured}, but trial {trial_id}'s saved sources have "
            f"content id {expected} (the op namespace suffix a build of them gets). Nothing was recorded. {hint}."
        )
    return []


def _noise_threshold(warnings: list[str]) -> float:
    try:
        return load_config().noise_threshold
    except HarnessError as exc:
        default = OPTIONAL_KEYS["noise_threshold"]
        warnings.append(f"noise_threshold unknown ({exc.message}); using {default:g}.")
        return default


def best(name: str, *, trials_root: Path | None = None) -> dict[str, Any]:
    _, state, warnings = _loaded(name, trials_root)
    trial = best_trial(state, _noise_threshold(warnings))
    if trial is None:
        raise CheckFailed(f"Trial tree {name!r} has no correct trial with a recorded speedup yet.")
    return {"name": name, "best_trial": trial.id, "speedup": trial.result.speedup,
            "speedup_side_by_side": trial.result.side_by_side_speedup,
            "speedup_ci": list(conditions_of(trial.result).speedup_ci or ()) or None,
            "baseline_us": trial.result.baseline_us, "kernel_us": trial.result.kernel_us, "warnings": warnings}


def baseline_us(name: str, *, refresh_timing: bool = False, threads: int | None = None,
                rounds: int | None = None, trials_root: Path | None = None) -> dict[str, Any]:
    store, state, warnings = _loaded(name, trials_root)
    if not refresh_timing and (threads is not None or rounds is not None):
        raise UsageError("--threads and --rounds apply to --refresh only.")
    previous = cached_baseline_us(state)
    if refresh_timing:
        report, run_warnings = refresh.time_baseline_pinned(refresh.check_baseline_unchanged(state),
                                                           threads=threads, rounds=rounds)
        warnings += run_warnings
        state = refresh.record_refresh(store, report)
        if report.get("reliable") is False:
            reasons = "; ".join(str(r) for r in report.get("unreliable_reasons") or []) or "no reason given"
            warnings.append(f"The baseline was timed on a busy machine ({reasons}): the new value is recorded, "
                            "but refresh again when the machine is quiet.")
    value = cached_baseline_us(state)
    if value is None:
        raise CheckFailed(
            f"Trial tree {name!r} has no recorded baseline time yet: record t0's result first "
            "(its benchmark run measures the baseline), or time it with baseline-us --refresh."
        )
    current = state.baseline_times[-1] if state.baseline_times else None
    _, trial = measured_baseline(state)
    conditions = current.conditions if current else (conditions_of(trial.result).to_json() if trial else {})
    warnings += _regime_warnings(state, conditions)
    return {
        "name": name,
        "baseline_us": value,
        "source": current.source if current else (f"result {trial.id}" if trial else None),
        "conditions": conditions,
        "previous_baseline_us": previous if refresh_timing else None,
        "history": [asdict(t) for t in state.baseline_times],
        "warnings": warnings,
    }


def _regime_warnings(state: TreeState, conditions: dict[str, Any]) -> list[str]:
    """A cached time whose record does not say where its inputs came from, for a baseline that
    names PERSISTENT_INPUTS: it may have been timed with the weight still in the cache (before
    the benchmark evicted it), and every --baseline-us run would divide by it."""
    if conditions.get("inputs_from_memory") is not None:
        return []
    try:
        named = load_baseline(state.baseline.path).persistent_inputs
    except HarnessError:
        return []
    if not named:
        return []
    return [f"The cached baseline time does not record where its inputs came from, and the baseline names "
            f"PERSISTENT_INPUTS {list(named)}: it may have been timed with those inputs still in the cache. "
            "Run baseline-us --refresh so kernel and baseline are timed alike."]


def _config_limits() -> tuple[int | None, float | None, str | None]:
    try:
        config = load_config()
    except HarnessError as exc:
        return None, None, f"max_trials and early_stop_speedup unknown: {exc.message}"
    return config.max_trials, config.early_stop_speedup, None


def _insights(state: TreeState, warnings: list[str]):
    max_trials, early_stop, config_warning = _config_limits()
    if config_warning:
        warnings.append(config_warning)
    return analyse_tree(state, max_trials=max_trials, early_stop_speedup=early_stop,
                        noise_threshold=_noise_threshold(warnings)), max_trials, early_stop


def status(name: str, *, trials_root: Path | None = None) -> tuple[dict[str, Any], TreeState, Any]:
    _, state, warnings = _loaded(name, trials_root)
    insights, max_trials, early_stop = _insights(state, warnings)
    payload = {
        "name": name,
        "baseline": asdict(state.baseline),
        "trials": [asdict(t) for t in state.trials],
        "best_trial": insights.best.id if insights.best else None,
        "trials_used": insights.used,
        "max_trials": max_trials,
        "early_stop_speedup": early_stop,
        "early_stop": insights.early_stop,
        "plateau": insights.plateau,
        "regression_of": insights.regression_of,
        "advice": list(insights.advice),
        "notes": list(insights.notes),
        "noise_threshold": insights.noise_threshold,
        # per trial: its conditions, how it compares with its parent, and what was measured differently
        "decisions": {
            t.id: {
                "conditions": conditions_of(t.result).to_json() if t.result else None,
                "vs_parent": insights.vs_parent[t.id].to_json() if t.id in insights.vs_parent else None,
                "conditions_differ_from_parent": insights.condition_changes.get(t.id, []),
                "accepted_unreliable": bool(t.result and t.result.accepted_unreliable),
            }
            for t in state.trials
        },
        "warnings": warnings,
    }
    return payload, state, insights


def finalize(name: str, output_dir: Path, *, final_json: Path | None = None, accept_unreliable: bool = False,
             trials_root: Path | None = None) -> dict[str, Any]:
    store, state, warnings = _loaded(name, trials_root)
    insights, _, _ = _insights(state, warnings)
    payload = finalize_tree(store, state, insights, output_dir, final_json=final_json,
                            accept_unreliable=accept_unreliable)
    payload["warnings"] = warnings
    return payload


def checkout(name: str, trial_id: str, directory: Path, *, force: bool,
             trials_root: Path | None = None) -> dict[str, Any]:
    store, _, warnings = _loaded(name, trials_root)
    outcome = checkout_trial(store, trial_id, directory, force=force)
    return {
        "name": name,
        "trial_id": outcome.trial.id,
        "directory": str(outcome.directory),
        "files": list(outcome.written),
        "removed": list(outcome.removed),
        "stashed_to": str(outcome.stashed) if outcome.stashed else None,
        "build_id": store.trial_build_id(outcome.trial),
        "warnings": warnings,
    }
