"""Measure whether remote (--cluster) and local runs of one kernel read the same speedup (issue 22).

Runs ``scripts/benchmark_cpu.py`` --runs times locally and --runs times with
``--cluster ADDRESS``, alternating which side goes first in each pair, and prints
per side the median speedup, its range and relative spread, the median wall time,
then the ratio of the medians (remote / local) with a bootstrap 95 % interval,
the verdict against the ±5 % band and the wall-clock overhead of a remote run.
Run it on a quiet machine with a farm node on that machine:

    python scripts/new_kernel.py --op rms_norm --name my_rmsnorm_kernel --dir kernel
    (cd kernel && python ../scripts/build_kernel.py --release)
    python -m kernel_harness.farm node --head --node-ip-address 127.0.0.1
    python scripts/farm_agreement.py examples/rms_norm/baseline.py --kernel-package kernel \\
        --op my_rmsnorm_kernel.rms_norm --cluster auto --runs 10 --json agreement.json
    python -m kernel_harness.farm stop

Flags after ``--`` go to every benchmark run (e.g. ``-- --threads 2``).
``--pool FILE ...`` adds the runs of earlier comparisons of the same target on this
CPU model (their --json); with ``--runs 0`` it only recomputes from them.
Exit 0: every run done and correct; 1: a run found the kernel incorrect; 2: bad
usage, or a run refused its input (the comparison stops at once); 3: a run crashed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
from rich.table import Table

from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.errors import UsageError
from kernel_harness.farm.agreement import (
    BAND,
    Run,
    bench_command,
    compare,
    machine_facts,
    pooled_runs,
    run_pairs,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(usage="%(prog)s BASELINE --kernel-package DIR --op PKG.FN --cluster ADDRESS "
                                      "[--runs N] [--json FILE] [-- BENCHMARK FLAGS]",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("baseline", help="the baseline.py file")
    p.add_argument("--kernel-package", required=True, help="the built kernel directory (shipped to the node)")
    p.add_argument("--op", required=True, help="<package>.<function>")
    p.add_argument("--cluster", required=True, metavar="ADDRESS",
                   help="HOST:PORT of the farm, or 'auto' for the node started on this machine")
    p.add_argument("--runs", type=int, default=10, help="runs per side (default 10; 0 with --pool: no new runs)")
    p.add_argument("--pool", type=Path, nargs="+", default=[], metavar="FILE",
                   help="also count the runs of these earlier --json reports (same target, same CPU model)")
    p.add_argument("--run-timeout", type=float, default=900.0, metavar="S",
                   help="a run that takes longer than S seconds counts as crashed (default 900)")
    add_json_option(p)
    return p


def _progress(run: Run) -> None:
    speed = f"{run.speedup:.3f}x" if run.speedup is not None else "-"
    state = "ok" if run.returncode == 0 else f"exit {run.returncode}: {run.error}"
    if run.node_wall_s is not None:  # where a remote run's time went
        state += f" (on the node {run.node_wall_s:.1f} s, submit to result {run.driver_wall_s:.1f} s)"
    console.print(f"  {run.side:6} #{run.index + 1}: {speed:>9}  {run.wall_s:7.1f} s  reliable={run.reliable}  "
                  f"threads={run.threads}  load={run.load_average}  {state}", soft_wrap=True)


def _load(machine: dict, key: str) -> str:
    """The one-minute load average a pooled file recorded ("?" when it has none)."""
    values = machine.get(key) or []
    return f"{values[0]:.2f}" if values and isinstance(values[0], int | float) else "?"


def _fmt(value: float | None, unit: str = "x", digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after `--` goes to every benchmark run (argparse would read it as our own flags)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = build_parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.runs < 0 or (args.runs == 0 and not args.pool):
        raise UsageError(f"--runs must be at least 1 (or 0 with --pool), not {args.runs}.")
    if any(a in ("--cluster", "--json", "--all-cpu-classes") for a in extra):
        raise UsageError("Pass --cluster only to farm_agreement.py itself, and no --json or --all-cpu-classes "
                         "after --: each run writes its own report.")
    local = bench_command(args.baseline, args.kernel_package, args.op, extra)
    remote = [*local, "--cluster", args.cluster]
    machine = machine_facts()
    target = {"baseline": str(Path(args.baseline).resolve()), "kernel_package": str(Path(args.kernel_package).resolve()),
              "op": args.op, "benchmark_flags": extra}
    earlier: list[Run] = []
    for path in args.pool:
        runs_there, when = pooled_runs(path, machine["cpu_model"], target)
        earlier += runs_there
        console.print(f"pooling {len(runs_there)} run(s) of {path}: {when.get('started_at', '?')} to "
                      f"{when.get('finished_at', '?')}, load average {_load(when, 'load_average_start')} -> "
                      f"{_load(when, 'load_average_end')}")
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    console.print(f"[bold]remote vs local speedup[/bold] on {machine['cpu_model']} ({machine['logical_cpus']} "
                  f"logical CPUs, tiers {', '.join(machine['tiers']) or 'generic'}), {args.runs} run(s) a side, "
                  f"from {started}, load average {', '.join(f'{x:.2f}' for x in machine['load_average_start'])}")
    runs = run_pairs(local, remote, args.runs, args.run_timeout, progress=_progress) if args.runs else []
    machine["load_average_end"] = list(os.getloadavg())
    machine["started_at"], machine["finished_at"] = started, datetime.now(timezone.utc).isoformat(timespec="seconds")
    result = compare(earlier + runs, machine)
    result.target, result.pooled_from = target, [str(path) for path in args.pool]
    if args.pool:
        console.print(f"{len(earlier)} pooled run(s) and {len(runs)} new one(s); the table's time and load "
                      "are this invocation's, the pooled series' are listed above")
    table = Table(caption="speedup: median, range and (max - min) / median; wall: median seconds a run",
                  title=f"{machine['cpu_model']}, {machine['logical_cpus']} logical CPUs, {started[:16]} UTC, "
                        f"load {machine['load_average_start'][0]:.2f} -> {machine['load_average_end'][0]:.2f}")
    # short headers: the table must fit 80 columns (a pipe or a log file) without cutting numbers
    for column in ("side", "ok", "reliable", "median", "range", "spread", "wall"):
        table.add_column(column)
    for name, side in (("local", result.local), ("remote", result.remote)):
        table.add_row(name, f"{side.ok}/{side.runs}", str(side.reliable), _fmt(side.median),
                      f"{_fmt(side.low)}-{_fmt(side.high)}", _fmt(side.rel_spread and side.rel_spread * 100, " %", 1),
                      _fmt(side.wall_median_s, " s", 1))
    console.print(table)
    ci = f"[{result.ratio_ci[0]:.3f}, {result.ratio_ci[1]:.3f}]" if result.ratio_ci else "(no interval)"
    console.print(f"remote / local median speedup ({result.basis}): {_fmt(result.ratio)} {ci} (bootstrap 95 %): "
                  f"[bold]{result.verdict}[/bold] (band ±{BAND:.0%})")
    console.print(f"overhead of a remote run (median wall, remote - local): {_fmt(result.overhead_s, ' s', 2)}")
    write_json_report(args.json, result.as_json())
    codes = {r.returncode for r in runs}  # this invocation's own runs decide its exit code
    return 3 if codes - {0, 1} else (1 if 1 in codes else 0)


if __name__ == "__main__":
    run_main(main)
