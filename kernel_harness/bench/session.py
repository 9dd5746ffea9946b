"""The state one benchmark run shares between its phases, and the parent's side of
talking to its worker processes (spawn, load, time, tier selection, tamper check).

Every phase module (:mod:`.checking`, :mod:`.timing`, :mod:`.sweep`,
:mod:`.throughput`) works on one :class:`Session`; :mod:`.runner` creates it
and calls the phases in order.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

from ..baseline import Baseline
from ..errors import CheckFailed, UsageError
from .options import TIERS, BenchOptions, BenchResult
from .process import WorkerProcess, with_steady_malloc


def system_seed() -> int:
    return random.SystemRandom().randrange(1, 2**31 - 1)


def cpu_has(tier: str) -> bool:
    try:
        from ..cpu import has_isa
    except ImportError:  # pragma: no cover - cpu.py ships with the harness
        return tier == "generic"
    return has_isa(tier)


@dataclass
class Session:
    o: BenchOptions
    rng: random.Random
    result: BenchResult
    baseline: Baseline | None = None
    kworker: WorkerProcess | None = None
    bworker: WorkerProcess | None = None
    # further worker pairs, for timing only (see the runner's module docstring)
    kspares: list[WorkerProcess] = field(default_factory=list)
    bspares: list[WorkerProcess] = field(default_factory=list)
    kernel_info: dict[str, Any] = field(default_factory=dict)

    def seed(self) -> int:
        return self.rng.randrange(1, 2**31 - 1)

    def workers(self) -> list[WorkerProcess]:
        return [w for w in (self.kworker, self.bworker, *self.kspares, *self.bspares) if w is not None]

    # ------------------------------------------------------------------ workers

    def spawn(self, role: str) -> WorkerProcess:
        # the same allocator steady state for every worker (see STEADY_MALLOC_ENV)
        env = with_steady_malloc(dict(os.environ))
        # identical thread settings for both workers, for torch and for a kernel's own OpenMP
        env["OMP_NUM_THREADS"] = str(self.result.threads)
        if self.o.tier in TIERS:
            env["KERNEL_CPU_ISA"] = self.o.tier
        return WorkerProcess(role, timeout=self.o.timeout, env=env)

    def spawn_spares(self) -> None:
        """The extra timing pairs; they import while the trace and warm-up run."""
        for _ in range(max(0, self.o.timing_processes - 1)):
            self.kspares.append(self.spawn("kernel"))
            if self.o.baseline_us is None:
                self.bspares.append(self.spawn("baseline"))

    def load(self, worker: WorkerProcess) -> dict[str, Any]:
        return worker.request("load", f"loading the {worker.role}", role=worker.role,
                              baseline_path=str(self.o.baseline_path),
                              kernel_spec=self.o.kernel_spec, op_path=self.o.op_path,
                              threads=self.result.threads)

    def start_kernel(self) -> None:
        assert self.kworker is not None
        self.kernel_info = self.load(self.kworker)
        self.check_tamper(self.kernel_info, "import")

    def check_tamper(self, reply: dict[str, Any], when: str) -> None:
        if reply.get("tampered"):
            names = ", ".join(reply["tampered"])
            raise CheckFailed(
                f"The kernel package replaced the harness's clock or code ({names}) during "
                f"{when}. A kernel must not patch timers or the harness; the run is rejected.")

    def time(self, worker: WorkerProcess, source: tuple[str, int], n: int, *, keep: bool,
             warmup: int = 0, what: str) -> tuple[list[int], list[int], int]:
        """Time ``n`` calls (after ``warmup``) on fresh inputs from new seeds:
        (times in ns, the timed calls' seeds, ns spent drawing inputs)."""
        seeds = [self.seed() for _ in range(n + warmup)]
        reply = worker.request("time", what, source=source, seeds=seeds, keep=keep,
                               warmup=warmup, cold=self.o.cold)
        self.check_tamper(reply, what)
        return reply["times_ns"], seeds[warmup:], reply["gen_ns"]

    # ------------------------------------------------------------------ tiers

    def tiers_to_check(self) -> list[str | None]:
        if self.o.tier != "all":
            return [None]
        return [None, *self.sweep_tiers()]

    def sweep_tiers(self) -> list[str]:
        declared = self.kernel_info.get("tiers")
        if declared is None:
            raise UsageError(
                "--tier all needs the kernel package to expose available_tiers() (the generated "
                "kernels do); this one does not.")
        return [t for t in TIERS if t in declared and cpu_has(t)]

    def set_tier(self, tier: str | None) -> None:
        assert self.kworker is not None
        if self.o.tier in TIERS:
            return  # forced for the whole run through the environment
        self.kworker.request("set_isa", "selecting a tier", tier=tier)

    def tier_label(self, tier: str | None) -> str:
        if self.o.tier in TIERS:
            return self.o.tier
        return tier or "dispatch"
