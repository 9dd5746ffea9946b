"""cpu_profiler.py: perf stat parsing and interpretation, the no-counters path, the roofline profile."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kernel_harness.analysis.strategy import KNOWN_REFERENCE_IDS
from kernel_harness.errors import UsageError
from kernel_harness.profiling import (interpret, parse_annotate, parse_perf_stat, parse_report, perf_status,
                                      resolve_baseline, roofline_profile, roofline_suggestions, spill_findings,
                                      stack_vector_share)
from kernel_harness.profiling.hotspots import HotSymbol, is_stack_vector_access, kernel_rows, sampling_status
from test_machine import fake_profile, install_fake_profile

DATA = Path(__file__).resolve().parent / "data" / "analysis"
PYKERNELS = DATA / "pykernels"
SMALL_BASELINE = DATA / "small_rms_norm_baseline.py"

STREAMING = {"cycles": 7993118401.0, "instructions": 5271066183.0, "L1-dcache-loads": 1698540127.0,
             "L1-dcache-load-misses": 201117354.0, "LLC-loads": 98342117.0, "LLC-load-misses": 61203366.0,
             "branches": 402917731.0, "branch-misses": 48350127.0}


# ------------------------------------------------------------------ parsing real perf output


def test_parse_human_and_csv_formats_agree() -> None:
    human = parse_perf_stat((DATA / "perf_stat_streaming.txt").read_text())
    csv = parse_perf_stat((DATA / "perf_stat_streaming.csv").read_text())
    assert human.values == STREAMING and csv.values == STREAMING
    assert human.elapsed_seconds == pytest.approx(3.001911203)
    metrics = csv.metrics()
    assert metrics["ipc"] == pytest.approx(5271066183 / 7993118401)
    assert metrics["llc_miss_rate"] == pytest.approx(61203366 / 98342117)
    assert metrics["l1d_miss_rate"] == pytest.approx(0.1184, abs=1e-4)
    assert metrics["branch_miss_rate"] == pytest.approx(0.12, abs=1e-4)


def test_hybrid_cpu_lines_add_up() -> None:
    counters = parse_perf_stat((DATA / "perf_stat_hybrid.txt").read_text())
    assert counters.get("cycles") == 2.5e9 and counters.get("instructions") == 7e9
    assert counters.metrics()["ipc"] == pytest.approx(2.8)


@pytest.mark.parametrize("name", ["perf_stat_not_supported.txt", "perf_stat_not_supported.csv"])
def test_not_supported_counters(name: str) -> None:
    counters = parse_perf_stat((DATA / name).read_text())
    assert "cycles" in counters.values and counters.get("cycles") is None
    assert not counters.supported and interpret(counters) == []


# ------------------------------------------------------------------ interpretation


def test_low_ipc_fma_loop_is_not_called_memory_bound() -> None:
    findings = interpret(parse_perf_stat((DATA / "perf_stat_fma_loop.txt").read_text()))
    assert findings[0].finding.startswith("latency-bound")
    assert "not memory-bound" in findings[0].finding
    assert "multiple-accumulators" in findings[0].references
    # The same counters from a loop at 80% of the FMA peak: low IPC is expected there.
    saturated = interpret(parse_perf_stat((DATA / "perf_stat_fma_loop.txt").read_text()), compute_fraction=0.8)
    assert saturated[0].finding == "compute-bound at the vector peak"


def test_low_ipc_with_high_llc_misses_is_memory_bound_and_branches_flagged() -> None:
    findings = interpret(parse_perf_stat((DATA / "perf_stat_streaming.csv").read_text()))
    assert [f.finding for f in findings] == ["memory-bound (DRAM)", "branch mispredictions"]
    assert "non-temporal-stores" in findings[0].references and "masked-tail" in findings[1].references
    for finding in findings:
        assert set(finding.references) <= KNOWN_REFERENCE_IDS and finding.next_step


def test_high_ipc_is_instruction_bound() -> None:
    findings = interpret(parse_perf_stat((DATA / "perf_stat_hybrid.txt").read_text()))
    assert findings[0].finding == "instruction-bound"


def _fake_perf(tmp_path: Path, stderr: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    perf = bin_dir / "perf"
    perf.write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{stderr}\nEOF\nexit 0\n")
    perf.chmod(perf.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_perf_status_reports_unsupported_counters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = _fake_perf(tmp_path, (DATA / "perf_stat_not_supported.csv").read_text())
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    status = perf_status()
    assert not status.available and "not supported" in status.reason
    assert "\n" not in status.reason  # one line


def test_perf_status_with_working_counters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = _fake_perf(tmp_path, (DATA / "perf_stat_streaming.csv").read_text())
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert perf_status().available


def test_perf_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    status = perf_status()
    assert not status.available and "not installed" in status.reason


# ------------------------------------------------------------------ perf record: hot symbols and spills


def test_report_rows_keep_names_with_spaces_and_pick_the_kernel_library() -> None:
    """perf report -t TAB output (captured): demangled names with spaces and commas survive, and only
    the kernel's own library counts as the kernel."""
    rows = parse_report((DATA / "perf_report_dso_symbol.txt").read_text())
    assert rows[0].share == pytest.approx(0.487) and rows[0].dso == "_ar_cpu_16fbac97af.abi3.so"
    assert rows[1].symbol == "ar_cpu::avx512::add_rms_norm_blocks<true, false, ar_cpu::bf16_t>"
    mine = kernel_rows(rows, {"_ar_cpu_16fbac97af.abi3.so"})
    assert [r.symbol for r in mine][:1] == ["ar_cpu::avx512::add_rms_norm_rows<ar_cpu::bf16_t>"]
    assert all(r.dso == "_ar_cpu_16fbac97af.abi3.so" for r in mine)
    assert kernel_rows(rows, {"_other_kernel.abi3.so"}) == []


