"""Warn when a SIMD section leaves floating-point contraction to the compiler's default.

GCC contracts ``a * b + c`` into one FMA inside ``-mfma``/AVX512 units unless told
otherwise (its default, even with ``-std=c++20``), which rounds once where eager
PyTorch rounds twice and flips bf16 results by one ulp on a few elements. Whether
that is wanted is a decision, so the flag must be explicit: ``-ffp-contract=off``
(match eager bit for bit; FMA only where the code writes one) or
``-ffp-contract=fast`` [ref:fp-contraction]. Owned by issue 20 (unseen ops).
"""

from __future__ import annotations

from typing import Any

from .findings import Report
from .isa import is_simd_section

CODE = "fp-contract-implicit"


def check_fp_contract(report: Report, toml: Any) -> None:
    """One warning per SIMD [kernel.*] section whose cxx-flags have no -ffp-contract=."""
    for kernel in toml.cpu_kernels:
        flags = tuple(kernel.cxx_flags)
        if not is_simd_section(flags) or any(f.startswith("-ffp-contract=") for f in flags):
            continue
        report.warning(
            CODE,
            "build.toml",
            toml.line_of(kernel.table, "cxx-flags") or kernel.line,
            f"[{kernel.table}] leaves floating-point contraction implicit: GCC then fuses a * b + c into one "
            "FMA (one rounding, eager PyTorch rounds twice), which flips bf16 results by one ulp on a few "
            "elements. Add \"-ffp-contract=off\" to its cxx-flags (matches eager; write vfmadd where you want "
            "an FMA) or \"-ffp-contract=fast\" to keep the fusion deliberately (references: fp-contraction).",
        )
