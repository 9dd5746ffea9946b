"""Tier evidence: for every tier a package declares, did it run, where, was it correct.

An entry (the benchmark JSON's ``tier_evidence`` list, and check_portability's)::

    {"tier": "avx2", "section": "my_kernel_cpu_avx2", "executed": true,
     "reason": null, "correct": true, "cpu": "Intel(R) Xeon(R) ...",
     "source_hash": "<sha256 of the tier's unit>", "emulated": false}

``executed`` false always carries a ``reason`` (this CPU lacks the tier, the
run forced another tier, the kernel crashed before running it, ...).
``source_hash`` is the unit hash of :mod:`.units` of the code that ran, so
evidence stays valid exactly as long as the unit it proves is unchanged. It
comes from the build's own record (``tier_units.json`` in the variant) when
there is one, so an installed package without sources has it too;
``source_hash_from`` says ``"build"`` or ``"sources"`` (a build without the
record: the sources' hash, unchecked against the build). When the build and
the sources disagree the build is stale: the entry carries ``stale_build``
(how the unit differs) and the build's hash. It is null only when neither is
at hand (``source_hash_reason`` says why). ``cpu`` names the machine (the
emulated model for QEMU runs). An executed ``avx512`` entry also says whether
the unit's AVX512-BF16 branches ran (``bf16_instructions``): the generated unit
runs on every AVX512 F/BW/VL/DQ CPU and takes its integer bf16 paths where the
CPU lacks AVX512-BF16 or ``KERNEL_CPU_MASK`` lists ``avx512bf16``; likewise
``vnni_instructions`` for its AVX512-VNNI branches (linear_int8's sums). A GEMM
package's avx512 section also carries ``-mamx-*`` (its tier reads ``amx``): the
dispatcher runs it as ``avx512``, so it counts as executed (``ran_as``) when
avx512 ran on a CPU whose AMX the unit uses, and as not executed, naming the
missing AMX or the mask, when avx512 ran without it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ..cpu import TIERS, cpu_flags, cpu_model, has_isa, missing_flags, supported_tiers
from .models import NO_AVX512_REASON
from .resolve import KnownUnits, resolve_units
from .units import TierUnit

#: The flags evidence lists for a CPU: the ones the tiers are compiled for.
RELEVANT_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                  "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


def host_cpu() -> str:
    """This machine's CPU for evidence: model name and the tier-relevant flags."""
    flags = sorted(f for f in RELEVANT_FLAGS if f in cpu_flags())
    return f"{cpu_model()} [{' '.join(flags) or 'no AVX2/AVX512 flags'}]"


def _masked(token: str) -> bool:
    """Whether ``KERNEL_CPU_MASK`` (comma separated, any case) lists ``token``, as cpu_features.hpp reads it."""
    return token in os.environ.get("KERNEL_CPU_MASK", "").lower().replace(" ", "").split(",")


def bf16_instructions_here() -> bool:
    """Whether a generated avx512 unit started from here takes its AVX512-BF16 branches (``kBf16``)."""
    return "avx512_bf16" in cpu_flags() and not _masked("avx512bf16")


def vnni_instructions_here() -> bool:
    """Whether a generated avx512 unit started from here takes its AVX512-VNNI branches (``kVnni``)."""
    return "avx512_vnni" in cpu_flags() and not _masked("avx512vnni")


def amx_instructions_here() -> bool:
    """Whether a GEMM unit started from here takes its AMX branches (cpu_features.hpp's
    ``amx_instructions``: the CPU's AMX flags, and ``KERNEL_CPU_MASK`` not listing ``amx``)."""
    return has_isa("amx") and not _masked("amx")


def dispatched_as(tier: str) -> str:
    """The dispatcher tier that runs a declared unit: a section built with ``-mamx-*``
    (``tier_of_flags`` says ``amx``) is a GEMM package's avx512 unit, which the dispatcher
    runs as ``avx512`` and which takes its AMX branches only where the CPU has AMX."""
    return "avx512" if tier == "amx" else tier


def ran_bf16_instructions(entry: dict[str, Any]) -> bool:
    """Whether an executed avx512 entry ran the BF16 branches (older entries: from the CPU's flags)."""
    if "bf16_instructions" in entry:
        return bool(entry["bf16_instructions"])
    return "avx512_bf16" in str(entry.get("cpu"))


