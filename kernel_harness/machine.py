"""The measured machine profile: what a kernel on *this* machine can reach.

``analyze_op.py`` turns FLOPs and bytes into a roofline floor, and
``cpu_profiler.py`` and the benchmark compare achieved numbers against the
same limits, so all of them read one cached :class:`MachineProfile`:

* topology and ISA from ``/proc/cpuinfo``, ``/sys/devices/system/cpu/cpu0/cache``
  and ``/sys/devices/system/node`` (cheap, read every time);
* peak arithmetic throughput (fp32 FMA with AVX512 and AVX2, the AVX512-BF16
  dot product, AMX bf16) from a small C++ probe (``probe/peak_probe.cpp``)
  compiled with plain ``g++`` into the cache directory and loaded with ctypes;
* memory bandwidth measured with torch, the library the kernels live in:
  streaming read, copy into a preallocated buffer and copy into a freshly
  allocated buffer.  The last one matters because a large output allocated per
  call is mmap'ed fresh by glibc and every page faults on first touch; on VMs
  that often halves the achievable bandwidth.

Measuring takes a few seconds (bounded well under 30 s), so the result is
cached under ``~/.cache/kernel_harness/machine/<key>.json`` with a key derived
from the CPU model, the ISA flags and the CPU count: moving to another
machine (or a VM with other flags) re-measures automatically, ``--refresh``
forces it.  ``KERNEL_HARNESS_MACHINE_CACHE`` points the cache elsewhere
(tests use it).

Bandwidth convention (as in STREAM): a copy of N bytes counts 2N bytes moved
(N read + N written); write-allocate traffic is not counted.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .atomic import atomic_write_json, exclusive_lock
from .native import PROBE_DIRECTORY, build_probe_library
from .stream_reader import LOCKSTEP, TORCH_SUM, StreamReader, try_stream_reader

# 2: the VDPBF16PS peak from 24 chains (12 under-read Zen 5 by 8 %): profiles of 1 are re-measured
# 3: read bandwidth is the faster of torch's sum and the lockstep reader (stream_reader.py; the sum
#    alone under-read a Zen 4 EPYC by up to 29 %): profiles of 2 are re-measured
SCHEMA_VERSION = 3
CACHE_ENV_VAR = "KERNEL_HARNESS_MACHINE_CACHE"
PROBE_SOURCE = PROBE_DIRECTORY / "peak_probe.cpp"

#: ISA flags worth reporting (``/proc/cpuinfo`` spelling).
INTERESTING_FLAGS: tuple[str, ...] = (
    "sse4_2", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512vbmi",
    "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
    "amx_tile", "amx_bf16", "amx_int8",
)

#: Peak kinds measured by the probe: name -> (probe kind id, flags it needs).
PEAK_KINDS: dict[str, tuple[int, tuple[str, ...]]] = {
    "fp32_fma_avx512": (0, ("avx512f",)),
    "fp32_fma_avx2": (1, ("avx2", "fma")),
    "bf16_dot_avx512": (2, ("avx512f", "avx512_bf16")),
    "amx_bf16": (3, ("amx_tile", "amx_bf16")),
}


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class CacheLevel:
    """One cache as seen by cpu0 (``size_bytes`` is the whole cache, ``shared_by`` CPUs share it)."""

    level: int
    type: str  # "Data", "Instruction" or "Unified"
    size_bytes: int
    shared_by: int
    line_bytes: int = 64


@dataclass(frozen=True)
class Peak:
    """Measured peak GFLOP/s of one instruction kind; ``None`` when not measured (no ISA/compiler)."""

    single_thread_gflops: float | None
    all_threads_gflops: float | None


@dataclass(frozen=True)
class Bandwidth:
    """Measured memory bandwidth in GB/s (1e9 bytes/s), bytes read + bytes written."""

    read_gbs: float
    copy_prealloc_gbs: float
    copy_fresh_gbs: float
    read_gbs_1t: float
    copy_prealloc_gbs_1t: float
    copy_fresh_gbs_1t: float
    buffer_bytes: int
    # which reader gave read_gbs / read_gbs_1t: stream_reader.TORCH_SUM or stream_reader.LOCKSTEP
    read_reader: str = TORCH_SUM
    read_reader_1t: str = TORCH_SUM


@dataclass(frozen=True)
class MachineProfile:
    """Everything the roofline needs about this machine (JSON round-trip: ``to_dict``/``from_dict``)."""

    schema_version: int
    cache_key: str
    cpu_model: str
    vendor: str
    flags: tuple[str, ...]  # the INTERESTING_FLAGS this CPU has
    logical_cpus: int
    physical_cores: int
    threads_per_core: int
    numa_nodes: int
    caches: tuple[CacheLevel, ...]
    peaks: dict[str, Peak]
    bandwidth: Bandwidth
    measured_at: str
    probe_seconds: float
    quick: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    # -- convenience accessors used by analysis / profiling -----------------
    def has_flag(self, flag: str) -> bool:
        return flag in self.flags

    def cache_bytes(self, level: int) -> int | None:
        """Data/unified cache size at ``level`` (L1 means L1d), or None when unknown."""
        for cache in self.caches:
            if cache.level == level and cache.type in ("Data", "Unified"):
                return cache.size_bytes
        return None

    def peak_gflops(self, kind: str, *, threads: str = "all") -> float | None:
        peak = self.peaks.get(kind)
        if peak is None:
            return None
        return peak.all_threads_gflops if threads == "all" else peak.single_thread_gflops

    def best_vector_fp32_gflops(self, *, threads: str = "all") -> float | None:
        """The fp32 FMA peak of the widest vector ISA measured (AVX512, else AVX2)."""
        for kind in ("fp32_fma_avx512", "fp32_fma_avx2"):
            value = self.peak_gflops(kind, threads=threads)
            if value:
                return value
        return None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["flags"] = list(self.flags)
        data["notes"] = list(self.notes)
        data["caches"] = [dataclasses.asdict(c) for c in self.caches]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachineProfile:
        return cls(
            schema_version=int(data["schema_version"]),
            cache_key=str(data["cache_key"]),
            cpu_model=str(data["cpu_model"]),
            vendor=str(data["vendor"]),
            flags=tuple(data["flags"]),
            logical_cpus=int(data["logical_cpus"]),
            physical_cores=int(data["physical_cores"]),
            threads_per_core=int(data["threads_per_core"]),
            numa_nodes=int(data["numa_nodes"]),
            caches=tuple(CacheLevel(**c) for c in data["caches"]),
            peaks={name: Peak(**p) for name, p in data["peaks"].items()},
            bandwidth=Bandwidth(**data["bandwidth"]),
            measured_at=str(data["measured_at"]),
            probe_seconds=float(data["probe_seconds"]),
            quick=bool(data.get("quick", False)),
            notes=tuple(data.get("notes", ())),
        )


# ------------------------------------------------------------------ static facts


@dataclass(frozen=True)
class CpuFacts:
    """What can be read without measuring; also the input of the cache key."""

    cpu_model: str
    vendor: str
    all_flags: frozenset[str]
    logical_cpus: int
    physical_cores: int
    threads_per_core: int
    numa_nodes: int
    caches: tuple[CacheLevel, ...]

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(f for f in INTERESTING_FLAGS if f in self.all_flags)

    def cache_key(self) -> str:
        """Stable key: model, sorted full flag set and CPU count, hashed to a short name."""
        material = "\n".join(
            [self.cpu_model, " ".join(sorted(self.all_flags)), str(self.logical_cpus), f"schema{SCHEMA_VERSION}"]
        )
        digest = hashlib.sha256(material.encode()).hexdigest()[:16]
        slug = re.sub(r"[^a-z0-9]+", "-", self.cpu_model.lower()).strip("-")[:40] or "cpu"
        return f"{slug}-{self.logical_cpus}cpu-{digest}"


def _cpu_flags() -> frozenset[str]:
    """The CPU flags via kernel_harness.cpu (honours its test override env var)."""
    try:
        from .cpu import cpu_flags
    except ImportError:  # the cpu module is owned elsewhere; read /proc/cpuinfo ourselves
        return _parse_cpuinfo(_read("/proc/cpuinfo")).get("flags", frozenset())
    return cpu_flags()


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _parse_cpuinfo(text: str) -> dict[str, Any]:
    """Model, vendor, flags and (physical id, core id) pairs from /proc/cpuinfo."""
    info: dict[str, Any] = {"cores": set(), "processors": 0}
    physical = core = None
    for line in text.splitlines() + [""]:
        if not line.strip():
            if physical is not None or core is not None:
                info["cores"].add((physical, core))
            physical = core = None
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            info["processors"] += 1
        elif key == "model name" and "model" not in info:
            info["model"] = value
        elif key == "vendor_id" and "vendor" not in info:
            info["vendor"] = value
        elif key in ("flags", "Features") and "flags" not in info:
            info["flags"] = frozenset(value.split())
        elif key == "physical id":
            physical = value
        elif key == "core id":
            core = value
    return info


def _parse_size(text: str) -> int:
    match = re.match(r"^\s*(\d+)\s*([KMG]?)", text)
    if not match:
        return 0
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[match.group(2)]
    return int(match.group(1)) * scale


def _count_cpu_list(text: str) -> int:
    total = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        total += (int(hi) - int(lo) + 1) if hi else 1
    return total


def read_caches(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> tuple[CacheLevel, ...]:
    caches = []
    for index in sorted(root.glob("index*")):
        level = _read(index / "level").strip()
        if not level.isdigit():
            continue
        caches.append(
            CacheLevel(
                level=int(level),
                type=_read(index / "type").strip() or "Unified",
                size_bytes=_parse_size(_read(index / "size")),
                shared_by=max(1, _count_cpu_list(_read(index / "shared_cpu_list"))),
                line_bytes=int(_read(index / "coherency_line_size").strip() or 64),
            )
        )
    return tuple(caches)


#: What code that needs a cache size assumes where sysfs lists none (the generated units'
#: kAssumedLastLevelCacheBytes): the L3 of the server cores this project has met.
ASSUMED_LLC_BYTES = 32 << 20


def last_level_cache_bytes(caches: tuple[CacheLevel, ...] | None = None) -> int | None:
    """The largest data or unified cache of the highest level (``read_caches()`` by default),
    or None when sysfs lists none: the size the generated units' bypass_caches_for() reads.
    (Not sysconf: glibc answers it from CPUID, which said 320 MiB for a 32 MiB L3 in a VM.)"""
    shared = [c for c in (read_caches() if caches is None else caches) if c.type != "Instruction" and c.size_bytes]
    if not shared:
        return None
    top = max(c.level for c in shared)
    return max(c.size_bytes for c in shared if c.level == top)


def last_level_cache_domains(cpus: set[int] | None = None,
                             root: Path = Path("/sys/devices/system/cpu")) -> int:
    """How many separate last-level caches ``cpus`` (this process's by default) spread over:
    an AMD EPYC has one L3 per core complex, so a process on two complexes sees two of the
    size ``last_level_cache_bytes()`` reports. 1 where sysfs does not say."""
    cpus = cpus if cpus is not None else (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set())
    domains = set()
    for cpu in cpus:
        indexes = [i for i in (root / f"cpu{cpu}" / "cache").glob("index*")
                   if _read(i / "level").strip().isdigit() and _read(i / "type").strip() != "Instruction"]
        if not indexes:
            continue
        top = max(indexes, key=lambda i: int(_read(i / "level").strip()))
        domains.add(_read(top / "shared_cpu_list").strip() or f"cpu{cpu}")
    return max(1, len(domains))


def read_cpu_facts() -> CpuFacts:
    info = _parse_cpuinfo(_read("/proc/cpuinfo"))
    logical = os.cpu_count() or info["processors"] or 1
    physical = len(info["cores"]) or logical
    nodes = len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or 1
    return CpuFacts(
        cpu_model=info.get("model", "unknown CPU"),
        vendor=info.get("vendor", "unknown"),
        all_flags=_cpu_flags(),
        logical_cpus=logical,
        physical_cores=physical,
        threads_per_core=max(1, logical // max(1, physical)),
        numa_nodes=nodes,
        caches=read_caches(),
    )


# --------------------------------------------------------------------- measuring


def cache_dir() -> Path:
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return Path(override).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kernel_harness" / "machine"


def measure_peaks(
    facts: CpuFacts, directory: Path, *, target_seconds: float, repeats: int, notes: list[str]
) -> dict[str, Peak]:
    peaks: dict[str, Peak] = {name: Peak(None, None) for name in PEAK_KINDS}
    try:
        library = ctypes.CDLL(str(build_probe_library(PROBE_SOURCE, directory)))
    except (OSError, RuntimeError, FileNotFoundError, subprocess.SubprocessError) as exc:
        notes.append(f"peak throughput not measured: {exc}")
        return peaks
    library.kh_peak_gflops.restype = ctypes.c_double
    library.kh_peak_gflops.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_int]
    library.kh_request_amx_permission.restype = ctypes.c_int
    for name, (kind, required) in PEAK_KINDS.items():
        missing = [flag for flag in required if flag not in facts.all_flags]
        if missing:
            notes.append(f"{name}: not measured, CPU lacks {', '.join(missing)}")
            continue
        if name == "amx_bf16" and library.kh_request_amx_permission() != 0:
            notes.append("amx_bf16: not measured, Linux refused arch_prctl(ARCH_REQ_XCOMP_PERM)")
            continue
        single = library.kh_peak_gflops(kind, 1, target_seconds, repeats)
        multi = library.kh_peak_gflops(kind, facts.logical_cpus, target_seconds, repeats)
        peaks[name] = Peak(round(single, 2) if single > 0 else None, round(multi, 2) if multi > 0 else None)
        if facts.logical_cpus > 1 and 0 < multi < 1.2 * single:
            notes.append(
                f"{name}: all threads reached only {multi / single:.2f}x one thread (shared execution "
                "unit, or other load on the machine during the probe; `--refresh` when idle to re-check)"
            )
    return peaks


def measure_bandwidth(facts: CpuFacts, *, quick: bool, reader: StreamReader | None = None) -> Bandwidth:
    """Best-of-N torch timings of read, copy into a preallocated buffer and copy into a fresh one.
    The read is the faster of torch's sum and, given a ``reader``, the lockstep read (see
    stream_reader.py: a floor must come from the fastest read we know)."""
    import torch  # imported here: reading the cached profile must not need torch

    llc = last_level_cache_bytes(facts.caches) or ASSUMED_LLC_BYTES
    if quick:
        nbytes = 64 * 1024**2
    else:
        # Twice the last-level cache so the stream cannot be served from it, within sane bounds.
        nbytes = min(max(2 * llc, 256 * 1024**2), 1024**3)
    count = nbytes // 4
    reps = 2 if quick else 4
    src = torch.ones(count, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.fill_(0.0)  # fault the preallocated destination in now, not inside the timing

    def best_of(fns: dict[str, Callable[[], object]]) -> dict[str, float]:
        """Each function's best time, the functions taking turns (a memory phase hits them all)."""
        for fn in fns.values():
            fn()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(reps):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        return {name: min(ts) for name, ts in times.items()}

    def best(fn: Callable[[], object]) -> float:
        return best_of({"": fn})[""]

    def fresh_copy() -> None:
        out = src.clone()  # new allocation: glibc mmaps it, every page faults on first write
        del out

    readers: dict[str, Callable[[], object]] = {TORCH_SUM: src.sum}
    if reader is not None:
        readers[LOCKSTEP] = lambda: reader.read([src])
    results: dict[str, float] = {}
    chosen: dict[str, str] = {}
    previous = torch.get_num_threads()
    try:
        for suffix, threads in (("", facts.logical_cpus), ("_1t", 1)):
            torch.set_num_threads(threads)
            rates = {name: nbytes / seconds / 1e9 for name, seconds in best_of(readers).items()}
            chosen[f"read_reader{suffix}"] = max(rates, key=lambda name: rates[name])
            results[f"read_gbs{suffix}"] = rates[chosen[f"read_reader{suffix}"]]
            results[f"copy_prealloc_gbs{suffix}"] = 2 * nbytes / best(lambda: dst.copy_(src)) / 1e9
            results[f"copy_fresh_gbs{suffix}"] = 2 * nbytes / best(fresh_copy) / 1e9
    finally:
        torch.set_num_threads(previous)
    del src, dst
    return Bandwidth(**{k: round(v, 2) for k, v in results.items()}, buffer_bytes=nbytes, **chosen)


