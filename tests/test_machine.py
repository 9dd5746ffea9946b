"""kernel_harness.machine: parsing, the cached profile, and one real (quick) probe run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_harness import cpu, machine
from kernel_harness.machine import Bandwidth, CacheLevel, CpuFacts, MachineProfile, Peak

PROJECT_ROOT = Path(__file__).resolve().parent.parent

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse avx2 fma f16c avx512f amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse avx2 fma f16c avx512f amx_tile

processor\t: 2
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 1
flags\t\t: fpu sse avx2 fma f16c avx512f amx_tile
"""


def fake_profile(cache_key: str = "test-key", **overrides) -> MachineProfile:
    """A profile with round numbers, so roofline tests can be checked by hand."""
    data = dict(
        schema_version=machine.SCHEMA_VERSION,
        cache_key=cache_key,
        cpu_model="Test CPU",
        vendor="GenuineIntel",
        flags=("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
               "amx_tile", "amx_bf16", "amx_int8"),
        logical_cpus=2,
        physical_cores=2,
        threads_per_core=1,
        numa_nodes=1,
        caches=(CacheLevel(1, "Data", 48 * 1024, 1), CacheLevel(1, "Instruction", 32 * 1024, 1),
                CacheLevel(2, "Unified", 2 * 1024**2, 1), CacheLevel(3, "Unified", 32 * 1024**2, 2)),
        peaks={"fp32_fma_avx512": Peak(100.0, 200.0), "fp32_fma_avx2": Peak(50.0, 100.0),
               "bf16_dot_avx512": Peak(100.0, 200.0), "amx_bf16": Peak(1000.0, 2000.0)},
        bandwidth=Bandwidth(read_gbs=20.0, copy_prealloc_gbs=20.0, copy_fresh_gbs=5.0, read_gbs_1t=10.0,
                            copy_prealloc_gbs_1t=10.0, copy_fresh_gbs_1t=2.5, buffer_bytes=64 * 1024**2),
        measured_at="2026-01-01T00:00:00Z",
        probe_seconds=1.0,
    )
    data.update(overrides)
    return MachineProfile(**data)


