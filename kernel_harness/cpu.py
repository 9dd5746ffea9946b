"""What this CPU can run: ISA flags from ``/proc/cpuinfo`` and the kernel tiers.

The kernels have three tiers (``generic``, ``avx2``, ``avx512``) and GEMM
kernels may use AMX.  Tests must never assume the CPU, so they ask
:func:`has_isa` and skip a tier with a reason instead.  The Linux kernel only
lists a flag in ``/proc/cpuinfo`` when the OS also saves the registers
(``avx512f`` disappears when XSAVE of the ZMM state is off), which is the same
guarantee the kernels' own CPUID + XGETBV check gives.

``KERNEL_HARNESS_CPU_FLAGS`` (space/comma separated) overrides the detected
flags; tests use it to simulate a CPU without AVX512.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

CPUINFO_PATH = Path("/proc/cpuinfo")
FLAGS_ENV_VAR = "KERNEL_HARNESS_CPU_FLAGS"

#: Tiers from slowest to fastest; ``supported_tiers`` keeps this order.
TIERS: tuple[str, ...] = ("generic", "avx2", "avx512")

#: The flags each tier needs to run (the generated dispatcher's checks in
#: ``cpu_features.hpp``): AVX512 F/BW/VL/DQ, exactly the unit's flags; its
#: AVX512-BF16 instructions are asm it runs only where the CPU has them
#: (``bf16_instructions``), so Skylake-SP and Ice Lake run it too.  AVX2 uses
#: FMA and F16C for fp16.  ``amx`` is not a dispatcher tier but GEMM kernels
#: test for it.
#: The avx512 tier's features in one place: the CPU check here, the unit's -m
#: flags (scaffold/catalogue.py) and what the validator lets a generated avx512
#: unit enable (validate/source_checks.py) all read this tuple.
AVX512_TIER_FEATURES: tuple[str, ...] = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
REQUIRED_FLAGS: dict[str, frozenset[str]] = {
    "generic": frozenset(),
    "avx2": frozenset({"avx2", "fma", "f16c"}),
    "avx512": frozenset(AVX512_TIER_FEATURES),
    "amx": frozenset({"amx_tile", "amx_bf16", "amx_int8"}),
}


def _parse_flags(text: str) -> frozenset[str]:
    # x86 says "flags", some other architectures "Features"; every core lists the
    # same set on the machines we target, so the first line is enough.
    for line in text.splitlines():
        match = re.match(r"^(flags|Features)\s*:\s*(.*)$", line)
        if match:
            return frozenset(match.group(2).split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def _detected_flags() -> frozenset[str]:
    try:
        return _parse_flags(CPUINFO_PATH.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return frozenset()


def _cpuinfo_field(name: str) -> str | None:
    """The first ``name : value`` of ``/proc/cpuinfo`` (None when absent or unreadable)."""
    try:
        text = CPUINFO_PATH.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(rf"^{re.escape(name)}\s*:\s*(.*)$", text, re.MULTILINE)
    return match.group(1).strip() if match else None


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` ("unknown CPU" when it cannot be read)."""
    return _cpuinfo_field("model name") or "unknown CPU"


@functools.lru_cache(maxsize=1)
def cpu_vendor() -> str:
    """CPUID's vendor string from ``/proc/cpuinfo`` ("GenuineIntel", "AuthenticAMD"; "" when
    unknown): some library rules hold on one vendor only (MKL's GEMMs are fast on Intel)."""
    return _cpuinfo_field("vendor_id") or ""


@functools.lru_cache(maxsize=1)
def cpu_family() -> int | None:
    """The CPU's display family from ``/proc/cpuinfo`` (25 = 0x19: Zen 3/4, 26 = 0x1A: Zen 5;
    6 on Intel cores), None when unknown."""
    value = _cpuinfo_field("cpu family")
    return int(value) if value and value.isdigit() else None


def row_streams_by_default() -> bool:
    """Whether the generated units' decode GEMVs read one weight row after the other here
    (cpu_features.hpp's row_stream_reads() without KERNEL_CPU_MASK / KERNEL_CPU_FORCE): on AMD
    family 0x1A (Zen 5) on, where it measured faster than blocks of rows; Zen 4 lost."""
    family = cpu_family()
    return cpu_vendor() == "AuthenticAMD" and family is not None and family >= 0x1A


def row_segments_by_default() -> bool:
    """Whether the generated units' decode GEMVs with one row of x read a weight the last-level
    cache cannot hold as segments of rows in lockstep here (cpu_features.hpp's
    row_segment_reads() without KERNEL_CPU_MASK / KERNEL_CPU_FORCE): on AMD family 0x19 with
    AVX512 (Zen 4), where it measured faster than blocks of adjacent rows."""
    return cpu_vendor() == "AuthenticAMD" and cpu_family() == 0x19 and "avx512f" in _detected_flags()


def cpu_flags() -> frozenset[str]:
    """The CPU's ISA flags (lower case, as ``/proc/cpuinfo`` spells them)."""
    override = os.environ.get(FLAGS_ENV_VAR)
    if override is not None:
        return frozenset(override.replace(",", " ").lower().split())
    return _detected_flags()


def has_isa(tier: str) -> bool:
    """True when this CPU can run ``tier`` (``generic``, ``avx2``, ``avx512`` or ``amx``)."""
    try:
        required = REQUIRED_FLAGS[tier]
    except KeyError:
        raise ValueError(
            f"unknown ISA tier {tier!r}; expected one of {', '.join(REQUIRED_FLAGS)}"
        ) from None
    return required <= cpu_flags()


def missing_flags(tier: str) -> list[str]:
    """The flags ``tier`` needs that this CPU lacks (for skip reasons and messages)."""
    return sorted(REQUIRED_FLAGS[tier] - cpu_flags())


def supported_tiers() -> list[str]:
    """The dispatcher tiers this CPU can run, slowest first (always includes ``generic``)."""
    return [tier for tier in TIERS if has_isa(tier)]


def skip_reason(tier: str) -> str:
    """A pytest skip reason for a tier this CPU cannot run."""
    return f"this CPU lacks {tier} (missing flags: {', '.join(missing_flags(tier))})"
