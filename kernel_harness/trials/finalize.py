"""Copying the best correct trial out of the tree with a summary of how it got there."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_json, atomic_write_text, copy_file
from ..errors import CheckFailed, UsageError
from ..portability.status import finalize_tier_table
from .conditions import conditions_of, speedup_interval
from .insights import TreeInsights
from .model import TreeState, Trial, TrialResult
from .render import interval_label, save_tree_png
from .results import check_reliable, json_build_id, read_benchmark_json
from .sources import file_sha256
from .store import TrialStore, now_iso

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
TREE_PNG = "trial_tree.png"


def _check_output_dir(output_dir: Path) -> None:
    """Refuse to mix the kernel into a directory that holds something else."""
    if output_dir.exists() and not output_dir.is_dir():
        raise UsageError(f"The output path {output_dir} exists and is not a directory.")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not (output_dir / SUMMARY_JSON).is_file():
        raise UsageError(
            f"The output directory {output_dir} is not empty and holds no earlier {SUMMARY_JSON}. "
            "Choose an empty directory (output/ by default) so nothing of yours is overwritten."
        )


def final_measurement(path: Path, state: TreeState, best: Trial, store: TrialStore, *,
                      accept_unreliable: bool) -> dict[str, Any]:
    """The final run (benchmark_cpu.py --json on the finalized build), checked before anything is written.

    Refused: an incorrect run (exit 1), and (exit 2) a run without a timed speedup, a run on another baseline
    (its ``baseline_sha256``, or the sha256 of its ``baseline_file``, differs from the tree's), a run against a
    cached --baseline-us (the final speedup is timed side by side), a run of
    another build than the best trial's sources, and an unreliable run unless
    accepted.
    """
    path = Path(path)
    data = read_benchmark_json(path, flag="--final-json")
    if not data["correct"]:
        raise CheckFailed(
            f"--final-json: {path} records an incorrect final run (see its \"failures\"). Nothing was "
            "recorded. The finalized kernel must pass; fix it or finalize another trial."
        )
    speedup = data.get("speedup")
    if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or not speedup > 0:
        raise UsageError(
            f"--final-json: {path} has no timed speedup (speedup: {speedup!r}; see its \"timing\" and "
            "\"notes\"). Nothing was recorded. The final measurement is a timed run: rerun "
            "benchmark_cpu.py on the finalized build without --baseline-us and pass that JSON."
        )
    baseline = data.get("baseline_file")
    measured_sha = data.get("baseline_sha256")  # recorded by the benchmark: valid from any directory
    if not isinstance(measured_sha, str) or not measured_sha:
        if not isinstance(baseline, str) or not Path(baseline).is_file():
            raise UsageError(
                f"--final-json: {path} names no readable baseline_file ({baseline!r}), so it cannot be checked "
                f"against the tree's baseline {state.baseline.path}. Rerun benchmark_cpu.py on that baseline."
            )
        measured_sha = file_sha256(Path(baseline))
    if measured_sha != state.baseline.sha256:
        raise UsageError(
            f"--final-json: {path} was measured on {baseline}, whose sha256 differs from the tree's baseline "
            f"{state.baseline.path} ({state.baseline.sha256[:12]}...): another baseline. Nothing was recorded. "
            "Rerun the final benchmark on the tree's baseline file."
        )
    if data.get("baseline_cached"):
        raise UsageError(
            f"--final-json: {path} divides by a cached --baseline-us. The final speedup times the baseline "
            "side by side: rerun benchmark_cpu.py without --baseline-us."
        )
    expected, measured = store.trial_build_id(best), json_build_id(data)
    if expected is not None and measured is not None and expected != measured:
        raise UsageError(
            f"--final-json: {path} measured build {measured}, but the finalized trial {best.id}'s sources "
            f"have content id {expected}. Build and install the finalized output directory, benchmark it "
            "and pass that JSON."
        )
    accepted = check_reliable(path, data, accept_unreliable=accept_unreliable, flag="--final-json")
    details = {k: data.get(k) for k in ("conditions", "reliable", "machine", "threads", "pinned", "load_average")}
    conditions = conditions_of(TrialResult(True, None, None, None, "", "", {**details, "speedup_ci": data.get("speedup_ci")}))
    return {
        "correct": True,
        "speedup": data.get("speedup"),
        "speedup_ci": list(speedup_interval(data)) if speedup_interval(data) else None,
        "speedup_verdict": data.get("speedup_verdict"),
        "baseline_us": data.get("baseline_us"),
        "kernel_us": data.get("kernel_us"),
        "conditions": {**(data.get("conditions") if isinstance(data.get("conditions"), dict) else {}),
                       **{k: v for k, v in conditions.to_json().items() if v is not None}},
        "reliable": data.get("reliable"),
        "unreliable_reasons": data.get("unreliable_reasons") or [],
        "accepted_unreliable": accepted,
        "build_id": measured,
        "build_verified": expected is not None and measured is not None,
        "trial": best.id,
        "source": str(path.resolve()),
        "recorded_at": now_iso(),
    }


def _earlier_final(output_dir: Path, best: Trial) -> dict[str, Any] | None:
    """A final measurement recorded by an earlier finalize of the same best trial, kept."""
    try:
        earlier = json.loads((output_dir / SUMMARY_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    final = earlier.get("final") if isinstance(earlier, dict) else None
    return final if isinstance(final, dict) and final.get("trial") == best.id else None


def summary_payload(state: TreeState, insights: TreeInsights, output_dir: Path) -> dict[str, Any]:
    best = insights.best
    return {
        "name": state.name,
        "finalized_at": now_iso(),
        "output_dir": str(output_dir.resolve()),
        "best_trial": best.id,
        "strategy": best.strategy,
        "speedup": best.result.speedup,
        "speedup_side_by_side": best.result.side_by_side_speedup,
        "baseline_us": best.result.baseline_us,
        "kernel_us": best.result.kernel_us,
        "baseline_file": state.baseline.path,
        "baseline_sha256": state.baseline.sha256,
        "files": list(best.files),
        "trials": [asdict(t) for t in state.trials],
        "max_trials": insights.max_trials,
        "early_stop": insights.early_stop,
        "noise_threshold": insights.noise_threshold,
        "speedup_ci": list(speedup_interval(best.result.details) or ()) or None,
        "conditions": conditions_of(best.result).to_json(),
        # the final benchmark of the finalized build (finalize --final-json), or None yet
        "final": None,
    }


def _final_markdown(final: dict[str, Any] | None) -> list[str]:
    if final is None:
        return ["## Final measurement", "",
                "Not recorded yet: build this directory, run benchmark_cpu.py on it without --baseline-us, "
                "then `trial_manager.py finalize LABEL OUTPUT --final-json FILE`.", ""]
    ci = final.get("speedup_ci")
    interval = f" (interval {ci[0]:.2f}-{ci[1]:.2f}x)" if ci else ""
    cond = final.get("conditions") or {}
    where = ", ".join(str(x) for x in (
        cond.get("cpu_model"), f"{cond.get('threads')} threads" if cond.get("threads") else None,
        "pinned" if cond.get("pinned") else "unpinned" if cond.get("pinned") is False else None,
        f"tier {cond.get('tier_ran')}" if cond.get("tier_ran") else None) if x)
    speed = final.get("speedup")
    lines = ["## Final measurement", "",
             f"Correct; {speed:.2f}x{interval}" if isinstance(speed, (int, float)) else "Correct",
             "", f"Measured on: {where or 'conditions not reported'}; build {final.get('build_id') or 'not reported'}."]
    if final.get("accepted_unreliable"):
        lines += ["", "Recorded although the benchmark marked it unreliable (--accept-unreliable): "
                  + "; ".join(final.get("unreliable_reasons") or [])]
    return [*lines, ""]


def summary_markdown(state: TreeState, insights: TreeInsights, final: dict[str, Any] | None = None) -> str:
    best = insights.best
    lines = [
        f"# Finalized kernel: {state.name}",
        "",
        f"Best trial **{best.id}**: {best.result.speedup_label()} "
        f"({best.result.baseline_us:.1f} us baseline -> {best.result.kernel_us:.1f} us kernel).",
        "",
        f"Strategy: {best.strategy}",
        "",
        f"Baseline: `{state.baseline.path}` (sha256 `{state.baseline.sha256[:16]}...`)",
        "",
        *_final_markdown(final),
        "## Trial tree",
        "",
        "| trial | parent | strategy | correct | speedup | baseline us | kernel us |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for trial in state.trials:
        result = trial.result
        cells = ["-", "-", "-", "-"] if result is None else [
            "yes" if result.correct else "no",
            result.speedup_label() + interval_label(trial),
            f"{result.baseline_us:.1f}" if result.baseline_us else "-",
            f"{result.kernel_us:.1f}" if result.kernel_us else "-",
        ]
        mark = " (best)" if trial.id == best.id else ""
        strategy = trial.strategy.replace("|", "\\|")
        lines.append(f"| {trial.id}{mark} | {trial.parent or '-'} | {strategy} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def finalize_tree(store: TrialStore, state: TreeState, insights: TreeInsights, output_dir: Path, *,
                  final_json: Path | None = None, accept_unreliable: bool = False) -> dict[str, Any]:
    if insights.best is None:
        raise CheckFailed(
            f"Trial tree {state.name!r} has no correct trial with a recorded speedup, so there is "
            "nothing to finalize. Record a passing result first (trial_manager.py result ... "
            "--correctness pass or --from-json)."
        )
    output_dir = Path(output_dir)
    _check_output_dir(output_dir)
    # checked before anything is written: a refused final run changes nothing
    final = (final_measurement(final_json, state, insights.best, store, accept_unreliable=accept_unreliable)
             if final_json is not None else _earlier_final(output_dir, insights.best))
    output_dir.mkdir(parents=True, exist_ok=True)
    source_dir = store.trial_sources_dir(insights.best.id)
    for relative in insights.best.files:
        target = output_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        copy_file(source_dir / relative, target)
    copy_file(store.directory / state.baseline.copy, output_dir / "baseline.py")
    payload = summary_payload(state, insights, output_dir)
    payload["final"] = final
    payload["tiers"], tier_md = finalize_tier_table(output_dir, payload)  # issue 24 (portability/status.py)
    atomic_write_json(output_dir / SUMMARY_JSON, json.loads(json.dumps(payload)))
    atomic_write_text(output_dir / SUMMARY_MD, summary_markdown(state, insights, final) + "\n" + tier_md)
    save_tree_png(state, insights, output_dir / TREE_PNG)
    return payload
