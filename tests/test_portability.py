"""Tier evidence, unit hashes and the emulated-CPU proof (issue 24).

The QEMU tests run the catalogue rms_norm kernel under ``qemu-x86_64 -cpu
Haswell`` (AVX2, no AVX512) and ``-cpu Nehalem`` (no AVX) through
``scripts/check_portability.py``: ONE emulated run per CPU model for the whole
module (the emulated ``import torch`` alone takes ~35 s), shared by a module
fixture; both models run side by side, Haswell on the kernel directory and
Nehalem on the same build installed from its wheel (so the installed-package
form is proven at no extra emulation time). They skip with the reason when
``qemu-x86_64`` is not installed (Debian's ``qemu-user``,
``tools/install_system_packages.sh``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import SCRIPTS, run_script

from kernel_harness.portability import bench_tier_evidence, declared_units, tier_of_flags, unrun_tiers_note
from kernel_harness.portability.emulate import EmulatedRun, judge, qemu_binary, run_emulated
from kernel_harness.portability.models import MODELS, NO_AVX512_REASON
from kernel_harness.scaffold import ScaffoldOptions, plan_project, write_project

ROOT = Path(__file__).resolve().parent.parent
RMS_BASELINE = ROOT / "examples" / "rms_norm" / "baseline.py"
needs_qemu = pytest.mark.skipif(qemu_binary() is None, reason=(
    "qemu-x86_64 is not installed (Debian package qemu-user; tools/install_system_packages.sh "
    "installs it when run as root), so no CPU can be emulated"))
AVX2_ONLY_FLAGS = "avx avx2 fma f16c sse4_2"


@pytest.fixture(scope="module")
def scaffolded(tmp_path_factory) -> Path:
    """A generated (not built) rms_norm kernel: sources and build.toml only."""
    directory = tmp_path_factory.mktemp("portability") / "tnorm"
    write_project(plan_project(ScaffoldOptions(ops=("rms_norm",), name="tnorm", directory=directory)), force=False)
    return directory


# ----------------------------------------------------------------------------- units


def test_tier_of_flags_reads_the_isa_from_the_m_flags():
    assert tier_of_flags([]) == "generic"
    assert tier_of_flags(["-fopenmp"]) == "generic"
    assert tier_of_flags(["-mavx2", "-mfma", "-mf16c", "-fopenmp"]) == "avx2"
    assert tier_of_flags(["-mavx512f", "-mavx512bf16"]) == "avx512"
    assert tier_of_flags(["-mamx-tile", "-mavx512f"]) == "amx"


def test_declared_units_hash_each_tier_and_shared_headers_invalidate_all(scaffolded: Path):
    units = declared_units(scaffolded)
    assert [u.tier for u in units] == ["generic", "avx2", "avx512"]
    assert units[2].files == ("tnorm_cpu/tnorm_avx512.cpp",)
    before = {u.tier: u.source_hash for u in units}
    assert len(set(before.values())) == 3

    unit = scaffolded / "tnorm_cpu" / "tnorm_avx512.cpp"
    original = unit.read_text()
    unit.write_text(original + "\n// a change to the AVX512 unit only\n")
    after = {u.tier: u.source_hash for u in declared_units(scaffolded)}
    unit.write_text(original)
    assert after["avx512"] != before["avx512"]
    assert after["avx2"] == before["avx2"] and after["generic"] == before["generic"]

    header = scaffolded / "tnorm_cpu" / "tnorm_tiers.hpp"  # included by both SIMD units
    original = header.read_text()
    header.write_text(original + "\n// shared helper change\n")
    after = {u.tier: u.source_hash for u in declared_units(scaffolded)}
    header.write_text(original)
    assert all(after[t] != before[t] for t in before)
    assert {u.tier: u.source_hash for u in declared_units(scaffolded)} == before


# ----------------------------------------------------------------------------- benchmark evidence


def _bench(spec: str, tier: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(options=SimpleNamespace(kernel_spec=spec, tier=tier))


def test_bench_evidence_on_an_avx2_only_cpu_names_the_unrun_avx512_tier(scaffolded, monkeypatch):
    monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", AVX2_ONLY_FLAGS)
    hashes = {u.tier: u.source_hash for u in declared_units(scaffolded)}
    payload = {"failures": [], "crash": None, "conditions": {"tier_ran": "avx2"}}
    evidence = {e["tier"]: e for e in bench_tier_evidence(_bench(str(scaffolded)), payload)}
    assert set(evidence) == {"generic", "avx2", "avx512"}
    assert evidence["avx2"]["executed"] and evidence["avx2"]["correct"] is True
    assert evidence["avx2"]["source_hash"] == hashes["avx2"]
    assert not evidence["avx512"]["executed"] and evidence["avx512"]["correct"] is None
    assert "lacks avx512" in evidence["avx512"]["reason"] and "avx512f" in evidence["avx512"]["reason"]
    assert "dispatcher chose another tier" in evidence["generic"]["reason"]
    assert all(set(e) >= {"tier", "executed", "reason", "correct", "cpu", "source_hash"}
               for e in evidence.values())
    note = unrun_tiers_note(list(evidence.values()))
    assert "avx512 (this CPU lacks avx512" in note and "--drop-unverified-tiers" in note


def test_bench_evidence_for_tier_all_marks_a_failing_tier_incorrect(scaffolded, monkeypatch):
    monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", AVX2_ONLY_FLAGS)
    payload = {"failures": [{"check": "values", "tier": "avx2", "input_set": "x"}], "crash": None,
               "tiers": {}}
    evidence = {e["tier"]: e for e in bench_tier_evidence(_bench(str(scaffolded), "all"), payload)}
    assert evidence["generic"]["executed"] and evidence["generic"]["correct"] is True
    assert evidence["avx2"]["executed"] and evidence["avx2"]["correct"] is False
    assert not evidence["avx512"]["executed"]


def test_bench_evidence_counts_a_gemm_avx512_unit_as_amx_only_where_its_amx_branches_ran(tmp_path, monkeypatch):
    """A GEMM package's avx512 section is built with -mamx-* (declared tier "amx"): the dispatcher
    runs it as avx512, so an avx512 run executes it, its AMX branches only on a CPU with AMX and
    without KERNEL_CPU_MASK=amx; otherwise the entry says which of the two kept them off."""
    directory = tmp_path / "tgemm"
    write_project(plan_project(ScaffoldOptions(ops=("linear",), name="tgemm", directory=directory)), force=False)
    assert [u.tier for u in declared_units(directory)] == ["generic", "avx2", "amx"]
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    avx512 = "avx avx2 fma f16c avx512f avx512bw avx512vl avx512dq"

    def amx_entry(flags: str, ran: str = "avx512") -> dict:
        monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", flags)
        payload = {"failures": [], "crash": None, "conditions": {"tier_ran": ran}}
        return {e["tier"]: e for e in bench_tier_evidence(_bench(str(directory)), payload)}["amx"]

    entry = amx_entry(f"{avx512} amx_tile amx_bf16 amx_int8")
    assert entry["executed"] and entry["correct"] is True and entry["ran_as"] == "avx512"
    entry = amx_entry(avx512)
    assert not entry["executed"] and "ran this unit but not its AMX branches" in entry["reason"]
    assert "amx_tile" in entry["reason"]
    monkeypatch.setenv("KERNEL_CPU_MASK", "amx")
    entry = amx_entry(f"{avx512} amx_tile amx_bf16 amx_int8")
    assert not entry["executed"] and "KERNEL_CPU_MASK lists amx" in entry["reason"]
    monkeypatch.delenv("KERNEL_CPU_MASK")
    entry = amx_entry(AVX2_ONLY_FLAGS, ran="avx2")
    assert not entry["executed"] and "avx512 tier's, which did not run" in entry["reason"]


def test_bench_evidence_after_a_crash_executes_nothing(scaffolded):
    payload = {"failures": [], "crash": {"kind": "SIGSEGV"}}
    evidence = bench_tier_evidence(_bench(str(scaffolded), "generic"), payload)
    assert [e["executed"] for e in evidence] == [False, False, False]
    assert all("crashed" in e["reason"] for e in evidence)


def test_bench_evidence_for_a_package_without_sources_or_build_record_has_no_hash_and_says_why(monkeypatch):
    monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", AVX2_ONLY_FLAGS)
    evidence = bench_tier_evidence(_bench("some_installed_kernel", "avx2"), {"failures": []})
    by_tier = {e["tier"]: e for e in evidence}
    assert by_tier["avx2"]["executed"] and by_tier["avx2"]["source_hash"] is None
    assert by_tier["avx2"]["source_hash_from"] is None
    reason = by_tier["avx2"]["source_hash_reason"]
    assert "installed package" in reason and "not found" in reason and "rebuild and reinstall" in reason


def test_a_build_without_the_unit_record_falls_back_to_the_sources_and_says_so(scaffolded, tmp_path):
    from kernel_harness.portability.resolve import resolve_units

    kernel = tmp_path / "tnorm"
    shutil.copytree(scaffolded, kernel)
    variant = kernel / "build" / "torch213-cxx11-cpu-x86_64-linux"
    variant.mkdir(parents=True)  # a build made before tier_units.json existed
    (variant / "metadata.json").write_text(json.dumps({"id": "_tnorm_cpu_0123456789"}))
    known = resolve_units(str(kernel), "_tnorm_cpu_0123456789")
    assert known.origin == "sources" and known.units == declared_units(kernel)
    assert "records no unit hashes" in known.notes[0] and "could not be checked" in known.notes[0]


# ----------------------------------------------------------------------------- QEMU


_AVX512_INSTRUCTION = textwrap.dedent("""
    import ctypes, mmap
    # vpxord zmm0, zmm0, zmm0 ; ret  -- an AVX512F instruction
    code = bytes([0x62, 0xF1, 0x7D, 0x48, 0xEF, 0xC0, 0xC3])
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()
    print("executed")
