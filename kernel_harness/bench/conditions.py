"""The conditions a run was measured under, and whether they let it be trusted.

A load average read at the start lags by a minute: with two busy loops started
just before a run it read 1.5-1.9 on a 2-vCPU machine while an identical
kernel read 10.9x.  So the run watches itself while it times:

* each worker reports, per round, the time its timing thread spent runnable but
  waiting for a CPU (``/proc/thread-self/schedstat``; ``run_queue_wait``, a share
  of the rounds' time), and the CPU time of that thread and of its whole
  process during the timed calls next to their wall time (``cpu_wall_ratio``:
  ~1.0 for a thread that held a CPU throughout; used for the verdict only where
  schedstat is missing, because a thread sleeping at a passive OpenMP barrier
  reads low too);
* a sampler thread in the parent reads the number of runnable tasks
  (``/proc/loadavg``'s running field) every few milliseconds during the
  rounds; runnable tasks beyond this run's own threads that do not fit on the
  free cores mean the timed side shared its CPUs (``oversubscribed``);
* the hypervisor's steal time (``/proc/stat``) over the rounds.

Any of these makes the run ``reliable: false`` with the reasons, and the report
says what to do about it.
"""

from __future__ import annotations

import os
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any

#: A timing thread on a CPU for less than this share of its timed calls' wall
#: time was descheduled (a quiet machine reads 0.97-1.0; a kernel that sleeps or
#: blocks inside its call reads low too, and is told so).
MIN_CPU_WALL_RATIO = 0.85
#: A timing thread that was runnable but had no CPU for more than this share of its
#: rounds (schedstat's run-queue wait) shared its CPU with other tasks. Preferred to
#: the CPU/wall ratio where the kernel provides it: it does not count a thread that
#: sleeps on purpose (an OpenMP barrier under OMP_WAIT_POLICY=PASSIVE).
MAX_WAIT_FRACTION = 0.10
#: Hypervisor steal above this share of the CPU time during the rounds.
MAX_STEAL_FRACTION = 0.05
#: The parent's sampling period of the run queue.
SAMPLE_PERIOD_S = 0.005


def running_tasks() -> int | None:
    """Runnable tasks on the whole machine now (``/proc/loadavg``'s 4th field, running/total)."""
    try:
        with open("/proc/loadavg") as fh:
            return int(fh.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_times() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from ``/proc/stat``."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:9]]
    return (values[7] if len(values) > 7 else 0), sum(values)


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


class RunQueueSampler:
    """Samples the run queue in a thread while the timing rounds run."""

    def __init__(self, period_s: float = SAMPLE_PERIOD_S) -> None:
        self.period_s = period_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="run-queue-sampler", daemon=True)
        self._steal_start: tuple[int, int] | None = None
        self.steal_fraction: float | None = None

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            value = running_tasks()
            if value is not None:
                self.samples.append(value)

    def __enter__(self) -> RunQueueSampler:
        self._steal_start = cpu_times()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
        end = cpu_times()
        if self._steal_start is not None and end is not None and end[1] > self._steal_start[1]:
            self.steal_fraction = (end[0] - self._steal_start[0]) / (end[1] - self._steal_start[1])


@dataclass
class SideCpu:
    """The CPU time one side's workers spent in their timed calls, and the time their
    timing thread waited for a CPU during their rounds, summed over rounds."""

    wall_ns: int = 0
    thread_cpu_ns: int = 0
    process_cpu_ns: int = 0
    round_ns: int = 0
    wait_ns: int | None = 0

    def add(self, times_ns: list[int], reply: dict[str, Any]) -> None:
        self.wall_ns += sum(times_ns)
        self.thread_cpu_ns += int(reply.get("thread_cpu_ns", 0))
        self.process_cpu_ns += int(reply.get("process_cpu_ns", 0))
        self.round_ns += int(reply.get("round_ns", 0))
        waited = reply.get("run_queue_wait_ns")
        self.wait_ns = None if waited is None or self.wait_ns is None else self.wait_ns + int(waited)

    @property
    def wait_fraction(self) -> float | None:
        """Share of its rounds the timing thread spent runnable without a CPU."""
        return self.wait_ns / self.round_ns if self.wait_ns is not None and self.round_ns else None

    @property
    def thread_ratio(self) -> float | None:
        return self.thread_cpu_ns / self.wall_ns if self.wall_ns else None

    @property
    def cores_busy(self) -> float | None:
        return self.process_cpu_ns / self.wall_ns if self.wall_ns else None