def install_fake_profile(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> MachineProfile:
    """Point the cache at ``cache_dir`` and store a fake profile under this machine's real key."""
    monkeypatch.setenv(machine.CACHE_ENV_VAR, str(cache_dir))
    profile = fake_profile(cache_key=machine.read_cpu_facts().cache_key())
    machine.store_profile(profile)
    return profile


def test_parse_cpuinfo_counts_physical_cores() -> None:
    info = machine._parse_cpuinfo(CPUINFO)
    assert info["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert info["vendor"] == "GenuineIntel"
    assert "amx_tile" in info["flags"]
    assert info["processors"] == 3
    assert len(info["cores"]) == 2  # cpu0 and cpu1 are hyperthreads of core 0


def test_read_caches_from_sysfs_layout(tmp_path: Path) -> None:
    for index, (level, kind, size, shared) in enumerate(
        [("1", "Data", "48K", "0-1"), ("1", "Instruction", "32K", "0"), ("2", "Unified", "2048K", "0"),
         ("3", "Unified", "105M", "0-55,112-167")]
    ):
        d = tmp_path / f"index{index}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
        (d / "shared_cpu_list").write_text(shared + "\n")
        (d / "coherency_line_size").write_text("64\n")
    caches = machine.read_caches(tmp_path)
    assert [c.size_bytes for c in caches] == [48 * 1024, 32 * 1024, 2048 * 1024, 105 * 1024**2]
    assert caches[0].shared_by == 2 and caches[3].shared_by == 112


def test_profile_json_round_trip() -> None:
    profile = fake_profile()
    text = json.dumps(profile.to_dict())
    assert MachineProfile.from_dict(json.loads(text)) == profile
    assert profile.cache_bytes(1) == 48 * 1024  # L1d, not L1i
    assert profile.cache_bytes(3) == 32 * 1024**2
    assert profile.peak_gflops("amx_bf16", threads="1") == 1000.0
    assert profile.best_vector_fp32_gflops() == 200.0


def _facts(**overrides) -> CpuFacts:
    data = dict(cpu_model="X", vendor="V", all_flags=frozenset({"avx2", "fma"}), logical_cpus=4,
                physical_cores=2, threads_per_core=2, numa_nodes=1, caches=())
    data.update(overrides)
    return CpuFacts(**data)


def test_cache_key_depends_on_model_flags_and_cpu_count() -> None:
    base = _facts().cache_key()
    assert _facts().cache_key() == base
    assert _facts(all_flags=frozenset({"avx2", "fma", "avx512f"})).cache_key() != base
    assert _facts(cpu_model="Y").cache_key() != base
    assert _facts(logical_cpus=8).cache_key() != base


def test_cache_second_call_does_not_measure_refresh_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(machine.CACHE_ENV_VAR, str(tmp_path))
    calls: list[bool] = []

    def fake_measure(*, quick: bool = False, facts: CpuFacts | None = None) -> MachineProfile:
        calls.append(quick)
        return fake_profile(cache_key=(facts or machine.read_cpu_facts()).cache_key())

    monkeypatch.setattr(machine, "measure_machine_profile", fake_measure)
    first = machine.get_machine_profile()
    second = machine.get_machine_profile()
    assert len(calls) == 1 and first == second
    assert (tmp_path / f"{first.cache_key}.json").is_file()
    machine.get_machine_profile(refresh=True)
    assert len(calls) == 2
    # Other CPU flags (another machine / VM) -> another key -> measured again.
    monkeypatch.setenv(cpu.FLAGS_ENV_VAR, "sse avx2 fma")
    other = machine.get_machine_profile()
    assert len(calls) == 3 and other.cache_key != first.cache_key
    # A corrupt cache file is re-measured, not trusted.
    (tmp_path / f"{other.cache_key}.json").write_text("{not json")
    machine.get_machine_profile()
    assert len(calls) == 4


def test_cli_prints_cached_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_profile(tmp_path, monkeypatch)
    out = tmp_path / "m.json"
    run = subprocess.run([sys.executable, "-m", "kernel_harness.machine", "--json", str(out)],
                         cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    assert "Test CPU" in run.stdout and "copy into fresh allocation 5.0 GB/s" in run.stdout
    assert json.loads(out.read_text())["bandwidth"]["copy_prealloc_gbs"] == 20.0


def test_real_quick_probe_measures_within_budget(tmp_path: Path) -> None:
    """One real probe run: compiles the C++ probe, measures peaks and bandwidth, caches the result."""
    env = dict(os.environ, **{machine.CACHE_ENV_VAR: str(tmp_path)})
    out = tmp_path / "m.json"
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "kernel_harness.machine", "--refresh", "--quick", "--json", str(out)],
                         cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, env=env)
    elapsed = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    assert elapsed < 30, f"probe took {elapsed:.1f} s"
    data = json.loads(out.read_text())
    profile = MachineProfile.from_dict(data)
    assert profile.quick
    bw = profile.bandwidth
    assert bw.read_gbs > 0.1 and bw.copy_prealloc_gbs > 0.1 and bw.copy_fresh_gbs > 0.01
    # the lockstep reader compiled and took its turns beside torch's sum
    assert bw.read_reader in ("torch sum", "lockstep read")
    assert not any(note.startswith("read bandwidth:") for note in profile.notes), profile.notes
    if cpu.has_isa("avx2"):
        assert (profile.peak_gflops("fp32_fma_avx2", threads="1") or 0) > 1.0
    else:
        assert profile.peak_gflops("fp32_fma_avx2") is None
    if cpu.has_isa("avx512"):
        peak512 = profile.peak_gflops("fp32_fma_avx512", threads="1") or 0
        assert peak512 > 1.0
    if cpu.has_isa("avx512") and "avx512_bf16" in cpu.cpu_flags():
        assert (profile.peak_gflops("bf16_dot_avx512", threads="1") or 0) > 1.0
    if cpu.has_isa("amx"):
        amx = profile.peaks["amx_bf16"]
        # AMX is either measured (and far above the vector peak) or a note says why not.
        assert (amx.single_thread_gflops or 0) > 1.0 or any("amx" in n for n in profile.notes)
    assert list(tmp_path.glob("*.json")) and list(tmp_path.glob("peak_probe-*.so"))
    # The second call reads the cache: the same numbers, no re-measurement.
    again = subprocess.run([sys.executable, "-m", "kernel_harness.machine", "--json", str(out)],
                           cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert again.returncode == 0
    assert json.loads(out.read_text())["measured_at"] == data["measured_at"]
    assert "Measuring this machine" not in again.stderr and "Measuring this machine" in run.stderr


def test_last_level_cache_domains_counts_each_shared_l3_once(tmp_path: Path) -> None:
    """An EPYC has one L3 per core complex: CPUs 0-1 share one, 2-3 another. A process on
    CPUs 0, 1 and 2 spans two of them (the cache scrub must cover both); no sysfs: one."""
    from kernel_harness.machine import last_level_cache_domains

    for cpu in range(4):
        for index, (level, kind, shared) in enumerate(((1, "Data", str(cpu)), (1, "Instruction", str(cpu)),
                                                       (2, "Unified", str(cpu)),
                                                       (3, "Unified", "0-1" if cpu < 2 else "2-3"))):
            d = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
            d.mkdir(parents=True)
            (d / "level").write_text(f"{level}\n")
            (d / "type").write_text(f"{kind}\n")
            (d / "shared_cpu_list").write_text(f"{shared}\n")
    assert last_level_cache_domains({0, 1}, root=tmp_path) == 1
    assert last_level_cache_domains({0, 1, 2}, root=tmp_path) == 2
    assert last_level_cache_domains({7}, root=tmp_path) == 1


class _TimedReader:
    """A stand-in for the lockstep reader that takes ``seconds`` per read."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.reads = 0

    def read(self, tensors) -> int:
        self.reads += 1
        time.sleep(self.seconds)
        return 0


@pytest.mark.parametrize("seconds, expected", [(0.0, "lockstep read"), (0.3, "torch sum")])
def test_the_read_bandwidth_is_the_faster_reader(seconds: float, expected: str) -> None:
    """Both readers take turns on the same buffer and the faster one's rate is reported, with its
    name, for all threads and for one (a floor must come from the fastest read we know)."""
    reader = _TimedReader(seconds)
    bw = machine.measure_bandwidth(machine.read_cpu_facts(), quick=True, reader=reader)
    assert bw.read_reader == bw.read_reader_1t == expected
    assert reader.reads == 2 * 3  # one warm-up and two timed reads per thread count
    without = machine.measure_bandwidth(machine.read_cpu_facts(), quick=True)
    assert without.read_reader == without.read_reader_1t == "torch sum"
