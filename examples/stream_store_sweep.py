"""Where streamed (non-temporal) output stores pay on this machine: fp32 rms_norm, layer_norm, add_rms_norm.

    python examples/stream_store_sweep.py [--kernel-dir DIR] [--ops rms_norm,layer_norm,add_rms_norm]
        [--fractions 0.25,0.5,0.75,1,1.5] [--cols 4096] [--rounds 8] [--calls 10] [--json FILE]

The generated units stream these ops' fp32 rows once a call's inputs and
outputs fill 3/4 of the last-level cache (bypass_caches_for, measured on a Zen 4
EPYC). Run this on a new CPU before trusting that bound there: each op is
timed at row counts that put its call at the given fractions of the cache,
streamed (KERNEL_CPU_FORCE=streamstores) against cached stores
(KERNEL_CPU_MASK=streamstores) in two worker processes, alternating, on the
same input every call and on inputs rotated through memory
(kernel_harness/bench/stream_stores.py). A verdict needs the whole interval on
one side of 1; same-input points that contradict the rule are flagged, and
rotated ones where streaming wins below the bound are marked as the gain the
rule leaves (it keeps outputs that fit cached for the op that reads them
next, which is not timed). Without
--kernel-dir the catalogue is generated and built (incrementally) where
bench_catalogue.py keeps it. Exit codes: 0 ok (a contradiction is a finding,
not a failure), 2 bad usage, 3 the kernel could not be built, loaded or run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from kernel_harness.bench.stream_stores import OPS, RULE_FRACTION, sweep, worker_main

DEFAULT_KERNEL_DIR = Path.home() / ".cache" / "kernel_harness" / "perf-catalogue"
# the table's short words for SweepPoint.verdict (the JSON keeps the long ones)
VERDICTS = {"streams faster": "faster", "streams slower": "slower", "no measurable difference": "no difference"}


def _usage(message: str) -> int:
    print(f"stream_store_sweep.py: {message}", file=sys.stderr)
    return 2


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel-dir", type=Path, default=None,
                   help="a built package holding the ops (default: the catalogue, built where "
                        "bench_catalogue.py keeps it)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    p.add_argument("--fractions", default="0.25,0.5,0.75,1,1.5",
                   help="the call's input + output bytes as fractions of the last-level cache")
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds per point (at least 3)")
    p.add_argument("--calls", type=int, default=10, help="timed calls per round")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: a timing worker
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.worker:
        return worker_main(args.worker)
    ops = [op for op in args.ops.split(",") if op]
    unknown = sorted(set(ops) - set(OPS))
    if unknown or not ops:
        return _usage(f"--ops {args.ops}: choose from {', '.join(OPS)}.")
    try:
        fractions = [float(f) for f in args.fractions.split(",") if f]
    except ValueError:
        return _usage(f"--fractions {args.fractions}: comma-separated positive numbers, such as 0.5,0.75,1.")
    if (not fractions or not all(math.isfinite(f) and f > 0 for f in fractions) or args.cols < 1
            or args.rounds < 3 or args.calls < 1):
        return _usage(f"--fractions {args.fractions} --cols {args.cols} --rounds {args.rounds} --calls {args.calls}: "
                      "fractions and cols must be positive, rounds at least 3 (for an interval), calls at least 1.")
    from rich.console import Console
    from rich.table import Table

    from kernel_harness.cpu import cpu_model
    from kernel_harness.machine import ASSUMED_LLC_BYTES, last_level_cache_bytes

    console = Console(width=None if sys.stdout.isatty() else 140)
    kernel_dir = args.kernel_dir
    if kernel_dir is None:
        from kernel_harness.perf_table import build_perf_kernel

        try:
            with console.status("building the catalogue kernel (incremental)"):
                kernel_dir = build_perf_kernel(DEFAULT_KERNEL_DIR)
        except Exception as exc:  # noqa: BLE001 - any build failure is reported the same way
            print(f"stream_store_sweep.py: could not build the catalogue in {DEFAULT_KERNEL_DIR}: {exc}",
                  file=sys.stderr)
            return 3
    elif not (kernel_dir / "build").is_dir():
        return _usage(f"{kernel_dir} has no build/ directory: build it first "
                      f"(python scripts/build_kernel.py --dir {kernel_dir}).")
    llc = last_level_cache_bytes() or ASSUMED_LLC_BYTES
    try:
        points = sweep(kernel_dir.resolve(), Path(__file__).resolve(), llc, ops, fractions, cols=args.cols,
                       rounds=args.rounds, calls=args.calls, progress=lambda what: console.log(f"timing {what}"))
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"stream_store_sweep.py: the kernel in {kernel_dir} could not be timed: {exc}", file=sys.stderr)
        return 3
    table = Table(title=f"{cpu_model()}: streamed over cached stores, fp32 x {args.cols} columns, "
                        f"last-level cache {llc >> 20} MiB")
    for column in ("op", "rows (of cache)", "inputs", "streamed us", "cached us", "ratio (95 % CI)", "verdict",
                   "rule"):
        table.add_column(column, no_wrap=True)
    for p in points:
        ci = "" if p.ci_low is None else f" ({p.ci_low:.2f}-{p.ci_high:.2f})"
        rule = ("streams" if p.rule_streams else "caches") + (" [red]contradicted[/red]" if p.rule_disagrees else
                                                                 " (gain left)" if p.gain_left else "")
        table.add_row(p.op, f"{p.rows} ({p.llc_fraction:g})", p.mode, f"{p.streamed_us:.0f}", f"{p.cached_us:.0f}",
                      f"{p.ratio:.2f}{ci}", VERDICTS.get(p.verdict, p.verdict), rule)
    table.caption = (f"rule: stream from {RULE_FRACTION:g} of the cache (bypass_caches_for); ratio below 1 "
                     "and verdict faster: streaming wins, with the whole interval below 1. The rule is for an "
                     "input just written (same input) and keeps an output that fits cached for the next op, "
                     "which is not timed here: 'gain left' marks what it forgoes when the input comes from memory")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_model(), "llc_bytes": llc, "rule_fraction": RULE_FRACTION,
                                         "points": [p.as_json() for p in points]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
