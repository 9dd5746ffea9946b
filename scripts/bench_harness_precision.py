"""Measure the benchmark's own precision and speed (the numbers in docs/benchmark.md).

Modes (--mode):

* ``identical`` (default): benchmark a kernel that *is* the baseline op
  (tests/data/bench_kernels/bk_delegating: F.rms_norm, like examples/rms_norm's
  run_baseline) --runs times and count the runs whose speedup lies in
  [0.95, 1.05] and whose interval contains 1.0;
* ``against``: an identical build against itself (``--against`` the same
  package or kernel directory; pass a built kernel directory with
  --kernel-package / --op to measure a real build) and count the runs whose
  vs_against ratio lies in [0.98, 1.02] and whose interval contains 1.0
  (issue 19's target: at least 9 of 10 each on a quiet machine);
* ``slower``: a C++ rms_norm made 10 % slower by a documented busy spin in its
  body (bk_native_spin, BK_SPIN_FRACTION=0.10: after computing it spins for a tenth
  of its own compute time) against the same C++ code without the spin (bk_native),
  on a 256 x 4096 fp32 rms_norm (tests/data/baselines/rms_norm_medium.py), and
  count the runs that call it "slower" (target: 9 of 10).  Both compile once on
  first use (torch.utils.cpp_extension, about a minute, cached).  A pure-Python
  spin kernel on a 100 us op (bk_honest_spin) was too noisy for a 10 % call.

``--busy N`` starts N busy background processes (``while True: pass``) for the
duration and counts the runs that were marked unreliable or read 0.8-1.25x
(the speedup, or the vs_against ratio in the against mode; target: 10 of 10 -
never a confident 10x).

The wall time of each full run is reported too (the issue asks for <= 30 s on
the rms_norm example), and the load average with every run: on a shared 2-core
box a number measured under load 8 is not the number of a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)

from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.cpu import cpu_model
from kernel_harness.errors import UsageError
from kernel_harness.paths import EXAMPLES_DIR, PROJECT_ROOT, SCRIPTS_DIR

IDENTICAL_KERNELS = PROJECT_ROOT / "tests" / "data" / "bench_kernels"
#: (kernel package, op, --against) per mode, unless given on the command line
MODE_DEFAULTS = {
    "identical": ("bk_delegating", "bk_delegating.rms_norm", None),
    "against": ("bk_honest", "bk_honest.rms_norm", None),  # None: against itself
    "slower": ("bk_native_spin", "bk_native_spin.rms_norm", "bk_native"),
}
#: the baseline per mode unless --baseline: bk_honest's fp32 einsum is not meant for
#: the example's bf16/fp16 sets, so its modes use the tests' small fp32 rms_norm
MODE_BASELINES = {
    "identical": EXAMPLES_DIR / "rms_norm" / "baseline.py",
    "against": PROJECT_ROOT / "tests" / "data" / "baselines" / "rms_norm_small.py",
    "slower": PROJECT_ROOT / "tests" / "data" / "baselines" / "rms_norm_medium.py",
}
#: benchmark_cpu.py arguments a mode always passes. The identical kernel IS eager's
#: F.rms_norm, which rounds an fp32 result: 26-31 of the 4M bf16 outputs of
#: examples/rms_norm flip by one ulp against its float64 ground truth, so the
#: strict check fails eager itself; the fp64-oracle rule accepts it as exactly as
#: accurate as the baseline (it is the baseline).
MODE_EXTRA = {"identical": ["--oracle", "fp64", "--accept-if-as-accurate"]}
#: the spin of the slower mode: 10 % of the call's own time
SLOWER_SPIN_FRACTION = "0.10"
BUSY_RANGE = (0.8, 1.25)


def one_run(baseline: Path, package: str, op: str, extra: list[str], env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        load = os.getloadavg()[0]
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(SCRIPTS_DIR / "benchmark_cpu.py"), str(baseline), "--kernel-package",
             package, "--op", op, "--json", str(out), *extra],
            capture_output=True, text=True, env=env, cwd=tmp)
        wall = time.monotonic() - started
        report = json.loads(out.read_text()) if out.exists() else {}
    return {"exit": proc.returncode, "wall_s": round(wall, 2), "load_before": round(load, 2),
            "speedup": report.get("speedup"), "speedup_ci": report.get("speedup_ci"),
            "speedup_paired": report.get("speedup_paired"),
            "baseline_us": report.get("baseline_us"), "kernel_us": report.get("kernel_us"),
            "vs_against": report.get("vs_against"), "reliable": report.get("reliable"),
            "unreliable_reasons": report.get("unreliable_reasons"),
            "conditions": report.get("conditions"),
            "stderr": proc.stderr[-500:] if proc.returncode else ""}


@contextmanager
def busy_processes(count: int) -> Iterator[list[subprocess.Popen]]:
    """``count`` busy loops for the duration (killed, by their own pids, on the way out)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def _resolved(spec: str | None) -> str | None:
    """A kernel directory as an absolute path (each run starts in a temporary directory);
    an installed package name as it is."""
    return str(Path(spec).resolve()) if spec and Path(spec).is_dir() else spec


