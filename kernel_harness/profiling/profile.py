"""``cpu_profiler.py``: counters when the machine has them, the roofline profile always.

Procedure step 9 wants the profile read and the next change chosen.  Hardware
counters are the best evidence, but many VMs (this one included) expose none,
so the report always carries a *roofline profile* measured in a child
process: achieved GB/s and GFLOP/s against the machine probe's limits, the
share of the call spent allocating and first-touching the output, and the
1-thread vs all-thread scaling.  Each finding maps to one next step and the
reference entries that explain it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..analysis.roofline import choose_limits
from ..analysis.strategy import PARALLEL_MIN_US, check_reference_ids
from ..analysis.trace import TraceError, trace_baseline
from ..bench.process import with_steady_malloc
from ..config import Config
from ..errors import ExitCode, KernelCrashed, UsageError
from ..machine import MachineProfile
from ..paths import EXAMPLES_DIR, PROJECT_ROOT
from ..portability.host import TIER_BITS, widest_tier
from .hotspots import record_attached, sampling_status, summarise_samples
from .perfstat import EVENTS, PerfCounters, interpret, perf_status, run_perf_stat_attached

SCHEMA_VERSION = 1
CHILD_TIMEOUT_S = 300
PERF_WINDOW_S = 3.0


def resolve_baseline(op_path: str, baseline: Path | None) -> tuple[Path, str]:
    """The baseline whose inputs drive the op: --baseline, a shipped example, or the one trial tree here."""
    if baseline is not None:
        if not Path(baseline).is_file():
            raise UsageError(f"--baseline {baseline} does not exist. Pass the baseline.py of this op.")
        return Path(baseline), "--baseline"
    function = op_path.rpartition(".")[2]
    example = EXAMPLES_DIR / function / "baseline.py"
    if example.is_file():
        return example, f"the shipped example for {function!r}"
    trees = sorted(Path.cwd().glob("trials/*/baseline.py"))
    if len(trees) == 1:
        return trees[0], f"the only trial tree here ({trees[0].parent.name})"
    raise UsageError(
        f"cpu_profiler.py needs inputs for {op_path}: pass --baseline baseline.py (the file given to "
        "trial_manager.py init). No shipped example matches the function name"
        + (f" and {len(trees)} trial trees exist under ./trials" if trees else "")
        + "."
    )


def _child_env() -> dict[str, str]:
    # the allocator steady state the benchmark times in (see STEADY_MALLOC_ENV),
    # so the profile explains the time the benchmark reports
    env = with_steady_malloc(dict(os.environ))
    env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _child_cmd(kernel_package: str, op: str, baseline: Path, mode: str, seconds: float, result: Path) -> list[str]:
    return [sys.executable, "-m", "kernel_harness.profiling.child", "--kernel-package", kernel_package,
            "--op", op, "--baseline", str(baseline), "--mode", mode, "--seconds", f"{seconds:g}",
            "--result", str(result)]


def _read_child_result(result: Path, returncode: int, stderr: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tail = " ".join(stderr.strip().splitlines()[-3:])
        try:
            status = f"was killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with status {returncode}"
        except ValueError:
            status = f"exited with status {returncode}"
        raise KernelCrashed(
            f"The kernel process {what} {status} without a result "
            f"(crashed? {tail or 'no stderr'}). Run scripts/benchmark_cpu.py for the correctness check "
            "and fix the crash before profiling."
        ) from None
    if not data.get("ok"):
        code = ExitCode(data.get("exit_code", 3)) if data.get("exit_code") in (1, 2, 3) else ExitCode.KERNEL_CRASHED
        error = UsageError if code == ExitCode.BAD_INPUT else KernelCrashed
        raise error(f"Profiling {what} failed: {data.get('error')}")
    return data


def measure_in_child(kernel_package: str, op: str, baseline: Path, *, seconds: float = 0.5) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kh-profile-") as tmp:
        result = Path(tmp) / "result.json"
        try:
            run = subprocess.run(_child_cmd(kernel_package, op, baseline, "measure", seconds, result),
                                 capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=_child_env())
        except subprocess.TimeoutExpired:
            raise KernelCrashed(f"{op} did not finish {CHILD_TIMEOUT_S} s of profiling calls: it hangs or is "
                                "far slower than expected. Check loop bounds and OpenMP barriers.") from None
        return _read_child_result(result, run.returncode, run.stderr, f"for {op}")


def perf_in_child(kernel_package: str, op: str, baseline: Path, *, counters: bool,
                  samples: Path | None) -> tuple[tuple[PerfCounters, str] | None, str, dict[str, Any]]:
    """Run the op in a loop in one child and, after warm-up, attach ``perf stat -p`` for a window
    (``counters``), then ``perf record -p`` for another into ``samples`` (when given). Returns perf
    stat's counters and raw text (or None), perf record's complaint ("" when it ran) and the child's
    loop report."""
    windows = int(counters) + int(samples is not None)
    with tempfile.TemporaryDirectory(prefix="kh-perf-") as tmp:
        result = Path(tmp) / "result.json"
        child = subprocess.Popen(_child_cmd(kernel_package, op, baseline, "loop", windows * PERF_WINDOW_S + 2.0,
                                            result),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env())
        try:
            deadline = time.monotonic() + CHILD_TIMEOUT_S
            line = ""
            while time.monotonic() < deadline:
                line = child.stdout.readline() if child.stdout else ""
                if not line or line.strip() == "READY":
                    break
            if line.strip() != "READY":
                child.wait(timeout=30)
                _read_child_result(result, child.returncode or 0, child.stderr.read() if child.stderr else "",
                                   f"for {op} (perf loop)")
                raise KernelCrashed(f"{op} never became ready for perf.")
            stat = run_perf_stat_attached(child.pid, PERF_WINDOW_S) if counters else None
            complaint = record_attached(child.pid, PERF_WINDOW_S, samples) if samples is not None else ""
            child.wait(timeout=CHILD_TIMEOUT_S)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        info = _read_child_result(result, child.returncode or 0, child.stderr.read() if child.stderr else "",
                                  f"for {op} (perf loop)")
        return stat, complaint, info


def run_vtune(config: Config, kernel_package: str, op: str, baseline: Path) -> dict[str, Any]:
    if not config.vtune_enabled:
        return {"enabled": False, "ran": False, "note": "VTune disabled (vtune_enabled: false in the config)"}
    binary = shutil.which(config.vtune_bin) or (config.vtune_bin if Path(config.vtune_bin).is_file() else None)
    if binary is None:
        return {"enabled": True, "ran": False,
                "note": f"vtune_enabled is true but {config.vtune_bin!r} was not found; install Intel VTune "
                        "(oneAPI) or set vtune_bin to its full path"}
    result_dir = Path(tempfile.mkdtemp(prefix="kh-vtune-"))
    with tempfile.TemporaryDirectory(prefix="kh-vtune-child-") as tmp:
        cmd = [binary, "-collect", "hotspots", "-result-dir", str(result_dir / "r"), "--",
               *_child_cmd(kernel_package, op, baseline, "loop", 5.0, Path(tmp) / "result.json")]
        collect = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=_child_env())
    if collect.returncode != 0:
        return {"enabled": True, "ran": False, "result_dir": str(result_dir),
                "note": f"vtune -collect hotspots failed: {collect.stderr.strip()[-400:]}"}
    report = subprocess.run([binary, "-report", "hotspots", "-result-dir", str(result_dir / "r")],
                            capture_output=True, text=True, timeout=120)
    return {"enabled": True, "ran": True, "result_dir": str(result_dir / "r"),
            "report_excerpt": "\n".join(report.stdout.splitlines()[:25]),
            "note": f"open the full result with: {binary} -report hotspots -result-dir {result_dir / 'r'}"}


def running_tier(machine: MachineProfile) -> str:
    """The SIMD tier a generated kernel runs in the profiled child: the one forced
    through KERNEL_CPU_ISA (inherited by the child), else the dispatcher's pick here."""
    forced = os.environ.get("KERNEL_CPU_ISA", "").strip().lower()
    return forced if forced in TIER_BITS else widest_tier(machine.has_flag)


