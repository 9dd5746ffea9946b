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
of them.

The builder embeds the hashes it compiled into the build variant
(``tier_units.json``, :func:`built_units_json`; covered by the variant's
kernels-data digest and shipped in the wheel), so evidence of an installed
package, or of a kernel directory whose sources are gone, still names the
units that ran (:func:`.resolve.resolve_units`). When both the sources and the build's
record are at hand they must agree; a tier whose unit differs is a stale
build (the sources changed after the build), and evidence records the
build's hash — the code that actually ran — and says so.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..buildtoml import KernelSection, load_build_toml

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


# --------------------------------------------------------------------------- the build's record

#: The file the builder writes into every build variant (and so into the wheel).
BUILT_UNITS_FILE = "tier_units.json"
BUILT_UNITS_SCHEMA = 1
HASH_RULE = ("sha256 over the build.toml section name, its cxx-flags, the bytes of its src files and of "
             "every header any CPU section lists (kernel_harness.portability.units.unit_hash)")


def built_units_json(kernel_dir: Path, build_id: str) -> str:
    """The ``tier_units.json`` the builder puts in a variant: each tier's unit hash at build time.

    ``build_id`` is the extension name (metadata.json's ``id``), so a record can
    be matched with the build that was loaded.
    """
    payload = {"schema_version": BUILT_UNITS_SCHEMA, "id": build_id, "hash_rule": HASH_RULE,
               "tiers": [u.to_dict() for u in declared_units(Path(kernel_dir))]}
    return json.dumps(payload, indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class BuiltUnits:
    """A variant's ``tier_units.json``: the units its build compiled."""

    variant: Path
    build_id: str | None
    units: list[TierUnit]


def read_built_units(variant: Path) -> BuiltUnits | None:
    """The record in ``variant`` (None when absent: a build made before it existed, or by
    another builder); ``ValueError`` naming the file when it is unreadable."""
    path = Path(variant) / BUILT_UNITS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        units = [TierUnit(tier=str(t["tier"]), section=str(t["section"]), files=tuple(map(str, t["files"])),
                          source_hash=str(t["source_hash"])) for t in data["tiers"]]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a tier unit record this harness wrote ({exc}); rebuild the kernel "
                         "(scripts/build_kernel.py) to rewrite it") from exc
    build_id = data.get("id") if isinstance(data.get("id"), str) else None
    return BuiltUnits(variant=Path(variant), build_id=build_id,
                      units=sorted(units, key=lambda u: (_order(u.tier), u.section)))


def _order(tier: str) -> int:
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)
