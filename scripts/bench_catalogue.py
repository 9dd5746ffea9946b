"""Benchmark: the generated catalogue kernels vs PyTorch eager and the allocate+copy floor.

Prints, per op, dtype, shape and tier: PyTorch us, ours us, speedup, GB/s, our
time as a multiple of the floor (each ratio with its 95 % interval; a * marks a
floor whose copy fits the last-level cache, a cache-resident copy rather than
a trip to memory), and the tier that ran, under the CPU's model name.
``--tier avx2`` (or avx512, generic) forces that tier through KERNEL_CPU_ISA,
``--tier all`` times every tier this machine runs, one after the other for
each case, and ``--tier auto`` (the default) times the dispatcher's own choice; tiers the CPU or the package lacks are listed as not
measured, with the reason. The numbers in the README's performance tables come
from this script. It runs with the same fixed malloc thresholds as the
benchmark's workers (eager bf16 rms_norm, with its large fp32 temporaries,
otherwise varies 3x with the allocator's history).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
import torch
from rich import box
from rich.table import Table

from kernel_harness.bench.process import with_steady_malloc
from kernel_harness.cpu import cpu_model, has_isa, missing_flags
from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.kernel_loader import load_kernel_module
from kernel_harness.machine import last_level_cache_bytes
from kernel_harness.perf_table import (EAGER_ISA_CHOICES, OPS, TIER_CHOICES, Row, build_perf_kernel, eager_capability,
                                       eager_isa_environment, measure, rows_as_dicts, select_cases, tier_plan)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    wanted = eager_isa_environment(with_steady_malloc(dict(os.environ)), args.eager_isa)
    if argv is None and not wanted.items() <= os.environ.items():
        # malloc reads its thresholds, and ATen/oneDNN their ISA caps, at
        # start-up: run again with the benchmark workers' allocator settings (so
        # PyTorch and our kernel are timed in the same steady state as
        # scripts/benchmark_cpu.py times them) and the eager ISA asked for
        os.execve(sys.executable, [sys.executable, *sys.argv], wanted)
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give at least 1 round per case (or leave it out for the time budget)")
    if not args.seconds_per_case > 0:
        parser.error(f"--seconds-per-case {args.seconds_per_case}: give a positive number of seconds")
    if args.eager_isa == "avx2" and not has_isa("avx2"):
        parser.error(f"--eager-isa avx2: this CPU ({cpu_model()}) lacks {', '.join(missing_flags('avx2'))}; "
                     "leave it at native")
    try:
        cases = select_cases(None if args.ops is None else [op.strip() for op in args.ops.split(",") if op.strip()])
    except ValueError as error:
        parser.error(f"--ops {args.ops}: {error}")
    if args.threads:
        torch.set_num_threads(args.threads)
    with console.status("generating and building the catalogue kernel"):
        kernel = load_kernel_module(str(build_perf_kernel(args.kernel_dir.resolve())))
    available = kernel.available_tiers()
    plan = tier_plan(args.tier, available)
    machine = cpu_model()
    eager = eager_capability()
    report = {"machine": machine, "threads": torch.get_num_threads(), "tier_requested": args.tier,
              "tiers_available": available, "tiers_not_measured": plan.not_measured,
              "eager_isa_requested": args.eager_isa, "eager_capability": eager,
              "allocator": "steady (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, tcache off)"}
    if not plan.measured:
        reasons = "; ".join(f"{tier}: {reason}" for tier, reason in plan.not_measured.items())
        console.print(f"[red]--tier {args.tier}: nothing to measure on this machine ({machine}): {reasons}. "
                      f"It runs {', '.join(available)}: pass one of those, all, or auto.[/red]")
        write_json_report(args.json, {**report, "load_average": os.getloadavg()[0], "rows": []})
        return 2
    # no vertical rules, no padding, short headers: the columns nearly fit an 80-column
    # terminal, and a narrower one folds a number onto a second line rather than cut it
    table = Table(title=f"Catalogue kernels vs PyTorch eager (times in us), --tier {args.tier}", box=box.SIMPLE_HEAD,
                  padding=(0, 0), show_edge=False,
                  caption=f"{machine}, {torch.get_num_threads()} threads, PyTorch eager on {eager}")
    for column in ("op dtype shape", "torch", "ours", "speedup", "95% CI", "GB/s", "/floor", "95% CI", "tier"):
        first = column == "op dtype shape"
        table.add_column(column, justify="left" if first else "right", no_wrap=first, overflow="fold")
    rows = []
    for case in cases:
        for tier in plan.measured:
            with console.status(f"timing {case.label} ({tier})"):
                row = measure(case, kernel, rounds=args.rounds, budget_s=args.seconds_per_case, tier=tier)
            rows.append(row)
            _add_row(table, row)
    console.print(table)
    load = os.getloadavg()[0]
    console.print(f"machine: {machine}; tiers this machine runs (the package's answer): {', '.join(available)}")
    console.print(f"PyTorch eager and the floor's copy ran on {eager} (--eager-isa {args.eager_isa})")
    for tier, reason in plan.not_measured.items():
        console.print(f"not measured: the {tier} tier ({reason})")
    cached = [row for row in rows if row.floor_in_cache]
    if cached:
        console.print(f"[yellow]{IN_CACHE_MARK} the floor's copy ({_mib(max(r.floor_bytes for r in cached))} MiB "
                      f"or less, read and written) fits this machine's last-level cache "
                      f"({_mib(last_level_cache_bytes() or 0)} MiB): it times a cache-resident copy, which moves "
                      f"with the share of the cache other tenants leave, not a trip to memory; compare such "
                      f"/floor ratios across runs only within their intervals[/yellow]")
    console.print(f"load average during the run: {load:.1f} on {os.cpu_count()} CPUs; rounds per case: "
                  + ", ".join(str(row.rounds) for row in rows))
    write_json_report(args.json, {**report, "load_average": load, "rows": rows_as_dicts(rows)})
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kernel-dir", type=Path,
                        default=Path.home() / ".cache" / "kernel_harness" / "perf-catalogue",
                        help="where the catalogue kernel is generated and built (incremental)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds per case (default: as many as --seconds-per-case allows, 15-75)")
    parser.add_argument("--seconds-per-case", type=float, default=6.0,
                        help="time budget per case when --rounds is not given (default 6)")
    parser.add_argument("--threads", type=int, default=None, help="torch/OpenMP threads (default: torch's)")
    parser.add_argument("--tier", choices=TIER_CHOICES, default="auto",
                        help="the kernels' tier to time: one tier (forced with KERNEL_CPU_ISA), all the tiers "
                             "this machine runs, or auto: the dispatcher's own choice (default)")
    parser.add_argument("--ops", default=None,
                        help=f"comma-separated ops to time (default: all of {', '.join(OPS)})")
    parser.add_argument("--eager-isa", choices=EAGER_ISA_CHOICES, default="native",
                        help="the instruction set PyTorch eager (and the floor's copy) may use: native (its own "
                             "best, the default) or avx2 (ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA), which with "
                             "--tier avx2 stands in for an AVX2-only CPU on an AVX512 one")
    add_json_option(parser)
    return parser


IN_CACHE_MARK = "*"


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.0f}"


def _interval(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"{low:.2f}-{high:.2f}"


def _add_row(table: Table, row: Row) -> None:
    mark = IN_CACHE_MARK if row.floor_in_cache else ""
    table.add_row(row.case, f"{row.torch_us:.0f}", f"{row.ours_us:.0f}", f"{row.speedup:.2f}x",
                  _interval(row.speedup_ci_low, row.speedup_ci_high), f"{row.gbps:.1f}",
                  f"{row.floor_fraction:.2f}{mark}", _interval(row.floor_ci_low, row.floor_ci_high), row.tier)


if __name__ == "__main__":
    run_main(main)