def test_spilling_loop_is_told_from_a_clean_one() -> None:
    """Captured perf annotate of the avx512 unit's bf16 add_rms_norm while kBf16 was a function-local
    static (its accumulators on the stack: 1.5x the time) against the avx2 rms_norm loop: the spill
    share separates them by far more than the threshold, and only the first gets the finding."""
    spilling = parse_annotate((DATA / "perf_annotate_spilling.txt").read_text())
    clean = parse_annotate((DATA / "perf_annotate_clean.txt").read_text())
    assert len(spilling) > 50 and len(clean) > 50
    assert stack_vector_share(spilling) > 0.4
    assert stack_vector_share(clean) < 0.03

    def hot(share: float) -> HotSymbol:
        return HotSymbol("f", "_k.so", 0.6, share)

    findings = spill_findings(hot(stack_vector_share(spilling)), 15000)
    assert [f.finding for f in findings] == ["spilled vectors in the hot loop"]
    assert "cpuid-xgetbv-detection" in findings[0].references
    assert set(findings[0].references) <= KNOWN_REFERENCE_IDS
    assert spill_findings(hot(stack_vector_share(clean)), 15000) == []
    assert spill_findings(None, 15000) == []


def test_rbp_counts_as_the_stack_only_as_the_frame_pointer() -> None:
    """GCC uses rbp as a general register unless the function set it up as its frame pointer: a load
    through it is then an input, not a spill."""
    load = "vmovups 0x20(%rbp),%ymm1"
    assert is_stack_vector_access(load, rbp_is_frame=True)
    assert not is_stack_vector_access(load, rbp_is_frame=False)
    assert is_stack_vector_access("vmovaps %zmm3,0x40(%rsp)", rbp_is_frame=False)
    assert not is_stack_vector_access("mov    0x8(%rsp),%rax", rbp_is_frame=True)  # not a vector
    lines = parse_annotate("   60.00 :   1000:  vmovups 0x20(%rbp),%ymm1\n   40.00 :   1004:  vaddps %ymm1,%ymm2,%ymm2\n")
    assert stack_vector_share(lines) == 0.0  # no `mov %rsp,%rbp`: rbp is a pointer here


