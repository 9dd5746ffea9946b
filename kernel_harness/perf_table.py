"""The catalogue kernels against PyTorch eager and the physical floor, side by side.

For each (op, dtype, shape) three things are timed in the same interleaved
rounds so machine drift hits all of them alike: PyTorch eager, our kernel, and
the floor — allocating an output of the same size and copying the input into
it, which is the least any op that returns a fresh tensor must do.  Every call
is timed on its own and the statistics are the benchmark's own
(:mod:`kernel_harness.bench.stats`): medians over all calls, and the speedup's
interval (and the floor fraction's) from a block bootstrap over paired rounds,
at least ±5 % wide (the run-to-run spread of an identical kernel here).  A
floor whose copy fits the last-level cache is marked as such
(``floor_in_cache``): on the Zen 4 VM the same op's fraction of a 16 MiB
floor read 1.73 in one run and 3.25 in the next, the copy alone moving 2x
with the share of the L3 other tenants left.  The number of rounds follows
a time budget per case, so fast cases get many rounds: in one process, the
bf16 rms_norm speedup of consecutive 15-round windows ranged over ±8 %, of
45-round windows over ±3 % (measured).  The table reports the speedup, achieved
GB/s and the fraction of the floor, plus the tier that ran.  A tier can be
forced (:func:`tier_plan`, ``KERNEL_CPU_ISA``, which the generated dispatcher
reads at every call, so one process times every tier the CPU has); tiers the
CPU or the package lacks are listed with the reason instead.  This is a
benchmark, not a test: its numbers go into the README with the machine they
ran on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from .bench import stats
from .bench.timing import round_order
from .build import build_kernel
from .cpu import TIERS, missing_flags
from .machine import last_level_cache_bytes
from .scaffold import ScaffoldOptions, plan_project, write_project

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PACKAGE = "perf_catalogue"
OPS = ("rms_norm", "add_rms_norm", "silu_and_mul", "gelu_and_mul", "softmax", "layer_norm")
#: The environment variable the generated dispatcher reads at every call.
ISA_ENV = "KERNEL_CPU_ISA"
#: ``--tier`` values: a tier, every tier this machine runs, or the dispatcher's own choice.
TIER_CHOICES = (*TIERS, "all", "auto")
#: ``--eager-isa`` values: PyTorch eager at its own best ISA, or capped at AVX2.
EAGER_ISA_CHOICES = ("native", "avx2")
#: What caps eager at AVX2: ATen's vectorised kernels read ATEN_CPU_CAPABILITY
#: and oneDNN reads ONEDNN_MAX_CPU_ISA, both once, at start-up.
EAGER_AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def eager_isa_environment(env: dict[str, str], eager_isa: str) -> dict[str, str]:
    """``env`` for a process whose PyTorch eager runs at most ``eager_isa``.

    Forcing our AVX2 tier on an AVX512 CPU while eager keeps its AVX512
    kernels compares two instruction sets, not two implementations: on an
    AVX2-only CPU, which is what ``--tier avx2`` stands in for, eager runs its
    AVX2 kernels too. "native" leaves eager as the environment has it.
    """
    if eager_isa not in EAGER_ISA_CHOICES:
        raise ValueError(f"unknown eager ISA {eager_isa!r}; use one of {', '.join(EAGER_ISA_CHOICES)}")
    return dict(env) if eager_isa == "native" else {**env, **EAGER_AVX2_ENV}


def eager_capability() -> str:
    """The instruction set PyTorch eager's vectorised kernels run in this process (AVX512, AVX2, DEFAULT)."""
    return str(torch.backends.cpu.get_cpu_capability())


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    rows: int
    cols: int  # the input's last dimension

    @property
    def label(self) -> str:
        return f"{self.op} {self.dtype} {self.rows}x{self.cols}"


DEFAULT_CASES = (
    Case("rms_norm", "bf16", 1024, 4096),
    Case("rms_norm", "bf16", 2048, 8192),
    Case("rms_norm", "fp32", 1024, 4096),
    Case("silu_and_mul", "bf16", 1024, 2 * 4096),
    Case("softmax", "fp32", 1024, 4096),
    Case("softmax", "bf16", 1024, 4096),
    # the other dtype of the ops above, and the rest of the catalogue, at the headline shape
    Case("silu_and_mul", "fp32", 1024, 2 * 4096),
    Case("add_rms_norm", "bf16", 1024, 4096),
    Case("add_rms_norm", "fp32", 1024, 4096),
    Case("gelu_and_mul", "bf16", 1024, 2 * 4096),
    Case("gelu_and_mul", "fp32", 1024, 2 * 4096),
    Case("layer_norm", "bf16", 1024, 4096),
    Case("layer_norm", "fp32", 1024, 4096),
)


