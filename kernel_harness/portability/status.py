"""What the evidence says about each declared tier's current unit (issue 24).

Shared by ``publish.py``'s guard (:mod:`kernel_harness.publish.tier_guard`) and
``trial_manager.py finalize``'s tier table. A tier is *verified* when some
evidence entry executed that tier on a unit with the current source hash
(:mod:`.units`) and was correct: here (this CPU, natively), on another machine,
or under emulation (:mod:`.emulate`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..validate.source_checks import INSN_GUARDS
from .evidence import dispatched_as, host_cpu, ran_bf16_instructions
from .units import TierUnit, declared_units

VERIFIED_HERE = "verified here"
VERIFIED_ELSEWHERE = "verified on another machine"
VERIFIED_EMULATED = "verified (emulated)"
FAILED = "failed its correctness check"
NEVER = "never executed since its unit last changed"
_VERIFIED = (VERIFIED_HERE, VERIFIED_ELSEWHERE, VERIFIED_EMULATED)


@dataclass
class TierStatus:
    """One declared tier and what the evidence says about its current unit."""

    unit: TierUnit
    status: str
    machines: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def verified(self) -> bool:
        return self.status in _VERIFIED

    def to_dict(self) -> dict[str, Any]:
        return {"tier": self.unit.tier, "section": self.unit.section, "files": list(self.unit.files),
                "source_hash": self.unit.source_hash, "status": self.status, "verified": self.verified,
                "machines": self.machines, "note": self.note}


# --------------------------------------------------------------------------- evidence


def evidence_in(data: Any) -> list[dict[str, Any]]:
    """Every tier evidence entry in a benchmark JSON, a check_portability JSON or a summary.json."""
    found: list[dict[str, Any]] = []
    if not isinstance(data, dict):
        return found
    entries = data.get("tier_evidence")
    if isinstance(entries, list):
        found += [e for e in entries if isinstance(e, dict)]
    for trial in data.get("trials") or []:
        if not isinstance(trial, dict):
            continue
        for result in [trial.get("result"), *(trial.get("superseded_results") or [])]:
            if isinstance(result, dict):
                found += evidence_in(result.get("details"))
    return found


def evidence_from_files(paths: list[Path]) -> list[dict[str, Any]]:
    """``--tier-evidence FILE``: each must be a readable JSON report holding tier evidence."""
    found: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"--tier-evidence {path} could not be read as JSON: {exc}. Pass the file "
                             "benchmark_cpu.py --json or check_portability.py --json wrote.") from exc
        entries = evidence_in(data)
        if not entries:
            raise UsageError(f"--tier-evidence {path} holds no tier_evidence. Pass a JSON written by "
                             "benchmark_cpu.py --json or check_portability.py --json of this harness.")
        found += entries
    return found


def tier_statuses(kernel_dir: Path, evidence: list[dict[str, Any]], *, here: str | None = None) -> list[TierStatus]:
    """What the evidence says about each declared tier's *current* unit."""
    here = here or host_cpu()
    statuses = []
    for unit in declared_units(kernel_dir):
        mine = [e for e in evidence if e.get("tier") == unit.tier and e.get("executed")]
        current = [e for e in mine if e.get("source_hash") == unit.source_hash]
        passed = [e for e in current if e.get("correct") is True]
        machines = sorted({str(e.get("cpu")) for e in passed})
        if any(e.get("cpu") == here and not e.get("emulated") for e in passed):
            status = VERIFIED_HERE
        elif any(not e.get("emulated") for e in passed):
            status = VERIFIED_ELSEWHERE
        elif passed:
            status = VERIFIED_EMULATED
        elif current:
            status = FAILED
            machines = sorted({str(e.get("cpu")) for e in current})
        else:
            status = NEVER
        notes = []
        if unit.tier == "avx512" and passed and not any(ran_bf16_instructions(e) for e in passed):
            notes.append("its AVX512-BF16 branches (kBf16) have not run: no machine above has AVX512-BF16 "
                         "(Cooper Lake, Sapphire Rapids, Zen 4 do); its integer bf16 paths did")
        if (dispatched_as(unit.tier) == "avx512" and passed and _calls_vnni(kernel_dir, unit)
                and not any(e.get("vnni_instructions") for e in passed)):
            notes.append("its AVX512-VNNI branches (kVnni: linear_int8's VPDPWSSD) have not run: no run above "
                         "had AVX512-VNNI (Cascade Lake, Ice Lake, Zen 4 on) unmasked; its VPMADDWD sums did")
        note = "; ".join(notes)
        if status == NEVER and mine:
            note = (f"it ran {len(mine)} time(s), but on an older unit (hash "
                    f"{str(mine[-1].get('source_hash'))[:12]}, now {unit.source_hash[:12]})")
        statuses.append(TierStatus(unit=unit, status=status, machines=machines, note=note))
    return statuses