def measure_machine_profile(*, quick: bool = False, facts: CpuFacts | None = None) -> MachineProfile:
    """Measure everything now (no cache). ``quick`` trades accuracy for ~2 s total (tests)."""
    facts = facts or read_cpu_facts()
    notes: list[str] = []
    started = time.perf_counter()
    peaks = measure_peaks(
        facts, cache_dir(), target_seconds=0.02 if quick else 0.05, repeats=1 if quick else 5, notes=notes
    )
    reader, missing = try_stream_reader(cache_dir())
    if missing:
        notes.append(f"read bandwidth: {missing}")
    bandwidth = measure_bandwidth(facts, quick=quick, reader=reader)
    if quick:
        notes.append("quick mode: short runs and 64 MiB buffers, numbers are rough")
    return MachineProfile(
        schema_version=SCHEMA_VERSION,
        cache_key=facts.cache_key(),
        cpu_model=facts.cpu_model,
        vendor=facts.vendor,
        flags=facts.flags,
        logical_cpus=facts.logical_cpus,
        physical_cores=facts.physical_cores,
        threads_per_core=facts.threads_per_core,
        numa_nodes=facts.numa_nodes,
        caches=facts.caches,
        peaks=peaks,
        bandwidth=bandwidth,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        probe_seconds=round(time.perf_counter() - started, 2),
        quick=quick,
        notes=tuple(notes),
    )