""")


@needs_qemu
def test_an_avx512_instruction_under_emulated_haswell_is_a_sigill_crash_naming_the_cpu(tmp_path):
    model = MODELS["haswell"]
    outcome = run_emulated(model, [sys.executable, "-c", _AVX512_INSTRUCTION], timeout=120, cwd=tmp_path)
    assert outcome.signal == "SIGILL", (outcome.returncode, outcome.stderr)
    assert not list(tmp_path.glob("*.core")), "QEMU must not leave core files behind"
    run = EmulatedRun(model=model, expected_tiers=["generic", "avx2"], outcome=outcome,
                      progress="[   1.0 s] calling my_kernel.rms_norm (tier dispatch) on set 0\n")
    judge(run)
    assert run.exit_code == 3
    assert "illegal instruction (SIGILL)" in run.crash and "Haswell" in run.crash
    assert "calling my_kernel.rms_norm (tier dispatch) on set 0" in run.crash


@pytest.fixture(scope="module")
def installed_catalogue(catalogue_kernel_dir: Path, tmp_path_factory) -> Path:
    """The catalogue build's wheel installed (pip --target) into a directory for PYTHONPATH:
    the installed-package form, with no sources anywhere near it."""
    (wheel,) = (catalogue_kernel_dir / "dist").glob("*.whl")
    target = tmp_path_factory.mktemp("site")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", str(wheel), "--no-deps", "--target", str(target),
                          "-q"], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    assert not (target / "harness_catalogue" / "build.toml").exists()
    return target


def _installed_env(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}


@pytest.fixture(scope="module")
def emulated(catalogue_kernel_dir: Path, installed_catalogue: Path, tmp_path_factory):
    """check_portability.py on the catalogue rms_norm, run once per model, side by side: Haswell on
    the kernel directory, Nehalem on the same build installed as the package harness_catalogue."""
    if qemu_binary() is None:
        pytest.skip("qemu-x86_64 is not installed (Debian package qemu-user)")
    jobs = {"haswell": (str(catalogue_kernel_dir), {}),
            "nehalem": ("harness_catalogue", _installed_env(installed_catalogue))}
    procs, outs = {}, {}
    for cpu, (spec, env) in jobs.items():
        outs[cpu] = tmp_path_factory.mktemp("qemu") / "portability.json"
        procs[cpu] = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "check_portability.py"), spec, "--baseline", str(RMS_BASELINE),
             "--op", "harness_catalogue.rms_norm", "--cpu", cpu, "--seed", "7", "--json", str(outs[cpu])],
            cwd=tmp_path_factory.mktemp("cwd"), env={**os.environ, **env}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
    runs = {}
    for cpu, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=1800)
        data = json.loads(outs[cpu].read_text()) if outs[cpu].is_file() else None
        runs[cpu] = SimpleNamespace(returncode=proc.returncode, stdout=stdout, stderr=stderr, data=data,
                                    run=((data or {}).get("runs") or [None])[0])
    return SimpleNamespace(runs=runs, kernel_dir=catalogue_kernel_dir)


@pytest.mark.slow
@needs_qemu
def test_emulated_haswell_dispatches_avx2_and_is_correct(emulated):
    haswell = emulated.runs["haswell"]
    assert haswell.returncode == 0, haswell.stdout + haswell.stderr
    run = haswell.run
    assert run["torch_capability"] == "AVX2"
    assert run["available_tiers"] == ["generic", "avx2"] == run["expected_tiers"]
    headline = run["dispatch"][0]
    assert headline["input_set"].startswith("get_inputs()") and headline["tier"] == "avx2"
    forced = {c["tier"] for c in run["checks"]}
    assert forced == {"dispatch", "generic", "avx2"}
    assert run["checks"] and all(c["correct"] for c in run["checks"])
    # every correctness input set of the baseline ran on every tier
    assert len(run["checks"]) == 3 * len(run["dispatch"]) and len(run["dispatch"]) > 10


@pytest.mark.slow
@needs_qemu
def test_emulated_nehalem_runs_the_installed_package_on_the_generic_tier_only(emulated, installed_catalogue):
    nehalem = emulated.runs["nehalem"]
    assert nehalem.returncode == 0, nehalem.stdout + nehalem.stderr
    run = nehalem.run
    assert run["ok"], run
    assert run["torch_capability"] == "DEFAULT"
    # the declared tiers come from the installed build's record: it must offer exactly generic here
    assert run["available_tiers"] == ["generic"] == run["expected_tiers"]
    assert {d["tier"] for d in run["dispatch"]} == {"generic"}
    assert all(c["correct"] for c in run["checks"])
    assert nehalem.data["kernel_package"] == "harness_catalogue"
    assert nehalem.data["unit_hashes"]["origin"] == "build"
    assert nehalem.data["unit_hashes"]["variant"] == str(installed_catalogue / "harness_catalogue")
    assert "note: unit hashes from the build's tier_units.json (installed package" in " ".join(nehalem.stdout.split())


@pytest.mark.slow
@needs_qemu
def test_emulated_runs_are_tier_evidence_with_the_unit_hashes(emulated):
    hashes = {u.tier: u.source_hash for u in declared_units(emulated.kernel_dir)}
    for cpu, label, ran_tiers in (("haswell", "QEMU Haswell (emulated)", {"generic", "avx2"}),
                                  ("nehalem", "QEMU Nehalem (emulated)", {"generic"})):
        evidence = emulated.runs[cpu].data["tier_evidence"]
        assert {(e["tier"], e["cpu"]) for e in evidence if e["executed"]} == {(t, label) for t in ran_tiers}
        # the directory's and the installed package's evidence name the same units: the
        # installed build's hashes come from its tier_units.json, the sources are not there
        for e in evidence:
            assert e["emulated"] is True and e["source_hash"] == hashes[e["tier"]], (cpu, e)
            assert e["source_hash_from"] == "build" and "stale_build" not in e
            if e["executed"]:
                assert e["correct"] is True and e["reason"] is None
        (avx512,) = [e for e in evidence if e["tier"] == "avx512"]
        assert not avx512["executed"] and avx512["reason"] == NO_AVX512_REASON
        assert "tier evidence (emulated)" in emulated.runs[cpu].stdout


def test_check_portability_refuses_a_wrong_op_package_before_emulating(scaffolded, script, tmp_path):
    proc = script("check_portability", scaffolded, "--baseline", RMS_BASELINE, "--op", "other.rms_norm",
                  cwd=tmp_path)
    assert proc.returncode == 2
    assert "names package 'other'" in proc.stderr and "--op tnorm.rms_norm" in proc.stderr


_SMALL_RMS_BASELINE = '''
import torch
EPS = 1e-6
def get_inputs():
    return [torch.randn(16, 256), 1.0 + 0.1 * torch.randn(256), EPS]
def get_correctness_inputs():
    return [[torch.randn(3, 7).to(torch.bfloat16), torch.randn(7).to(torch.bfloat16), EPS]]
def get_reference_output(x, weight, eps):
    xd = x.double()
    return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)
'''


@pytest.mark.slow
def test_benchmark_tier_all_on_an_avx2_host_records_evidence_and_names_the_unrun_avx512_tier(
        catalogue_kernel_dir, tmp_path):
    from kernel_harness.cpu import has_isa

    if not has_isa("avx2"):
        pytest.skip("this CPU has no AVX2, so it cannot stand in for an AVX2-only host")
    baseline = tmp_path / "baseline.py"
    baseline.write_text(_SMALL_RMS_BASELINE)
    out = tmp_path / "bench.json"
    # an AVX2-only host: the harness's flags and the kernel's own CPUID view agree
    env = {"KERNEL_HARNESS_CPU_FLAGS": AVX2_ONLY_FLAGS, "KERNEL_CPU_MASK": "avx512"}
    proc = run_script("benchmark_cpu", baseline, "--kernel-package", catalogue_kernel_dir, "--op",
                      "harness_catalogue.rms_norm", "--tier", "all", "--rounds", "3", "--calls", "3",
                      "--json", out, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    hashes = {u.tier: u.source_hash for u in declared_units(catalogue_kernel_dir)}
    evidence = {e["tier"]: e for e in report["tier_evidence"]}
    assert set(evidence) == {"generic", "avx2", "avx512"}
    for tier in ("generic", "avx2"):
        assert evidence[tier]["executed"] and evidence[tier]["correct"] is True
        assert evidence[tier]["source_hash"] == hashes[tier] and evidence[tier]["emulated"] is False
    assert not evidence["avx512"]["executed"] and evidence["avx512"]["source_hash"] == hashes["avx512"]
    assert "this CPU lacks avx512" in evidence["avx512"]["reason"]
    # the human report says which declared tier it could not run, and why
    assert "declared tiers not executed in this run: avx512 (this CPU lacks avx512" in " ".join(proc.stdout.split())


def _bench_one_tier(spec, baseline_dir: Path, *, env: dict | None = None):
    """benchmark_cpu.py on the widest tier this CPU runs, as small as a run can be."""
    from kernel_harness.portability.host import widest_tier

    tier = widest_tier()
    baseline = baseline_dir / "baseline.py"
    baseline.write_text(_SMALL_RMS_BASELINE)
    out = baseline_dir / "bench.json"
    proc = run_script("benchmark_cpu", baseline, "--kernel-package", spec, "--op", "harness_catalogue.rms_norm",
                      "--tier", tier, "--rounds", "3", "--calls", "3", "--json", out, cwd=baseline_dir, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    return tier, {e["tier"]: e for e in report["tier_evidence"]}, proc


@pytest.mark.slow
def test_benchmark_of_the_installed_package_records_the_unit_hashes_its_build_embedded(
        catalogue_kernel_dir, installed_catalogue, tmp_path):
    tier, evidence, _ = _bench_one_tier("harness_catalogue", tmp_path, env=_installed_env(installed_catalogue))
    hashes = {u.tier: u.source_hash for u in declared_units(catalogue_kernel_dir)}
    assert set(evidence) == set(hashes)
    for name, entry in evidence.items():
        # the package has no sources: the hashes are the build's own record, equal to the sources'
        assert entry["source_hash"] == hashes[name] and entry["source_hash_from"] == "build", entry
        assert "source_hash_reason" not in entry and "stale_build" not in entry
        assert entry["section"] == f"harness_catalogue_cpu{'' if name == 'generic' else '_' + name}"
    assert evidence[tier]["executed"] and evidence[tier]["correct"] is True


@pytest.mark.slow
def test_benchmark_of_a_stale_build_records_the_built_unit_and_says_the_sources_changed(
        catalogue_kernel_dir, tmp_path):
    from kernel_harness.portability.status import NEVER, tier_statuses

    kernel = tmp_path / "harness_catalogue"
    shutil.copytree(catalogue_kernel_dir, kernel, ignore=shutil.ignore_patterns("dist", "__pycache__", ".objs"))
    built = {u.tier: u.source_hash for u in declared_units(kernel)}
    from kernel_harness.portability.host import widest_tier

    edited = kernel / "harness_catalogue_cpu" / (
        "harness_catalogue_cpu.cpp" if widest_tier() == "generic" else f"harness_catalogue_{widest_tier()}.cpp")
    edited.write_text(edited.read_text() + "\n// edited after the build, never rebuilt\n")
    tier, evidence, proc = _bench_one_tier(kernel, tmp_path)
    now = {u.tier: u.source_hash for u in declared_units(kernel)}
    assert now[tier] != built[tier]
    ran = evidence[tier]
    # what ran is the build: its hash is recorded, and the entry says the sources moved on
    assert ran["executed"] and ran["source_hash"] == built[tier] and ran["source_hash_from"] == "build"
    assert "changed after the build" in ran["stale_build"] and edited.name in ran["stale_build"]
    assert all("stale_build" not in e for t, e in evidence.items() if t != tier)
    assert "stale build" in " ".join(proc.stdout.split())
    # so that run cannot verify the edited unit: publish's guard and finalize still see it unverified
    status = {s.unit.tier: s for s in tier_statuses(kernel, list(evidence.values()))}[tier]
    assert status.status == NEVER and "older unit" in status.note


def test_a_kernel_directory_without_its_sources_takes_the_hashes_from_its_build(tmp_path):
    from kernel_harness.portability.resolve import resolve_units
    from kernel_harness.portability.units import BUILT_UNITS_FILE, built_units_json

    source = tmp_path / "src" / "tnorm"
    write_project(plan_project(ScaffoldOptions(ops=("rms_norm",), name="tnorm", directory=source)), force=False)
    expected = declared_units(source)
    shipped = tmp_path / "shipped"  # build.toml and the build only, as some repositories ship them
    variant = shipped / "build" / "torch213-cxx11-cpu-x86_64-linux"
    variant.mkdir(parents=True)
    shutil.copy2(source / "build.toml", shipped / "build.toml")
    (variant / "metadata.json").write_text(json.dumps({"id": "_tnorm_cpu_0123456789"}))
    (variant / BUILT_UNITS_FILE).write_text(built_units_json(source, "_tnorm_cpu_0123456789"))
    known = resolve_units(str(shipped), "_tnorm_cpu_0123456789")
    assert known.origin == "build" and known.units == expected and not known.stale
    assert "sources build.toml lists are not in" in known.notes[0]
    # another build was loaded than the one this record describes: no hashes, and why
    other = resolve_units(str(shipped), "_tnorm_cpu_9999999999")
    assert other.units is None and "no build variant" in other.reason


# ----------------------------------------------------------------------------- advice for this host


def test_advice_targets_the_widest_tier_the_machine_runs_not_its_widest_flag():
    from test_machine import fake_profile

    from kernel_harness.analysis.strategy import simd_strategy
    from kernel_harness.portability.host import widest_tier
    from kernel_harness.profiling.profile import roofline_suggestions

    full = fake_profile()
    # Ice Lake: AVX512F/BW/VL/DQ without AVX512-BF16 runs the avx512 unit (its BF16
    # instructions sit behind a run-time test); Knights Landing (AVX512F, no BW/VL/DQ) does not
    ice_lake = fake_profile(flags=tuple(f for f in full.flags if f != "avx512_bf16"))
    knl = fake_profile(flags=tuple(f for f in full.flags if f not in ("avx512bw", "avx512vl", "avx512dq")))
    zen3 = fake_profile(flags=("avx2", "fma", "f16c"))
    assert widest_tier(full.has_flag) == "avx512" and widest_tier(ice_lake.has_flag) == "avx512"
    assert widest_tier(knl.has_flag) == "avx2" and widest_tier(zen3.has_flag) == "avx2"
    vec = simd_strategy("reduction", "norm", "bf16", knl, row_bytes=8192, name="rms_norm")["vector"]
    assert vec["vector_bits"] == 256 and vec["tier"] == "avx2" and "_mm512" not in vec["tail"]
    assert "lacks avx512bw, avx512dq, avx512vl" in vec["tier_note"] and "work in the avx2 unit" in vec["tier_note"]
    for machine in (full, ice_lake):
        assert simd_strategy("reduction", "norm", "bf16", machine, name="rms_norm")["vector"]["tier_note"] is None
    rp = {"output": {}, "roofline_fraction": 0.3, "thread_scaling": 1.9, "threads": 2, "bound": "memory",
          "achieved_gbs": 3.0, "limits": {"bandwidth_gbs": 10.0}, "dtype": "bf16", "time_us": 100.0,
          "time_1t_us": 190.0}
    for profile, expected in ((zen3, "256-bit loads in the avx2 unit"), (knl, "256-bit loads in the avx2 unit"),
                              (ice_lake, "512-bit loads in the avx512 unit"), (full, "512-bit loads in the avx512 unit")):
        steps = " ".join(s["next_step"] for s in roofline_suggestions(rp, profile, loaded=True))
        assert expected in steps
        assert ("512-bit" in steps) == (profile in (full, ice_lake))
