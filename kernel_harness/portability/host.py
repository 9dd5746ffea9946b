"""The widest dispatcher tier a machine runs: what advice and the demo aim at.

The generated dispatcher runs its ``avx512`` tier on any CPU with AVX512
F/BW/VL/DQ (``cpu_features.hpp``; the unit's AVX512-BF16 instructions sit
behind a run-time test), its ``avx2`` tier on one with AVX2/FMA/F16C: advice
about 512-bit registers or knobs of the AVX512 unit on a CPU without AVX512
would be about code that never executes there. Flags are spelled as
``/proc/cpuinfo`` spells them (``avx512f``).
"""

from __future__ import annotations

from collections.abc import Callable

from ..cpu import REQUIRED_FLAGS, cpu_flags, has_isa

#: Vector width of each tier's unit (generic: the ATen fallback, no SIMD of ours).
TIER_BITS = {"avx512": 512, "avx2": 256, "generic": 0}


def widest_tier(has_flag: Callable[[str], bool] | None = None) -> str:
    """``avx512``, ``avx2`` or ``generic``: the tier the dispatcher runs here for non-empty inputs.

    ``has_flag`` answers for another machine description (e.g. the cached
    :class:`~kernel_harness.machine.MachineProfile`); by default this CPU
    (``kernel_harness.cpu``, which honours ``KERNEL_HARNESS_CPU_FLAGS``).
    """
    for tier in ("avx512", "avx2"):
        if has_flag is None:
            if has_isa(tier):
                return tier
        elif all(has_flag(flag) for flag in REQUIRED_FLAGS[tier]):
            return tier
    return "generic"


def narrower_tier_note(has_flag: Callable[[str], bool] | None = None) -> str | None:
    """Why the widest tier is narrower than the CPU's widest vectors, when it is."""
    tier = widest_tier(has_flag)
    check = has_flag or (lambda flag: flag in cpu_flags())
    if tier != "avx512" and check("avx512f"):
        missing = sorted(f for f in REQUIRED_FLAGS["avx512"] if not check(f))
        return (f"this CPU has AVX512F but lacks {', '.join(missing)}, which the generated avx512 tier "
                f"needs: the dispatcher runs the {tier} tier here, so work in the {tier} unit (the avx512 "
                "unit never executes on this machine)")
    return None
