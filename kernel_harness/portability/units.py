"""The tiers a kernel declares and the content hash of each tier's unit.

A tier is one ``[kernel.<section>]`` table of ``build.toml``; its ISA is read
from the section's ``-m`` flags (the same rule as the publisher and the
validator: any ``-mamx*`` flag is ``amx``, any ``-mavx512*`` is ``avx512``,
``-mavx2`` is ``avx2``, none is ``generic``).

The unit hash (:func:`unit_hash`) is what "the code of this tier at the time"
means for evidence: sha256 over the section's name and ``cxx-flags``, the
bytes of every file its ``src`` lists, and the bytes of every header
(``.h``/``.hpp``) listed by *any* CPU section. Headers count for every tier
because they are shared (``<name>_tiers.hpp`` holds the SIMD helpers both the
AVX2 and the AVX512 unit include): an edit there changes code that each tier
compiles, so it must invalidate every tier's evidence. This is conservative on
purpose — a header edit that only matters to one tier asks for evidence of all
of them — and needs nothing from the build: an installed package without its
sources has no unit hashes (``source_hash`` is null and the evidence says why).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ..buildtoml import KernelSection, load_build_toml
from ..errors import HarnessError

#: Dispatcher tiers, slowest first (the order ``available_tiers()`` uses); amx
#: sections are listed after them.
TIER_ORDER: tuple[str, ...] = ("generic", "avx2", "avx512", "amx")
HEADER_SUFFIXES = (".h", ".hpp", ".hh", ".hxx", ".inc")
#: The generated tier switches (tiers.hpp): which tiers exist, not what one computes.
TIER_SWITCH = re.compile(rb"^[ \t]*#define[ \t]+KERNEL_HAVE_(AVX2|AVX512)[ \t]+[01][ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class TierUnit:
    """One declared tier: its build.toml section, its source files and their hash."""

    tier: str
    section: str
    files: tuple[str, ...]  # the section's src, relative to the kernel directory
    source_hash: str  # sha256 hex of the unit (see module docstring)

    def to_dict(self) -> dict[str, object]:
        return {"tier": self.tier, "section": self.section, "files": list(self.files),
                "source_hash": self.source_hash}


def tier_of_flags(cxx_flags: tuple[str, ...] | list[str]) -> str:
    """The ISA tier a section compiles for, from its ``-m`` flags."""
    flags = [f[2:] for f in cxx_flags if isinstance(f, str) and f.startswith("-m")]
    if any(f.startswith("amx") for f in flags):
        return "amx"
    if any(f.startswith("avx512") for f in flags):
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "generic"


def _file_bytes(root: Path, rel: str) -> bytes:
    path = root / rel
    try:
        return TIER_SWITCH.sub(rb"#define KERNEL_HAVE_\1 <switch>", path.read_bytes())
    except OSError:
        # a listed file that is missing hashes as "missing": the build fails
        # anyway, and the hash still differs from any real content
        return b"\0missing\0"


def _shared_headers(sections: tuple[KernelSection, ...]) -> list[str]:
    return sorted({f for s in sections for f in s.src if f.endswith(HEADER_SUFFIXES)})


def unit_hash(root: Path, section: KernelSection, shared_headers: list[str]) -> str:
    """sha256 of one tier's unit: section name, flags, its sources and the shared headers."""
    digest = hashlib.sha256()
    digest.update(b"section\0" + section.key.encode() + b"\0")
    digest.update(b"flags\0" + "\0".join(section.cxx_flags).encode() + b"\0")
    for rel in sorted(set(section.src) | set(shared_headers)):
        digest.update(b"file\0" + rel.encode() + b"\0" + _file_bytes(root, rel) + b"\0")
    return digest.hexdigest()


def declared_units(kernel_dir: Path) -> list[TierUnit]:
    """The CPU tiers ``kernel_dir/build.toml`` declares, slowest first, with unit hashes."""
    toml = load_build_toml(Path(kernel_dir) / "build.toml")
    sections = toml.cpu_kernels
    headers = _shared_headers(sections)
    units = [TierUnit(tier=tier_of_flags(s.cxx_flags), section=s.key, files=tuple(s.src),
                      source_hash=unit_hash(toml.root, s, headers)) for s in sections]
    return sorted(units, key=lambda u: (TIER_ORDER.index(u.tier), u.section))


def kernel_dir_of(spec: str) -> Path | None:
    """The kernel directory behind a ``--kernel-package`` spec, or None for an installed package.

    A kernel directory is recognised the way the loader recognises it (a path
    holding build.toml); a finalized ``output/`` directory holds one too.
    """
    path = Path(spec)
    if (path / "build.toml").is_file():
        return path.resolve()
    return None


def units_for_spec(spec: str) -> tuple[list[TierUnit] | None, str | None]:
    """``(units, None)`` for a kernel directory, ``(None, reason)`` when they cannot be known."""
    directory = kernel_dir_of(spec)
    if directory is None:
        return None, (f"{spec} is an installed package: its sources (build.toml) are not "
                      "here, so its declared tiers and unit hashes are unknown; pass the "
                      "kernel directory to record them")
    try:
        return declared_units(directory), None
    except HarnessError as exc:
        return None, f"{directory}/build.toml could not be read: {exc.message}"