# ------------------------------------------------------------------------ cache


def cache_path(facts: CpuFacts | None = None) -> Path:
    facts = facts or read_cpu_facts()
    return cache_dir() / f"{facts.cache_key()}.json"


def load_cached_profile(facts: CpuFacts | None = None) -> MachineProfile | None:
    """The cached profile for this machine, or None when absent, stale-schema or unreadable."""
    path = cache_path(facts)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        profile = MachineProfile.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return profile if profile.schema_version == SCHEMA_VERSION else None


def store_profile(profile: MachineProfile) -> Path:
    path = cache_dir() / f"{profile.cache_key}.json"
    atomic_write_json(path, profile.to_dict())
    return path


def get_machine_profile(
    *, refresh: bool = False, quick: bool = False, on_measure: Callable[[], None] | None = None
) -> MachineProfile:
    """The cached profile of this machine, measuring (and caching) it on first use or ``refresh``.

    A lock serialises concurrent first uses, so two scripts started together
    measure once and do not disturb each other's timings.
    """
    facts = read_cpu_facts()
    if not refresh:
        cached = load_cached_profile(facts)
        if cached is not None:
            return cached
    with exclusive_lock(cache_dir() / ".probe.lock"):
        if not refresh:
            cached = load_cached_profile(facts)
            if cached is not None:
                return cached
        if on_measure is not None:
            on_measure()  # lets a script say why this first run takes a few seconds
        profile = measure_machine_profile(quick=quick, facts=facts)
        store_profile(profile)
        return profile