def test_blocks_of_one_name_add_up_by_samples() -> None:
    """perf annotates every function of the name (a function and its OpenMP clone), each block in
    percent of its own samples: 50 samples of spills in one block must not weigh as much as 15000
    clean ones in the other. A prologue line printed without a percentage still marks rbp as the
    frame pointer."""
    text = ("Percent | Source code & Disassembly of k.so for cpu-clock (50 samples, percent: local period)\n"
            "         :   1000:  mov    %rsp,%rbp\n"
            "  100.00 :   1004:  vmovaps %zmm1,-0x40(%rbp)\n"
            "Percent | Source code & Disassembly of k.so for cpu-clock (15000 samples, percent: local period)\n"
            "   60.00 :   2000:  vfmadd231ps %zmm1,%zmm2,%zmm3\n"
            "   40.00 :   2004:  add    $0x40,%rax\n")
    lines = parse_annotate(text)
    assert len(lines) == 4 and lines[0].samples == 0.0
    assert stack_vector_share(lines) == pytest.approx(50 / 15050)
    assert stack_vector_share([]) is None


def test_spill_finding_needs_enough_samples_and_a_share() -> None:
    assert spill_findings(HotSymbol("f", "_k.so", 0.6, 0.5), 15000)
    assert spill_findings(HotSymbol("f", "_k.so", 0.01, 0.5), 15000) == []  # 150 samples: too few to judge
    assert spill_findings(HotSymbol("f", "_k.so", 0.6, None), 15000) == []  # annotate gave nothing


FAKE_SAMPLING_PERF = """#!/bin/sh
# Stands in for perf record/report/annotate with captured output (the spilling avx512 loop).
case "$1" in
  record) for a; do case "$prev" in -o) : > "$a" ;; esac; prev="$a"; done; exit 0 ;;
  report) printf '# Samples: 15K of event cpu-clock\\n'
          cat "{report}" ;;
  annotate) printf 'Percent | Source code & Disassembly of x for cpu-clock (15435 samples, percent: local period)\\n'
            cat "{annotate}" ;;
esac
exit 0
"""


def test_hottest_kernel_symbol_through_perf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampling chain (one report for the sample count and the rows, annotate of the kernel
    library's hottest function, the profile's hotspots fields) on a perf that replays captured
    output: the guarded loop is named and flagged."""
    from kernel_harness.profiling.hotspots import hottest_kernel_symbol, sampled_report, summarise_samples

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    perf = bin_dir / "perf"
    perf.write_text(FAKE_SAMPLING_PERF.format(report=DATA / "perf_report_dso_symbol.txt",
                                              annotate=DATA / "perf_annotate_spilling.txt"))
    perf.chmod(perf.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    data = tmp_path / "perf.data"
    data.write_text("")
    samples, rows = sampled_report(data)
    assert samples == 15000 and rows[0].symbol == "ar_cpu::avx512::add_rms_norm_rows<ar_cpu::bf16_t>"
    hot = hottest_kernel_symbol(data, rows, {"_ar_cpu_16fbac97af.abi3.so"})
    assert hot is not None and hot.symbol == "ar_cpu::avx512::add_rms_norm_rows<ar_cpu::bf16_t>"
    assert hot.stack_vector_share is not None and hot.stack_vector_share > 0.4
    assert [f.finding for f in spill_findings(hot, 15000)] == ["spilled vectors in the hot loop"]
    assert hottest_kernel_symbol(data, rows, {"_not_this_kernel.so"}) is None
    report = summarise_samples(data, ["_ar_cpu_16fbac97af.abi3.so"], "")
    assert report["available"] and report["samples"] == 15000
    assert report["hottest"]["symbol"] == hot.symbol
    assert [f["finding"] for f in report["findings"]] == ["spilled vectors in the hot loop"]
    missing = summarise_samples(tmp_path / "absent.data", [], "perf record exited 1: no such process")
    assert missing == {"available": False, "reason": "perf record exited 1: no such process"}


def test_sampling_status_without_perf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    status = sampling_status()
    assert not status.available and "not installed" in status.reason


def test_sampling_status_when_perf_writes_no_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A perf that exits 0 but writes no data file (as the counter-replaying fakes do) is not sampling."""
    bin_dir = _fake_perf(tmp_path, (DATA / "perf_stat_streaming.csv").read_text())
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    status = sampling_status()
    assert not status.available and "no samples" in status.reason and "\n" not in status.reason


# ------------------------------------------------------------------ roofline profile arithmetic


