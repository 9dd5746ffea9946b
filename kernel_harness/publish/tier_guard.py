"""Never ship a tier nobody ran: the publish guard, the card's tier table, dropping tiers.

Every tier ``build.toml`` declares must have *evidence*: a run that executed
that tier's unit, with the unit's current content hash
(:mod:`kernel_harness.portability.units`), and passed the correctness check.
Evidence comes from

* the publish-time check itself: ``scripts/benchmark_cpu.py --tier all`` on the
  stage, which executes every tier this machine can run (:func:`with_all_tiers`);
* the trials in ``summary.json`` of a finalized ``output/`` (each trial's
  benchmark JSON carries ``tier_evidence``);
* ``--tier-evidence FILE``: a ``benchmark_cpu.py --json`` or
  ``check_portability.py --json`` made elsewhere (e.g. on a machine with
  AVX512), trusted only for units whose hash still matches.

A tier without evidence is refused on upload, naming the tier, its unit and
the two ways out; a dry run lists it and says that an upload would be refused.
``--drop-unverified-tiers`` copies the kernel without the unverified tiers
this machine cannot run (their build.toml section removed, the generated tier
switch ``KERNEL_HAVE_<TIER>`` set to 0), so the publisher builds that copy and
the dispatcher falls back to the best verified tier on every CPU.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cpu import supported_tiers
from ..errors import CheckFailed, UsageError
from ..portability.evidence import host_cpu
from ..portability.units import TierUnit, declared_units

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
        note = ""
        if status == NEVER and mine:
            note = (f"it ran {len(mine)} time(s), but on an older unit (hash "
                    f"{str(mine[-1].get('source_hash'))[:12]}, now {unit.source_hash[:12]})")
        statuses.append(TierStatus(unit=unit, status=status, machines=machines, note=note))
    return statuses


def with_all_tiers(check_args: list[str], load: dict[str, Any] | None = None) -> list[str]:
    """The publish-time benchmark checks every tier this machine runs: ``--tier all`` unless
    a ``--tier`` is given or the package has no ``available_tiers()`` (``load`` is the
    load check's report; --tier all needs that function)."""
    if "--tier" in check_args or (load is not None and not load.get("available_tiers")):
        return list(check_args)
    return [*check_args, "--tier", "all"]


# --------------------------------------------------------------------------- refusal and card


def refusal_message(unverified: list[TierStatus], kernel_dir: Path) -> str:
    parts = []
    for s in unverified:
        why = s.status + (f" ({s.note})" if s.note else "")
        # no square brackets: the CLI prints errors with rich, which would eat "[kernel.x]" as markup
        parts.append(f"tier {s.unit.tier} (build.toml section kernel.{s.unit.section}: "
                     f"{', '.join(s.unit.files)}) {why}")
    tiers = ", ".join(s.unit.tier for s in unverified)
    return (f"publish.py refuses to upload {kernel_dir}: " + "; ".join(parts) + ". Nobody has run "
            f"that code as it is now, yet the dispatcher would choose it first on every CPU that has "
            f"{tiers}. Two ways out: (1) run scripts/benchmark_cpu.py --tier all --json FILE on a "
            "machine that has the tier (or check_portability.py for the tiers QEMU emulates) and pass "
            "the file with --tier-evidence FILE (or import it into the trial: trial_manager.py result "
            "--from-json FILE, then finalize), checked against the unit's source hash; or (2) rerun with "
            "--drop-unverified-tiers to publish without that tier, so the dispatcher falls back to the "
            "best verified one.")


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


def enforce_tier_evidence(plan: Any, options: Any, verification: Any, report: dict[str, Any]) -> None:
    """The pipeline's hook after verification: record the tier table, add it to the card,
    and refuse an upload (not a dry run) while a declared tier is unverified."""
    evidence = evidence_in(plan.source.summary) + evidence_in(verification.benchmark)
    evidence += evidence_from_files(list(getattr(options, "tier_evidence", []) or []))
    statuses = tier_statuses(plan.source.root, evidence)
    report["tiers"] = [s.to_dict() for s in statuses]
    card_path = plan.stage / "README.md"
    if card_path.is_file():
        card = card_path.read_text(encoding="utf-8").rstrip("\n") + "\n\n" + tier_table_markdown(statuses)
        card_path.write_text(card, encoding="utf-8")
        report["card"] = card
    unverified = [s for s in statuses if not s.verified]
    if not unverified:
        return
    message = refusal_message(unverified, plan.source.root)
    if options.dry_run:
        report["notes"].append("an upload would be refused: " + message)
        return
    raise CheckFailed(message)


# --------------------------------------------------------------------------- dropping tiers

_COPY_IGNORE = shutil.ignore_patterns("build", "dist", "__pycache__", "*.pyc", ".ninja*", "*.o")


def tiers_to_drop(kernel_dir: Path, evidence: list[dict[str, Any]]) -> list[TierStatus]:
    """Unverified tiers the publish-time check cannot verify here (this CPU lacks them);
    never the generic tier, which every other tier falls back to."""
    here = supported_tiers()
    return [s for s in tier_statuses(kernel_dir, evidence)
            if not s.verified and s.unit.tier != "generic" and s.unit.tier not in here]


def _remove_section(text: str, section: str) -> str:
    """build.toml without ``[kernel.<section>]`` (and the comment lines right above it)."""
    lines = text.splitlines(keepends=True)
    header = re.compile(rf"^\s*\[kernel\.{re.escape(section)}\]\s*(#.*)?$")
    start = next((i for i, ln in enumerate(lines) if header.match(ln)), None)
    if start is None:
        return text
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    while end > start + 1 and lines[end - 1].lstrip().startswith("#"):
        end -= 1  # the next section's own comment stays with it
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    return "".join(lines[:start] + lines[end:])


def drop_tiers(kernel_dir: Path, drop: list[TierUnit], dest: Path) -> Path:
    """Copy ``kernel_dir`` (sources only) to ``dest`` without the ``drop`` tiers."""
    kernel_dir = Path(kernel_dir)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(kernel_dir, dest, ignore=_COPY_IGNORE)
    toml = dest / "build.toml"
    text = toml.read_text(encoding="utf-8")
    for unit in drop:
        text = _remove_section(text, unit.section)
        switched = False
        switch = re.compile(rf"^([ \t]*#define[ \t]+KERNEL_HAVE_{unit.tier.upper()}[ \t]+)1([ \t]*)$", re.MULTILINE)
        for header in sorted(dest.rglob("*.hpp")) + sorted(dest.rglob("*.h")):
            body = header.read_text(encoding="utf-8", errors="replace")
            new = switch.sub(r"\g<1>0\2", body)
            if new != body:
                header.write_text(new, encoding="utf-8")
                switched = True
        if not switched:
            raise UsageError(
                f"--drop-unverified-tiers cannot drop the {unit.tier} tier of {kernel_dir}: no header "
                f"defines KERNEL_HAVE_{unit.tier.upper()} (the switch scripts/new_kernel.py generates), so "
                f"the dispatcher would still call the {unit.tier} unit. Remove the tier by hand, or carry "
                "evidence with --tier-evidence.")
    toml.write_text(text, encoding="utf-8")
    return dest


def apply_drop_unverified_tiers(options: Any, report: dict[str, Any], log: Any) -> Any:
    """The pipeline's first hook: with ``--drop-unverified-tiers``, publish a copy without the
    tiers that have no evidence and that this machine cannot verify; returns the options to use."""
    if not getattr(options, "drop_unverified_tiers", False):
        return options
    from dataclasses import replace

    from .layout import read_kernel_source

    source = read_kernel_source(options.source_dir, baseline=options.baseline)
    evidence = evidence_in(source.summary) + evidence_from_files(list(options.tier_evidence or []))
    drop = tiers_to_drop(source.root, evidence)
    if not drop:
        report.setdefault("notes", []).append("--drop-unverified-tiers: every declared tier has evidence "
                                              "or runs here, nothing dropped")
        return options
    names = "-".join(s.unit.tier for s in drop)
    dest = (Path.cwd() / "publish" / f"{source.root.name}-without-{names}").resolve()
    log(f"--drop-unverified-tiers: copying {source.root} to {dest} without "
        + ", ".join(f"{s.unit.tier} (section kernel.{s.unit.section}, {s.status})" for s in drop))
    drop_tiers(source.root, [s.unit for s in drop], dest)
    baseline = options.baseline or source.baseline
    report["dropped_tiers"] = [s.to_dict() for s in drop]
    return replace(options, source_dir=dest, baseline=baseline)
