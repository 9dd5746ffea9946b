"""publish.py's tier guard (issue 24): no tier is uploaded that nobody ran as it is now.

Fast tests use a generated (not built) kernel and synthetic evidence; two slow
tests publish kernels: the RoPE-like scenario (a copy of the catalogue kernel
whose AVX512 unit changed after its last execution) is refused with the message
naming the tier, its unit and both ways out, and --drop-unverified-tiers
publishes a rebuilt one-op kernel whose dispatcher falls back to a verified
tier on a real CPU that has the dropped tier (avx512 -> avx2 on a machine with
AVX512 F/BW/VL/DQ; avx2 -> generic elsewhere: one rebuild per machine).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_script

from kernel_harness.cpu import has_isa, missing_flags
from kernel_harness.portability import declared_units
from kernel_harness.publish.tier_guard import (NEVER, VERIFIED_ELSEWHERE, VERIFIED_EMULATED, VERIFIED_HERE, FAILED,
                                               drop_tiers, evidence_in, refusal_message, tier_statuses,
                                               tier_table_markdown, with_all_tiers)
from kernel_harness.scaffold import ScaffoldOptions, plan_project, write_project

ROOT = Path(__file__).resolve().parent.parent
RMS_BASELINE = ROOT / "examples" / "rms_norm" / "baseline.py"


@pytest.fixture
def kernel(tmp_path) -> Path:
    directory = tmp_path / "tnorm"
    write_project(plan_project(ScaffoldOptions(ops=("rms_norm",), name="tnorm", directory=directory)), force=False)
    return directory


def _ev(unit, *, cpu="CPU A", executed=True, correct=True, emulated=False, source_hash=None):
    return {"tier": unit.tier, "executed": executed, "correct": correct, "cpu": cpu, "emulated": emulated,
            "source_hash": source_hash or unit.source_hash, "reason": None}


def test_statuses_follow_the_evidence_for_the_current_unit_only(kernel):
    generic, avx2, avx512 = declared_units(kernel)
    evidence = [_ev(generic, cpu="HERE"), _ev(avx2, cpu="QEMU Haswell (emulated)", emulated=True),
                _ev(avx512, cpu="CPU B", source_hash="0" * 64)]
    by_tier = {s.unit.tier: s for s in tier_statuses(kernel, evidence, here="HERE")}
    assert by_tier["generic"].status == VERIFIED_HERE and by_tier["generic"].verified
    assert by_tier["avx2"].status == VERIFIED_EMULATED and by_tier["avx2"].verified
    assert by_tier["avx512"].status == NEVER and not by_tier["avx512"].verified
    assert "older unit" in by_tier["avx512"].note
    evidence.append(_ev(avx512, cpu="CPU B"))
    assert tier_statuses(kernel, evidence, here="HERE")[2].status == VERIFIED_ELSEWHERE
    failing = [_ev(avx512, cpu="CPU B", correct=False)]
    assert tier_statuses(kernel, failing, here="HERE")[2].status == FAILED


def test_an_avx512_unit_verified_only_without_avx512_bf16_says_its_bf16_branches_never_ran(kernel, monkeypatch):
    """Ice Lake runs the avx512 unit but not its kBf16 branches: verified, with a note that says so,
    until a run on a CPU with AVX512-BF16 (and without KERNEL_CPU_MASK=avx512bf16) adds evidence."""
    from kernel_harness.portability.evidence import bf16_instructions_here

    avx512 = declared_units(kernel)[2]
    ice_lake = {**_ev(avx512, cpu="Ice Lake [avx2 avx512f avx512bw avx512vl avx512dq]"), "bf16_instructions": False}
    status = tier_statuses(kernel, [ice_lake], here="HERE")[2]
    assert status.verified and "AVX512-BF16 branches (kBf16) have not run" in status.note
    assert "have not run" in tier_table_markdown([status])
    spr = {**_ev(avx512, cpu="Sapphire Rapids [avx512f avx512_bf16]"), "bf16_instructions": True}
    assert tier_statuses(kernel, [ice_lake, spr], here="HERE")[2].note == ""
    older = _ev(avx512, cpu="Sapphire Rapids [avx2 avx512f avx512_bf16]")  # before the key existed: the flags say
    assert tier_statuses(kernel, [older], here="HERE")[2].note == ""
    # this process: the CPU's flag, unless the mask hides the instructions
    monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", "avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16")
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    assert bf16_instructions_here()
    monkeypatch.setenv("KERNEL_CPU_MASK", "avx512bf16")
    assert not bf16_instructions_here()
    monkeypatch.delenv("KERNEL_CPU_MASK")
    monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", "avx2 fma f16c avx512f avx512bw avx512vl avx512dq")
    assert not bf16_instructions_here()


def test_avx512_evidence_says_whether_the_vnni_branches_ran(kernel, monkeypatch):
    """An executed avx512 entry records vnni_instructions (linear_int8's VPDPWSSD behind kVnni) as the
    unit decides it: the CPU's flag, unless KERNEL_CPU_MASK lists avx512vnni; emulated runs never."""
    from kernel_harness.portability.evidence import _entry

    unit = declared_units(kernel)[2]
    base = "avx2 fma f16c avx512f avx512bw avx512vl avx512dq"
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    for flags, mask, emulated, expected in ((base + " avx512_vnni", None, False, True),
                                            (base + " avx512_vnni", "avx512bf16,avx512vnni", False, False),
                                            (base, None, False, False), (base + " avx512_vnni", None, True, False)):
        monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", flags)
        if mask:
            monkeypatch.setenv("KERNEL_CPU_MASK", mask)
        entry = _entry(unit, "avx512", executed=True, correct=True, reason=None, cpu="X", emulated=emulated)
        assert entry["vnni_instructions"] is expected, (flags, mask, emulated)
        monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    assert "vnni_instructions" not in _entry(unit, "avx2", executed=True, correct=True, reason=None, cpu="X",
                                             emulated=False)


def test_an_int8_unit_verified_only_without_vnni_says_its_vnni_branches_never_ran(tmp_path):
    """A unit with linear_int8 takes VPDPWSSD only behind kVnni: evidence from runs without AVX512-VNNI
    (Skylake-SP, or KERNEL_CPU_MASK=avx512vnni) verifies it with a note, until a run with it; a unit
    without such branches never gets the note."""
    directory = tmp_path / "tint8"
    write_project(plan_project(ScaffoldOptions(ops=("linear_int8",), name="tint8", directory=directory)), force=False)
    unit = next(u for u in declared_units(directory) if u.tier in ("avx512", "amx"))
    without = {**_ev(unit, cpu="Skylake-SP"), "bf16_instructions": False, "vnni_instructions": False}
    status = next(s for s in tier_statuses(directory, [without], here="HERE") if s.unit == unit)
    assert status.verified and "AVX512-VNNI branches (kVnni" in status.note
    with_vnni = {**_ev(unit, cpu="Zen 4"), "bf16_instructions": True, "vnni_instructions": True}
    status = next(s for s in tier_statuses(directory, [without, with_vnni], here="HERE") if s.unit == unit)
    assert "VNNI" not in status.note


def test_editing_a_unit_after_its_evidence_makes_it_unverified_and_the_refusal_says_why(kernel):
    units = declared_units(kernel)
    evidence = [_ev(u) for u in units]
    assert all(s.verified for s in tier_statuses(kernel, evidence))
    unit = kernel / "tnorm_cpu" / "tnorm_avx512.cpp"
    unit.write_text(unit.read_text() + "\n// the agent's untested loop\n")
    statuses = tier_statuses(kernel, evidence)
    unverified = [s for s in statuses if not s.verified]
    assert [s.unit.tier for s in unverified] == ["avx512"]
    message = refusal_message(unverified, kernel)
    assert "tier avx512 (build.toml section kernel.tnorm_cpu_avx512: tnorm_cpu/tnorm_avx512.cpp)" in message
    assert NEVER in message and "--tier-evidence FILE" in message and "--drop-unverified-tiers" in message
    table = tier_table_markdown(statuses)
    assert "| avx512 | `tnorm_cpu_avx512` |" in table and NEVER in table


def test_evidence_is_found_in_benchmark_json_and_in_summary_trials(kernel):
    unit = declared_units(kernel)[1]
    bench = {"correct": True, "tier_evidence": [_ev(unit)]}
    summary = {"trials": [{"result": {"details": bench}, "superseded_results": [{"details": bench}]}]}
    assert len(evidence_in(bench)) == 1 and len(evidence_in(summary)) == 2
    assert with_all_tiers(["--rounds", "3"]) == ["--rounds", "3", "--tier", "all"]
    assert with_all_tiers(["--tier", "avx2"]) == ["--tier", "avx2"]
    assert with_all_tiers([], {"available_tiers": ["generic", "avx2"]}) == ["--tier", "all"]
    assert with_all_tiers([], {"available_tiers": None}) == []  # --tier all needs available_tiers()


def test_dropping_a_tier_removes_its_section_and_switch_and_keeps_the_other_hashes(kernel, tmp_path):
    units = declared_units(kernel)
    dest = drop_tiers(kernel, [units[2]], tmp_path / "dropped")
    text = (dest / "build.toml").read_text()
    assert "[kernel.tnorm_cpu_avx512]" not in text and "-mavx512f" not in text
    assert "[kernel.tnorm_cpu_avx2]" in text and "# AVX2 tier" in text
    assert "#define KERNEL_HAVE_AVX512 0" in (dest / "tnorm_cpu" / "tnorm_tiers.hpp").read_text()
    kept = declared_units(dest)
    assert [u.tier for u in kept] == ["generic", "avx2"]
    assert [u.source_hash for u in kept] == [u.source_hash for u in units[:2]]


# ----------------------------------------------------------------------------- publish.py


def _catalogue_copy(catalogue_kernel_dir: Path, dest: Path) -> Path:
    shutil.copytree(catalogue_kernel_dir, dest, ignore=shutil.ignore_patterns("dist", "__pycache__"))
    return dest


@pytest.mark.slow
def test_publish_refuses_a_kernel_whose_avx512_unit_changed_after_its_last_execution(catalogue_kernel_dir, tmp_path):
    """On an AVX512 CPU the harness and the kernel are told the CPU has none (as on a Zen 3):
    otherwise publish.py's own --tier all check would run the changed unit and verify it."""
    hide = ({"KERNEL_HARNESS_CPU_FLAGS": _HOST_WITHOUT["avx512"], "KERNEL_CPU_MASK": "avx512"}
            if has_isa("avx512") else {})
    kernel = _catalogue_copy(catalogue_kernel_dir, tmp_path / "harness_catalogue")
    # the RoPE scenario: a benchmark on an AVX512 machine ran the avx512 unit, which changed since
    units = {u.tier: u for u in declared_units(kernel)}
    stale = {"correct": True, "tier_evidence": [
        {"tier": "avx512", "executed": True, "correct": True, "cpu": "Xeon with AVX512",
         "emulated": False, "reason": None, "source_hash": "f" * 64, "section": units["avx512"].section}]}
    carried = tmp_path / "bench-elsewhere.json"
    carried.write_text(json.dumps(stale))
    proc = run_script("publish", kernel, "--repo-id", "me/harness-catalogue", "--no-build", "--baseline",
                      RMS_BASELINE, "--op", "harness_catalogue.rms_norm", "--rounds", "3", "--tier-evidence",
                      carried, "--json", tmp_path / "r.json", cwd=tmp_path, timeout=1200,
                      env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_unused", "HF_HUB_OFFLINE": "1",
                           **hide})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())
    assert "refuses to upload" in message
    assert ("tier avx512 (build.toml section kernel.harness_catalogue_cpu_avx512: "
            "harness_catalogue_cpu/harness_catalogue_avx512.cpp) never executed") in message
    assert "older unit" in message and "--tier-evidence FILE" in message and "--drop-unverified-tiers" in message
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["uploaded"] is False
    tiers = {t["tier"]: t for t in report["tiers"]}
    assert tiers["avx512"]["verified"] is False
    # publish's own check ran every tier this machine has
    for tier in ("generic", "avx2"):
        if has_isa(tier):
            assert tiers[tier]["status"] == VERIFIED_HERE


