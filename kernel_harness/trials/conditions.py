"""The conditions a result was measured under, and whether two results share them.

A speedup is only comparable with another measured the same way: pinned or
not, the same thread count, the same CPU and tier, the same inputs read from
memory (the baseline's ``PERSISTENT_INPUTS``: a weight fresh from a copy sits
in the last-level cache), and neither run on an oversubscribed machine.  ``benchmark_cpu.py --json`` reports them in its
``conditions`` object; results recorded from older reports still carry
``threads``, ``pinned``, ``load_average`` and ``machine``, from which the
same fields are read where they exist (``None`` where they do not).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .model import TrialResult


@dataclass(frozen=True)
class Conditions:
    cpu_model: str | None = None
    supported_tiers: tuple[str, ...] | None = None
    tier_ran: str | None = None
    threads: int | None = None
    pinned: bool | None = None
    load_before: float | None = None
    load_after: float | None = None
    oversubscribed: bool | None = None
    reliable: bool | None = None
    speedup_ci: tuple[float, float] | None = None
    # input positions evicted before each call (() none; None: a report from before the field)
    inputs_from_memory: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["supported_tiers"] = list(self.supported_tiers) if self.supported_tiers is not None else None
        data["speedup_ci"] = list(self.speedup_ci) if self.speedup_ci is not None else None
        data["inputs_from_memory"] = list(self.inputs_from_memory) if self.inputs_from_memory is not None else None
        return data

    def label(self) -> str:
        """A short line for the status tree: 'pinned, 2 threads, avx512, load 0.4-0.6'."""
        parts = []
        if self.pinned is not None:
            parts.append("pinned" if self.pinned else "unpinned")
        if self.threads is not None:
            parts.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}")
        if self.tier_ran:
            parts.append(self.tier_ran)
        if self.inputs_from_memory:
            parts.append(f"inputs {_positions(self.inputs_from_memory)} from memory")
        loads = [f"{v:.1f}" for v in (self.load_before, self.load_after) if v is not None]
        if loads:
            parts.append("load " + "-".join(loads))
        if self.oversubscribed:
            parts.append("OVERSUBSCRIBED")
        return ", ".join(parts)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _positions(positions: tuple[int, ...]) -> str:
    return ", ".join(map(str, positions)) if positions else "none"


def _position_list(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in value):
        return None
    return tuple(value)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def speedup_interval(details: dict[str, Any]) -> tuple[float, float] | None:
    """The recorded speedup interval [low, high], when it is a usable pair of numbers."""
    ci = details.get("speedup_ci")
    if not isinstance(ci, (list, tuple)) or len(ci) != 2:
        return None
    low, high = _number(ci[0]), _number(ci[1])
    if low is None or high is None or low <= 0 or high < low:
        return None
    return low, high


def conditions_of(result: TrialResult | None) -> Conditions:
    """The conditions of a recorded result, from the benchmark keys it carried."""
    if result is None:
        return Conditions()
    details = result.details
    raw = details.get("conditions") if isinstance(details.get("conditions"), dict) else {}
    machine = details.get("machine") if isinstance(details.get("machine"), dict) else {}
    tiers = raw.get("supported_tiers", machine.get("supported_tiers"))
    threads = raw.get("threads", details.get("threads"))
    load_after = _number(raw.get("load_after", details.get("load_average")))
    oversubscribed = _bool(raw.get("oversubscribed"))
    cpus = _number(machine.get("logical_cpus"))
    if oversubscribed is None and load_after is not None and cpus:
        oversubscribed = load_after > cpus  # the pre-detector rule: load average above the CPUs
    return Conditions(
        cpu_model=_text(raw.get("cpu_model", machine.get("cpu_model"))),
        supported_tiers=tuple(str(t) for t in tiers) if isinstance(tiers, list) else None,
        tier_ran=_text(raw.get("tier_ran")),
        threads=threads if isinstance(threads, int) and not isinstance(threads, bool) else None,
        pinned=_bool(raw.get("pinned", details.get("pinned"))),
        load_before=_number(raw.get("load_before")),
        load_after=load_after,
        oversubscribed=oversubscribed,
        reliable=_bool(details.get("reliable")),
        speedup_ci=speedup_interval(details),
        inputs_from_memory=_position_list(raw.get("inputs_from_memory")),
    )


def differences(parent: Conditions, child: Conditions) -> list[str]:
    """How ``child`` was measured differently from ``parent`` (fields known on both sides)."""
    found: list[str] = []
    if parent.pinned is not None and child.pinned is not None and parent.pinned != child.pinned:
        found.append(f"{'pinned' if child.pinned else 'unpinned'} (parent {'pinned' if parent.pinned else 'unpinned'})")
    if parent.threads is not None and child.threads is not None and parent.threads != child.threads:
        found.append(f"{child.threads} threads (parent {parent.threads})")
    if parent.cpu_model and child.cpu_model and parent.cpu_model != child.cpu_model:
        found.append(f"CPU {child.cpu_model} (parent {parent.cpu_model})")
    if parent.tier_ran and child.tier_ran and parent.tier_ran != child.tier_ran:
        found.append(f"tier {child.tier_ran} (parent {parent.tier_ran})")
    if parent.inputs_from_memory is not None and child.inputs_from_memory is not None \
            and parent.inputs_from_memory != child.inputs_from_memory:
        found.append(f"inputs from memory: {_positions(child.inputs_from_memory)} "
                     f"(parent {_positions(parent.inputs_from_memory)})")
    if child.oversubscribed:
        found.append("oversubscribed machine")
    elif parent.oversubscribed:
        found.append("parent measured on an oversubscribed machine")
    return found
