"""Checks that read the C++ sources: ISA use, unfinished bodies, alignment, tails, thresholds.

All of these are heuristics over comment-free text (see ``cxx_text``).  Errors
are reserved for things that are certainly wrong (an intrinsic the flags do
not enable fails to compile; ``KERNEL_TODO(`` is an unwritten body); the rest
are warnings an agent should read, not obey blindly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..cpu import AVX512_TIER_FEATURES
from .cxx_text import Source
from .findings import Report
from .isa import LEVEL_NAMES, LEVEL_OF_FEATURE, compiled_code, enabled_features, flags_level, intrinsic_uses

TODO_MARKER = "KERNEL_TODO("
_TODO_DEFINE_RE = re.compile(r"^\s*#\s*define\s+KERNEL_TODO\s*\(")

_TORCH_HEADER_RE = re.compile(r"^(torch/|ATen/|c10/|torch_binding\.h$|Python\.h$|pybind11/)")

_ALIGNED_RE = re.compile(
    r"\b(_mm(?:256|512)?_(?:load|store|stream)_(?:ps|pd|si256|si512|epi32|epi64)|_mm(?:256|512)?_stream_load_si(?:256|512))\s*\("
)
_ALIGNED_DECL_RE = re.compile(r"\balignas\s*\([^)]*\)\s*[\w:<>,\s]*?\b(\w+)\s*\[")
_ASSUME_RE = re.compile(r"\b(\w+)\s*=\s*(?:\([^;]*?\))?\s*(?:static_cast<[^>]*>\s*\()?\s*(?:__builtin_assume_aligned|std::assume_aligned\s*<[^>]*>)\s*\(")
_ASSUME_ARG_RE = re.compile(r"(?:__builtin_assume_aligned|std::assume_aligned\s*<[^>]*>)\s*\(\s*(\w+)")

_MASK_TAIL_RE = re.compile(r"__mmask\d+|_mask_|_maskz_|maskload|maskstore|_cvtu32_mask|_bzhi_u32")
_FOR_RE = re.compile(r"\bfor\s*\(([^;()]*);([^;]*);([^)]*)\)")
_WHILE_TAIL_RE = re.compile(r"\bwhile\s*\(\s*\w+\s*<")
_ZERO_INIT_RE = re.compile(r"^\s*(?:[\w:]+\s+)?\w+\s*=\s*0\s*$")

_THRESHOLD_RE = re.compile(
    r"threshold|\bk(?:Min|Small|Parallel|Omp|Grain)\w*|\b[A-Z][A-Z0-9_]*(?:MIN|THRESHOLD|SMALL|GRAIN)[A-Z0-9_]*\b|"
    r"\b(?:numel|num_tokens|rows|n_rows|num_rows|size|total)\s*(?:\(\s*\))?\s*<=?\s*(?:\d{2,}|k\w+)",
    re.IGNORECASE,
)


def check_todo_markers(report: Report, source: Source) -> None:
    for number, line in enumerate(source.raw.splitlines(), 1):
        if TODO_MARKER in line and not _TODO_DEFINE_RE.match(line):
            report.error(
                "unfinished-body",
                source.rel,
                number,
                f"unfinished compute body: {line.strip()[:120]} -- write the body and remove the KERNEL_TODO marker",
            )


def unit_level(source: Source, flags: tuple[str, ...]) -> int:
    code = compiled_code(source.code, flags)
    return max((LEVEL_OF_FEATURE.get(feature, 0) for _, _, feature, _ in intrinsic_uses(code)), default=0)


def check_isa(report: Report, source: Source, section: str, flags: tuple[str, ...]) -> None:
    """Every intrinsic must be enabled by the flags of the section that compiles it."""
    enabled = enabled_features(flags)
    reported: set[str] = set()
    guarded_unit = is_bf16_guarded_unit(source)
    for word, offset, feature, flag in intrinsic_uses(compiled_code(source.code, flags)):
        if feature in enabled or feature in reported or (guarded_unit and feature in _GUARDED_FEATURES):
            continue  # (a generated avx512 unit's BF16/VNNI intrinsics: check_insn_guards says what to do)
        reported.add(feature)
        fix = (f"Move this code to the {LEVEL_NAMES[LEVEL_OF_FEATURE.get(feature, 1)]} tier unit, or add {flag} "
               "to that section only if this unit is meant for that ISA.")
        if guarded_unit and feature not in _AVX512_TIER_FEATURES:
            fix = (f"This generated avx512 unit runs on every CPU with AVX512 F/BW/VL/DQ, so {flag} may not be "
                   "added (isa-beyond-tier): write the instruction as volatile asm behind a run-time test of "
                   "the CPU, as bf16_dot_insn is behind kBf16, or keep to AVX512 F/BW/VL/DQ.")
        report.error(
            "isa-not-enabled",
            source.rel,
            source.line_of(offset),
            f"{word} needs {feature}, which the cxx-flags of [{section}] do not enable "
            f"(flags: {' '.join(flags) or 'none'}). {fix}",
        )


def check_mixing(report: Report, section: str, flags: tuple[str, ...], units: list[Source], line: int | None, toml_rel: str) -> None:
    """One tier = one ISA level: AVX2 code compiled with AVX512 flags may emit AVX512 (SIGILL on AVX2-only CPUs)."""
    section_level = flags_level(flags)
    levels = {unit.rel: unit_level(unit, flags) for unit in units}
    used = {level for level in levels.values() if level > 0}
    if len(used) > 1:
        described = ", ".join(f"{rel} ({LEVEL_NAMES[level]})" for rel, level in levels.items() if level)
        report.error(
            "mixed-isa",
            toml_rel,
            line,
            f"[{section}] mixes ISA levels: {described}. Give each tier its own [kernel.*] section "
            "with its own cxx-flags so the lower tier is never compiled with the higher tier's flags.",
        )
        return
    if section_level == 2:
        for rel, level in levels.items():
            named_avx2 = re.search(r"avx2(?!\d)", rel.lower()) is not None
            if level == 1 or (named_avx2 and level != 2):
                report.error(
                    "mixed-isa",
                    rel,
                    None,
                    f"{rel} is an AVX2-level unit but [{section}] compiles it with AVX512 flags "
                    f"({' '.join(flags)}); the compiler may then emit AVX512 instructions in the AVX2 tier, "
                    "which crash with SIGILL on CPUs without AVX512. Move it to the AVX2 section.",
                )


@dataclass(frozen=True)
class InsnGuard:
    """An instruction family a generated avx512 unit runs only behind a run-time test of the CPU.

    The unit runs on every CPU with AVX512 F/BW/VL/DQ, so it is built without the
    family's flag and spells those instructions as volatile-asm helpers
    (``<prefix>_*_insn``) called on a line that tests ``guard`` (or a local copy of it,
    ``const bool dot = kVnni;``, which hot loops read once)."""

    guard: str  # the unit's test, e.g. kBf16
    prefix: str  # the helpers' prefix: bf16 -> bf16_*_insn
    feature: str  # the family's feature name in validate.isa
    isa: str  # its name in messages
    lacking: str  # CPUs of the tier without it
    code: str  # the finding's code
    helpers: str  # the unit's helpers, for the message
    other_branch: str  # what the other branch of the test runs

    @property
    def call_re(self) -> re.Pattern[str]:
        return re.compile(rf"\b({self.prefix}_\w+_insn)\s*\(")

    @property
    def definition_re(self) -> re.Pattern[str]:
        return re.compile(rf"^\s*(?:static\s+)?(?:inline\s+)?(?!return\b|else\b)[\w:]+\s+{self.prefix}_\w+_insn\s*\(")

    @property
    def alias_re(self) -> re.Pattern[str]:
        return re.compile(rf"\bconst\s+bool\s+(\w+)\s*=\s*\(?\s*{self.guard}\s*\)?\s*;")


#: The families a generated avx512 unit guards (avx512.cpp.in).
INSN_GUARDS = (
    InsnGuard("kBf16", "bf16", "avx512bf16", "AVX512-BF16", "Skylake-SP to Ice Lake", "bf16-unguarded",
              "bf16_cvt_insn, bf16_cvt2_insn, bf16_dot_insn", "the unit's integer path"),
    InsnGuard("kVnni", "vnni", "avx512vnni", "AVX512-VNNI", "Skylake-SP", "vnni-unguarded",
              "vnni_dot_insn", "vimadd (VPMADDWD + VPADDD)"),
)
_GUARDED_FEATURES = frozenset(g.feature for g in INSN_GUARDS)
_BF16_GUARD_DEF_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+kBf16\b", re.MULTILINE)


def is_bf16_guarded_unit(source: Source) -> bool:
    """A generated avx512 unit (it defines the kBf16 test): it runs on AVX512 CPUs without
    AVX512-BF16 or AVX512-VNNI and guards those instructions (INSN_GUARDS)."""
    return _BF16_GUARD_DEF_RE.search(source.code) is not None


def check_insn_guards(report: Report, source: Source) -> None:
    """In a generated avx512 unit an AVX512-BF16 or AVX512-VNNI instruction runs only behind
    its test (``kBf16``, ``kVnni``).

    The dispatcher runs that unit on every CPU with AVX512 F/BW/VL/DQ; Skylake-SP
    lacks both families and Ice Lake lacks AVX512-BF16. The unit is built without
    their flags and spells the instructions as volatile asm helpers
    (``bf16_*_insn``, ``vnni_*_insn``): an intrinsic behind ``if (kBf16)`` is not
    safe, the compiler may execute it speculatively (GCC 12 did: SIGILL on an Ice
    Lake). So such an intrinsic is an error here, and so is a helper call whose
    line does not test the family's guard (the check reads lines: ``kBf16 ? ... :
    ...`` or ``if (kBf16) return ...;``), or a local copy of it declared as
    ``const bool insn = kBf16;`` (``insn ? ... : ...``). Units that do not define
    ``kBf16`` (not built from our templates) are left to the ordinary ISA check.
    """
    if not is_bf16_guarded_unit(source):
        return
    for guard in INSN_GUARDS:
        _check_guard(report, source, guard)


def _check_guard(report: Report, source: Source, g: InsnGuard) -> None:
    why = f"this avx512 unit also runs on CPUs without {g.isa} ({g.lacking}: SIGILL there)"
    for word, offset, feature, _flag in intrinsic_uses(source.code):
        if feature == g.feature:
            report.error(
                g.code, source.rel, source.line_of(offset),
                f"{word} is an {g.isa} intrinsic, and {why}; an intrinsic is unsafe even behind "
                f"`if ({g.guard})` because the compiler may run it speculatively, so the unit is built "
                f"without -m{g.feature}. Call the unit's volatile-asm helpers instead ({g.helpers}) with "
                f"{g.guard} tested on the same line"
                + (", or its store/to_bf16_2/vsq2_acc helpers, which already do." if g.prefix == "bf16" else "."),
            )
    lines = source.code.splitlines()
    guards = re.compile(r"\b(?:" + "|".join([g.guard, *g.alias_re.findall(source.code)]) + r")\b")
    for match in g.call_re.finditer(source.code):
        number = source.line_of(match.start())
        line = lines[number - 1]
        if guards.search(line) or g.definition_re.match(line):
            continue
        report.error(
            g.code, source.rel, number,
            f"{match.group(1)}(...) runs an {g.isa} instruction, and {why}. Test {g.guard} on the "
            f"same line and give the other branch {g.other_branch}, e.g. "
            f"`{g.guard} ? {match.group(1)}(...) : ...`.",
        )


#: What a generated avx512 unit may be compiled for: the dispatcher's avx512 check
#: (F/BW/VL/DQ, and what they imply) plus AMX, whose intrinsics are volatile asm
#: that runs only behind amx_instructions() (cpu_features.hpp).
_AVX512_TIER_FEATURES = {*AVX512_TIER_FEATURES, "avx512cd", "avx2", "avx", "fma", "f16c", "sse",
                         "amx-tile", "amx-bf16", "amx-int8"}


def check_avx512_tier_flags(report: Report, section: str, flags: tuple[str, ...], units: list[Source],
                            line: int | None) -> None:
    """A generated avx512 unit runs on every CPU with AVX512 F/BW/VL/DQ, so its flags may
    enable nothing beyond that: with -mavx512bf16, -mavx512vbmi or -march=native the
    compiler may emit those instructions anywhere in the unit (SIGILL on Skylake-SP)."""
    if not any(is_bf16_guarded_unit(unit) for unit in units):
        return
    extra = sorted(enabled_features(flags) - _AVX512_TIER_FEATURES)
    if extra:
        report.error(
            "isa-beyond-tier", "build.toml", line,
            f"[{section}] enables {', '.join(extra)} for a generated avx512 unit, which the dispatcher runs "
            "on every CPU with AVX512 F/BW/VL/DQ (Skylake-SP to Ice Lake lack them): the compiler may then "
            "use those instructions anywhere in the unit. Keep the cxx-flags to -mavx512f -mavx512bw "
            "-mavx512vl -mavx512dq (plus -mamx-* for GEMM); an instruction beyond them goes in volatile asm "
            "behind a run-time test, as bf16_dot_insn does behind kBf16.",
        )


def check_torch_in_tier(report: Report, source: Source, section: str) -> None:
    for header, number in source.includes():
        if _TORCH_HEADER_RE.match(header):
            report.warning(
                "torch-in-tier",
                source.rel,
                number,
                f"#include <{header}> in a SIMD tier unit of [{section}]: torch headers make this unit take "
                "10+ s instead of ~1 s to recompile. Pass raw pointers and sizes from the bridge instead.",
            )


def _aligned_names(code: str) -> set[str]:
    names = {m.group(1) for m in _ALIGNED_DECL_RE.finditer(code)}
    names |= {m.group(1) for m in _ASSUME_RE.finditer(code)}
    names |= {m.group(1) for m in _ASSUME_ARG_RE.finditer(code)}
    return names


def _pointer_base(code: str, start: int) -> str | None:
    """The identifier at the start of the first argument of the call that opens at ``start``."""
    match = re.match(r"\s*\(?\s*(?:\(\s*[\w:\s*<>]+\)\s*)?(?:reinterpret_cast<[^>]*>\s*\(\s*)?&?\s*(\w+)", code[start:])
    return match.group(1) if match else None


def check_aligned_access(report: Report, source: Source) -> None:
    aligned = _aligned_names(source.code)
    for match in _ALIGNED_RE.finditer(source.code):
        base = _pointer_base(source.code, match.end())
        if base is not None and base in aligned:
            continue
        report.warning(
            "aligned-access",
            source.rel,
            source.line_of(match.start()),
            f"{match.group(1)} requires a {64 if '512' in match.group(1) else 32}-byte aligned address but "
            f"{base or 'the pointer'} is not known to be aligned (tensor storage and row offsets often are not); "
            "use the unaligned loadu/storeu form, or declare the buffer alignas(64) / __builtin_assume_aligned.",
        )


def _has_tail(code: str) -> bool:
    """Masked loads/stores, or a scalar loop that continues where a vector loop stopped."""
    if _MASK_TAIL_RE.search(code) or _WHILE_TAIL_RE.search(code):
        return True
    for loop in _FOR_RE.finditer(code):
        init, _, step = loop.groups()
        scalar_step = re.search(r"\+\+|\+=\s*1\b", step) is not None
        if scalar_step and not _ZERO_INIT_RE.match(init):
            return True  # e.g. for (; i < n; ++i) or for (j = full; j < n; ++j)
    return False


def check_tail(report: Report, source: Source) -> None:
    loops = [m for m in _FOR_RE.finditer(source.code) if re.search(r"\+=\s*(?!1\b)\S", m.group(3))]
    if not loops or not intrinsic_uses(source.code) or _has_tail(source.code):
        return
    report.warning(
        "no-tail-handling",
        source.rel,
        source.line_of(loops[0].start()),
        "this SIMD loop steps by a vector width but no tail handling was seen (no masked load/store, "
        "no remainder loop): sizes that are not a multiple of the vector width read and write out of bounds. "
        "Handle the last n % width elements with a mask (__mmask16) or a scalar loop.",
    )


def check_threshold(report: Report, source: Source) -> None:
    if _THRESHOLD_RE.search(source.code):
        return
    report.warning(
        "no-size-threshold",
        source.rel,
        None,
        "the dispatcher has no small-size threshold: on tiny inputs the SIMD tier plus OpenMP start-up is "
        "slower than ATen, so compare the number of rows/elements with a constant (e.g. kMinRowsForSimd) "
        "and call the generic tier below it.",
    )