#: How a host without the dropped tiers looks to the harness (KERNEL_HARNESS_CPU_FLAGS).
_HOST_WITHOUT = {"avx512": "avx avx2 fma f16c sse4_2", "avx2": "sse4_2"}
_DROPPED = {"avx512": ["avx512"], "avx2": ["avx2", "avx512"]}
_LOAD_AND_DISPATCH = (
    "import os, sys, torch, kernels\n"
    "from pathlib import Path\n"
    "m = kernels.get_local_kernel(Path(sys.argv[1]))\n"
    "x = torch.randn(8, 4096); w = torch.randn(4096)\n"
    "print('TIERS', m.available_tiers(), m.dispatch_tier('rms_norm', x, w))\n"
    "os.environ['KERNEL_CPU_ISA'] = sys.argv[2]\n"
    "try:\n    m.rms_norm(x, w, 1e-6)\nexcept Exception as e:\n    print('refused:', e)\n"
)


def _fallback_skip_reason(dropped: str) -> str | None:
    """Why the case "a CPU that has ``dropped`` runs the published package without it" cannot run here."""
    if not has_isa(dropped):
        needs = "AVX512 F/BW/VL/DQ, e.g. Skylake-SP, Ice Lake or Zen 4" if dropped == "avx512" else "AVX2"
        other = ("; the avx2 case proves the same mechanism on this CPU" if dropped == "avx512" and has_isa("avx2")
                 else "")
        return (f"this CPU cannot run the {dropped} tier (it lacks {', '.join(missing_flags(dropped))}), so a "
                f"package published without it dispatching to a narrower tier proves nothing here: the "
                f"dispatcher never picks {dropped} on this CPU anyway. The case needs a CPU with {needs}{other}")
    if dropped == "avx2" and has_isa("avx512"):
        return ("this CPU runs the avx512 tier, so the avx512 case proves the fallback here on real hardware "
                "(one rebuild per machine keeps the suite short)")
    return None


