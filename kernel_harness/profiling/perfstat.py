"""``perf stat``: availability check, output parsing and interpretation.

Parsing accepts both of perf's formats, because which one a user pastes or a
tool captures varies:

* human: ``     1,234,567      cycles      #  2.1 GHz   (49.98%)``
* CSV (``-x,``): ``1234567,,cycles,1000000,100.00,2.10,GHz``

``<not supported>`` / ``<not counted>`` values become ``None``.  Event names are
normalised (``cycles:u`` and ``cpu_core/cycles/`` -> ``cycles``) so hybrid CPUs
and user-only counting read the same.

Interpretation follows the procedure: a pure AVX512 FMA loop has a low IPC by
design (one 512-bit instruction does 32 FLOPs and the two FMA ports retire at
most 2 per cycle), so a low IPC alone never means memory-bound; memory-bound
is claimed only when a miss rate is high too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

#: Events requested, in perf's generic names.
EVENTS: tuple[str, ...] = (
    "cycles", "instructions", "L1-dcache-loads", "L1-dcache-load-misses", "LLC-loads", "LLC-load-misses",
    "branches", "branch-misses",
)

# Thresholds (documented in docs/analysis.md).
LOW_IPC = 1.0
HIGH_IPC = 2.0
HIGH_L1_MISS = 0.10  # a streaming kernel misses once per 64-byte line: 1/4..1/16 of its loads
HIGH_LLC_MISS = 0.30
HIGH_BRANCH_MISS = 0.05


@dataclass(frozen=True)
class PerfCounters:
    values: dict[str, float | None]  # None = <not supported> / <not counted>
    elapsed_seconds: float | None = None

    def get(self, event: str) -> float | None:
        return self.values.get(event)

    @property
    def supported(self) -> bool:
        """True when the two basic counters were actually counted."""
        return self.get("cycles") is not None and self.get("instructions") is not None

    def ratio(self, num: str, den: str) -> float | None:
        a, b = self.get(num), self.get(den)
        return a / b if a is not None and b else None

    def metrics(self) -> dict[str, float | None]:
        return {
            "ipc": self.ratio("instructions", "cycles"),
            "l1d_miss_rate": self.ratio("L1-dcache-load-misses", "L1-dcache-loads"),
            "llc_miss_rate": self.ratio("LLC-load-misses", "LLC-loads"),
            "branch_miss_rate": self.ratio("branch-misses", "branches"),
        }


def normalise_event(name: str) -> str:
    name = name.strip()
    match = re.match(r"^[\w\-]+/([^/]+)/[a-zA-Z]*$", name)  # cpu_core/cycles/  or  cpu/event=.../u
    if match:
        name = match.group(1)
    return re.sub(r":[ukhHGpPS]+$", "", name)


def _number(text: str) -> float | None:
    text = text.strip()
    if not text or text.startswith("<"):
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


_HUMAN = re.compile(r"^\s*(<not supported>|<not counted>|[\d][\d,]*(?:\.\d+)?)\s+(?:(msec|usec|sec|ns)\s+)?(\S+)")
_CSV = re.compile(r"^\s*(<not supported>|<not counted>|[\d.]+),([^,]*),([A-Za-z][^,]*)(?:,|$)")
_ELAPSED = re.compile(r"^\s*([\d.,]+)\s+seconds time elapsed")


def parse_perf_stat(text: str) -> PerfCounters:
    """Counters from ``perf stat`` output in either format (lines that are not counters are skipped)."""
    values: dict[str, float | None] = {}
    elapsed = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        found = _ELAPSED.match(line)
        if found:
            elapsed = _number(found.group(1))
            continue
        match = _CSV.match(line)
        if match:
            value, event = match.group(1), match.group(3)
        else:
            match = _HUMAN.match(line)
            if not match:
                continue
            value, event = match.group(1), match.group(3)
        event = normalise_event(event)
        if event in ("seconds", "Performance"):
            continue
        values[event] = _add(values[event], _number(value)) if event in values else _number(value)
    return PerfCounters(values=values, elapsed_seconds=elapsed)


def _add(previous: float | None, value: float | None) -> float | None:
    """Hybrid CPUs print one line per core type; their counts add up."""
    if previous is None:
        return value
    if value is None:
        return previous
    return previous + value


@dataclass(frozen=True)
class PerfStatus:
    available: bool
    reason: str  # one line, shown to the user when not available


#: Why perf cannot help when it is not on PATH (perf stat and perf record alike).
PERF_MISSING = "perf is not installed (no `perf` on PATH)"


def perf_denied(lines: list[str], doing: str) -> PerfStatus | None:
    """The status for perf output that says the kernel forbids ``doing`` (count, sample), else None."""
    if any("perf_event_paranoid" in line or "ermission" in line for line in lines):
        return PerfStatus(False, f"perf is not allowed to {doing} here (kernel.perf_event_paranoid); run "
                                 "`sudo sysctl kernel.perf_event_paranoid=1` or profile as root")
    return None


def perf_status(perf: str = "perf") -> PerfStatus:
    """Whether ``perf stat`` can count hardware events here (``perf stat -e instructions true``)."""
    binary = shutil.which(perf)
    if binary is None:
        return PerfStatus(False, PERF_MISSING)
    try:
        run = subprocess.run([binary, "stat", "-x,", "-e", "cycles,instructions", "true"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return PerfStatus(False, f"perf could not run: {exc}")
    counters = parse_perf_stat(run.stderr)
    if counters.supported:
        return PerfStatus(True, "perf stat counts cycles and instructions")
    text = run.stderr.strip().splitlines()
    if any("not supported" in line for line in text):
        return PerfStatus(False, "perf is installed but this CPU/VM reports the hardware counters as "
                                 "<not supported> (no PMU passthrough)")
    denied = perf_denied(text, "count")
    if denied is not None:
        return denied
    return PerfStatus(False, f"perf stat returned no counters ({text[-1] if text else 'no output'})")


@dataclass(frozen=True)
class Finding:
    finding: str
    evidence: str
    next_step: str
    references: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["references"] = list(self.references)
        return data


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def interpret(counters: PerfCounters, *, compute_fraction: float | None = None) -> list[Finding]:
    """Findings from counters, each with the next step and the reference that explains it.

    ``compute_fraction`` (achieved / peak GFLOP/s from the roofline profile) tells a
    saturated FMA loop, whose low IPC is expected, from a latency-bound one.
    """
    m = counters.metrics()
    ipc, l1, llc, br = m["ipc"], m["l1d_miss_rate"], m["llc_miss_rate"], m["branch_miss_rate"]
    findings: list[Finding] = []
    if ipc is None:
        return findings
    l1_high = l1 is not None and l1 > HIGH_L1_MISS
    llc_high = llc is not None and llc > HIGH_LLC_MISS
    misses = f"L1d miss {_pct(l1) if l1 is not None else 'n/a'}, LLC miss {_pct(llc) if llc is not None else 'n/a'}"
    if ipc < LOW_IPC and llc_high:
        findings.append(Finding(
            "memory-bound (DRAM)",
            f"IPC {ipc:.2f} with {misses}",
            "cut DRAM traffic: one pass over the data, prefetch a few lines ahead, non-temporal stores for "
            "outputs larger than the LLC, and reuse the output buffer",
            ("level-memory-traffic", "software-prefetch", "non-temporal-stores", "single-pass-row-in-cache"),
        ))
    elif ipc < LOW_IPC and l1_high:
        findings.append(Finding(
            "cache-bound (L2/L3 hits)",
            f"IPC {ipc:.2f} with {misses}",
            "block the loop so a row (or tile) stays in L1/L2 between passes",
            ("cache-blocking", "single-pass-row-in-cache", "software-prefetch"),
        ))
    elif ipc < LOW_IPC and compute_fraction is not None and compute_fraction >= 0.6:
        findings.append(Finding(
            "compute-bound at the vector peak",
            f"IPC {ipc:.2f} with {misses} and {100 * compute_fraction:.0f}% of the measured FMA peak: one 512-bit "
            "FMA does 32 FLOPs, so a saturated AVX512 loop has a low IPC by design",
            "only a cheaper algorithm helps now: fewer FLOPs (fusion, reuse), AMX/BF16 dot products for GEMM",
            ("level-algorithm", "level-fusion", "avx512-bf16-dot"),
        ))
    elif ipc < LOW_IPC:
        findings.append(Finding(
            "latency-bound arithmetic, not memory-bound",
            f"IPC {ipc:.2f} but {misses} are low: a pure AVX512 FMA loop has low IPC by design; here the cause "
            "is long dependency chains (one accumulator, exp/div latency)",
            "use 2-4 independent accumulators and unroll so several vector ops are in flight",
            ("multiple-accumulators", "unroll-and-prefetch", "level-vectorize"),
        ))
    elif ipc >= HIGH_IPC and not l1_high and not llc_high:
        findings.append(Finding(
            "instruction-bound",
            f"IPC {ipc:.2f} with {misses}: the core is busy retiring many instructions",
            "reduce instructions per element: make sure the hot loop is vectorised (zmm, not scalar), hoist "
            "per-row work out of the inner loop, use the cheapest exp/erf approximation that meets tolerance",
            ("level-vectorize", "vectorized-exp", "masked-tail"),
        ))
    else:
        findings.append(Finding(
            "balanced",
            f"IPC {ipc:.2f} with {misses}",
            "no single counter dominates: compare the achieved bandwidth with the roofline below and pick the "
            "next level from the optimisation levels",
            ("level-threading", "level-fusion"),
        ))
    if br is not None and br > HIGH_BRANCH_MISS:
        findings.append(Finding(
            "branch mispredictions",
            f"branch miss rate {_pct(br)}",
            "remove data-dependent branches from the inner loop: masked tail instead of a scalar remainder "
            "loop, dispatch on dtype/ISA once per call, not per element",
            ("masked-tail", "level-vectorize"),
        ))
    return findings


def run_perf_stat_attached(pid: int, seconds: float, perf: str = "perf") -> tuple[PerfCounters, str]:
    """Count EVENTS on process ``pid`` for ``seconds`` (``perf stat -p``); returns counters and raw text."""
    binary = shutil.which(perf) or perf
    cmd = [binary, "stat", "-x,", "-e", ",".join(EVENTS), "-p", str(pid), "--", "sleep", f"{seconds:g}"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    return parse_perf_stat(run.stderr), run.stderr