def _measured(t_all: float, t_one: float, *, with_out: float | None = None) -> dict:
    data = {"threads": 2, "output_bytes": 4 * 1024**2, "output_is_single_tensor": True,
            "all_threads": {"median_us": t_all}, "one_thread": {"median_us": t_one},
            "accepts_out": with_out is not None,
            "alloc_touch": {"median_us": 900.0}, "touch_prealloc": {"median_us": 200.0}}
    if with_out is not None:
        data["with_out"] = {"median_us": with_out}
    return data


def test_roofline_profile_hand_computed() -> None:
    # 8 MB moved in 1000 us = 8 GB/s of the fake profile's 20 GB/s; floor = 8e6 / 20e3 = 400 us.
    rp = roofline_profile(_measured(1000.0, 1800.0, with_out=500.0), flops=4e6, nbytes=8e6, kind="reduction",
                          dtype="fp32", machine=fake_profile())
    assert rp["achieved_gbs"] == pytest.approx(8.0) and rp["bandwidth_fraction"] == pytest.approx(0.4)
    assert rp["achieved_gflops"] == pytest.approx(4.0) and rp["compute_fraction"] == pytest.approx(0.02)
    assert rp["floor_time_us"] == pytest.approx(400.0) and rp["roofline_fraction"] == pytest.approx(0.4)
    assert rp["thread_scaling"] == pytest.approx(1.8) and rp["bound"] == "memory"
    assert rp["output"]["alloc_overhead_us"] == pytest.approx(500.0)  # op(x) - op(x, out=buf)
    assert rp["output"]["alloc_share"] == pytest.approx(0.5)
    suggestions = roofline_suggestions(rp, fake_profile())
    assert "out=" in suggestions[0]["next_step"]
    assert {"first-touch-page-faults", "out-parameter-api"} <= set(suggestions[0]["references"])


def test_compute_fraction_is_of_the_peak_of_the_tier_the_kernel_runs(monkeypatch) -> None:
    """A kernel forced to (or dispatched to) its AVX2 unit is measured against the AVX2
    FMA peak: against the AVX512 peak its compute fraction would read half as high."""
    from kernel_harness.profiling.profile import running_tier

    machine = fake_profile()
    args = dict(flops=4e6, nbytes=8e6, kind="gemm", dtype="fp32", machine=machine, gemm_m=64)
    avx2 = roofline_profile(_measured(1000.0, 1800.0), tier="avx2", **args)
    avx512 = roofline_profile(_measured(1000.0, 1800.0), tier="avx512", **args)
    assert avx2["limits"]["peak_source"] == "fp32_fma_avx2" and avx2["limits"]["tier"] == "avx2"
    assert avx2["compute_fraction"] == pytest.approx(4.0 / machine.peak_gflops("fp32_fma_avx2"))
    assert avx2["compute_fraction"] > avx512["compute_fraction"]
    monkeypatch.setenv("KERNEL_CPU_ISA", "avx2")
    assert running_tier(machine) == "avx2"
    monkeypatch.delenv("KERNEL_CPU_ISA")
    assert running_tier(machine) == "avx512"  # the fake machine has AVX512 F/BW/VL/DQ


def test_alloc_cost_without_out_parameter_uses_empty_plus_touch() -> None:
    rp = roofline_profile(_measured(1000.0, 1900.0), flops=0.0, nbytes=8e6, kind="elementwise", dtype="fp32",
                          machine=fake_profile())
    assert rp["output"]["alloc_overhead_us"] == pytest.approx(700.0)  # 900 - 200
    assert "first touch" in rp["output"]["alloc_method"]


def test_poor_scaling_suggests_threading() -> None:
    rp = roofline_profile(_measured(1000.0, 1050.0, with_out=990.0), flops=1e6, nbytes=8e6, kind="reduction",
                          dtype="fp32", machine=fake_profile())
    steps = roofline_suggestions(rp, fake_profile())
    assert any("omp-row-parallel" in s["references"] for s in steps)