@pytest.mark.slow
@pytest.mark.parametrize("dropped, fallback", [
    pytest.param("avx512", "avx2", id="avx512-cpu-runs-avx2"),
    pytest.param("avx2", "generic", id="avx2-cpu-runs-generic"),
])
def test_drop_unverified_tiers_publishes_a_package_that_dispatches_to_a_verified_tier_on_a_cpu_with_the_dropped_one(
        dropped, fallback, kernel, tmp_path):
    """The package is published as a host without ``dropped`` would publish it (the harness's CPU flags
    and the kernel's own CPUID view both lack it, so its unit cannot be verified and is dropped); then it
    is loaded through ``kernels`` on this real CPU, which HAS ``dropped``: the dispatcher must run
    ``fallback``, the best verified tier, and forcing ``dropped`` must be refused."""
    reason = _fallback_skip_reason(dropped)
    if reason:
        pytest.skip(reason)
    env = {"KERNEL_HARNESS_CPU_FLAGS": _HOST_WITHOUT[dropped], "KERNEL_CPU_MASK": ",".join(_DROPPED[dropped])}
    proc = run_script("publish", kernel, "--repo-id", "me/tnorm", "--dry-run", "--baseline", RMS_BASELINE,
                      "--op", "tnorm.rms_norm", "--rounds", "3", "--drop-unverified-tiers", "--json",
                      tmp_path / "r.json", cwd=tmp_path, timeout=1800, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    kept = [t for t in ("generic", "avx2", "avx512") if t not in _DROPPED[dropped]]
    assert [t["tier"] for t in report["dropped_tiers"]] == _DROPPED[dropped]
    assert [t["tier"] for t in report["tiers"]] == kept
    assert all(t["verified"] for t in report["tiers"]), report["tiers"]
    stage = Path(report["stage_dir"])
    assert "## Tiers and the evidence behind them" in (stage / "README.md").read_text()
    # the staged package on this real CPU (no mask, real CPUID): it has `dropped`, the package does not
    real = {k: v for k, v in os.environ.items()
            if k not in ("KERNEL_CPU_ISA", "KERNEL_CPU_MASK", "KERNEL_HARNESS_CPU_FLAGS")}
    out = subprocess.run([sys.executable, "-c", _LOAD_AND_DISPATCH, str(stage), dropped], capture_output=True,
                         text=True, env=real, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"TIERS {kept} {fallback}" in out.stdout, out.stdout
    assert "refused:" in out.stdout and f"generated without the {dropped} tier" in out.stdout


def test_finalize_tier_table_aggregates_every_trials_evidence(kernel):
    from kernel_harness.portability.status import finalize_tier_table

    generic, avx2, avx512 = declared_units(kernel)
    trial = {"result": {"details": {"tier_evidence": [_ev(avx2, cpu="AMD EPYC"), _ev(generic, cpu="AMD EPYC")]}}}
    old = {"result": {"details": {"tier_evidence": [_ev(avx512, cpu="Xeon", source_hash="1" * 64)]}}}
    rows, markdown = finalize_tier_table(kernel, {"trials": [old, trial]})
    by_tier = {r["tier"]: r for r in rows}
    assert by_tier["avx2"]["verified"] and by_tier["avx2"]["machines"] == ["AMD EPYC"]
    assert by_tier["avx512"]["status"] == NEVER and "older unit" in by_tier["avx512"]["note"]
    assert "| avx512 | `tnorm_cpu_avx512` |" in markdown
    rows, markdown = finalize_tier_table(kernel / "missing", {"trials": []})
    assert rows == [] and "No tier table" in markdown


def test_trial_result_warns_when_the_change_touched_only_a_tier_that_did_not_run(kernel, tmp_path):
    from kernel_harness.trials import commands

    root = tmp_path / "trials"
    baseline = tmp_path / "baseline.py"
    baseline.write_text(RMS_BASELINE.read_text())
    commands.init("rms", baseline, force=False, trials_root=root)
    commands.save("rms", kernel, strategy="t0", parent=None, trials_root=root)
    unit = kernel / "tnorm_cpu" / "tnorm_avx512.cpp"
    unit.write_text(unit.read_text() + "\n// a knob of the AVX512 unit\n")
    commands.save("rms", kernel, strategy="t1: avx512 knob", parent="t0", trials_root=root)
    hashes = {u.tier: u for u in declared_units(kernel)}
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"correct": True, "speedup": 2.0, "baseline_us": 200.0, "kernel_us": 100.0,
                                  "tier_evidence": [_ev(hashes["avx2"]), _ev(hashes["avx512"], executed=False)]}))
    payload = commands.result("rms", "t1", correctness=None, speedup=None, baseline_us=None, kernel_us=None,
                              from_json=report, force=False, trials_root=root)
    (warning,) = [w for w in payload["warnings"] if "did not change" in w]
    assert "changed only avx512 (tnorm_cpu/tnorm_avx512.cpp)" in warning and "executed avx2" in warning
    # the same change measured where avx512 ran: no warning
    report.write_text(json.dumps({"correct": True, "speedup": 2.0, "baseline_us": 200.0, "kernel_us": 100.0,
                                  "tier_evidence": [_ev(hashes["avx512"])]}))
    payload = commands.result("rms", "t1", correctness=None, speedup=None, baseline_us=None, kernel_us=None,
                              from_json=report, force=True, trials_root=root)
    assert not [w for w in payload["warnings"] if "did not change" in w]


