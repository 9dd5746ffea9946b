"""Turning command-line numbers or a benchmark JSON into a validated result.

Numbers are never trusted as typed: they must be finite and positive, and the
speedup must agree with baseline_us / kernel_us within 2 %, because a
mistyped speedup would steer every later decision of the trial loop.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .buildid import id_of_module
from .model import TrialResult
from .store import now_iso

SPEEDUP_CONSISTENCY = 0.02
# Keys of benchmark_cpu.py's JSON kept with a result for later reading.
CARRIED_BENCHMARK_KEYS = (
    "iqr", "threads", "pinned", "acceptance_rule", "speedup_ci", "speedup_verdict", "baseline_cached", "baseline_drift",
    "speedup_spot", "speedup_spot_ci", "speedup_paired", "load_average", "pinned_detail", "baseline_file",
    # issue 19: the conditions of the run, whether the benchmark trusted its own timing,
    # the side-by-side ratio against another build, and which build was measured
    "conditions", "reliable", "unreliable_reasons", "vs_against", "kernel_build",
    "tolerances", "widened", "failures", "tiers", "crash", "machine", "versions",
    "tier_evidence",  # issue 24: which tiers ran, where, on which unit hash
)


def _positive_finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{name} must be a number, found {value!r}.")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{name} must be a finite positive number, found {value!r}.")
    return value


def build_result(
    *,
    correct: bool,
    speedup: Any,
    baseline_us: Any,
    kernel_us: Any,
    source: str,
    details: dict[str, Any] | None = None,
) -> TrialResult:
    numbers = {"speedup": speedup, "baseline_us": baseline_us, "kernel_us": kernel_us}
    given = {k: v for k, v in numbers.items() if v is not None}
    if correct and len(given) != 3:
        missing = ", ".join(f"--{k}" for k in numbers if k not in given)
        raise UsageError(f"A passing result needs --speedup, --baseline_us and --kernel_us; missing {missing}.")
    if not correct and given and len(given) != 3:
        raise UsageError(
            "A failing result takes either no timings or all three of --speedup, --baseline_us and --kernel_us."
        )
    checked = {k: _positive_finite(f"--{k}", v) for k, v in given.items()}
    if checked:
        expected = checked["baseline_us"] / checked["kernel_us"]
        if abs(checked["speedup"] - expected) > SPEEDUP_CONSISTENCY * expected:
            raise UsageError(
                f"--speedup {checked['speedup']:g} disagrees with --baseline_us / --kernel_us = "
                f"{checked['baseline_us']:g} / {checked['kernel_us']:g} = {expected:.4g} by more than 2 %. "
                "Record the numbers the benchmark printed, or use --from-json with its JSON file."
            )
    return TrialResult(
        correct=correct,
        speedup=checked.get("speedup"),
        baseline_us=checked.get("baseline_us"),
        kernel_us=checked.get("kernel_us"),
        recorded_at=now_iso(),
        source=source,
        details=details or {},
    )


def read_benchmark_json(path: Path, flag: str = "--from-json") -> dict[str, Any]:
    """The report ``benchmark_cpu.py --json`` wrote, or a UsageError naming the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{flag}: the file {path} does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag}: could not read {path}: {exc}.") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag}: {path} is not valid JSON ({exc.msg} at line {exc.lineno}).") from exc
    if not isinstance(data, dict) or not isinstance(data.get("correct"), bool):
        raise UsageError(
            f"{flag}: {path} is not a benchmark_cpu.py report (it needs a boolean \"correct\" key). "
            "Pass the file written by benchmark_cpu.py --json."
        )
    return data


def check_reliable(path: Path, data: dict[str, Any], *, accept_unreliable: bool, flag: str = "--from-json") -> bool:
    """Refuse a timed run the benchmark itself marked ``reliable: false``, unless accepted.

    Returns True when an unreliable run was accepted (recorded on the result).
    Reports written before the key existed count as reliable; an incorrect run
    has no timing to distrust.
    """
    if data.get("reliable") is not False or not data.get("correct"):
        return False
    if accept_unreliable:
        return True
    reasons = data.get("unreliable_reasons")
    listed = "; ".join(str(r) for r in reasons) if isinstance(reasons, list) and reasons else "no reason given"
    raise UsageError(
        f"{flag}: {path} says its timing is unreliable (reliable: false: {listed}). Nothing was recorded. "
        "Stop the other jobs on the machine (or benchmark with --threads N, N the free cores) and rerun; "
        "record it anyway only knowingly, with --accept-unreliable (the trial then shows it)."
    )


def result_from_benchmark_json(path: Path, *, accept_unreliable: bool = False) -> TrialResult:
    """Read the JSON ``benchmark_cpu.py --json`` wrote, so numbers are never retyped."""
    path = Path(path)
    data = read_benchmark_json(path)
    accepted = check_reliable(path, data, accept_unreliable=accept_unreliable)
    correct = data["correct"]
    timings = [data.get(k) for k in ("speedup", "baseline_us", "kernel_us")]
    if not correct and any(t is None for t in timings):
        timings = [None, None, None]
    details = {k: data[k] for k in CARRIED_BENCHMARK_KEYS if k in data}
    try:
        result = build_result(
            correct=correct,
            speedup=timings[0],
            baseline_us=timings[1],
            kernel_us=timings[2],
            source=str(path.resolve()),
            details=details,
        )
    except UsageError as exc:
        raise UsageError(f"--from-json {path}: {exc.message}") from exc
    return replace(result, accepted_unreliable=accepted)


def json_build_id(data: dict[str, Any]) -> str | None:
    """The content id of the build a benchmark report measured (``kernel_build``)."""
    build = data.get("kernel_build")
    if not isinstance(build, dict):
        return None
    found = build.get("build_id")
    if isinstance(found, str) and found:
        return found
    return id_of_module(build.get("module"))