def test_threads_slower_than_one_suggests_a_threshold_not_more_threads() -> None:
    rp = roofline_profile(_measured(300.0, 100.0, with_out=290.0), flops=1e5, nbytes=1e6, kind="elementwise",
                          dtype="fp32", machine=fake_profile())
    steps = roofline_suggestions(rp, fake_profile())
    threading = [s for s in steps if "omp-small-size-threshold" in s["references"]]
    assert threading and "slower than one" in threading[0]["why"]
    assert not any("omp-row-parallel" in s["references"] for s in steps)
    # Measured on a loaded machine, scaling says nothing about the kernel: no threading advice.
    loaded = roofline_suggestions(rp, fake_profile(), loaded=True)
    assert not any("level-threading" in s["references"] for s in loaded)


def test_resolve_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_baseline("pkg.fn", SMALL_BASELINE)[0] == SMALL_BASELINE
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError):
        resolve_baseline("pkg.not_an_example_op", None)
    tree = tmp_path / "trials" / "my_kernel"
    tree.mkdir(parents=True)
    (tree / "baseline.py").write_text("")
    assert resolve_baseline("pkg.not_an_example_op", None)[0] == tree / "baseline.py"
    # A shipped example wins over the trial tree when the function name matches it.
    if (DATA.parent.parent.parent / "examples" / "rms_norm" / "baseline.py").is_file():
        assert resolve_baseline("pkg.rms_norm", None)[0].parent.name == "rms_norm"


# ------------------------------------------------------------------ the script end to end


def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, vtune: bool = False) -> None:
    install_fake_profile(tmp_path / "machine", monkeypatch)
    monkeypatch.setenv("PYTHONPATH", str(PYKERNELS))
    config = tmp_path / "config.yaml"
    config.write_text(
        "max_trials: 4\nearly_stop_speedup: 10.0\nperf_stat_enabled: true\n"
        f"vtune_enabled: {'true' if vtune else 'false'}\nvtune_bin: definitely-not-vtune-here\n"
        'build_command: "true"\ninstall_command: "true"\n'
    )
    monkeypatch.setenv("KERNEL_HARNESS_CONFIG", str(config))


def test_profiler_script_roofline_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script) -> None:
    _env(tmp_path, monkeypatch, vtune=True)
    out = tmp_path / "p.json"
    run = script("cpu_profiler", "--kernel-package", "kh_torch_kernel", "--op", "kh_torch_kernel.rms_norm",
                 "--baseline", SMALL_BASELINE, "--seconds", "0.1", "--json", out, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert set(data) >= {"schema_version", "kernel_package", "op", "baseline", "perf", "vtune", "roofline_profile",
                         "suggestions", "next_step", "notes"}
    status = perf_status()
    assert data["perf"]["available"] == status.available
    # Sampling needs no counters: where perf record works, the kernel's hottest function is named.
    hotspots = data["hotspots"]
    assert hotspots["available"] == sampling_status().available
    if hotspots["available"]:
        assert hotspots["samples"] > 0 and "perf record (" in run.stdout
        assert hotspots["hottest"] is None or 0.0 <= hotspots["hottest"]["stack_vector_share"] <= 1.0
    else:
        assert "perf record: no samples" in run.stdout
    if not status.available:
        # One plain line about the counters, then the roofline profile.
        assert "perf stat: no counters" in run.stdout
        assert len([ln for ln in run.stdout.splitlines() if "perf stat" in ln]) == 1
    rp = data["roofline_profile"]
    assert rp["kind"] == "reduction" and rp["dtype"] == "fp32"
    assert rp["bytes"] == (2 * 256 * 1024 + 1024) * 4
    assert rp["time_us"] > 0 and rp["time_1t_us"] > 0 and rp["thread_scaling"] > 0
    assert rp["output"]["accepts_out"] is True and rp["output"]["alloc_overhead_us"] is not None
    assert data["vtune"]["enabled"] and not data["vtune"]["ran"] and "not found" in data["vtune"]["note"]
    assert data["next_step"] and all(set(s["references"]) <= KNOWN_REFERENCE_IDS for s in data["suggestions"])


FAKE_ATTACHING_PERF = """#!/bin/sh
# Stands in for `perf stat -x, -e ... -p PID -- sleep S` on a machine with counters:
# waits the window like the real one, then prints captured counters on stderr.
for last; do :; done
case "$*" in
  *" -p "*) sleep "$last" ;;
esac
cat "{fixture}" >&2
exit 0
"""


def test_profiler_script_counters_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script) -> None:
    """With counters (a fake perf replaying captured -x, output): findings lead the suggestions."""
    _env(tmp_path, monkeypatch)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    perf = bin_dir / "perf"
    perf.write_text(FAKE_ATTACHING_PERF.format(fixture=DATA / "perf_stat_streaming.csv"))
    perf.chmod(perf.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "p.json"
    run = script("cpu_profiler", "--kernel-package", "kh_torch_kernel", "--op", "kh_torch_kernel.softmax",
                 "--baseline", SMALL_BASELINE.with_name("small_softmax_baseline.py"), "--seconds", "0.1",
                 "--json", out, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    perf_report = data["perf"]
    assert perf_report["available"] is True
    assert perf_report["metrics"]["llc_miss_rate"] == pytest.approx(0.6224, abs=1e-4)
    assert [f["finding"] for f in perf_report["findings"]] == ["memory-bound (DRAM)", "branch mispredictions"]
    assert perf_report["per_call"]["cycles"] > 0
    assert data["suggestions"][0]["why"].startswith("memory-bound (DRAM)")
    assert "IPC 0.66" in run.stdout


def test_profiler_crashing_kernel_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script) -> None:
    _env(tmp_path, monkeypatch)
    monkeypatch.setenv("KERNEL_HARNESS_CONFIG", str(tmp_path / "config.yaml"))
    cfg = (tmp_path / "config.yaml").read_text().replace("perf_stat_enabled: true", "perf_stat_enabled: false")
    (tmp_path / "config.yaml").write_text(cfg)
    run = script("cpu_profiler", "--kernel-package", "kh_torch_kernel", "--op", "kh_torch_kernel.crash",
                 "--baseline", SMALL_BASELINE, "--seconds", "0.1", cwd=tmp_path)
    assert run.returncode == 3, run.stderr
    assert "Traceback" not in run.stderr


def test_profiler_unknown_package_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script) -> None:
    _env(tmp_path, monkeypatch)
    run = script("cpu_profiler", "--kernel-package", "no_such_kernel_pkg", "--op", "no_such_kernel_pkg.rms_norm",
                 "--baseline", SMALL_BASELINE, "--seconds", "0.1", cwd=tmp_path)
    assert run.returncode == 3 and "not installed" in run.stderr


