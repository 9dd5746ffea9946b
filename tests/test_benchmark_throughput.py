"""The benchmark's throughput block: which measured peak a kernel's GFLOP/s are held against.

A bf16 GEMM on a CPU with AMX runs on tiles (the avx512 unit's AMX path, or
oneDNN in the generic tier) and can beat the fp32 vector peak several times:
held against that peak it read "202 % of peak" (linear M = 128 on a Sapphire
Rapids class Xeon). The peak follows the op's arithmetic per byte, its dtype
and the tier that ran, and names its source.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_machine import fake_profile, install_fake_profile

from kernel_harness.bench.throughput import machine_limits


@pytest.fixture
def profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return install_fake_profile(tmp_path, monkeypatch)  # AVX512 200, AVX2 100, AMX 2000 GFLOP/s, 20 GB/s


def test_a_bf16_gemm_on_the_avx512_tier_is_held_against_the_amx_peak(profile):
    limits = machine_limits(2, dtype="bf16", tier="avx512", flops_per_byte=120.0)
    assert limits["peak_gflops"] == 2000.0 and limits["peak_source"] == "amx_bf16"
    assert machine_limits(2, dtype="bf16", tier="generic", flops_per_byte=120.0)["peak_source"] == "amx_bf16"
    assert machine_limits(1, dtype="bf16", tier="avx512", flops_per_byte=120.0)["peak_gflops"] == 1000.0


def test_streaming_ops_fp32_and_the_avx2_tier_keep_the_vector_peak(profile):
    # decode-shaped: ~1 FLOP per byte, below the vector peak's balance (200 / 20 = 10)
    assert machine_limits(2, dtype="bf16", tier="avx512", flops_per_byte=1.0)["peak_gflops"] == 200.0
    assert machine_limits(2, dtype="fp32", tier="avx512", flops_per_byte=120.0)["peak_gflops"] == 200.0
    avx2 = machine_limits(2, dtype="bf16", tier="avx2", flops_per_byte=120.0)
    assert avx2["peak_gflops"] == 100.0 and avx2["peak_source"] == "fp32_fma_avx2"
    assert machine_limits(2)["peak_gflops"] == 200.0  # nothing known about the op: the vector peak


def test_without_amx_a_bf16_gemm_never_gets_a_peak_below_the_vector_one(tmp_path, monkeypatch):
    """A CPU with AVX512-BF16 but no AMX: the probe's VDPBF16PS peak may read below the FMA one,
    and the kernel may widen and FMA instead, so the larger of the two stands."""
    import kernel_harness.machine as machine
    from test_machine import Peak

    monkeypatch.setenv(machine.CACHE_ENV_VAR, str(tmp_path))
    slow_dot = fake_profile(cache_key=machine.read_cpu_facts().cache_key(),
                            flags=("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"),
                            peaks={"fp32_fma_avx512": Peak(100.0, 200.0), "fp32_fma_avx2": Peak(50.0, 100.0),
                                   "bf16_dot_avx512": Peak(60.0, 120.0)})
    machine.store_profile(slow_dot)
    limits = machine_limits(2, dtype="bf16", tier="avx512", flops_per_byte=120.0)
    assert limits["peak_gflops"] == 200.0
