"""Check a CPU kernel against its baseline and time both (procedure steps 6, 8, 11)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)

from kernel_harness import correctness
from kernel_harness.bench.report import print_report, to_json
from kernel_harness.bench.runner import Benchmark, BenchOptions, Failure
from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.errors import CheckFailed, KernelCrashed, UsageError
from kernel_harness.farm.submit import add_cluster_options, run_remote

DESCRIPTION = (
    "Check the kernel function --op against the baseline file on at least three freshly seeded "
    "get_inputs() sets plus get_correctness_inputs(), then time baseline and kernel in "
    "interleaved rounds on fresh inputs per call. The kernel runs in a child process that never "
    "holds a reference output. Exit 0: correct; 1: incorrect (or --assert-dispatch failed); "
    "2: bad usage or bad baseline file; 3: the kernel could not be loaded, crashed or hung. "
    "The speedup is data, not an exit code."
)

EPILOG = "Correctness rules, k = kernel element, r = reference element: " + correctness.help_text() + (
    ". Tuples, lists and dicts are walked element-wise and must match in structure, dtype and "
    "shape. --accept-if-as-accurate also passes a leaf whose worst |k - oracle| is at most "
    f"{correctness.AS_ACCURATE_FACTOR:g}x the baseline's own worst |baseline - oracle| "
    "(oracle: the reference on float64 copies of the inputs)."
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("baseline", help="the baseline.py file (get_inputs and get_reference_output or Model)")
    p.add_argument("--kernel-package", required=True,
                   help="installed package name, or a kernel directory (loaded with kernels.get_local_kernel)")
    p.add_argument("--op", required=True, help="<package>.<function>, e.g. my_kernel.rms_norm")
    p.add_argument("--baseline-us", type=float, default=None,
                   help="reuse this cached baseline median (trial_manager.py baseline-us) instead of timing it")
    p.add_argument("--atol", type=float, default=None,
                   help="widen the absolute tolerance of floating-point leaves to max(default, ATOL)")
    p.add_argument("--rtol", type=float, default=None,
                   help="widen the relative tolerance of floating-point leaves to max(default, RTOL)")
    p.add_argument("--tier", choices=["generic", "avx2", "avx512", "all"], default=None,
                   help="force one tier through KERNEL_CPU_ISA, or 'all' to check and time every tier")
    p.add_argument("--assert-dispatch", action="store_true",
                   help="with --tier all: exit 1 when the dispatcher's pick lags the fastest tier by more than "
                        "--tolerance, the whole interval past it, in the sweep and in a fresh worker (a lag "
                        "whose interval straddles the tolerance is reported as dispatch_undecided)")
    p.add_argument("--tolerance", type=float, default=5.0, metavar="PCT",
                   help="allowed lag of the dispatcher's pick for --assert-dispatch (default 5)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="kill the kernel when one step takes longer than S seconds (default 120)")
    p.add_argument("--cold", action="store_true",
                   help="rotate enough fresh input sets per round to exceed the last-level cache")
    p.add_argument("--oracle", choices=["fp64"], default=None,
                   help="also compare kernel and baseline against the reference on float64 inputs")
    p.add_argument("--accept-if-as-accurate", action="store_true",
                   help="pass a kernel no less accurate than the baseline against the fp64 oracle "
                        "(implies --oracle fp64); the JSON records the rule used")
    p.add_argument("--rounds", type=int, default=BenchOptions.rounds,
                   help=f"interleaved timing rounds (default {BenchOptions.rounds})")
    p.add_argument("--calls", type=int, default=None,
                   help="timed calls per round and side (default: calibrated)")
    p.add_argument("--processes", type=int, default=BenchOptions.timing_processes,
                   help="worker processes per side that the timing rounds rotate over (default "
                        f"{BenchOptions.timing_processes}; each extra one costs a torch import): "
                        "the interval then also covers a process's own performance regime")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for baseline and kernel (default: torch's default)")
    p.add_argument("--against", default=None, metavar="DIR|INSTALLED_PKG",
                   help="another build of the kernel (e.g. the parent trial's, from trial_manager.py "
                        "checkout): checked the same way and timed in the same interleaved rounds on "
                        "the same fresh inputs; reports vs_against (its median / the candidate's, "
                        "with an interval: > 1 means the candidate is faster)")
    p.add_argument("--against-precision", type=float, default=100 * BenchOptions.against_precision,
                   metavar="PCT",
                   help="with --against: add rounds until the ratio's 95 %% interval lies within PCT %% "
                        f"of it (default {100 * BenchOptions.against_precision:g})")
    p.add_argument("--against-max-s", type=float, default=BenchOptions.against_max_s, metavar="S",
                   help="with --against: stop adding rounds after S seconds of timing (default "
                        f"{BenchOptions.against_max_s:g}; 0 keeps the usual --rounds)")
    p.add_argument("--speedup-precision", type=float, default=0.0, metavar="PCT",
                   help="add rounds until the speedup's own 95 %% interval lies within PCT %% of it (e.g. 2), "
                        "or --speedup-max-s of timing is spent: for a point estimate that must not move "
                        "between runs by more than PCT %%; default 0, off (the usual --rounds)")
    p.add_argument("--speedup-max-s", type=float, default=BenchOptions.speedup_max_s, metavar="S",
                   help="with --speedup-precision: stop adding rounds after S seconds of timing (default "
                        f"{BenchOptions.speedup_max_s:g})")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the run's input seeds (default: random, so nothing can be precomputed)")
    add_cluster_options(p)
    add_json_option(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("atol", "rtol", "baseline_us", "timeout", "tolerance", "against_max_s",
                 "speedup_max_s"):
        value = getattr(args, name)
        if value is not None and not value >= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be a non-negative number, not {value}.")
    if args.baseline_us is not None and args.baseline_us <= 0:
        raise UsageError("--baseline-us must be positive (trial_manager.py baseline-us prints it).")
    if args.cluster:  # the same benchmark on a Ray farm node (kernel_harness/farm)
        return run_remote(args, build_parser())
    options = BenchOptions(
        baseline_path=args.baseline, kernel_spec=args.kernel_package, op_path=args.op,
        baseline_us=args.baseline_us, atol=args.atol, rtol=args.rtol, tier=args.tier,
        timeout=args.timeout, cold=args.cold, oracle=args.oracle,
        accept_if_as_accurate=args.accept_if_as_accurate, assert_dispatch=args.assert_dispatch,
        dispatch_tolerance_pct=args.tolerance, rounds=args.rounds, calls_per_round=args.calls,
        timing_processes=args.processes,
        threads=args.threads, seed=args.seed, against=args.against,
        against_precision=args.against_precision / 100, against_max_s=args.against_max_s,
        speedup_precision=args.speedup_precision / 100, speedup_max_s=args.speedup_max_s,
    )
    bench = Benchmark(options)
    try:
        result = bench.run()
    except KernelCrashed as err:
        crash = getattr(err, "crash", None) or {"role": "kernel", "kind": "could-not-load", "during": "loading"}
        write_json_report(args.json, to_json(bench.result, crash={**crash, "message": err.message}))
        raise
    except CheckFailed as err:
        # an unwritten KERNEL_TODO body (issue 20) is its own check, not tampering
        check = "unfinished-body" if err.message.startswith("KERNEL_TODO at ") else "tamper"
        bench.result.failures.append(Failure(check, "-", "-", err.message))
        bench.result.correct = False
        write_json_report(args.json, to_json(bench.result))
        raise
    payload = to_json(result, kernel_version=bench.kernel_info.get("version"))
    print_report(payload, console)
    write_json_report(args.json, payload)
    if not payload["correct"]:
        return 1
    if options.assert_dispatch and result.dispatch_violations:
        console.print("[bold red]--assert-dispatch failed[/bold red]: the dispatcher does not pick the "
                      f"fastest tier within {options.dispatch_tolerance_pct:g} %; adjust the "
                      "small-size threshold (omp-small-size-threshold).")
        return 1
    return 0


if __name__ == "__main__":
    run_main(main)
