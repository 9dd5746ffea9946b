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

import re
import shutil
from pathlib import Path
from typing import Any

from ..cpu import supported_tiers
from ..errors import CheckFailed, UsageError
from ..portability.status import (FAILED, NEVER, VERIFIED_ELSEWHERE, VERIFIED_EMULATED, VERIFIED_HERE,
                                  TierStatus, evidence_from_files, evidence_in, tier_statuses,
                                  tier_table_markdown)
from ..portability.units import TierUnit

__all__ = ["FAILED", "NEVER", "VERIFIED_ELSEWHERE", "VERIFIED_EMULATED", "VERIFIED_HERE", "TierStatus",
           "apply_drop_unverified_tiers", "drop_tiers", "enforce_tier_evidence", "evidence_in",
           "refusal_message", "tier_statuses", "tier_table_markdown", "tiers_to_drop", "with_all_tiers"]


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