# -------------------------------------------------------------------------- CLI


def describe(profile: MachineProfile) -> list[str]:
    """Human-readable lines (used by ``python -m kernel_harness.machine`` and the scripts)."""
    def fmt(value: float | None, unit: str) -> str:
        return f"{value:,.1f} {unit}" if value else "n/a"

    lines = [
        f"CPU: {profile.cpu_model} ({profile.vendor}), {profile.physical_cores} cores / "
        f"{profile.logical_cpus} threads, {profile.numa_nodes} NUMA node(s)",
        f"ISA: {' '.join(profile.flags) or 'none of interest'}",
        "Caches: "
        + ", ".join(
            f"L{c.level}{'d' if c.type == 'Data' else 'i' if c.type == 'Instruction' else ''} "
            f"{c.size_bytes // 1024} KiB (shared by {c.shared_by})"
            for c in profile.caches
        ),
    ]
    for name, peak in profile.peaks.items():
        lines.append(
            f"Peak {name}: 1 thread {fmt(peak.single_thread_gflops, 'GFLOP/s')}, "
            f"all threads {fmt(peak.all_threads_gflops, 'GFLOP/s')}"
        )
    bw = profile.bandwidth
    lines.append(
        f"Memory bandwidth (all threads): read {bw.read_gbs:.1f} GB/s ({bw.read_reader}), copy into preallocated "
        f"{bw.copy_prealloc_gbs:.1f} GB/s, copy into fresh allocation {bw.copy_fresh_gbs:.1f} GB/s"
    )
    lines.append(
        f"Memory bandwidth (1 thread): read {bw.read_gbs_1t:.1f} GB/s ({bw.read_reader_1t}), copy into preallocated "
        f"{bw.copy_prealloc_gbs_1t:.1f} GB/s, copy into fresh allocation {bw.copy_fresh_gbs_1t:.1f} GB/s"
    )
    lines.append(
        f"Measured {profile.measured_at} in {profile.probe_seconds:.1f} s "
        f"(buffers {bw.buffer_bytes // 1024**2} MiB); cache key {profile.cache_key}"
    )
    lines.extend(f"Note: {note}" for note in profile.notes)
    return lines


def announce_measuring() -> None:
    """Tell the user (on stderr, so JSON/stdout stay clean) why this call takes a while."""
    from .cli import err_console

    err_console.print(
        f"Measuring this machine once (peak GFLOP/s and memory bandwidth, under 30 s); cached in {cache_dir()}.",
        soft_wrap=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import add_json_option, console, write_json_report

    parser = argparse.ArgumentParser(
        prog="python -m kernel_harness.machine",
        description="Print this machine's measured profile (peak GFLOP/s, memory bandwidth, caches, ISA). "
        f"Cached under {cache_dir()}.",
    )
    parser.add_argument("--refresh", action="store_true", help="measure again instead of using the cache")
    parser.add_argument("--quick", action="store_true", help="short, rough measurement (~2 s)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    profile = get_machine_profile(refresh=args.refresh, quick=args.quick, on_measure=announce_measuring)
    for line in describe(profile):
        console.print(line, soft_wrap=True)
    write_json_report(args.json, profile.to_dict())
    return 0


if __name__ == "__main__":
    from .cli import run_main

    run_main(main)
