"""What the timed kernel achieves (GB/s, GFLOP/s) against the machine's measured
limits, and the cache size --cold needs to exceed."""

from __future__ import annotations

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
    limits = machine_limits(r.threads, dtype=_dtype_name(s.inputs), tier=r.conditions.get("tier_ran"),
                            flops_per_byte=flops / moved if flops and moved else None)
    info.update(limits)
    if limits.get("bandwidth_gbps") and info["gbps"]:
        info["bandwidth_fraction"] = info["gbps"] / limits["bandwidth_gbps"]
    if limits.get("peak_gflops") and info["gflops"]:
        info["peak_fraction"] = info["gflops"] / limits["peak_gflops"]
    r.throughput = info


_DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


def _dtype_name(inputs: Any) -> str | None:
    """The first floating-point input's dtype as the probe names it ("bf16", ...)."""
    for t in tree.tensors(inputs):
        if t.is_floating_point():
            return _DTYPE_NAMES.get(str(t.dtype))
    return None


def _peak(profile: Any, *, threads: int, dtype: str | None, tier: str | None,
          flops_per_byte: float | None) -> tuple[float | None, str]:
    """The compute peak the timed kernel is held against, and which probe peak it is.

    The fp32 FMA peak of the tier that ran (the widest when unknown), unless the op does more arithmetic per
    byte than that peak and the bandwidth balance (a GEMM's shape) and its dtype has
    a faster unit this tier can reach: bf16 on a CPU with AMX, whose tiles the avx512
    unit and oneDNN use (the analysis's choose_limits decides as for analyze_op.py).
    Never a peak below the tier's fp32 one: a bf16 kernel may widen and FMA, so the
    fraction stays a fraction."""
    from ..analysis.roofline import choose_limits

    single = threads == 1
    vector = choose_limits(profile, kind="elementwise", dtype="fp32", tier=tier)
    if not profile.peak_gflops(vector.peak_source):
        return None, "unmeasured"  # the probe measured no FMA peak for this tier
    vector_peak = vector.peak_gflops_1t if single else vector.peak_gflops
    if dtype and flops_per_byte and vector.bandwidth_gbs and flops_per_byte > vector.peak_gflops / vector.bandwidth_gbs:
        chosen = choose_limits(profile, kind="gemm", dtype=dtype, tier=tier)
        peak = chosen.peak_gflops_1t if single else chosen.peak_gflops
        if peak > vector_peak:
            return peak, chosen.peak_source
    return vector_peak, vector.peak_source


def machine_limits(threads: int, *, dtype: str | None = None, tier: str | None = None,
                   flops_per_byte: float | None = None) -> dict[str, Any]:
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
    peak, source = _peak(profile, threads=threads, dtype=dtype, tier=tier, flops_per_byte=flops_per_byte)
    return {
        "machine_limits": "measured profile of " + profile.measured_at,
        "bandwidth_gbps": bw.copy_prealloc_gbs_1t if single else bw.copy_prealloc_gbs,
        "peak_gflops": peak,
        "peak_source": source,
    }