def _entry(unit: TierUnit | None, tier: str, *, executed: bool, correct: bool | None,
           reason: str | None, cpu: str, emulated: bool) -> dict[str, Any]:
    entry = {"tier": tier, "section": unit.section if unit else None, "executed": executed,
             "reason": None if executed else reason, "correct": correct if executed else None,
             "cpu": cpu, "source_hash": unit.source_hash if unit else None, "emulated": emulated}
    if executed and dispatched_as(tier) == "avx512":
        entry["bf16_instructions"] = False if emulated else bf16_instructions_here()
        entry["vnni_instructions"] = False if emulated else vnni_instructions_here()
    return entry


# --------------------------------------------------------------------------- benchmark


def _bench_ran(result: Any, payload: dict[str, Any], usable: list[str]) -> tuple[dict[str, set[str]], str]:
    """Tier -> the labels its correctness calls carry in ``failures``, and how that was known."""
    forced = getattr(result.options, "tier", None)
    if forced in TIERS:
        return {forced: {forced}}, f"--tier {forced} forced it"
    tier_ran = (payload.get("conditions") or {}).get("tier_ran") or getattr(result, "tier_ran", None)
    if forced == "all":
        swept = (payload.get("tiers") or {}).get("swept") or usable
        ran = {t: {t} for t in swept}
        if tier_ran in ran:
            ran[tier_ran].add("dispatch")  # the dispatcher's own calls ran on it too
        return ran, "--tier all checked every tier this CPU can run"
    if tier_ran in TIERS:
        return {tier_ran: {"dispatch"}}, "the dispatcher chose it"
    if usable:
        # no record of the dispatcher's choice: it picks the widest available tier
        # for every non-empty problem (generic_threshold defaults to 1 element)
        return {usable[-1]: {"dispatch"}}, "the dispatcher's choice (the widest tier this CPU runs)"
    return {}, "unknown"