def _calls_vnni(kernel_dir: Path, unit: TierUnit) -> bool:
    """Whether the unit's sources take AVX512-VNNI branches: a call of a vnni_*_insn helper
    other than its definition (the validator's reading, INSN_GUARDS)."""
    vnni = next(g for g in INSN_GUARDS if g.feature == "avx512vnni")
    for rel in unit.files:
        path = kernel_dir / rel
        if not path.is_file():
            continue
        lines = path.read_text(errors="replace").splitlines()
        if any(vnni.call_re.search(line) and not vnni.definition_re.match(line) for line in lines):
            return True
    return False


def tier_table_markdown(statuses: list[TierStatus]) -> str:
    lines = ["## Tiers and the evidence behind them", "",
             "Each tier's unit (its build.toml section's sources and the shared headers) is identified by "
             "a sha256 content hash; a tier counts as verified only when a run executed that exact unit and "
             "passed the correctness check.", "",
             "| Tier | build.toml section | Unit hash | Evidence | Machines |", "| --- | --- | --- | --- | --- |"]
    for s in statuses:
        machines = "; ".join(m.replace("|", "/") for m in s.machines) or "-"
        status = s.status + (f" ({s.note})" if s.note else "")
        lines.append(f"| {s.unit.tier} | `{s.unit.section}` | `{s.unit.source_hash[:12]}` | {status} | {machines} |")
    return "\n".join(lines) + "\n"


def finalize_tier_table(output_dir: Path, summary: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """``trial_manager.py finalize``'s tier table: each declared tier of the finalized sources
    against every trial's evidence (``summary.json`` key ``tiers`` and a summary.md section)."""
    try:
        statuses = tier_statuses(Path(output_dir), evidence_in(summary))
    except UsageError as exc:  # no or broken build.toml: say so instead of failing the finalize
        return [], f"## Tiers\n\nNo tier table: {exc.message}\n"
    return [s.to_dict() for s in statuses], tier_table_markdown(statuses)


def unrun_change_warning(trial_dir: Path, parent_dir: Path | None,
                         evidence: list[dict[str, Any]] | None) -> str | None:
    """The trial loop's warning: a trial whose changed units all belong to tiers its benchmark
    did not execute measured code it did not change, so its result is noise (None otherwise,
    and when the units or the evidence are unknown)."""
    if parent_dir is None or not evidence:
        return None
    try:
        now = declared_units(trial_dir)
        before = {u.section: u.source_hash for u in declared_units(parent_dir)}
    except UsageError:
        return None
    changed = [u for u in now if before.get(u.section) != u.source_hash]
    ran = sorted({str(e.get("tier")) for e in evidence if e.get("executed")})
    if not changed or any(u.tier in ran for u in changed):
        return None
    units = ", ".join(f"{u.tier} ({', '.join(u.files)})" for u in changed)
    return (f"this trial changed only {units}, but its benchmark executed {', '.join(ran) or 'no tier'}: "
            "the timing measured code the trial did not change, so the result is noise. Change the unit "
            "of the tier this machine runs, or benchmark on a machine that has the changed tier.")
