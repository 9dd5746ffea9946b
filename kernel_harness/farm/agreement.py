"""Do a remote and a local run of the same kernel read the same speedup?  (``scripts/farm_agreement.py``)

Issue 22 asks that the speedup read through the farm stay within ±5 % of the
one read locally on the same machine, and that a remote run cost at most 5 s
more.  One measurement of 4 + 4 runs read 5.87x remote vs 5.59x local: at the
band's edge, from too few runs to say which.  This runs N local and N remote
(``--cluster``) benchmarks of the same build, alternating which goes first in
each pair (so a drift of the machine's load hits both sides alike), and
summarises each side by its median and spread, the ratio of the medians with a
bootstrap 95 % interval, and the wall-clock overhead.  The verdict rests on
the runs the benchmark marked reliable (at least :data:`MIN_RUNS` a side) and
says "within ±5 %" only when the whole interval is inside the band, and
"outside" only when the whole interval is outside it: anything else is
"undecided" (more runs, or a quieter machine).

``--pool FILE`` adds the runs of earlier comparisons (their ``--json``) of the
same build on the same CPU model, so two series taken one after another decide
together what neither decides alone; a file from another CPU model or another
target is refused.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..paths import SCRIPTS_DIR

#: the agreement band of issue 22
BAND = 0.05
#: reliable runs a side the verdict needs (fewer: "undecided")
MIN_RUNS = 5
#: bootstrap resamples of the ratio of medians (fixed seed: the same runs give the same interval)
BOOTSTRAP = 2000


@dataclass(frozen=True)
class Run:
    """One benchmark_cpu.py run as the comparison needs it."""

    side: str  # "local" | "remote"
    index: int
    returncode: int
    wall_s: float
    speedup: float | None
    speedup_ci: list[float] | None
    reliable: bool | None
    threads: int | None
    load_average: Any
    node: str | None = None
    error: str | None = None
    #: remote runs: the run on the node, and submit-to-result in the driver (the rest of wall_s is the
    #: driver's start, its connection to the cluster and its checks)
    node_wall_s: float | None = None
    driver_wall_s: float | None = None


@dataclass(frozen=True)
class SideSummary:
    runs: int
    ok: int
    reliable: int
    median: float | None
    low: float | None
    high: float | None
    #: (max - min) / median, the spread the ±5 % band is compared with
    rel_spread: float | None
    wall_median_s: float | None


@dataclass
class Agreement:
    machine: dict[str, Any]
    local: SideSummary
    remote: SideSummary
    ratio: float | None
    ratio_ci: list[float] | None
    verdict: str
    overhead_s: float | None
    runs: list[Run] = field(default_factory=list)
    #: which runs the ratio and its interval come from
    basis: str = "reliable runs"

    #: what was measured (baseline, kernel directory, op, benchmark flags): --pool checks it
    target: dict[str, Any] | None = None
    #: the --pool files whose runs are included
    pooled_from: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"machine": self.machine, "target": self.target, "pooled_from": self.pooled_from,
                "local": asdict(self.local), "remote": asdict(self.remote),
                "ratio_remote_over_local": self.ratio, "ratio_ci95": self.ratio_ci, "band": BAND,
                "ratio_basis": self.basis, "verdict": self.verdict, "overhead_s": self.overhead_s, "runs": [asdict(r) for r in self.runs]}


def summarise(runs: list[Run], side: str) -> SideSummary:
    mine = [r for r in runs if r.side == side]
    good = [r.speedup for r in mine if r.returncode == 0 and r.speedup is not None]
    walls = [r.wall_s for r in mine if r.returncode == 0]
    med = statistics.median(good) if good else None
    return SideSummary(
        runs=len(mine), ok=len(good), reliable=sum(1 for r in mine if r.reliable),
        median=round(med, 4) if med is not None else None,
        low=min(good) if good else None, high=max(good) if good else None,
        rel_spread=round((max(good) - min(good)) / med, 4) if good and med else None,
        wall_median_s=round(statistics.median(walls), 3) if walls else None)


def ratio_interval(local: list[float], remote: list[float], resamples: int = BOOTSTRAP,
                   seed: int = 22) -> tuple[float | None, list[float] | None]:
    """The ratio of medians remote/local and its bootstrap 95 % interval (None with fewer than 2 a side)."""
    if not local or not remote:
        return None, None
    ratio = statistics.median(remote) / statistics.median(local)
    if len(local) < 2 or len(remote) < 2:
        return round(ratio, 4), None
    rng = random.Random(seed)
    samples = sorted(statistics.median(rng.choices(remote, k=len(remote)))
                     / statistics.median(rng.choices(local, k=len(local))) for _ in range(resamples))
    return round(ratio, 4), [round(samples[int(0.025 * resamples)], 4), round(samples[int(0.975 * resamples) - 1], 4)]


def verdict(ratio_ci: list[float] | None, band: float = BAND) -> str:
    """``within``/``outside`` only when the whole interval says so; else ``undecided``."""
    if ratio_ci is None:
        return "undecided (too few successful runs for an interval)"
    low, high = ratio_ci
    if 1 - band <= low and high <= 1 + band:
        return f"within ±{band:.0%}"
    if high < 1 - band or low > 1 + band:
        return f"outside ±{band:.0%}"
    return f"undecided (the interval crosses the ±{band:.0%} band: more runs or a quieter machine)"


def _speedups(runs: list[Run], side: str, reliable_only: bool) -> list[float]:
    return [r.speedup for r in runs if r.side == side and r.returncode == 0 and r.speedup is not None
            and (r.reliable or not reliable_only)]


def compare(runs: list[Run], machine: dict[str, Any]) -> Agreement:
    """The comparison; the verdict rests on the runs marked reliable, at least MIN_RUNS a side.

    With fewer, the ratio and interval of every successful run are shown but the verdict is
    "undecided": a bootstrap of two or three values is no interval, and a run the benchmark
    itself marked unreliable (a busy machine) is no evidence of agreement or disagreement."""
    local, remote = summarise(runs, "local"), summarise(runs, "remote")
    good = {side: _speedups(runs, side, reliable_only=True) for side in ("local", "remote")}
    enough = min(map(len, good.values())) >= MIN_RUNS
    if not enough:
        good = {side: _speedups(runs, side, reliable_only=False) for side in ("local", "remote")}
    ratio, ci = ratio_interval(good["local"], good["remote"])
    said = verdict(ci) if enough else (
        f"undecided ({local.reliable} local and {remote.reliable} remote runs marked reliable; a verdict needs "
        f"at least {MIN_RUNS} a side: more runs, or a quieter machine)")
    overhead = (round(remote.wall_median_s - local.wall_median_s, 3)
                if remote.wall_median_s is not None and local.wall_median_s is not None else None)
    return Agreement(machine, local, remote, ratio, ci, said, overhead, runs,
                     basis="reliable runs" if enough else "every successful run (too few reliable ones)")


def run_once(side: str, index: int, command: list[str], timeout: float) -> Run:
    """One benchmark_cpu.py run (``command`` without --json); its report read back."""
    with tempfile.TemporaryDirectory(prefix="kh-agree-") as tmp:
        report_path = Path(tmp) / "r.json"
        t0 = time.monotonic()
        try:
            proc = subprocess.run([*command, "--json", str(report_path)], capture_output=True, text=True,
                                  timeout=timeout)
            code, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            code, err = 3, f"did not finish within {timeout:g} s"
        wall = round(time.monotonic() - t0, 3)
        report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.is_file() else {}
    remote = report.get("remote") or {}
    return Run(side=side, index=index, returncode=code, wall_s=wall, speedup=report.get("speedup"),
               speedup_ci=report.get("speedup_ci"), reliable=report.get("reliable"),
               threads=report.get("threads"), load_average=report.get("load_average"),
               node=remote.get("node"), error=None if code == 0 else (err.strip().splitlines() or ["?"])[-1][:300],
               node_wall_s=remote.get("wall_s"), driver_wall_s=remote.get("driver_wall_s"))


def bench_command(baseline: str, kernel_package: str, op: str, extra: list[str]) -> list[str]:
    return [sys.executable, str(SCRIPTS_DIR / "benchmark_cpu.py"), baseline, "--kernel-package", kernel_package,
            "--op", op, *extra]


def run_pairs(local_cmd: list[str], remote_cmd: list[str], n: int, timeout: float,
              progress: Callable[[Run], None] | None = None) -> list[Run]:
    """N local and N remote runs, the first of each pair alternating (L R, R L, L R, ...).

    A run that exits 2 (bad input, no cluster) stops the comparison at once: every
    further run would say the same."""
    runs: list[Run] = []
    for i in range(n):
        order = [("local", local_cmd), ("remote", remote_cmd)]
        for side, cmd in (order if i % 2 == 0 else order[::-1]):
            run = run_once(side, i, cmd, timeout)
            runs.append(run)
            if progress is not None:
                progress(run)
            if run.returncode == 2:
                raise UsageError(f"The {side} run refused its input (exit 2): {run.error}")
    return runs


def machine_facts() -> dict[str, Any]:
    """The machine the comparison ran on (the driver; the remote report names the node)."""
    from .. import cpu  # noqa: PLC0415

    return {"cpu_model": cpu.cpu_model(), "logical_cpus": os.cpu_count(),
            "tiers": [name for name in ("avx2", "avx512", "amx") if cpu.has_isa(name)],
            "load_average_start": list(os.getloadavg())}


def pooled_runs(path: Path, cpu_model: str, target: dict[str, Any]) -> tuple[list[Run], dict[str, Any]]:
    """The runs of an earlier comparison's JSON and its machine record (when and under which
    load it ran), checked to be of this CPU model and target (a file written before
    targets were recorded is taken on the caller's word)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        runs = [Run(**run) for run in data["runs"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(f"--pool {path}: not a readable scripts/farm_agreement.py --json report ({err}). "
                         "Pass the file an earlier comparison wrote with --json.") from err
    theirs = (data.get("machine") or {}).get("cpu_model")
    if theirs != cpu_model:
        raise UsageError(f"--pool {path} was measured on {theirs!r}, this machine is {cpu_model!r}: runs of "
                         "another CPU do not belong in one comparison. Pool files from this machine only.")
    recorded = data.get("target")
    if recorded is not None and recorded != target:
        raise UsageError(f"--pool {path} measured {recorded}, not this comparison's {target}: pool only "
                         "series of the same baseline, kernel, op and benchmark flags.")
    for run in runs:
        if run.side not in ("local", "remote"):
            raise UsageError(f"--pool {path}: a run has side {run.side!r} (local or remote expected).")
    return runs, data.get("machine") or {}
