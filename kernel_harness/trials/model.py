"""The trial tree's state: typed records and their strict (de)serialisation.

``state.json`` may be edited by hand or damaged; loading checks every field
and raises :class:`StateError` naming the file and the field, so a damaged
tree is reported, never silently reset.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError

#: 2 added Trial.build_id, TrialResult.accepted_unreliable and TreeState.baseline_times;
#: version-1 files load unchanged (the new fields take their empty defaults) and are
#: written back as version 2, which an older harness refuses rather than silently
#: dropping the new fields.
SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
TRIAL_ID = re.compile(r"t(0|[1-9][0-9]*)")


class StateError(UsageError):
    """The state file exists but cannot be trusted."""


@dataclass(frozen=True)
class BaselineRecord:
    path: str
    sha256: str
    copy: str  # file name of the copy inside the tree directory
    recorded_at: str


@dataclass(frozen=True)
class TrialResult:
    correct: bool
    speedup: float | None
    baseline_us: float | None
    kernel_us: float | None
    recorded_at: str
    source: str  # "cli" or the path of the benchmark JSON it came from
    details: dict[str, Any] = field(default_factory=dict)
    # recorded although the benchmark said reliable: false (--accept-unreliable)
    accepted_unreliable: bool = False

    @property
    def ranking_speedup(self) -> float | None:
        """What trials are compared by: a ratio measured side by side in the trial's own run.

        With a cached baseline (--baseline-us) the recorded speedup divides a
        baseline time from another run, so a host that slowed down or sped up
        since then shifts it by as much (drifts of 15-67 % were measured here);
        the baseline's spot rounds of the same run (``speedup_spot``) do not
        have that bias. Without spot rounds it is the speedup itself.
        """
        spot = self.side_by_side_speedup
        return spot if spot is not None else self.speedup

    @property
    def side_by_side_speedup(self) -> float | None:
        """The side-by-side ratio of a cached-baseline result (see :func:`side_by_side`)."""
        return side_by_side(self.details, self.speedup)

    def speedup_label(self) -> str:
        """The recorded speedup, and the side-by-side ratio when trials are ranked by it."""
        return speedup_label(self.speedup, self.side_by_side_speedup)


def _usable(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def side_by_side(details: dict[str, Any], speedup: float | None) -> float | None:
    """The side-by-side ratio of a cached-baseline result, from its carried benchmark keys.

    ``speedup_spot`` when recorded; results written before that key existed
    carry ``baseline_drift`` (spot / cached - 1), and speedup * (1 + drift) is
    the same ratio. None for anything else (unusable numbers included).
    """
    spot = details.get("speedup_spot")
    if _usable(spot) and spot > 0:
        return float(spot)
    drift = details.get("baseline_drift")
    if details.get("baseline_cached") is True and _usable(drift) and drift > -1 and speedup:
        return speedup * (1.0 + drift)
    return None


def speedup_label(speedup: float | None, spot: float | None) -> str:
    """'7.00x', or '7.00x (6.81x side by side)' for a cached-baseline result."""
    if speedup is None:
        return "-"
    return f"{speedup:.2f}x" + (f" ({spot:.2f}x side by side)" if spot is not None else "")


@dataclass(frozen=True)
class Trial:
    id: str
    parent: str | None
    strategy: str
    created_at: str
    sources_sha256: str
    files: tuple[str, ...]
    result: TrialResult | None = None
    superseded_results: tuple[TrialResult, ...] = ()
    # content id of the saved sources (kernel_harness/build/plan.py content_id): the
    # suffix of the op namespace a build of exactly these sources gets; None when the
    # saved build.toml cannot be read (or for trials saved before it was recorded)
    build_id: str | None = None

    @property
    def number(self) -> int:
        return int(self.id[1:])


@dataclass(frozen=True)
class BaselineTime:
    """One timing of the baseline alone, the value ``baseline-us`` hands out."""

    baseline_us: float
    recorded_at: str
    source: str  # "refresh" or "result tN" (taken over from a trial's benchmark run)
    conditions: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TreeState:
    name: str
    created_at: str
    baseline: BaselineRecord
    trials: tuple[Trial, ...] = ()
    schema: int = SCHEMA_VERSION
    # every baseline timing, oldest first; the last one is current (baseline-us --refresh)
    baseline_times: tuple[BaselineTime, ...] = ()

    def trial(self, trial_id: str) -> Trial | None:
        return next((t for t in self.trials if t.id == trial_id), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- loading


class _Reader:
    """Field access that names the state file and the JSON path on every error."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, problem: str) -> StateError:
        return StateError(
            f"The trial state {self.path} is damaged at {where}: {problem}. Nothing was changed. "
            "Restore the file from a backup or fix the field by hand; the trial directories next "
            "to it still hold every saved source."
        )

    def get(self, data: dict, key: str, where: str, kinds: tuple[type, ...], *, optional: bool = False):
        if not isinstance(data, dict):
            raise self.fail(where, f"expected an object, found {type(data).__name__}")
        if key not in data:
            if optional:
                return None
            raise self.fail(f"{where}.{key}", "the field is missing")
        value = data[key]
        if value is None and optional:
            return None
        if isinstance(value, bool) and bool not in kinds:
            raise self.fail(f"{where}.{key}", f"expected {_kind_names(kinds)}, found a boolean")
        if not isinstance(value, kinds):
            raise self.fail(f"{where}.{key}", f"expected {_kind_names(kinds)}, found {type(value).__name__}")
        return value

    def number(self, data: dict, key: str, where: str) -> float | None:
        value = self.get(data, key, where, (int, float), optional=True)
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise self.fail(f"{where}.{key}", f"expected a finite positive number, found {value!r}")
        return None if value is None else float(value)