def bench_tier_evidence(result: Any, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """``tier_evidence`` for one ``benchmark_cpu.py`` run (see module docstring).

    ``result`` is the :class:`~kernel_harness.bench.runner.BenchResult`,
    ``payload`` the JSON built from it so far (its ``failures``, ``tiers``,
    ``crash`` and, when the benchmark records it, ``conditions.tier_ran``).
    """
    spec = result.options.kernel_spec
    build_module = (payload.get("kernel_build") or {}).get("module")
    known = resolve_units(spec, build_module if isinstance(build_module, str) else None)
    units = known.units
    cpu = host_cpu()
    here = supported_tiers()
    declared = [dispatched_as(u.tier) for u in units] if units is not None else list(here)
    usable = [t for t in TIERS if t in declared and t in here]
    ran, how = _bench_ran(result, payload, usable)
    crash = payload.get("crash")
    failures = payload.get("failures") or []
    entries = []
    targets: Iterable[tuple[TierUnit | None, str]] = (
        [(u, u.tier) for u in units] if units is not None else [(None, t) for t in declared])
    for unit, tier in targets:
        runs_as = dispatched_as(tier)
        amx_skipped = tier == "amx" and not amx_instructions_here()
        if runs_as in ran and not crash and not amx_skipped:
            bad = any(f.get("tier") in ran[runs_as] for f in failures)
            entry = _entry(unit, tier, executed=True, correct=not bad, reason=None, cpu=cpu,
                           emulated=False)
            entry["how"] = how
            if tier == "amx":
                entry["ran_as"] = runs_as
        else:
            entry = _entry(unit, tier, executed=False, correct=None, cpu=cpu, emulated=False,
                           reason=_not_run_reason(tier, here, result, crash, ran))
        entries.append(with_origin(entry, known))
    return entries


def with_origin(entry: dict[str, Any], known: KnownUnits) -> dict[str, Any]:
    """Say where the entry's ``source_hash`` comes from, and whether its build was stale."""
    entry["source_hash_from"] = known.origin
    if entry.get("source_hash") is None:
        entry["source_hash_reason"] = known.reason
    if entry["tier"] in known.stale:
        entry["stale_build"] = known.stale[entry["tier"]]
    return entry


def _not_run_reason(tier: str, here: list[str], result: Any, crash: Any, ran: dict[str, set[str]]) -> str:
    if crash:
        return "the kernel crashed or could not be loaded before this tier was checked"
    if tier == "amx":
        if "avx512" not in ran:
            return "its unit is the avx512 tier's, which did not run: " + _not_run_reason(
                "avx512", here, result, crash, ran)
        why = (f"this CPU lacks amx (missing flags: {', '.join(missing_flags('amx'))})" if not has_isa("amx")
               else "KERNEL_CPU_MASK lists amx")
        return f"the avx512 tier ran this unit but not its AMX branches: {why}"
    if tier not in here:
        return f"this CPU lacks {tier} (missing flags: {', '.join(missing_flags(tier))})"
    forced = getattr(result.options, "tier", None)
    if forced in TIERS:
        return f"--tier {forced} forced another tier; --tier all checks every tier this CPU runs"
    if forced == "all":
        return "the package's available_tiers() does not offer it here"
    return "the dispatcher chose another tier; run with --tier all (or --tier " + tier + ")"


def unrun_tiers_note(evidence: list[dict[str, Any]]) -> str | None:
    """One sentence for ``--tier all``: the declared tiers it could not run, with the reason."""
    missing = [e for e in evidence if not e["executed"]]
    if not missing:
        return None
    parts = [f"{e['tier']} ({e['reason']})" for e in missing]
    return ("declared tiers not executed in this run: " + "; ".join(parts)
            + ". Their code is unverified here: run the benchmark on a CPU that has them, "
            "or publish with --drop-unverified-tiers.")


def record_tier_evidence(result: Any, payload: dict[str, Any]) -> None:
    """The benchmark report's hook: ``payload["tier_evidence"]``, and with ``--tier all``
    a note naming the declared tiers it could not run and why."""
    evidence = bench_tier_evidence(result, payload)
    payload["tier_evidence"] = evidence
    notes: list[str] = []
    stale = [e for e in evidence if e.get("stale_build")]
    if stale:
        notes.append("stale build: the build that ran was compiled from other units than the sources hold "
                     "now (" + "; ".join(f"{e['tier']}: {e['stale_build']}" for e in stale) + "). Its tier "
                     "evidence is for the built units, not the sources: rebuild (scripts/build_kernel.py) "
                     "and rerun to verify the sources.")
    note = unrun_tiers_note(evidence) if getattr(result.options, "tier", None) == "all" else None
    if note:
        notes.append(note)
    if notes:
        payload["notes"] = [*(payload.get("notes") or []), *notes]


# --------------------------------------------------------------------------- emulation


def emulated_tier_evidence(runs: list[Any], known: KnownUnits) -> list[dict[str, Any]]:
    """Evidence from check_portability's emulated runs: one entry per (tier, model) it ran on,
    one entry for each declared tier no model ran."""
    units = known.units
    tiers = [(u, u.tier) for u in units] if units is not None else [
        (None, t) for t in TIERS if any(t in (r.available_tiers or []) for r in runs)]
    entries: list[dict[str, Any]] = []
    for unit, tier in tiers:
        ran_somewhere = False
        for run in runs:
            entry = _emulated_entry(run, unit, tier)
            if entry is not None:
                entries.append(entry)
                ran_somewhere = True
        if not ran_somewhere:
            entries.append(_entry(unit, tier, executed=False, correct=None, emulated=True,
                                  cpu=", ".join(r.model.label for r in runs),
                                  reason=_emulated_not_run_reason(tier, runs)))
    return [with_origin(e, known) for e in entries]


def _emulated_entry(run: Any, unit: TierUnit | None, tier: str) -> dict[str, Any] | None:
    """The entry for ``tier`` on one emulated run, or None when that run did not execute it."""
    if tier not in run.model.tiers:
        return None
    cpu = run.model.label
    if run.crash or run.emulation_problem:
        if run.crash and tier in (run.available_tiers or []):
            return _entry(unit, tier, executed=True, correct=False, reason=None, cpu=cpu,
                          emulated=True) | {"crash": run.crash}
        return None
    dispatched = {d["input_set"] for d in run.dispatch if d["tier"] == tier}
    checks = [c for c in run.checks if c["tier"] == tier
              or (c["tier"] == "dispatch" and c["input_set"] in dispatched)]
    if not checks:
        return None
    return _entry(unit, tier, executed=True, correct=all(c.get("correct") for c in checks),
                  reason=None, cpu=cpu, emulated=True)


def _emulated_not_run_reason(tier: str, runs: list[Any]) -> str:
    if tier in ("avx512", "amx"):
        return NO_AVX512_REASON
    crashed = [r for r in runs if r.crash or r.emulation_problem]
    if crashed:
        return "the emulated run failed before checking it: " + (crashed[0].crash or crashed[0].emulation_problem)
    return "none of the emulated CPU models chosen (--cpu) runs this tier"
