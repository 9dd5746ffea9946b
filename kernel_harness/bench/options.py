"""What a benchmark run is asked to do (:class:`BenchOptions`) and what it found
(:class:`BenchResult`), plus the small derived quantities the report prints.

Kept apart from the phases that fill them in, so the report and the trial
manager can read results without importing the machinery that runs workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import stats

TIERS = ("generic", "avx2", "avx512")
#: Upper bound of input sets rotated per round with --cold (memory and time).
MAX_COLD_SETS = 256


@dataclass
class BenchOptions:
    baseline_path: str
    kernel_spec: str
    op_path: str
    baseline_us: float | None = None
    atol: float | None = None
    rtol: float | None = None
    tier: str | None = None  # None: the dispatcher's choice; "all": sweep
    timeout: float = 120.0
    cold: bool = False
    oracle: str | None = None  # None or "fp64"
    accept_if_as_accurate: bool = False
    assert_dispatch: bool = False
    dispatch_tolerance_pct: float = 5.0
    rounds: int = 20
    calls_per_round: int | None = None  # None: calibrated
    target_round_s: float = 0.03
    timing_processes: int = 1  # worker pairs the timing rounds rotate over (--processes)
    time_budget_s: float = 14.0
    threads: int | None = None
    verified_calls: int = 4  # timed calls verified per run, in rounds the worker cannot predict
    correctness_seeds: int = 3
    settle_s: float = 0.01
    sweep_rounds: int = 3
    seed: int | None = None  # run seed; random by default so nothing can be precomputed
    against: str | None = None  # another build (directory or package) timed side by side (--against)
    # --against adds rounds until the ratio's interval is this tight (relative half-width) ...
    against_precision: float = 0.02
    # ... or this many seconds of timing are spent (0: only the usual rounds)
    against_max_s: float = 90.0
    # the plain run adds rounds until the speedup's interval is this tight (0: off) ...
    speedup_precision: float = 0.0
    # ... or this many seconds of timing are spent (counted with --against's)
    speedup_max_s: float = 90.0


@dataclass
class InputSet:
    label: str
    source: tuple[str, int]
    seed: int
    inputs: list[Any]


@dataclass
class Failure:
    check: str  # values | aliasing | input-modified | async | timed-call | tamper
    input_set: str
    tier: str
    message: str
    leaf: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {"check": self.check, "input_set": self.input_set, "tier": self.tier,
                "message": self.message}
        if self.leaf is not None:
            data.update({k: v for k, v in self.leaf.items() if k != "message"})
            data["leaf_message"] = self.leaf.get("message")
        return data


@dataclass
class BenchResult:
    options: BenchOptions
    correct: bool = False
    failures: list[Failure] = field(default_factory=list)
    acceptance_rule: str = "tolerance"
    tolerances: dict[str, str] = field(default_factory=dict)
    widened: bool = False
    oracle: list[dict[str, Any]] = field(default_factory=list)
    would_pass_as_accurate: bool | None = None
    baseline: stats.Measurement | None = None
    kernel: stats.Measurement | None = None
    baseline_us: float | None = None
    kernel_us: float | None = None
    baseline_cached: bool = False
    # With a cached baseline: the baseline timed now in a few spot rounds, so a
    # change of the machine's speed since the value was cached shows (drift).
    baseline_spot: stats.Measurement | None = None
    # the kernel's rounds timed beside the spot rounds, and the spot rounds over them with
    # its paired interval
    kernel_spot: stats.Measurement | None = None
    speedup_spot: stats.Speedup | None = None
    speedup: stats.Speedup | None = None
    threads: int = 0
    pinned: bool = False
    pinned_detail: str = ""
    tiers: dict[str, Any] = field(default_factory=dict)
    aten_ops: dict[str, Any] = field(default_factory=dict)
    throughput: dict[str, Any] = field(default_factory=dict)
    verified_calls: int = 0
    input_sets: list[str] = field(default_factory=list)
    calls_per_round: int = 0
    timing_processes: int = 1
    # the baseline's PERSISTENT_INPUTS, evicted before each fresh call (eviction.py)
    inputs_from_memory: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    timing_skipped: str | None = None
    dispatch_violations: list[str] = field(default_factory=list)
    # lags above the tolerance whose interval reaches below it (sweep.lag_verdict)
    dispatch_undecided: list[str] = field(default_factory=list)
    load_average: float | None = None
    # what the run measured under (see conditions.py) and whether it can be trusted
    conditions: dict[str, Any] = field(default_factory=dict)
    reliable: bool = True
    unreliable_reasons: list[str] = field(default_factory=list)
    unreliable_advice: str | None = None
    # the build the kernel worker loaded: op namespace / module and content id
    kernel_build: dict[str, Any] | None = None
    # --against: the other build's times and failures, and the side-by-side ratio
    against: stats.Measurement | None = None
    against_build: dict[str, Any] | None = None
    against_failures: list[Failure] = field(default_factory=list)
    vs_against: dict[str, Any] | None = None
    speedup_rounds: dict[str, Any] | None = None  # what --speedup-precision added (against.extend_until_precise)


#: Spot rounds this far (relative) from a cached baseline earn a note: two
#: uncached runs of the eager rms_norm baseline a minute apart differed by
#: 15-17 % on this shared VM, so smaller drifts are within its noise.
DRIFT_NOTE = 0.15


def spot_rounds(rounds: int) -> set[int]:
    """Up to four rounds spread over the run for a cached baseline's spot timing;
    never round 0 (it follows the warm-up) unless it is the only one."""
    return {max(min(1, rounds - 1), (2 * k + 1) * rounds // 8) for k in range(4)}


def spot_speedup(result: BenchResult) -> float | None:
    """Baseline spot median / kernel median: the ratio measured side by side in this
    run, which a change of the machine's speed since the baseline was cached moves
    on both sides alike (None without spot rounds).

    With its interval (``speedup_spot``, three spot rounds or more) it is that
    interval's own point: the spot rounds over the kernel rounds timed beside them,
    so the point always lies inside the interval reported with it.
    """
    if not result.baseline_cached or result.baseline_spot is None or not result.kernel_us:
        return None
    if result.speedup_spot is not None and result.speedup_spot.ci_low is not None:
        return result.speedup_spot.value
    return result.baseline_spot.median_us / result.kernel_us


def baseline_drift(result: BenchResult) -> float | None:
    """Relative change of the baseline since it was cached (spot median / cached - 1)."""
    if not result.baseline_cached or result.baseline_spot is None or not result.baseline_us:
        return None
    return result.baseline_spot.median_us / result.baseline_us - 1.0
