"""``baseline-us LABEL --refresh``: time the baseline again and record it with its conditions.

The cached value is what every later ``--baseline-us`` run divides by, so it
should come from a quiet, pinned run, not from whichever run recorded t0.
The timing runs in a child process (``python -m kernel_harness.bench.baseline_timing``)
started under ``numactl --cpunodebind=0 --membind=0`` when numactl exists and
this process is not already pinned, exactly like procedure step 8's benchmark
runs; its worker inherits the binding.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..bench.pinning import detect_pinning
from ..errors import ExitCode, HarnessError, UsageError
from ..paths import PROJECT_ROOT
from .conditions import conditions_of
from .insights import measured_baseline
from .model import BaselineTime, TreeState
from .sources import file_sha256
from .store import TrialStore, now_iso

NUMACTL_ARGS = ("--cpunodebind=0", "--membind=0")


def timing_command(baseline: Path, threads: int | None, rounds: int | None) -> tuple[list[str], str]:
    """The command that times the baseline, and how it is pinned (for the record)."""
    command = [sys.executable, "-m", "kernel_harness.bench.baseline_timing", str(baseline)]
    if threads is not None:
        command += ["--threads", str(threads)]
    if rounds is not None:
        command += ["--rounds", str(rounds)]
    if detect_pinning().pinned:
        return command, "already pinned by the caller"
    numactl = shutil.which("numactl")
    if numactl is None:
        return command, "not pinned: numactl is not installed"
    return [numactl, *NUMACTL_ARGS, *command], "numactl " + " ".join(NUMACTL_ARGS)


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"Timing the baseline took more than {timeout:g} s and was stopped; nothing was "
                           "recorded. Is the baseline far slower than expected, or the machine busy?",
                           exit_code=ExitCode.KERNEL_CRASHED) from None


def time_baseline_pinned(baseline: Path, *, threads: int | None, rounds: int | None,
                         timeout: float = 600.0) -> tuple[dict[str, Any], list[str]]:
    """The child's JSON report and warnings; numactl refusing (no NUMA policy allowed in a
    container, say) falls back to an unpinned run that says so."""
    command, how = timing_command(baseline, threads, rounds)
    warnings: list[str] = []
    proc = _run(command, timeout)
    if proc.returncode != 0 and command[0] != sys.executable and "numactl" in Path(command[0]).name:
        warnings.append(f"numactl could not pin the run ({proc.stderr.strip()[-200:] or 'no message'}); "
                        "the baseline was timed unpinned.")
        command, how = command[1 + len(NUMACTL_ARGS):], "not pinned: numactl failed"
        proc = _run(command, timeout)
    try:
        report = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    except ValueError:
        report = None
    if proc.returncode != 0 or not isinstance(report, dict) or "baseline_us" not in report:
        message = (report or {}).get("error") if isinstance(report, dict) else None
        code = (report or {}).get("exit_code") if isinstance(report, dict) else None
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise HarnessError(
            f"Timing the baseline {baseline} failed: {message or tail or f'exit status {proc.returncode}'}. "
            "Nothing was recorded; the previous baseline time stays current.",
            exit_code=ExitCode(code) if code in (1, 2, 3) else ExitCode.KERNEL_CRASHED,
        )
    report["pinned_via"] = how
    return report, warnings


def check_baseline_unchanged(state: TreeState) -> Path:
    path = Path(state.baseline.path)
    if not path.is_file() or file_sha256(path) != state.baseline.sha256:
        raise UsageError(
            f"The baseline {path} recorded at init is missing or changed (sha256 differs), so a new time "
            "would belong to another baseline. Restore it from the tree's baseline.py copy, or start a "
            "new tree with init --force."
        )
    return path


def record_refresh(store: TrialStore, report: dict[str, Any]) -> TreeState:
    """Append the new timing; the value in use before (possibly t0's) goes first into history."""
    timing = report.get("timing") if isinstance(report.get("timing"), dict) else {}
    new = BaselineTime(
        baseline_us=float(report["baseline_us"]),
        recorded_at=now_iso(),
        source="refresh",
        conditions=dict(report.get("conditions") or {}),
        details={**timing, "pinned_via": report.get("pinned_via")},
    )

    def change(state: TreeState) -> TreeState:
        times = state.baseline_times
        if not times:
            value, trial = measured_baseline(state)
            if value is not None and trial is not None:
                times = (BaselineTime(value, trial.result.recorded_at, f"result {trial.id}",
                                      conditions_of(trial.result).to_json()),)
        return replace(state, baseline_times=(*times, new))

    return store.update_state(change)
