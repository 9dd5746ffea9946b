"""Copying the best correct trial out of the tree with a summary of how it got there."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_json, atomic_write_text
from ..errors import CheckFailed, UsageError
from ..portability.status import finalize_tier_table
from .insights import TreeInsights
from .model import TreeState
from .render import save_tree_png
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
    }


def summary_markdown(state: TreeState, insights: TreeInsights) -> str:
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
        "## Trial tree",
        "",
        "| trial | parent | strategy | correct | speedup | baseline us | kernel us |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for trial in state.trials:
        result = trial.result
        cells = ["-", "-", "-", "-"] if result is None else [
            "yes" if result.correct else "no",
            result.speedup_label(),
            f"{result.baseline_us:.1f}" if result.baseline_us else "-",
            f"{result.kernel_us:.1f}" if result.kernel_us else "-",
        ]
        mark = " (best)" if trial.id == best.id else ""
        strategy = trial.strategy.replace("|", "\\|")
        lines.append(f"| {trial.id}{mark} | {trial.parent or '-'} | {strategy} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def finalize_tree(store: TrialStore, state: TreeState, insights: TreeInsights, output_dir: Path) -> dict[str, Any]:
    if insights.best is None:
        raise CheckFailed(
            f"Trial tree {state.name!r} has no correct trial with a recorded speedup, so there is "
            "nothing to finalize. Record a passing result first (trial_manager.py result ... "
            "--correctness pass or --from-json)."
        )
    output_dir = Path(output_dir)
    _check_output_dir(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    source_dir = store.trial_sources_dir(insights.best.id)
    for relative in insights.best.files:
        target = output_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source_dir / relative, target)
    shutil.copyfile(store.directory / state.baseline.copy, output_dir / "baseline.py")
    payload = summary_payload(state, insights, output_dir)
    payload["tiers"], tier_md = finalize_tier_table(output_dir, payload)  # issue 24 (portability/status.py)
    atomic_write_json(output_dir / SUMMARY_JSON, json.loads(json.dumps(payload)))
    atomic_write_text(output_dir / SUMMARY_MD, summary_markdown(state, insights) + "\n" + tier_md)
    save_tree_png(state, insights, output_dir / TREE_PNG)
    return payload