@dataclass(frozen=True)
class Row:
    case: str
    torch_us: float
    ours_us: float
    floor_us: float
    speedup: float
    gbps: float
    floor_fraction: float  # ours / floor: 1.0 means as fast as allocate+copy
    tier: str
    speedup_ci_low: float | None  # the speedup's 95 % interval (stats.speedup; None below 3 rounds)
    speedup_ci_high: float | None
    rounds: int
    tier_requested: str = "auto"  # the forced tier (KERNEL_CPU_ISA), or "auto": the dispatcher's choice
    floor_ci_low: float | None = None  # floor_fraction's 95 % interval, from the same paired rounds
    floor_ci_high: float | None = None
    floor_bytes: int = 0  # what the floor's copy reads and writes
    # whether floor_bytes fit this machine's last-level cache (None: its size unknown): then
    # the floor times a cache-resident copy, which moves with the cache share other
    # tenants leave, not a trip to memory
    floor_in_cache: bool | None = None


@dataclass(frozen=True)
class TierPlan:
    """The tiers a run times, and those it cannot, each with the reason."""

    measured: tuple[str, ...]  # "auto" (the dispatcher's choice) or forced tiers, in TIERS order
    not_measured: dict[str, str]  # tier -> why not (the CPU lacks flags, the package lacks the tier)


def tier_plan(requested: str, available: list[str]) -> TierPlan:
    """What ``--tier requested`` times, given the tiers the built package says this CPU runs.

    ``available`` is the package's own answer (``available_tiers()``); a tier
    missing from it is explained by the CPU flags it lacks when there are any.
    """
    if requested not in TIER_CHOICES:
        raise ValueError(f"unknown tier {requested!r}; use one of {', '.join(TIER_CHOICES)}")
    if requested == "auto":
        return TierPlan(("auto",), {})
    wanted = TIERS if requested == "all" else (requested,)
    missing = {}
    for tier in wanted:
        if tier in available:
            continue
        flags = missing_flags(tier)
        missing[tier] = (f"this CPU lacks {', '.join(flags)}" if flags
                         else "the package has no such tier for this CPU")
    return TierPlan(tuple(t for t in wanted if t not in missing), missing)


@contextmanager
def forced_tier(tier: str) -> Iterator[None]:
    """Run the generated kernels on ``tier`` ("auto": the dispatcher's own choice) inside the block."""
    before = os.environ.get(ISA_ENV)
    if tier == "auto":
        os.environ.pop(ISA_ENV, None)
    else:
        os.environ[ISA_ENV] = tier
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ISA_ENV, None)
        else:
            os.environ[ISA_ENV] = before