@pytest.mark.slow
def test_profiler_on_the_catalogue_kernel(request: pytest.FixtureRequest, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, script) -> None:
    """The real built kernel (shared session fixture), when the fixture module exists."""
    try:
        kernel_dir = request.getfixturevalue("catalogue_kernel_dir")
    except pytest.FixtureLookupError:
        pytest.skip("tests/fixtures_kernels.py (catalogue_kernel_dir) is not there yet")
    _env(tmp_path, monkeypatch)
    out = tmp_path / "p.json"
    run = script("cpu_profiler", "--kernel-package", kernel_dir, "--op", "harness_catalogue.rms_norm",
                 "--seconds", "0.2", "--json", out, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert data["roofline_profile"]["achieved_gbs"] > 0


def test_the_profiled_calls_rotate_the_persistent_inputs() -> None:
    """The child's timings and its perf loop call the op on each input list in turn, so with
    the baseline's PERSISTENT_INPUTS rotated (bench/eviction.py) no call finds its weight
    where the previous one left it; the measure payload says how many copies."""
    import torch

    from kernel_harness.bench.eviction import rotated_sets
    from kernel_harness.profiling.child import loop, measure

    x, w = torch.randn(4, 8), torch.randn(1 << 18)
    sets = rotated_sets([x, w], (1,), llc_bytes=1 << 20)
    seen: list[int] = []

    def op(a, b, out=None):
        seen.append(b.data_ptr())
        return a * b[:8]

    result = measure(op, sets, seconds=0.01)
    assert result["input_copies"] == len(sets) == 3
    assert set(seen) == {s[1].data_ptr() for s in sets}
    assert all(a != b for a, b in zip(seen, seen[1:]))  # never the same weight twice in a row
    seen.clear()
    loop(op, sets, seconds=0.01)
    assert len(set(seen)) == 3 and all(a != b for a, b in zip(seen, seen[1:]))
