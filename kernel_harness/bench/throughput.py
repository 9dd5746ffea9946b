"""What the timed kernel achieves (GB/s, GFLOP/s) against the machine's measured
limits, and the cache size --cold needs to exceed."""

from __future__ import annotations

import os
from typing import Any

from . import tree
from .options import InputSet
from .session import Session


def measure_throughput(session: Session, s: InputSet) -> None:
    """Fill ``result.throughput`` from the kernel's median on the headline input set."""
    baseline, r = session.baseline, session.result
    assert baseline is not None
    if r.kernel_us is None:
        return
    moved = baseline.amount("BYTES", s.inputs)
    source_bytes = "BYTES in the baseline"
    if moved is None:
        out = baseline.reference(tree.clone_tree(s.inputs))
        moved = float(tree.nbytes(s.inputs) + tree.nbytes(out))
        source_bytes = "estimate: every input read once and every output written once"
    flops = baseline.amount("FLOPS", s.inputs)
    seconds = r.kernel_us * 1e-6
    info: dict[str, Any] = {
        "bytes": moved, "bytes_source": source_bytes, "flops": flops,
        "gbps": moved / seconds / 1e9 if moved else None,
        "gflops": flops / seconds / 1e9 if flops else None,
    }
    if r.baseline_us:
        info["baseline_gbps"] = moved / (r.baseline_us * 1e-6) / 1e9 if moved else None
    limits = machine_limits(r.threads)
    info.update(limits)
    if limits.get("bandwidth_gbps") and info["gbps"]:
        info["bandwidth_fraction"] = info["gbps"] / limits["bandwidth_gbps"]
    if limits.get("peak_gflops") and info["gflops"]:
        info["peak_fraction"] = info["gflops"] / limits["peak_gflops"]
    r.throughput = info


def last_level_cache_bytes() -> int | None:
    root = "/sys/devices/system/cpu/cpu0/cache"
    best = None
    try:
        for entry in sorted(os.listdir(root)):
            if not entry.startswith("index"):
                continue
            with open(f"{root}/{entry}/type") as fh:
                if fh.read().strip() == "Instruction":
                    continue
            with open(f"{root}/{entry}/size") as fh:
                text = fh.read().strip().upper()
            mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * mult
            best = max(best or 0, size)
    except (OSError, ValueError):
        return None
    return best


def machine_limits(threads: int) -> dict[str, Any]:
    """The machine's measured limits, from the cached profile only (no probing mid-benchmark)."""
    try:
        from ..machine import load_cached_profile
    except ImportError:
        return {"machine_limits": "machine limits unknown (kernel_harness.machine unavailable)"}
    try:
        profile = load_cached_profile()
    except Exception:  # noqa: BLE001 - a broken cache must not break a benchmark
        profile = None
    if profile is None:
        return {"machine_limits": "machine limits unknown: no measured profile yet (run "
                                  "python -m kernel_harness.machine once)"}
    single = threads == 1
    bw = profile.bandwidth
    return {
        "machine_limits": "measured profile of " + profile.measured_at,
        "bandwidth_gbps": bw.copy_prealloc_gbs_1t if single else bw.copy_prealloc_gbs,
        "peak_gflops": profile.best_vector_fp32_gflops(threads="single" if single else "all"),
    }