def _functions(case: Case, kernel: ModuleType) -> tuple[list[Any], Callable, Callable, int]:
    """Inputs, the eager op, our op, and the bytes the op must move."""
    dtype = DTYPES[case.dtype]
    x = torch.randn(case.rows, case.cols).to(dtype)
    size = x.element_size()
    if case.op == "rms_norm":
        w = (1 + 0.1 * torch.randn(case.cols)).to(dtype)
        inputs = [x, w, 1e-6]
        return inputs, lambda *a: F.rms_norm(a[0], (case.cols,), a[1], a[2]), kernel.rms_norm, 2 * x.numel() * size
    if case.op == "silu_and_mul":
        d = case.cols // 2
        return [x], lambda a: F.silu(a[..., :d]) * a[..., d:], kernel.silu_and_mul, (x.numel() + x.numel() // 2) * size
    if case.op == "softmax":
        return [x], lambda a: torch.softmax(a, dim=-1), kernel.softmax, 2 * x.numel() * size
    if case.op == "gelu_and_mul":
        d = case.cols // 2
        return [x], lambda a: F.gelu(a[..., :d]) * a[..., d:], kernel.gelu_and_mul, (x.numel() + x.numel() // 2) * size
    if case.op == "add_rms_norm":
        r = torch.randn(case.rows, case.cols).to(dtype)
        w = (1 + 0.1 * torch.randn(case.cols)).to(dtype)

        def eager(x_, r_, w_, eps):
            h = x_ + r_
            return F.rms_norm(h, (case.cols,), w_, eps), h

        return [x, r, w, 1e-6], eager, kernel.add_rms_norm, 4 * x.numel() * size  # reads x, r; writes y, h
    if case.op == "layer_norm":
        w = (1 + 0.1 * torch.randn(case.cols)).to(dtype)
        b = (0.1 * torch.randn(case.cols)).to(dtype)
        return ([x, w, b, 1e-5], lambda *a: F.layer_norm(a[0], (case.cols,), a[1], a[2], a[3]), kernel.layer_norm,
                2 * x.numel() * size)
    raise ValueError(case.op)


def interleaved_samples(fns: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, stats.Measurement]:
    """``rounds`` rounds of ``calls`` individually timed calls of every function, side by side.

    Each round times every function once, the rounds going through every
    order of the functions in turn (the benchmark's :func:`round_order`), so
    each one runs in every position and right after every other equally often:
    a predecessor's dirty cache lines and temporaries are evicted on the next
    one's time. Plain reversal every other round kept "ours" in the middle of
    three, and a fixed order let two builds of one source differ by 30 % in a
    linear A/B on the Zen 5 EPYC (examples/linear/README.md).
    """
    samples = {name: stats.Measurement(name) for name in fns}
    for r in range(rounds):
        for name in round_order(r, 1, tuple(fns)):
            samples[name].add_round(_call_times_ns(fns[name], calls))
    return samples


def _call_times_ns(fn: Callable[[], Any], calls: int) -> list[int]:
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return times


def rounds_for(round_s: float, budget_s: float, least: int = 15, most: int = 75) -> int:
    """Rounds that fit ``budget_s`` at ``round_s`` per round, within [least, most]."""
    if round_s <= 0:
        return most
    return max(least, min(most, int(budget_s / round_s)))


def _floor_bytes(reference: torch.Tensor | tuple[torch.Tensor, ...]) -> int:
    """Bytes the floor reads and writes: each output once from its source, once into the new tensor."""
    outputs = reference if isinstance(reference, tuple) else (reference,)
    return 2 * sum(r.numel() * r.element_size() for r in outputs)


def _fits_cache(nbytes: int) -> bool | None:
    llc = last_level_cache_bytes()
    return None if llc is None else nbytes <= llc


def _floor(reference: torch.Tensor | tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    """Allocate every output of the op (one, or add_rms_norm's two) and copy an equal-sized tensor into it."""
    sources = [torch.empty_like(r).copy_(r) for r in (reference if isinstance(reference, tuple) else (reference,))]
    if len(sources) == 1:
        source = sources[0]
        return lambda: torch.empty_like(source).copy_(source)
    return lambda: [torch.empty_like(s).copy_(s) for s in sources]


def measure(case: Case, kernel: ModuleType, rounds: int | None = None, calls: int = 10,
            budget_s: float = 6.0, seed: int = 0, tier: str = "auto") -> Row:
    """Time one case on ``tier`` ("auto": the dispatcher's choice); ``rounds`` None sizes the
    rounds to ``budget_s`` (rounds_for)."""
    with forced_tier(tier):
        return _measure(case, kernel, rounds, calls, budget_s, seed, tier)


def _measure(case: Case, kernel: ModuleType, rounds: int | None, calls: int, budget_s: float, seed: int,
             tier: str) -> Row:
    inputs, eager, ours, nbytes = _functions(case, kernel)
    reference = eager(*inputs)
    floor = _floor(reference)
    fns = {"torch": lambda: eager(*inputs), "ours": lambda: ours(*inputs), "floor": floor}
    # warm-up (first-call costs: lazy init, page faults of the pool), which
    # also tells how long a round takes
    round_ns = sum(sum(_call_times_ns(fn, 2)) / 2 for fn in fns.values()) * calls
    if rounds is None:
        rounds = rounds_for(round_ns / 1e9, budget_s)
    samples = interleaved_samples(fns, rounds, calls)
    t_torch, t_ours, t_floor = (samples[k].median_us for k in ("torch", "ours", "floor"))
    speedup = stats.speedup(samples["torch"], samples["ours"], seed=seed)
    # ours over the floor is a "speedup" of the floor's time by ours: the same paired bootstrap
    fraction = stats.speedup(samples["ours"], samples["floor"], seed=seed)
    floor_bytes = _floor_bytes(reference)
    return Row(
        case=case.label, torch_us=t_torch, ours_us=t_ours, floor_us=t_floor, speedup=speedup.value,
        gbps=nbytes / (t_ours * 1e-6) / 1e9, floor_fraction=fraction.value,
        tier=kernel.dispatch_tier(case.op, *inputs),
        speedup_ci_low=speedup.ci_low, speedup_ci_high=speedup.ci_high, rounds=rounds, tier_requested=tier,
        floor_ci_low=fraction.ci_low, floor_ci_high=fraction.ci_high, floor_bytes=floor_bytes,
        floor_in_cache=_fits_cache(floor_bytes),
    )


def select_cases(ops: list[str] | None) -> tuple[Case, ...]:
    """DEFAULT_CASES of the named ops (all of them for None); unknown names raise ValueError."""
    if ops is None:
        return DEFAULT_CASES
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise ValueError(f"unknown op {', '.join(unknown)}; the catalogue benchmark has {', '.join(OPS)}")
    return tuple(case for case in DEFAULT_CASES if case.op in ops)


def build_perf_kernel(directory: Path) -> Path:
    """Generate the catalogue ops from the templates and build them (incremental)."""
    write_project(plan_project(ScaffoldOptions(ops=OPS, name=PACKAGE, directory=directory, force=True)), force=True)
    build_kernel(directory, wheel=False)
    return directory


def rows_as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    return [asdict(row) for row in rows]
