"""What the built library holds: prefetch instructions per tier namespace, and calls per function.

A prefetch knob changes timings only if the compiler kept the prefetch. GCC 12
at -O2/-O3 deletes calls to a function whose only effect is
``__builtin_prefetch`` in a loop: it finds it "looping const", assumes the
loop ends (C++'s -ffinite-loops) and drops the call as having no effect. This
project's units ran without any prefetch for two days while their knobs were
timed. The build therefore reports the count for every tier, so two trials of
a prefetch knob that hold the same count are known to have tested nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

#: Tier namespaces as they appear in mangled names (``<ns>_cpu::avx2::f`` ->
#: ``...4avx2...``); functions outside them count as "other" (bridge, generic).
_TIER_MARKERS = (("avx512", "6avx512"), ("avx2", "4avx2"))


def _tier_of(symbol_line: str) -> str:
    return next((tier for tier, marker in _TIER_MARKERS if marker in symbol_line), "other")


def prefetch_counts(library: Path, mnemonic: str = "prefetch") -> dict[str, int] | None:
    """Prefetch instructions in ``library`` by tier namespace ("avx2", "avx512",
    "other"); None when objdump (binutils) is not installed or cannot read it.
    ``mnemonic`` narrows the count to one kind (``"prefetchnta"``: the
    non-temporal hints only; the default counts every prefetch)."""
    listing = _disassembly(library)
    if listing is None:
        return None
    counts = {"avx2": 0, "avx512": 0, "other": 0}
    tier = "other"
    for line in listing.splitlines():
        if line.endswith(">:"):  # a function's first line, with its mangled name
            tier = _tier_of(line)
        elif f"\t{mnemonic}" in line:
            counts[tier] += 1
    return counts


def _disassembly(library: Path, demangle: bool = False) -> str | None:
    """objdump's listing of ``library``; None when binutils is missing or cannot read it."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    try:
        return subprocess.run([objdump, "-d", "--no-show-raw-insn", *(["-C"] if demangle else []), str(library)],
                              check=True, capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def calls_by_function(library: Path, name_part: str) -> dict[str, set[str]] | None:
    """The functions each function of ``library`` whose demangled name contains
    ``name_part`` calls (``memcpy@plt``, ``omp_get_thread_num@plt``, ...); None
    without objdump. A library call inside a vector loop costs more than the
    call: GCC spills the live vector registers around it (see load_wide_tail in
    the avx512 unit), so tests use this to keep such calls out of hot bodies."""
    listing = _disassembly(library, demangle=True)
    if listing is None:
        return None
    calls: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in listing.splitlines():
        if line.endswith(">:"):
            name = line[line.index("<") + 1:-2]
            current = calls.setdefault(name, set()) if name_part in name else None
        elif current is not None and "\tcall" in line and "<" in line:
            current.add(line[line.rindex("<") + 1:line.rindex(">")])
    return calls


def cached_prefetch_counts(library: Path, cache: Path) -> dict[str, int] | None:
    """``prefetch_counts(library)``, read from ``cache`` while the library's size and
    modification time are those the cache recorded: a no-op rebuild (nothing relinked)
    then costs no objdump run (0.3-0.8 s here), which ``bench_build.py`` would otherwise
    time as part of every build. An unreadable or stale cache is simply recomputed."""
    try:
        stat = library.stat()
    except OSError:
        return None
    key = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        recorded = json.loads(cache.read_text(encoding="utf-8"))
        if recorded.get("library") == key and isinstance(recorded.get("counts"), dict):
            return recorded["counts"]
    except (OSError, ValueError, AttributeError):
        pass
    counts = prefetch_counts(library)
    if counts is not None:
        try:
            cache.write_text(json.dumps({"library": key, "counts": counts}), encoding="utf-8")
        except OSError:
            pass  # a cache we cannot write is only a slower next build
    return counts
