"""Which ISA extensions a unit's flags enable and which its intrinsics need.

Compiling an intrinsic without its ``-m`` flag fails with GCC's cryptic
"inlining failed in call to 'always_inline' ... target specific option
mismatch"; the worse failure is silent: an AVX2 tier compiled with AVX512
flags may be auto-vectorised with AVX512 instructions and die with SIGILL on a
CPU without AVX512.  Both are caught here from the text, before compiling.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: Features a GCC ``-m`` flag turns on, including what it implies (GCC's own
#: implication chains, reduced to the features the checks below use).
_AVX512_BASE = {"avx512f", "avx2", "avx", "fma", "f16c", "sse"}
FLAG_FEATURES: dict[str, set[str]] = {
    "-mavx": {"avx", "sse"},
    "-mavx2": {"avx2", "avx", "sse"},
    "-mfma": {"fma", "avx", "sse"},
    "-mf16c": {"f16c", "avx", "sse"},
    "-mavx512f": set(_AVX512_BASE),
    "-mavx512bw": _AVX512_BASE | {"avx512bw"},
    "-mavx512vl": _AVX512_BASE | {"avx512vl"},
    "-mavx512dq": _AVX512_BASE | {"avx512dq"},
    "-mavx512cd": _AVX512_BASE | {"avx512cd"},
    "-mavx512bf16": _AVX512_BASE | {"avx512bw", "avx512bf16"},
    "-mavx512fp16": _AVX512_BASE | {"avx512bw", "avx512vl", "avx512dq", "avx512fp16"},
    "-mavx512vbmi": _AVX512_BASE | {"avx512bw", "avx512vbmi"},
    "-mavx512vnni": _AVX512_BASE | {"avx512vnni"},
    "-mamx-tile": {"amx-tile"},
    "-mamx-bf16": {"amx-tile", "amx-bf16"},
    "-mamx-int8": {"amx-tile", "amx-int8"},
}
_MARCH_ALL = set().union(*FLAG_FEATURES.values())
_NO_FLAG = re.compile(r"^-mno-(.*)$")

#: (regex, feature, flag to add) in the order they are tried; the first
#: pattern that matches an intrinsic name decides its feature.
_INTRINSIC_RULES: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"^_tile_dpbf16ps$"), "amx-bf16", "-mamx-bf16"),
    (re.compile(r"^_tile_dpb[su][su]d$"), "amx-int8", "-mamx-int8"),
    (re.compile(r"^_tile_"), "amx-tile", "-mamx-tile"),
    (re.compile(r"(cvtne2?ps_pbh|dpbf16_ps|cvtpbh_ps|cvtsbh_ss|cvtness_sbh)"), "avx512bf16", "-mavx512bf16"),
    (re.compile(r"^_mm(256)?_cvt(ph_ps|ps_ph)$|^_cvtsh_ss$|^_cvtss_sh$"), "f16c", "-mf16c"),
    (re.compile(r"^_mm(256|512)?_(?!cvtps_ph$)\w+_(ph|sh|pch)$"), "avx512fp16", "-mavx512fp16"),
    (re.compile(r"^_mm512_.*(dpbusds?|dpwssds?)_epi32$"), "avx512vnni", "-mavx512vnni"),
    (re.compile(r"^_mm512_.*(permutexvar|permutex2var|multishift)_epi8$"), "avx512vbmi", "-mavx512vbmi"),
    (re.compile(r"^_mm512_(?!set)\w*_(epi8|epu8|epi16|epu16)$|^_mm512_(cvtepi16_epi8|cvtepi8_epi16|cvtepu8_epi16|packs|packus|movm_epi8|movm_epi16|movepi8_mask|movepi16_mask)"), "avx512bw", "-mavx512bw"),
    (re.compile(r"^_mm512_.*(_pd_ps|cvt(t)?p[sd]_epi64|cvt(t)?p[sd]_epu64|cvtepi64_p[sd]|cvtepu64_p[sd]|_mullo_epi64|(and|andnot|or|xor)_p[sd]|fpclass|range_p|reduce_p|extractf32x8|extracti32x8|insertf32x8|inserti32x8|movepi32_mask|movm_epi32)"), "avx512dq", "-mavx512dq"),
    (re.compile(r"^_mm(256)?_(mask|maskz)_|^_mm(256)?_.*_mask$|^_mm(256)?_(cmp|test|testn)_.*_mask|^_mm256_cvtepi32_epi16|^_mm256_rcp14|^_mm256_rsqrt14"), "avx512vl", "-mavx512vl"),
    (re.compile(r"^_mm512_|^_cvtu32_mask|^_cvtmask|^_kand|^_kor|^_knot|^_kxor|^_load_mask|^_store_mask"), "avx512f", "-mavx512f"),
    (re.compile(r"^_mm(256)?_f(n)?m(add|sub|addsub|subadd)_"), "fma", "-mfma"),
    (re.compile(r"^_mm256_.*_(epi8|epi16|epi32|epi64|epu8|epu16|epu32|si256)$|^_mm256_(i32|i64)gather|^_mm256_(permutevar8x32|permute4x64|broadcastsi128|maskload_epi|maskstore_epi|sllv|srlv|srav|cvtepi|cvtepu)"), "avx2", "-mavx2"),
    (re.compile(r"^_mm256_"), "avx", "-mavx2"),
]
_VECTOR_TYPE_RULES: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"^__m512(i|d|h|bh)?$|^__mmask(8|16|32|64)$"), "avx512f", "-mavx512f"),
    (re.compile(r"^__m256bh$"), "avx512bf16", "-mavx512bf16"),
]

_WORD_RE = re.compile(r"\b(_mm(?:256|512)?_\w+|_tile_\w+|_cvt\w+|_k(?:and|or|not|xor)\w*|_load_mask\w*|_store_mask\w*|__m512\w*|__m256bh|__mmask\d+)\b")

#: For deciding which *tier* a unit is written for (used by the mixing check).
LEVEL_OF_FEATURE = {
    "avx": 1,
    "avx2": 1,
    "fma": 1,
    "f16c": 1,
    "avx512f": 2,
    "avx512bw": 2,
    "avx512vl": 2,
    "avx512dq": 2,
    "avx512bf16": 2,
    "avx512fp16": 2,
    "avx512vbmi": 2,
    "avx512vnni": 2,
    "amx-tile": 2,
    "amx-bf16": 2,
    "amx-int8": 2,
}
LEVEL_NAMES = {0: "generic", 1: "avx2", 2: "avx512"}


def enabled_features(flags: Iterable[str]) -> set[str]:
    enabled: set[str] = set()
    for flag in flags:
        if flag == "-march=native":
            enabled |= _MARCH_ALL
        elif flag.startswith("-march=") and any(s in flag for s in ("sapphirerapids", "icelake", "skylake-avx512", "cascadelake", "cooperlake", "tigerlake", "graniterapids", "znver4", "znver5")):
            enabled |= _MARCH_ALL
        elif flag.startswith("-march=") and any(s in flag for s in ("haswell", "broadwell", "skylake", "znver", "x86-64-v3", "alderlake")):
            enabled |= FLAG_FEATURES["-mavx2"] | FLAG_FEATURES["-mfma"] | FLAG_FEATURES["-mf16c"]
        elif flag.startswith("-march=x86-64-v4"):
            enabled |= FLAG_FEATURES["-mavx512bw"] | FLAG_FEATURES["-mavx512vl"] | FLAG_FEATURES["-mavx512dq"]
        elif flag in FLAG_FEATURES:
            enabled |= FLAG_FEATURES[flag]
    for flag in flags:
        no = _NO_FLAG.match(flag)
        if no:
            enabled.discard(no.group(1))
    return enabled


def flags_level(flags: Iterable[str]) -> int:
    return max((LEVEL_OF_FEATURE.get(f, 0) for f in enabled_features(flags)), default=0)


def is_simd_section(flags: Iterable[str]) -> bool:
    """A section is a SIMD tier when its flags enable any vector ISA extension."""
    return flags_level(flags) > 0


def feature_of(word: str) -> tuple[str, str] | None:
    """``(feature, flag)`` an intrinsic or vector type needs, or None if not an ISA intrinsic."""
    for pattern, feature, flag in _VECTOR_TYPE_RULES:
        if pattern.match(word):
            return feature, flag
    if word.startswith("__m"):
        return None
    for pattern, feature, flag in _INTRINSIC_RULES:
        if pattern.search(word):
            # _mm_* (SSE/128-bit) names only need a feature when a rule above names one
            return feature, flag
    return None


def intrinsic_uses(code: str) -> list[tuple[str, int, str, str]]:
    """``(word, offset, feature, flag)`` for every ISA intrinsic or vector type in ``code``."""
    uses = []
    for match in _WORD_RE.finditer(code):
        word = match.group(1)
        if word.startswith("_mm_") and not re.search(r"_(mask|maskz)_|_f(n)?m(add|sub)|cvt(ph_ps|ps_ph)|dpbf16|cvtne", word):
            continue  # plain SSE: baseline on x86-64
        found = feature_of(word)
        if found:
            uses.append((word, match.start(), found[0], found[1]))
    return uses


#: GCC's feature-test macros: defined exactly when the unit's flags enable the
#: feature, so code under ``#if defined(__AMX_TILE__)`` is compiled only there.
ISA_MACROS: dict[str, str] = {
    "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma", "__F16C__": "f16c",
    "__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw", "__AVX512VL__": "avx512vl",
    "__AVX512DQ__": "avx512dq", "__AVX512CD__": "avx512cd", "__AVX512BF16__": "avx512bf16",
    "__AVX512FP16__": "avx512fp16", "__AVX512VBMI__": "avx512vbmi", "__AVX512VNNI__": "avx512vnni",
    "__AMX_TILE__": "amx-tile", "__AMX_BF16__": "amx-bf16", "__AMX_INT8__": "amx-int8",
}
_DIRECTIVE_RE = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")
_DEFINED_RE = re.compile(r"^!?\s*defined\s*\(?\s*(\w+)\s*\)?$")


def _isa_condition(kind: str, condition: str, enabled: set[str]) -> bool | None:
    """The value of a preprocessor condition made only of ISA macro tests, or None
    when it tests anything else (then both branches count as compiled)."""
    condition = condition.split("//")[0].strip()
    if kind in ("ifdef", "ifndef"):
        feature = ISA_MACROS.get(condition)
        return None if feature is None else (feature in enabled) == (kind == "ifdef")
    terms = [term.strip() for term in condition.split("&&")]
    values = []
    for term in terms:
        match = _DEFINED_RE.match(term)
        if match is None or match.group(1) not in ISA_MACROS:
            return None
        value = ISA_MACROS[match.group(1)] in enabled
        values.append(not value if term.startswith("!") else value)
    return all(values)


def compiled_code(code: str, flags: Iterable[str]) -> str:
    """``code`` with the lines a compiler given ``flags`` skips blanked (same offsets):
    regions under ``#if defined(__AMX_TILE__) && ...``, ``#ifdef __AVX512F__`` and the
    like whose ISA macros these flags do not define. Other conditions are kept whole."""
    enabled = enabled_features(flags)
    stack: list[tuple[bool, bool | None]] = []  # (enclosing region compiled, this branch's value)
    out = []
    for line in code.splitlines(keepends=True):
        compiled = all(outer and value is not False for outer, value in stack)
        match = _DIRECTIVE_RE.match(line)
        if match:
            kind, rest = match.group(1), match.group(2)
            if kind in ("if", "ifdef", "ifndef"):
                stack.append((compiled, _isa_condition(kind, rest, enabled)))
            elif kind == "else" and stack:
                outer, value = stack[-1]
                stack[-1] = (outer, None if value is None else not value)
            elif kind == "elif" and stack:
                stack[-1] = (stack[-1][0], None)
            elif kind == "endif" and stack:
                stack.pop()
            out.append(line)
            continue
        out.append(line if compiled else "".join(c if c == "\n" else " " for c in line))
    return "".join(out)