def roofline_profile(measured: dict[str, Any], *, flops: float, nbytes: float, kind: str, dtype: str,
                     machine: MachineProfile, gemm_m: int | None = None,
                     tier: str | None = None) -> dict[str, Any]:
    """Achieved vs attainable, allocation share and thread scaling from the child's timings;
    the compute ceiling is the peak of the SIMD ``tier`` the kernel runs."""
    limits = choose_limits(machine, kind=kind, dtype=dtype, m=gemm_m, tier=tier)
    t_all = measured["all_threads"]["median_us"]
    t_one = measured["one_thread"]["median_us"]
    achieved_gbs = nbytes / (t_all * 1e3) if t_all else 0.0
    achieved_gflops = flops / (t_all * 1e3) if t_all else 0.0
    compute_us = flops / (limits.peak_gflops * 1e3)
    memory_us = nbytes / (limits.bandwidth_gbs * 1e3)
    floor_us = max(compute_us, memory_us)
    output: dict[str, Any] = {"bytes": measured.get("output_bytes", 0), "accepts_out": measured.get("accepts_out", False)}
    alloc_us = None
    if measured.get("accepts_out") and "with_out" in measured:
        output["time_with_out_us"] = measured["with_out"]["median_us"]
        alloc_us = max(0.0, t_all - output["time_with_out_us"])
        output["alloc_method"] = "op(x) vs op(x, out=preallocated)"
    if "alloc_touch" in measured:
        output["alloc_touch_us"] = measured["alloc_touch"]["median_us"]
        output["touch_prealloc_us"] = measured["touch_prealloc"]["median_us"]
        if alloc_us is None:
            alloc_us = max(0.0, output["alloc_touch_us"] - output["touch_prealloc_us"])
            output["alloc_method"] = "torch.empty + first touch vs writing a warm buffer of the output's size"
    output["alloc_overhead_us"] = alloc_us
    output["alloc_share"] = (alloc_us / t_all) if alloc_us is not None and t_all else None
    return {
        "kind": kind,
        "dtype": dtype,
        "flops": flops,
        "bytes": nbytes,
        "time_us": t_all,
        "time_1t_us": t_one,
        "threads": measured.get("threads"),
        "thread_scaling": (t_one / t_all) if t_all else None,
        "achieved_gbs": achieved_gbs,
        "achieved_gflops": achieved_gflops,
        "limits": {"bandwidth_gbs": limits.bandwidth_gbs, "peak_gflops": limits.peak_gflops,
                   "peak_source": limits.peak_source, "fresh_output_gbs": limits.fresh_output_gbs,
                   "tier": tier},
        "bandwidth_fraction": achieved_gbs / limits.bandwidth_gbs,
        "compute_fraction": achieved_gflops / limits.peak_gflops,
        "bound": "memory" if memory_us >= compute_us else "compute",
        "floor_time_us": floor_us,
        "roofline_fraction": floor_us / t_all if t_all else None,
        "output": output,
    }