def _contains_one(ci: list[float] | None) -> bool:
    return bool(ci) and ci[0] <= 1.0 <= ci[1]


def _ratio(run: dict[str, Any], mode: str) -> float | None:
    if mode == "identical":
        return run["speedup"]
    return (run["vs_against"] or {}).get("ratio")


def summarize(runs: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """The counts the issue's targets are stated in, for this mode."""
    speedups = [r["speedup"] for r in runs if r["speedup"] is not None]
    paired = [r["speedup_paired"] for r in runs if r.get("speedup_paired") is not None]
    walls = [r["wall_s"] for r in runs]
    summary: dict[str, Any] = {
        "within_0.95_1.05": sum(0.95 <= s <= 1.05 for s in speedups),
        "paired_within_0.95_1.05": sum(0.95 <= s <= 1.05 for s in paired),
        "within_0.98_1.02": sum(0.98 <= s <= 1.02 for s in speedups),
        "paired_within_0.98_1.02": sum(0.98 <= s <= 1.02 for s in paired),
        "speedup_ci_contains_1": sum(_contains_one(r["speedup_ci"]) for r in runs),
        "speedup_min": min(speedups, default=None), "speedup_max": max(speedups, default=None),
        "unreliable": sum(r["reliable"] is False for r in runs),
        "wall_s_median": round(statistics.median(walls), 2) if walls else None,
        "wall_s_max": max(walls, default=None),
    }
    against = [r["vs_against"] for r in runs if r.get("vs_against")]
    if mode == "against":
        summary["against_within_0.98_1.02"] = sum(0.98 <= v["ratio"] <= 1.02 for v in against)
        summary["against_ci_contains_1"] = sum(_contains_one(v["ci"]) for v in against)
    if mode == "slower":
        summary["called_slower"] = sum(v["verdict"] == "slower" for v in against)
        summary["called_faster"] = sum(v["verdict"] == "faster" for v in against)
    extended = [v["rounds"] for v in against if v.get("rounds")]
    if extended:  # the rounds --against added until its interval was tight (or time ran out)
        summary["against_stopped"] = {why: sum(e["stopped"] == why for e in extended)
                                      for why in sorted({e["stopped"] for e in extended})}
        summary["against_rounds_median"] = statistics.median(e["rounds"] for e in extended)
        summary["against_timing_s_median"] = round(statistics.median(e["seconds"] for e in extended), 1)
    ratios = [_ratio(r, mode) for r in runs]
    summary["ratio_min"] = min((x for x in ratios if x is not None), default=None)
    summary["ratio_max"] = max((x for x in ratios if x is not None), default=None)
    summary["unreliable_or_within_0.8_1.25"] = sum(
        r["reliable"] is False or (x is not None and BUSY_RANGE[0] <= x <= BUSY_RANGE[1])
        for r, x in zip(runs, ratios, strict=True))
    return summary


def _headline(summary: dict[str, Any], mode: str, runs: int, busy: int) -> str:
    if busy:
        return (f"{summary['unreliable_or_within_0.8_1.25']} of {runs} runs marked unreliable or within "
                f"0.8-1.25x with {busy} busy processes ({summary['unreliable']} unreliable)")
    if mode == "against":
        return (f"{summary['against_within_0.98_1.02']} of {runs} identical-build ratios within 0.98-1.02, "
                f"{summary['against_ci_contains_1']} intervals contain 1.0")
    if mode == "slower":
        return (f"{summary['called_slower']} of {runs} runs call the 10 %-slower kernel slower "
                f"({summary['called_faster']} faster)")
    return (f"{summary['within_0.95_1.05']} of {runs} speedups within 0.95-1.05 "
            f"({summary['paired_within_0.95_1.05']} paired), {summary['within_0.98_1.02']} within 0.98-1.02 "
            f"({summary['paired_within_0.98_1.02']} paired), {summary['speedup_ci_contains_1']} intervals "
            "contain 1.0")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--mode", choices=sorted(MODE_DEFAULTS), default="identical",
                        help="identical: kernel == baseline op; against: a build against itself; "
                             "slower: a 10 %%-slower spin kernel against the plain one")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="start N busy background processes for the duration")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="baseline file (default: examples/rms_norm for identical, the tests' small "
                             "fp32 rms_norm for the bk_honest modes)")
    parser.add_argument("--kernel-package", default=None,
                        help="the candidate (default per mode: bk_delegating, bk_honest, bk_honest_spin)")
    parser.add_argument("--op", default=None, help="its --op (default per mode)")
    parser.add_argument("--against", default=None,
                        help="the build to compare with (against mode: the candidate itself; slower: bk_honest)")
    parser.add_argument("--extra", default="--accept-if-as-accurate",
                        help="extra benchmark_cpu.py arguments (one string)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    args.baseline = (args.baseline or MODE_BASELINES[args.mode]).resolve()  # each run starts elsewhere
    if not args.baseline.is_file():
        raise UsageError(f"Baseline {args.baseline} does not exist.")
    if args.busy < 0 or args.runs < 1:
        raise UsageError("--busy must be >= 0 and --runs >= 1.")
    package, op, against = MODE_DEFAULTS[args.mode]
    package, op = _resolved(args.kernel_package or package), args.op or op
    against = _resolved(args.against or against) or (package if args.mode == "against" else None)
    extra = MODE_EXTRA.get(args.mode, []) + args.extra.split() + (["--against", against] if against else [])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(IDENTICAL_KERNELS), env.get("PYTHONPATH", "")) if p)
    if args.mode == "slower":
        env["BK_SPIN_FRACTION"] = SLOWER_SPIN_FRACTION
    runs = []
    with busy_processes(args.busy):
        for i in range(args.runs):
            run = one_run(args.baseline, package, op, extra, env)
            runs.append(run)
            vs = run["vs_against"] or {}
            console.print(f"run {i + 1}: exit {run['exit']}, speedup {run['speedup']} (paired "
                          f"{run['speedup_paired']}), CI {run['speedup_ci']}"
                          + (f", vs against {vs.get('ratio')} CI {vs.get('ci')} {vs.get('verdict')}" if vs else "")
                          + (f" after {vs['rounds']['rounds']} rounds ({vs['rounds']['stopped']})"
                             if vs.get("rounds") else "")
                          + f", reliable {run['reliable']}, {run['wall_s']} s, load {run['load_before']}")
            if run["stderr"]:
                console.print(run["stderr"])
    summary = {"mode": args.mode, "busy_processes": args.busy, "baseline": str(args.baseline),
               "kernel": op, "against": against, "runs": runs, "of": len(runs),
               **summarize(runs, args.mode),
               "load_avg_median": round(statistics.median(r["load_before"] for r in runs), 2) if runs else None,
               "cpu": os.cpu_count(), "cpu_model": cpu_model()}
    console.print(f"[bold]{_headline(summary, args.mode, len(runs), args.busy)}[/bold]; ratio range "
                  f"{summary['ratio_min']}-{summary['ratio_max']}; wall time median {summary['wall_s_median']} s, "
                  f"max {summary['wall_s_max']} s; median load average {summary['load_avg_median']} on "
                  f"{summary['cpu']} CPUs ({summary['cpu_model']})"
                  + (f"; --against stopped {summary['against_stopped']}, median {summary['against_rounds_median']} "
                     f"rounds, {summary['against_timing_s_median']} s of timing" if "against_stopped" in summary else ""))
    write_json_report(args.json, summary)
    return 0


if __name__ == "__main__":
    run_main(main)
