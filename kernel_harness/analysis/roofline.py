"""Roofline arithmetic: the fastest an op can possibly run on this machine.

``floor time = max(FLOPs / peak FLOP/s, bytes / bandwidth)``.  The op is
*memory-bound* when the byte term is the larger one, i.e. when its arithmetic
intensity (FLOPs per byte) is below the machine balance (peak / bandwidth).

The limits come from the measured :class:`~kernel_harness.machine.MachineProfile`:
the bandwidth of a copy into a preallocated buffer (what a kernel with an
``out=`` argument can reach) and the peak of the instruction the suggested
strategy uses (fp32 FMA for element-wise work in any dtype, since bf16/fp16 are
widened to fp32; the AVX512-BF16 dot product or AMX for bf16 GEMM), in the SIMD
tier the kernel runs: a kernel running its AVX2 unit (a CPU without AVX512
F/BW/VL/DQ, or KERNEL_CPU_ISA=avx2) is held to the AVX2 FMA peak, not to a peak
no instruction of its unit can reach.

A freshly allocated output is slower to write: every 4 KiB page faults on
first touch.  ``floor_time_fresh_output_us`` charges the output bytes at the
measured fresh-copy rate instead, which is what a kernel that calls
``torch.empty`` per call will see on large outputs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..machine import MachineProfile

#: Below this many rows a bf16 GEMM uses AVX512-BF16 dot products; from it up, AMX tiles pay off.
#: (An AMX tile holds 16 rows; with very few rows most of each tile multiply is wasted.)
AMX_MIN_M = 5


@dataclass(frozen=True)
class Limits:
    """The roofline's ceilings for one (kind, dtype, M) on this machine."""

    peak_gflops: float
    peak_gflops_1t: float
    peak_source: str
    bandwidth_gbs: float
    bandwidth_gbs_1t: float
    fresh_output_gbs: float
    bandwidth_source: str = "copy_prealloc_gbs"


@dataclass(frozen=True)
class Roofline:
    flops: int
    bytes: int
    input_bytes: int
    output_bytes: int
    arithmetic_intensity: float  # FLOPs per byte
    machine_balance: float  # peak FLOP/s / bandwidth, FLOPs per byte
    peak_gflops: float
    peak_source: str
    bandwidth_gbs: float
    compute_time_us: float
    memory_time_us: float
    floor_time_us: float
    floor_time_1t_us: float
    floor_time_fresh_output_us: float
    bound: str  # "memory" or "compute"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, float):
                data[key] = round(value, 4) if math.isfinite(value) else None  # JSON has no inf
        return data


def choose_limits(machine: MachineProfile, *, kind: str, dtype: str, m: int | None = None,
                  tier: str | None = None) -> Limits:
    """Pick the peak that the suggested strategy would use and the bandwidth to compare against.

    ``tier`` is the SIMD tier the kernel runs (``avx2``, ``avx512``; ``generic`` or
    None: ATen/oneDNN, which use the widest instructions the CPU has).
    """
    bw = machine.bandwidth
    source = _peak_source(machine, kind=kind, dtype=dtype, m=m, tier=tier)
    peak = machine.peak_gflops(source) or 1.0
    peak_1t = machine.peak_gflops(source, threads="1") or peak
    if source == "fp32_fma_avx2" and not machine.peak_gflops(source):
        source = "unmeasured (1 GFLOP/s placeholder)"
    return Limits(
        peak_gflops=peak,
        peak_gflops_1t=peak_1t,
        peak_source=source,
        bandwidth_gbs=bw.copy_prealloc_gbs,
        bandwidth_gbs_1t=bw.copy_prealloc_gbs_1t,
        fresh_output_gbs=bw.copy_fresh_gbs,
    )


def _peak_source(machine: MachineProfile, *, kind: str, dtype: str, m: int | None,
                 tier: str | None) -> str:
    """The probe's peak kind for this op in this tier."""
    if tier == "avx2":
        return "fp32_fma_avx2"  # bf16/fp16 are widened to fp32 and FMA'd in the AVX2 unit
    source = "fp32_fma_avx512" if machine.peak_gflops("fp32_fma_avx512") else "fp32_fma_avx2"
    if kind in ("gemm", "attention") and dtype == "bf16":
        if machine.peak_gflops("amx_bf16") and (m is None or m >= AMX_MIN_M):
            source = "amx_bf16"
        elif machine.peak_gflops("bf16_dot_avx512"):
            source = "bf16_dot_avx512"
    return source


def roofline(flops: float, input_bytes: int, output_bytes: int, limits: Limits) -> Roofline:
    """The roofline numbers for one shape; all times in microseconds."""
    total = input_bytes + output_bytes
    compute_us = flops / (limits.peak_gflops * 1e3)  # GFLOP/s = 1e3 FLOP/us
    memory_us = total / (limits.bandwidth_gbs * 1e3)  # GB/s = 1e3 B/us
    compute_1t = flops / (limits.peak_gflops_1t * 1e3)
    memory_1t = total / (limits.bandwidth_gbs_1t * 1e3)
    # Page-fault surcharge: a fresh copy of N bytes moves 2N at fresh_output_gbs, a preallocated
    # one at bandwidth_gbs; the difference per output byte is what first touch costs.
    fault_us_per_byte = max(0.0, 2 / (limits.fresh_output_gbs * 1e3) - 2 / (limits.bandwidth_gbs * 1e3))
    fresh_memory_us = memory_us + output_bytes * fault_us_per_byte
    return Roofline(
        flops=int(flops),
        bytes=int(total),
        input_bytes=int(input_bytes),
        output_bytes=int(output_bytes),
        arithmetic_intensity=flops / total if total else float("inf") if flops else 0.0,
        machine_balance=limits.peak_gflops / limits.bandwidth_gbs,
        peak_gflops=limits.peak_gflops,
        peak_source=limits.peak_source,
        bandwidth_gbs=limits.bandwidth_gbs,
        compute_time_us=compute_us,
        memory_time_us=memory_us,
        floor_time_us=max(compute_us, memory_us),
        floor_time_1t_us=max(compute_1t, memory_1t),
        floor_time_fresh_output_us=max(compute_us, fresh_memory_us),
        bound="memory" if memory_us >= compute_us else "compute",
    )


def cache_fit(nbytes: int, machine: MachineProfile) -> str:
    """Smallest level holding ``nbytes``: "L1", "L2", "L3" or "DRAM" (per-core L1/L2)."""
    for level in (1, 2, 3):
        size = machine.cache_bytes(level)
        if size and nbytes <= size:
            return f"L{level}"
    return "DRAM"


def working_set(total_bytes: int, row_bytes: int | None, machine: MachineProfile) -> dict[str, Any]:
    """Where the whole op's data and one row live; a cache-resident op beats the DRAM floor."""
    data: dict[str, Any] = {
        "bytes": int(total_bytes),
        "fits_in": cache_fit(total_bytes, machine),
        "l1d_bytes": machine.cache_bytes(1),
        "l2_bytes": machine.cache_bytes(2),
        "l3_bytes": machine.cache_bytes(3),
        "row_bytes": int(row_bytes) if row_bytes else None,
        "row_fits_in": cache_fit(row_bytes, machine) if row_bytes else None,
    }
    if data["fits_in"] != "DRAM":
        data["note"] = (
            f"the whole working set fits in {data['fits_in']}: back-to-back benchmark calls run from cache, "
            "so the DRAM floor is pessimistic and call overhead / threading cost dominate"
        )
    else:
        data["note"] = "the working set exceeds the last-level cache: every call streams from DRAM"
    return data