def test_trial_manager_finalize_writes_the_tier_table_into_summary_json_and_md(kernel, tmp_path):
    baseline = tmp_path / "baseline.py"
    baseline.write_text(RMS_BASELINE.read_text())
    for args in (("init", "rms", baseline), ("save", "rms", kernel, "--strategy", "template")):
        proc = run_script("trial_manager", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    units = {u.tier: u for u in declared_units(kernel)}
    bench = tmp_path / "bench.json"  # a benchmark made on an AVX2-only machine, carried here
    bench.write_text(json.dumps({"correct": True, "speedup": 2.0, "baseline_us": 200.0, "kernel_us": 100.0,
                                 "tier_evidence": [_ev(units["generic"], cpu="AMD EPYC 7B13"),
                                                   _ev(units["avx2"], cpu="AMD EPYC 7B13"),
                                                   _ev(units["avx512"], cpu="AMD EPYC 7B13", executed=False,
                                                       correct=None)]}))
    for args in (("result", "rms", "t0", "--from-json", bench), ("finalize", "rms", "output")):
        proc = run_script("trial_manager", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "output" / "summary.json").read_text())
    tiers = {t["tier"]: t for t in summary["tiers"]}
    assert list(tiers) == ["generic", "avx2", "avx512"]
    assert tiers["avx2"]["status"] == VERIFIED_ELSEWHERE and tiers["avx2"]["machines"] == ["AMD EPYC 7B13"]
    assert tiers["avx512"]["status"] == NEVER and not tiers["avx512"]["verified"]
    assert tiers["avx512"]["source_hash"] == units["avx512"].source_hash
    markdown = (tmp_path / "output" / "summary.md").read_text()
    assert "## Tiers and the evidence behind them" in markdown
    assert f"| avx2 | `tnorm_cpu_avx2` | `{units['avx2'].source_hash[:12]}` | {VERIFIED_ELSEWHERE} | AMD EPYC 7B13 |" in markdown
    assert f"| avx512 | `tnorm_cpu_avx512` | `{units['avx512'].source_hash[:12]}` | {NEVER} | - |" in markdown