@dataclass
class Watch:
    """What the run saw of its machine while timing."""

    threads: int
    sides: dict[str, SideCpu] = field(default_factory=dict)
    run_queue: list[int] = field(default_factory=list)
    steal_fraction: float | None = None
    load_before: float | None = None
    load_after: float | None = None

    def side(self, name: str) -> SideCpu:
        return self.sides.setdefault(name, SideCpu())

    def others_running(self) -> float | None:
        """Median runnable tasks that are not this run's: all runnable minus the
        sampler itself and the timed side's threads."""
        if not self.run_queue:
            return None
        return max(0.0, statistics.median(self.run_queue) - 1 - self.threads)


def assess(watch: Watch, cpus: int) -> tuple[dict[str, Any], list[str], int | None]:
    """The measured part of ``conditions``, the unreliable reasons, and a --threads
    value that would fit on the free cores (None when the run was reliable)."""
    others = watch.others_running()
    free = cpus - watch.threads
    oversubscribed = others is not None and others > free
    measured: dict[str, Any] = {
        "load_before": watch.load_before,
        "load_after": watch.load_after,
        "oversubscribed": oversubscribed,
        "cpu_wall_ratio": {name: _round(side.thread_ratio) for name, side in watch.sides.items()},
        "cores_busy": {name: _round(side.cores_busy) for name, side in watch.sides.items()},
        "run_queue_wait": {name: _round(side.wait_fraction) for name, side in watch.sides.items()},
        "run_queue_max": max(watch.run_queue) if watch.run_queue else None,
        "run_queue_median": statistics.median(watch.run_queue) if watch.run_queue else None,
        "run_queue_samples": len(watch.run_queue),
        "other_runnable_median": others,
        "steal_fraction": _round(watch.steal_fraction, 4),
        "logical_cpus": cpus,
    }
    reasons = []
    if oversubscribed:
        reasons.append(
            f"oversubscribed: a median of {others:g} runnable tasks besides this run's "
            f"{watch.threads} timing thread(s) during the rounds, on {cpus} logical CPUs "
            f"({max(free, 0)} free)")
    for name, side in watch.sides.items():
        wait, ratio = side.wait_fraction, side.thread_ratio
        if wait is not None:
            if wait > MAX_WAIT_FRACTION:
                reasons.append(
                    f"the {name} worker's timing thread waited for a CPU during {100 * wait:.0f} % of "
                    "its rounds: other runnable tasks kept it off the CPUs")
        elif ratio is not None and ratio < MIN_CPU_WALL_RATIO:
            reasons.append(
                f"the {name} worker's timing thread was on a CPU for only {100 * ratio:.0f} % of its "
                "timed calls' wall time: other processes took its CPU (or the call sleeps or blocks)")
    if watch.steal_fraction is not None and watch.steal_fraction > MAX_STEAL_FRACTION:
        reasons.append(f"the hypervisor stole {100 * watch.steal_fraction:.0f} % of the CPU time "
                       "during the rounds (a busy host)")
    suggest = None
    if reasons:
        suggest = max(1, cpus - int(round(others or 0)))
    return measured, reasons, suggest


def advice(reasons: list[str], suggest_threads: int | None, threads: int) -> str | None:
    """What to do about an unreliable run, in one sentence."""
    if not reasons:
        return None
    fit = (f", or rerun with --threads {suggest_threads} (the cores left free by the other jobs)"
           if suggest_threads is not None and suggest_threads < threads else "")
    return ("the timings of this run are not reliable: stop the other jobs on this machine and rerun"
            + fit + "; trial_manager.py result --from-json refuses it unless --accept-unreliable")


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)
