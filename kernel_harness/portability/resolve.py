"""Which tier units a ``--kernel-package`` spec stands for, and where their hashes come from.

The spec is a kernel directory or an installed package name (the loader's
rule). Evidence records the units of the build that *ran*: its own record,
``tier_units.json`` (:mod:`.units`), when there is one; otherwise the
sources' hashes. With both at hand they must agree; where they do not, the
build is stale and :class:`KnownUnits` says which tier and how.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HarnessError
from .units import BUILT_UNITS_FILE, BuiltUnits, TierUnit, declared_units, kernel_dir_of, read_built_units


def _variant_id(variant: Path) -> str | None:
    try:
        value = json.loads((variant / "metadata.json").read_text(encoding="utf-8")).get("id")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _torch_variant() -> str | None:
    try:
        from ..build.toolchain import torch_info

        return torch_info().variant
    except Exception:  # noqa: BLE001 - no torch here: then the variant cannot be chosen by name
        return None


def variant_of_directory(directory: Path, build_module: str | None = None) -> Path | None:
    """The build variant of a kernel directory the loader uses: the one whose metadata id is
    the loaded ``build_module`` when known, else the one named for this torch, else the only one."""
    build = Path(directory) / "build"
    variants = sorted(p for p in build.glob("torch*") if (p / "metadata.json").is_file()) if build.is_dir() else []
    if build_module:
        return next((v for v in variants if _variant_id(v) == build_module), None)
    if len(variants) == 1:
        return variants[0]
    name = _torch_variant()
    return next((v for v in variants if v.name == name), None)


def installed_package_dir(spec: str) -> Path | None:
    """Where an installed package lives (found, not imported: finding the top-level package
    runs none of its code)."""
    top = spec.split(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    locations = list(getattr(found, "submodule_search_locations", None) or []) if found else []
    return Path(locations[0]) if locations else None


# --------------------------------------------------------------------------- resolving a spec


@dataclass
class KnownUnits:
    """The tier units behind a ``--kernel-package`` spec, and where their hashes come from.

    ``units`` is what evidence records: the build's record when there is one
    (the code that ran), else the sources' hashes, else None (``reason`` says
    why). ``origin`` is ``"build"``, ``"sources"`` or None; ``stale`` names each
    tier whose built unit differs from the sources' now; ``notes`` explain the rest.
    """

    units: list[TierUnit] | None
    origin: str | None
    reason: str | None = None
    stale: dict[str, str] = field(default_factory=dict)  # tier -> how its built unit differs
    notes: list[str] = field(default_factory=list)
    variant: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"origin": self.origin, "reason": self.reason, "stale": dict(self.stale),
                "notes": list(self.notes), "variant": str(self.variant) if self.variant else None}


def _sources_present(directory: Path, units: list[TierUnit]) -> bool:
    return all((directory / rel).is_file() for u in units for rel in u.files)


def _stale_tiers(built: list[TierUnit], sources: list[TierUnit], variant: Path) -> dict[str, str]:
    """Tier -> how the built unit differs from the sources' (empty when they agree)."""
    now = {u.section: u for u in sources}
    out: dict[str, str] = {}
    for unit in built:
        current = now.get(unit.section)
        if current is None:
            out[unit.tier] = f"section kernel.{unit.section} is no longer in build.toml"
        elif current.source_hash != unit.source_hash:
            out[unit.tier] = (f"the build in {variant.name} compiled unit {unit.source_hash[:12]}, the sources "
                              f"now hash to {current.source_hash[:12]} ({', '.join(current.files)} or a shared "
                              "header changed after the build)")
    built_sections = {u.section for u in built}
    for u in sources:
        if u.section not in built_sections:
            out.setdefault(u.tier, f"section kernel.{u.section} was added to build.toml after the build")
    return out


def _from_build(variant: Path | None, build_module: str | None) -> tuple[BuiltUnits | None, str | None]:
    """The variant's record, or None and why."""
    if variant is None:
        return None, "no build variant of it was found"
    try:
        record = read_built_units(variant)
    except ValueError as exc:
        return None, str(exc)
    if record is None:
        return None, (f"its build {variant} records no unit hashes ({BUILT_UNITS_FILE} is missing: built "
                      "before the harness wrote it, or by another builder); rebuild it with scripts/build_kernel.py")
    if build_module and record.build_id and record.build_id != build_module:
        return None, (f"{variant / BUILT_UNITS_FILE} describes build {record.build_id}, but {build_module} "
                      "was loaded")
    return record, None


def resolve_units(spec: str, build_module: str | None = None) -> KnownUnits:
    """The tier units behind ``spec`` (a kernel directory or an installed package name).

    ``build_module`` is the loaded build's op namespace (the benchmark's
    ``kernel_build.module``), which picks the variant that actually ran.
    """
    directory = kernel_dir_of(spec)
    if directory is None:
        package = installed_package_dir(spec)
        record, why = _from_build(package, build_module)
        if record is None:
            where = f"installed at {package}" if package else "not found as an installed package"
            return KnownUnits(None, None, reason=(
                f"{spec} is an installed package ({where}) without its sources, and {why}, so its declared "
                "tiers and unit hashes are unknown; rebuild and reinstall it, or pass the kernel directory"))
        return KnownUnits(record.units, "build", variant=package, notes=[
            f"unit hashes from the build's {BUILT_UNITS_FILE} (installed package, no sources here)"])
    try:
        sources = declared_units(directory)
    except HarnessError as exc:
        return KnownUnits(None, None, reason=f"{directory}/build.toml could not be read: {exc.message}")
    variant = variant_of_directory(directory, build_module)
    record, why = _from_build(variant, build_module)
    have_sources = _sources_present(directory, sources)
    if record is None:
        if have_sources:
            return KnownUnits(sources, "sources", variant=variant, notes=[
                f"unit hashes from the sources: {why}, so the build could not be checked against them"])
        return KnownUnits(None, None, variant=variant, reason=(
            f"{directory} lacks sources build.toml lists and {why}, so the unit hashes are unknown"))
    if not have_sources:
        return KnownUnits(record.units, "build", variant=variant, notes=[
            f"unit hashes from the build's {BUILT_UNITS_FILE}: sources build.toml lists are not in {directory}"])
    stale = _stale_tiers(record.units, sources, record.variant)
    notes = []
    if stale:
        notes.append("stale build: the sources changed after the build that ran, so the evidence is for the "
                     "built units (their hashes are recorded), not for the sources as they are now: "
                     + "; ".join(f"{t}: {m}" for t, m in stale.items()) + ". Rebuild (scripts/build_kernel.py) and rerun to verify the sources.")
    return KnownUnits(record.units, "build", stale=stale, notes=notes, variant=record.variant)


def units_for_spec(spec: str, build_module: str | None = None) -> tuple[list[TierUnit] | None, str | None]:
    """``(units, None)`` when the units behind ``spec`` are known, ``(None, reason)`` otherwise
    (:func:`resolve_units` says where they come from)."""
    known = resolve_units(spec, build_module)
    return known.units, known.reason