def _kind_names(kinds: tuple[type, ...]) -> str:
    return " or ".join({int: "a number", float: "a number", str: "a string", bool: "a boolean",
                        list: "a list", dict: "an object"}[k] for k in kinds)


def _result_from_json(reader: _Reader, data: Any, where: str) -> TrialResult:
    details = reader.get(data, "details", where, (dict,), optional=True) or {}
    return TrialResult(
        correct=reader.get(data, "correct", where, (bool,)),
        speedup=reader.number(data, "speedup", where),
        baseline_us=reader.number(data, "baseline_us", where),
        kernel_us=reader.number(data, "kernel_us", where),
        recorded_at=reader.get(data, "recorded_at", where, (str,)),
        source=reader.get(data, "source", where, (str,)),
        details=details,
        accepted_unreliable=bool(reader.get(data, "accepted_unreliable", where, (bool,), optional=True)),
    )


def _baseline_time_from_json(reader: _Reader, data: Any, where: str) -> BaselineTime:
    value = reader.number(data, "baseline_us", where)
    if value is None:
        raise reader.fail(f"{where}.baseline_us", "the field is missing")
    return BaselineTime(
        baseline_us=value,
        recorded_at=reader.get(data, "recorded_at", where, (str,)),
        source=reader.get(data, "source", where, (str,)),
        conditions=reader.get(data, "conditions", where, (dict,), optional=True) or {},
        details=reader.get(data, "details", where, (dict,), optional=True) or {},
    )


def _trial_from_json(reader: _Reader, data: Any, where: str) -> Trial:
    trial_id = reader.get(data, "id", where, (str,))
    if not TRIAL_ID.fullmatch(trial_id):
        raise reader.fail(f"{where}.id", f"{trial_id!r} is not a trial id like t0, t1, ...")
    files = reader.get(data, "files", where, (list,))
    if not all(isinstance(f, str) for f in files):
        raise reader.fail(f"{where}.files", "every entry must be a relative path string")
    result_data = reader.get(data, "result", where, (dict,), optional=True)
    superseded = reader.get(data, "superseded_results", where, (list,), optional=True) or []
    return Trial(
        id=trial_id,
        parent=reader.get(data, "parent", where, (str,), optional=True),
        strategy=reader.get(data, "strategy", where, (str,)),
        created_at=reader.get(data, "created_at", where, (str,)),
        sources_sha256=reader.get(data, "sources_sha256", where, (str,)),
        files=tuple(files),
        result=None if result_data is None else _result_from_json(reader, result_data, f"{where}.result"),
        superseded_results=tuple(
            _result_from_json(reader, item, f"{where}.superseded_results[{i}]") for i, item in enumerate(superseded)
        ),
        build_id=reader.get(data, "build_id", where, (str,), optional=True),
    )


def state_from_json(path: Path, data: Any) -> TreeState:
    reader = _Reader(path)
    if not isinstance(data, dict):
        raise reader.fail("the top level", f"expected an object, found {type(data).__name__}")
    schema = reader.get(data, "schema", "$", (int,))
    if schema not in READABLE_SCHEMAS:
        raise reader.fail("$.schema", f"version {schema} is not a supported version "
                                      f"({', '.join(map(str, READABLE_SCHEMAS))})")
    baseline = reader.get(data, "baseline", "$", (dict,))
    trials_data = reader.get(data, "trials", "$", (list,))
    trials = tuple(_trial_from_json(reader, item, f"$.trials[{i}]") for i, item in enumerate(trials_data))
    _check_tree_shape(reader, trials)
    return TreeState(
        name=reader.get(data, "name", "$", (str,)),
        created_at=reader.get(data, "created_at", "$", (str,)),
        baseline=BaselineRecord(
            path=reader.get(baseline, "path", "$.baseline", (str,)),
            sha256=reader.get(baseline, "sha256", "$.baseline", (str,)),
            copy=reader.get(baseline, "copy", "$.baseline", (str,)),
            recorded_at=reader.get(baseline, "recorded_at", "$.baseline", (str,)),
        ),
        trials=trials,
        schema=SCHEMA_VERSION,  # written back in the current version
        baseline_times=tuple(
            _baseline_time_from_json(reader, item, f"$.baseline_times[{i}]")
            for i, item in enumerate(reader.get(data, "baseline_times", "$", (list,), optional=True) or [])
        ),
    )


def _check_tree_shape(reader: _Reader, trials: tuple[Trial, ...]) -> None:
    """Ids are t0..tN in order and every parent is an earlier trial (so no cycles)."""
    seen: set[str] = set()
    for index, trial in enumerate(trials):
        if trial.id != f"t{index}":
            raise reader.fail(f"$.trials[{index}].id", f"expected t{index}, found {trial.id}")
        if trial.parent is not None and trial.parent not in seen:
            raise reader.fail(f"$.trials[{index}].parent", f"{trial.parent!r} is not an earlier trial")
        seen.add(trial.id)
