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
from .conditions import Watch
from .options import TIERS, BenchOptions, BenchResult
from .process import OMP_WAIT_POLICY, WorkerProcess, worker_env


def omp_wait_policy() -> str:
    """The OpenMP wait policy the workers run with."""
    return os.environ.get("OMP_WAIT_POLICY", OMP_WAIT_POLICY)


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
    # --against: one more kernel worker, loading the other build
    aworker: WorkerProcess | None = None
    # --against: the workers that time the two builds, fresh ones of identical history
    # (see spawn_spares); empty otherwise, and the checked workers time
    ktimers: list[WorkerProcess] = field(default_factory=list)
    atimers: list[WorkerProcess] = field(default_factory=list)
    against_info: dict[str, Any] = field(default_factory=dict)
    # what the timing rounds saw of the machine (conditions.py); None before timing
    watch: Watch | None = None

    def seed(self) -> int:
        return self.rng.randrange(1, 2**31 - 1)

    def workers(self) -> list[WorkerProcess]:
        return [w for w in (self.kworker, self.bworker, self.aworker, *self.kspares, *self.bspares,
                            *self.ktimers, *self.atimers)
                if w is not None]

    # ------------------------------------------------------------------ workers

    def spawn(self, role: str) -> WorkerProcess:
        env = worker_env(self.result.threads)  # one definition for every timing worker
        if self.o.tier in TIERS:
            env["KERNEL_CPU_ISA"] = self.o.tier
        return WorkerProcess(role, timeout=self.o.timeout, env=env)

    def spawn_spares(self) -> None:
        """The extra timing pairs; they import while the trace and warm-up run.

        With --against, neither checked worker times: the candidate's worker has run
        the ATen trace and the dispatch query besides the correctness calls, the other
        build's worker has not, and an identical build read 3-4 % slower as the
        candidate than as the --against build (median of ten quiet runs).  Both builds
        are timed instead by fresh workers that did nothing but import and warm up, so
        neither side carries a history the other lacks.
        """
        if self.o.against:
            pairs = max(1, self.o.timing_processes)
            self.ktimers = [self.spawn("kernel") for _ in range(pairs)]
            self.atimers = [self.spawn("against") for _ in range(pairs)]
        else:
            for _ in range(max(0, self.o.timing_processes - 1)):
                self.kspares.append(self.spawn("kernel"))
        if self.o.baseline_us is None:
            for _ in range(max(0, self.o.timing_processes - 1)):
                self.bspares.append(self.spawn("baseline"))

    def timing_workers(self) -> tuple[list[WorkerProcess], list[WorkerProcess]]:
        """(the candidate's timing workers, the --against build's): one per pair."""
        if self.ktimers:
            return self.ktimers, self.atimers
        assert self.kworker is not None
        return [self.kworker, *self.kspares], [self.aworker] if self.aworker is not None else []

    def load(self, worker: WorkerProcess) -> dict[str, Any]:
        against = worker.role == "against"
        return worker.request("load", f"loading the {worker.role}",
                              role="kernel" if against else worker.role,
                              baseline_path=str(self.o.baseline_path),
                              kernel_spec=self.o.against if against else self.o.kernel_spec,
                              op_path=self.o.op_path, own_package=against,
                              threads=self.result.threads)

    def start_against(self) -> None:
        """Load the --against build in its own worker (two builds of one package name
        never meet in one process)."""
        assert self.aworker is not None
        self.against_info = self.load(self.aworker)
        self.check_tamper(self.against_info, "the --against build's import")

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
             warmup: int = 0, steady: bool = False, what: str) -> tuple[list[int], list[int], int]:
        """Time ``n`` calls (after ``warmup``) on fresh inputs from new seeds, or with
        ``steady`` on one draw copied to a new address per call (worker.time):
        (times in ns, the timed calls' seeds, ns spent drawing inputs)."""
        reply, seeds = self.time_reply(worker, source, [self.seed() for _ in range(n + warmup)],
                                       keep=keep, warmup=warmup, steady=steady, what=what)
        return reply["times_ns"], seeds[warmup:], reply["gen_ns"]

    def time_reply(self, worker: WorkerProcess, source: tuple[str, int], seeds: list[int], *,
                   keep: bool, warmup: int = 0, steady: bool = False,
                   what: str) -> tuple[dict[str, Any], list[int]]:
        """The worker's whole reply to one timing request on the given seeds (times,
        CPU times), and the seeds."""
        reply = worker.request("time", what, source=source, seeds=seeds, keep=keep,
                               warmup=warmup, cold=self.o.cold, steady=steady)
        self.check_tamper(reply, what)
        return reply, seeds

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
