"""The catalogue kernels against PyTorch eager and the physical floor, side by side.

For each (op, dtype, shape) three things are timed in the same interleaved
rounds so machine drift hits all of them alike: PyTorch eager, our kernel, and
the floor — allocating an output of the same size and copying the input into
it, which is the least any op that returns a fresh tensor must do.  The table
reports medians over rounds, the speedup, achieved GB/s and the fraction of
the floor, plus the tier the dispatcher picked.  This is a benchmark, not a
test: its numbers go into the README with the machine they ran on.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from .build import build_kernel
from .scaffold import ScaffoldOptions, plan_project, write_project

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PACKAGE = "perf_catalogue"
OPS = ("rms_norm", "silu_and_mul", "softmax")


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
    raise ValueError(case.op)


def interleaved_samples(fns: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, list[float]]:
    """``rounds`` timings (µs per call, ``calls`` calls each) of every function, side by side.

    Each round times every function once; odd rounds go in reverse order, so
    that no function always follows the same neighbour (a predecessor's dirty
    cache lines and temporaries are evicted on the next one's time).
    """
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        for name in order if r % 2 == 0 else reversed(order):
            samples[name].append(_time_us(fns[name], calls))
    return samples


def _time_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def measure(case: Case, kernel: ModuleType, rounds: int = 15, calls: int = 10) -> Row:
    inputs, eager, ours, nbytes = _functions(case, kernel)
    reference = eager(*inputs)
    source = torch.empty_like(reference).copy_(reference)  # an output-sized tensor to copy
    floor = lambda: torch.empty_like(source).copy_(source)  # noqa: E731
    fns = {"torch": lambda: eager(*inputs), "ours": lambda: ours(*inputs), "floor": floor}
    for fn in fns.values():
        fn()  # warm-up: first-call costs (lazy init, page faults of the pool)
    samples = interleaved_samples(fns, rounds, calls)
    t_torch, t_ours, t_floor = (statistics.median(samples[k]) for k in ("torch", "ours", "floor"))
    return Row(
        case=case.label, torch_us=t_torch, ours_us=t_ours, floor_us=t_floor, speedup=t_torch / t_ours,
        gbps=nbytes / (t_ours * 1e-6) / 1e9, floor_fraction=t_ours / t_floor,
        tier=kernel.dispatch_tier(case.op, *inputs),
    )


def build_perf_kernel(directory: Path) -> Path:
    """Generate the catalogue ops from the templates and build them (incremental)."""
    write_project(plan_project(ScaffoldOptions(ops=OPS, name=PACKAGE, directory=directory, force=True)), force=True)
    build_kernel(directory, wheel=False)
    return directory


def rows_as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    return [asdict(row) for row in rows]
