"""The trial manager's commands as functions returning JSON-ready payloads.

``scripts/trial_manager.py`` parses arguments and prints; everything it does
is here so tests call the same code.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..config import load_config
from ..errors import CheckFailed, HarnessError
from ..portability.status import unrun_change_warning
from .finalize import finalize_tree
from .insights import analyse_tree, best_trial, cached_baseline_us
from .model import TreeState
from .results import build_result, result_from_benchmark_json
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
    trials_root: Path | None = None,
) -> dict[str, Any]:
    store, _, warnings = _loaded(name, trials_root)
    if from_json is not None:
        if correctness is not None or any(v is not None for v in (speedup, baseline_us, kernel_us)):
            raise HarnessError("Pass either --from-json or --correctness/--speedup/--baseline_us/--kernel_us, not both.")
        record = result_from_benchmark_json(from_json)
    else:
        if correctness is None:
            raise HarnessError("Pass --correctness pass|fail (with the timings), or --from-json FILE.")
        record = build_result(
            correct=correctness == "pass", speedup=speedup, baseline_us=baseline_us,
            kernel_us=kernel_us, source="cli",
        )
    trial = store.record_result(trial_id, record, force=force)
    parent_dir = store.trial_sources_dir(trial.parent) if trial.parent else None  # issue 24:
    unrun = unrun_change_warning(store.trial_sources_dir(trial.id), parent_dir,  # a change to a tier that
                                 record.details.get("tier_evidence"))  # did not run records noise
    warnings = [*warnings, unrun] if unrun else warnings
    return {"name": name, "trial_id": trial.id, "result": asdict(record), "warnings": warnings}


def best(name: str, *, trials_root: Path | None = None) -> dict[str, Any]:
    _, state, warnings = _loaded(name, trials_root)
    trial = best_trial(state)
    if trial is None:
        raise CheckFailed(f"Trial tree {name!r} has no correct trial with a recorded speedup yet.")
    return {"name": name, "best_trial": trial.id, "speedup": trial.result.speedup,
            "speedup_side_by_side": trial.result.side_by_side_speedup,
            "baseline_us": trial.result.baseline_us, "kernel_us": trial.result.kernel_us, "warnings": warnings}


def baseline_us(name: str, *, trials_root: Path | None = None) -> dict[str, Any]:
    _, state, warnings = _loaded(name, trials_root)
    value = cached_baseline_us(state)
    if value is None:
        raise CheckFailed(
            f"Trial tree {name!r} has no recorded baseline time yet: record t0's result first "
            "(its benchmark run measures the baseline)."
        )
    return {"name": name, "baseline_us": value, "warnings": warnings}


def _config_limits() -> tuple[int | None, float | None, str | None]:
    try:
        config = load_config()
    except HarnessError as exc:
        return None, None, f"max_trials and early_stop_speedup unknown: {exc.message}"
    return config.max_trials, config.early_stop_speedup, None


def status(name: str, *, trials_root: Path | None = None) -> tuple[dict[str, Any], TreeState, Any]:
    _, state, warnings = _loaded(name, trials_root)
    max_trials, early_stop, config_warning = _config_limits()
    if config_warning:
        warnings.append(config_warning)
    insights = analyse_tree(state, max_trials=max_trials, early_stop_speedup=early_stop)
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
        "warnings": warnings,
    }
    return payload, state, insights


def finalize(name: str, output_dir: Path, *, trials_root: Path | None = None) -> dict[str, Any]:
    store, state, warnings = _loaded(name, trials_root)
    max_trials, early_stop, config_warning = _config_limits()
    if config_warning:
        warnings.append(config_warning)
    insights = analyse_tree(state, max_trials=max_trials, early_stop_speedup=early_stop)
    payload = finalize_tree(store, state, insights, output_dir)
    payload["warnings"] = warnings
    return payload
