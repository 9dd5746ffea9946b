"""The avx2 and avx512 units of linear_int8 side by side on tiny calls, and where the dispatcher sends each.

    python examples/linear_int8/tiny_sweep.py <kernel dir> [--shapes 3x7x13,9x31x17,...]
        [--dtypes fp32,bf16] [--rounds 15] [--calls 100] [--tolerance 5] [--json FILE]

Below ``kLinearInt8Avx512MinWork`` multiply-adds (templates/ops/linear_int8.op)
the dispatcher runs the avx2 unit on a CPU that has the avx512 one: on a Xeon
with AMX the avx512 call took 4-11 % longer there (the same bits either way).
This script re-measures that rule on the machine it runs on. For each shape
and dtype both units run in the same process, alternately round by round (x
copied to a new tensor before every call, as the tier sweep's steady regime
does), and the ratio avx512 / avx2 of their median times comes with the
harness's bootstrap interval (kernel_harness/bench/stats.py, widened to the
5 % reproducibility floor). A row says which unit is faster only when its
interval excludes 1 ("neither" otherwise), and judges the dispatcher's pick
as ``benchmark_cpu.py --assert-dispatch`` does: a violation only when the
whole interval of its lag lies beyond the tolerance (``--tolerance``, 5 %),
"undecided" when it reaches below it; the threshold is worth moving only
where violations line up. The CPU, threads and load are printed with the table and stored in
the JSON: they are part of every number.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from kernel_harness.bench.stats import Measurement, speedup
from kernel_harness.bench.sweep import lag_verdict

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: M x N x K: from 15 to 65536 multiply-adds, around the rule's 4096
DEFAULT_SHAPES = "5x3x1,4x1x40,3x7x13,8x8x16,3x13x37,4x16x64,9x31x17,2x64x64,8x32x64,4x128x128"
UNITS = ("avx2", "avx512")
#: The table's mark after the pick's lag, by lag_verdict
VERDICT_MARKS = {"ok": "", "noise": "", "undecided": "?", "violation": "!"}


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"3x7x13,9x31x17"`` -> [(3, 7, 13), (9, 31, 17)]; ValueError naming a bad item."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"{item!r} is not MxNxK with three positive integers (e.g. 3x7x13)")
        shapes.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return shapes


def _round(kernel, unit: str, x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, out: torch.Tensor,
           calls: int) -> list[int]:
    """``calls`` timed calls on ``unit`` (ns each), x copied before each call."""
    os.environ["KERNEL_CPU_ISA"] = unit
    times = []
    for _ in range(calls):
        a = x.clone()
        start = time.perf_counter_ns()
        kernel.linear_int8(a, q, s, out=out)
        times.append(time.perf_counter_ns() - start)
    return times


def measure_shape(kernel, shape: tuple[int, int, int], dtype: str, rounds: int, calls: int,
                  tolerance_pct: float = 5.0) -> dict:
    """Both units on one shape: medians, the avx512 / avx2 ratio with its interval, which unit is
    faster (only outside the interval), the dispatcher's pick and its lag judged as
    ``--assert-dispatch`` judges one (bench/sweep.py's lag_verdict against ``tolerance_pct``)."""
    m, n, k = shape
    gen = torch.Generator().manual_seed(m * 1_000_003 + n * 1009 + k)
    x = torch.randn(m, k, generator=gen).to(DTYPES[dtype])
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    s = torch.rand(n, generator=gen) / 100
    out = torch.empty(m, n, dtype=x.dtype)
    os.environ.pop("KERNEL_CPU_ISA", None)
    pick = kernel.dispatch_tier("linear_int8", x, q, s)
    timed = {unit: Measurement(unit) for unit in UNITS}
    order, shuffler = list(UNITS), random.Random(m * n * k)
    for r in range(rounds + 1):  # round 0 warms both up and is dropped
        shuffler.shuffle(order)  # a fixed order biases the second
        for unit in order:
            times = _round(kernel, unit, x, q, s, out, calls)
            if r:
                timed[unit].add_round(times)
    os.environ.pop("KERNEL_CPU_ISA", None)
    # "speedup" of avx2 over avx512: above 1 means the avx2 unit is faster
    ratio = speedup(timed["avx512"], timed["avx2"])
    if ratio.ci_low is not None and ratio.ci_low > 1.0:
        faster = "avx2"
    elif ratio.ci_high is not None and ratio.ci_high < 1.0:
        faster = "avx512"
    else:
        faster = None
    lag, lag_ci = pick_lag(pick, ratio.value, ratio.ci_low, ratio.ci_high)
    return {"shape": f"{m}x{n}x{k}", "dtype": dtype, "multiply_adds": m * n * k,
            "median_us": {unit: timed[unit].median_us for unit in UNITS},
            "avx512_over_avx2": ratio.value, "ci_low": ratio.ci_low, "ci_high": ratio.ci_high,
            "faster": faster, "dispatcher_pick": pick, "pick_lag_pct": lag,
            "pick_verdict": lag_verdict(lag, lag_ci, tolerance_pct)}


def pick_lag(pick: str, ratio: float, low: float | None, high: float | None) -> tuple[float, tuple | None]:
    """The picked unit's lag behind the other in percent, with its interval, from the avx512 / avx2
    time ratio and its interval (a negative lag: the pick is the faster one)."""
    if pick == "avx2":  # avx2's time over avx512's is the inverse ratio
        ratio, low, high = 1 / ratio, (None if high is None else 1 / high), (None if low is None else 1 / low)
    interval = None if low is None or high is None else ((low - 1) * 100, (high - 1) * 100)
    return (ratio - 1) * 100, interval


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernel_dir", type=Path, help="a built package holding linear_int8 (new_kernel.py --op linear_int8)")
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"MxNxK list (default {DEFAULT_SHAPES})")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--rounds", type=int, default=15, help="alternating rounds per shape (default 15)")
    p.add_argument("--calls", type=int, default=100, help="calls per round (default 100)")
    p.add_argument("--tolerance", type=float, default=5.0,
                   help="allowed lag of the dispatcher's pick, percent (default 5, as --assert-dispatch)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as error:
        p.error(f"--shapes: {error}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes or any(d not in DTYPES for d in dtypes):
        p.error(f"--dtypes {args.dtypes}: use a comma-separated list of {', '.join(DTYPES)}")
    if args.rounds < 3 or args.calls < 1:
        p.error("--rounds must be at least 3 (an interval needs them) and --calls at least 1")
    import kernels
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from kernel_harness.cpu import cpu_model

    console = Console()
    try:
        kernel = kernels.get_local_kernel(args.kernel_dir)
    except Exception as error:  # noqa: BLE001 - any load failure is the same advice
        console.print(f"[red]{args.kernel_dir}: cannot load a built kernel package ({error}). Build it with "
                      f"`python scripts/build_kernel.py` in that directory first.[/red]")
        return 3
    missing = [unit for unit in UNITS if unit not in kernel.available_tiers()]
    if missing or not hasattr(kernel, "linear_int8"):
        reason = (f"this CPU ({cpu_model()}) or the package lacks the {', '.join(missing)} tier"
                  if missing else "the package has no linear_int8")
        console.print(f"[red]nothing to compare: {reason}. The script times the avx2 unit against the avx512 "
                      f"one, so it needs a CPU with AVX512 F/BW/VL/DQ.[/red]")
        return 2
    rows = []
    table = Table(title="linear_int8: avx512 / avx2 time (us; 95 % interval, at least +-5 %)", box=box.SIMPLE_HEAD,
                  padding=(0, 1), collapse_padding=True, pad_edge=False, show_edge=False)
    for column in ("dtype", "shape", "MACs", "avx2", "avx512", "ratio", "95% CI", "faster", "pick", "lag"):
        table.add_column(column, justify="left" if column in ("dtype", "shape") else "right", no_wrap=True)
    with console.status("timing both units on each shape"):
        for dtype in dtypes:
            for shape in shapes:
                row = measure_shape(kernel, shape, dtype, args.rounds, args.calls, args.tolerance)
                rows.append(row)
                interval = "-" if row["ci_low"] is None else f"{row['ci_low']:.2f}-{row['ci_high']:.2f}"
                lag = f"{row['pick_lag_pct']:+.0f}%{VERDICT_MARKS[row['pick_verdict']]}"
                table.add_row(dtype, row["shape"], str(row["multiply_adds"]), f"{row['median_us']['avx2']:.2f}",
                              f"{row['median_us']['avx512']:.2f}", f"{row['avx512_over_avx2']:.2f}", interval,
                              row["faster"] or "-", row["dispatcher_pick"], lag)
    conditions = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "pinned": False,
                  "load_average_after": os.getloadavg()[0]}
    console.print(table)
    console.print("faster: the unit whose time is lower with the whole interval (- : neither); lag: the pick's "
                  f"behind the other unit, ! a violation of the {args.tolerance:g} % tolerance (the whole "
                  "interval beyond it), ? undecided (the median beyond it, the interval not)")
    console.print(f"{conditions['cpu']}, {conditions['threads']} threads, not pinned, load average "
                  f"{conditions['load_average_after']:.1f} after the run; rounds {args.rounds} x {args.calls} calls")
    if args.json:
        args.json.write_text(json.dumps({**conditions, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