def roofline_suggestions(rp: dict[str, Any], machine: MachineProfile, *, loaded: bool = False) -> list[dict[str, Any]]:
    """Next changes from the roofline profile, most important first.

    ``loaded``: other processes competed for the cores while measuring; thread
    scaling measured then says nothing about the kernel, so no advice is drawn from it.
    """
    out: list[dict[str, Any]] = []

    def add(next_step: str, why: str, refs: list[str]) -> None:
        out.append({"next_step": next_step, "why": why, "references": check_reference_ids(refs)})

    share = rp["output"].get("alloc_share")
    fraction = rp["roofline_fraction"] or 0.0
    scaling = rp["thread_scaling"] or 1.0
    threads = rp["threads"] or 1
    if share is not None and share > 0.25:
        add("stop paying for a fresh output every call: accept out= (and let callers reuse buffers)",
            f"allocating and first-touching the {rp['output']['bytes'] / 1024**2:.1f} MiB output costs "
            f"{rp['output']['alloc_overhead_us']:.0f} us, {100 * share:.0f}% of the call (page faults)",
            ["first-touch-page-faults", "out-parameter-api"])
    if threads > 1 and not loaded:
        if scaling < 0.9:
            add("run this size on one thread (a size threshold before the omp parallel region) and make sure the "
                "kernel uses torch's OpenMP runtime",
                f"{threads} threads are slower than one ({rp['time_us']:.1f} us vs {rp['time_1t_us']:.1f} us): the "
                "fork/join or oversubscription costs more than the parallel work saves",
                ["omp-small-size-threshold", "shared-openmp-runtime", "level-threading"])
        elif scaling < 0.6 * threads and rp["time_1t_us"] >= 2 * PARALLEL_MIN_US:
            add("parallelise the outer (row/token) loop with OpenMP on torch's runtime",
                f"{threads} threads are only {scaling:.2f}x faster than one on {rp['time_1t_us']:.0f} us of work",
                ["omp-row-parallel", "shared-openmp-runtime", "level-threading"])
    if fraction > 1.05:
        add("measure a size beyond the last-level cache before optimising further",
            f"the call is {fraction:.1f}x faster than the DRAM roofline: the data stays cache-resident between "
            "calls, so this size measures cache bandwidth and call overhead",
            ["cache-blocking", "omp-small-size-threshold"])
    elif fraction >= 0.8:
        add("near the roofline: only moving fewer bytes helps now (fuse neighbouring ops, avoid the output "
            "allocation, non-temporal stores for outputs larger than the LLC)",
            f"{100 * fraction:.0f}% of the roofline floor",
            ["level-fusion", "level-memory-traffic", "non-temporal-stores"])
    elif rp["bound"] == "memory":
        tier = rp["limits"].get("tier") or widest_tier(machine.has_flag)
        width = f"{TIER_BITS[tier]}-bit loads in the {tier} unit (the tier this machine runs)" \
            if tier != "generic" else "the widest vectors the CPU has"
        add(f"make the hot loop stream at full width: {width}, 2-4 accumulators, one pass over each row, "
            "masked tail instead of a scalar loop",
            f"memory-bound op at {100 * fraction:.0f}% of the roofline ({rp['achieved_gbs']:.1f} of "
            f"{rp['limits']['bandwidth_gbs']:.1f} GB/s)",
            ["level-vectorize", "multiple-accumulators", "single-pass-row-in-cache", "unroll-and-prefetch",
             "masked-tail"])
    else:
        refs = ["cache-blocking", "cpublas-brgemm", "level-algorithm"]
        if machine.has_flag("amx_bf16") and rp["dtype"] == "bf16":
            refs += ["amx-tile-config", "vnni-packing"]
        add("block for the caches and use a GEMM micro-kernel (brgemm / AMX tiles for bf16)",
            f"compute-bound op at {100 * fraction:.0f}% of the roofline ({rp['achieved_gflops']:.1f} of "
            f"{rp['limits']['peak_gflops']:.1f} GFLOP/s, {rp['limits']['peak_source']})",
            refs)
    return out


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def profile_op(kernel_package: str, op: str, baseline: Path | None, *, config: Config,
               machine: MachineProfile, seconds: float = 0.5) -> dict[str, Any]:
    baseline_path, baseline_source = resolve_baseline(op, baseline)
    notes: list[str] = []
    # FLOPs and bytes: the baseline's own FLOPS/BYTES when it declares them, else the fake-tensor trace.
    kind, dtype, flops, nbytes, gemm_m, source = "elementwise", "fp32", 0.0, 0.0, None, "none"
    try:
        trace = trace_baseline(baseline_path)
    except TraceError as exc:
        notes.append(f"could not trace {baseline_path} ({exc}); FLOPs/bytes unknown, roofline fractions are 0")
    else:
        kind, dtype = trace.kind, trace.dtype or "fp32"
        flops, nbytes, source = float(trace.flops), float(trace.min_bytes), "fake-tensor trace of the baseline"
        if trace.declared_flops is not None or trace.declared_bytes is not None:
            flops = trace.declared_flops if trace.declared_flops is not None else flops
            nbytes = trace.declared_bytes if trace.declared_bytes is not None else nbytes
            source = "the baseline's FLOPS/BYTES"
        mm = [o for o in trace.ops if o.category == "matmul" and o.out_shapes]
        if mm and len(mm[0].out_shapes[0]) >= 2:
            gemm_m = int(mm[0].out_shapes[0][-2])

    perf: dict[str, Any] = {"enabled": config.perf_stat_enabled, "events": list(EVENTS)}
    hotspots: dict[str, Any] = {"event": "cpu-clock"}
    if not config.perf_stat_enabled:
        perf.update(available=False, reason="perf_stat_enabled is false in the config; counters skipped")
        hotspots.update(available=False, reason="perf_stat_enabled is false in the config; sampling skipped")
    else:
        status, sampling = perf_status(), sampling_status()
        perf.update(available=status.available, reason=status.reason)
        hotspots.update(available=sampling.available, reason=sampling.reason)
        if status.available or sampling.available:
            with tempfile.TemporaryDirectory(prefix="kh-sample-") as tmp:
                data = Path(tmp) / "perf.data" if sampling.available else None
                stat, complaint, loop_info = perf_in_child(kernel_package, op, baseline_path,
                                                           counters=status.available, samples=data)
                if data is not None:
                    hotspots.update(summarise_samples(data, loop_info.get("libraries", []), complaint))
            if stat is not None:
                counters, raw = stat
                calls = max(1.0, PERF_WINDOW_S * 1e6 / max(loop_info.get("us_per_call", 1.0), 1e-3))
                perf.update(counters=counters.values, metrics=counters.metrics(),
                            per_call={k: (v / calls if v is not None else None) for k, v in counters.values.items()},
                            raw=raw)
                perf["_counters"] = counters
                if not counters.supported:
                    perf.update(available=False, reason="perf stat -p returned no cycles/instructions for the kernel")
    load_before = _load_average()
    measured = measure_in_child(kernel_package, op, baseline_path, seconds=seconds)
    load = max(load_before, _load_average())
    loaded = load > 0.5 * machine.logical_cpus + 0.5
    if loaded:
        notes.append(f"load average {load:.1f} on {machine.logical_cpus} CPUs while measuring: other processes "
                     "competed for the cores, so the timings (above all the all-thread one) are pessimistic and "
                     "no threading advice is drawn from them; re-run on an idle machine")
    rp = roofline_profile(measured, flops=flops, nbytes=nbytes, kind=kind, dtype=dtype, machine=machine,
                          gemm_m=gemm_m, tier=running_tier(machine))
    rp["counts_source"] = source
    # how many copies of the baseline's PERSISTENT_INPUTS the calls rotated through (1: none named)
    rp["input_copies"] = measured.get("input_copies", 1)
    if rp["input_copies"] > 1:
        notes.append(f"the baseline's PERSISTENT_INPUTS rotated through {rp['input_copies']} copies, so every "
                     "timed and sampled call read them from memory, as a model reads its weights")
    counters_obj = perf.pop("_counters", None)
    if counters_obj is not None:
        perf["findings"] = [f.to_dict() for f in interpret(counters_obj, compute_fraction=rp["compute_fraction"])]
    suggestions = roofline_suggestions(rp, machine, loaded=loaded)
    rp["load_average"] = round(load, 2)
    # Counter and sampling findings are the strongest evidence: they come first, in their own order.
    measured_findings = perf.get("findings", []) + hotspots.get("findings", [])
    suggestions = [{"next_step": f["next_step"], "why": f"{f['finding']}: {f['evidence']}",
                    "references": check_reference_ids(f["references"])} for f in measured_findings] + suggestions
    if machine.quick:
        notes.append("machine profile measured in quick mode; `python -m kernel_harness.machine --refresh` for "
                     "accurate limits")
    return {
        "schema_version": SCHEMA_VERSION,
        "kernel_package": kernel_package,
        "op": op,
        "baseline": str(baseline_path),
        "baseline_source": baseline_source,
        "machine": {"cpu_model": machine.cpu_model, "logical_cpus": machine.logical_cpus,
                    "cache_key": machine.cache_key},
        "perf": perf,
        "hotspots": hotspots,
        "vtune": run_vtune(config, kernel_package, op, baseline_path),
        "roofline_profile": rp,
        "suggestions": suggestions,
        "next_step": suggestions[0]["next_step"] if suggestions else None,
        "notes": notes,
    }
