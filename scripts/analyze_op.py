"""Analyse an operation for this machine: kind, roofline, SIMD strategy (procedure step 2).

    python scripts/analyze_op.py --op rms_norm --shapes "1024x4096,2048x8192" [--dtype bf16]
    python scripts/analyze_op.py --op my_op --file baseline.py   # traces the baseline, shapes from it
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)

from kernel_harness.analysis import analyze_op, parse_shapes, print_report
from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.errors import UsageError
from kernel_harness.machine import announce_measuring, get_machine_profile


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Classify an op (element-wise, reduction, GEMM, attention), compute its FLOPs, bytes and "
        "roofline floor on this machine, and suggest the SIMD strategy and references to read."
    )
    parser.add_argument("--op", required=True, help="plain op name, e.g. rms_norm (not package.function)")
    parser.add_argument("--shapes", default=None,
                        help='comma-separated shapes, e.g. "1024x4096,2048x8192" (GEMM: MxNxK; attention: BxHxSxD)')
    parser.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default=None,
                        help="element type (default: the baseline's, else fp32)")
    parser.add_argument("--file", type=Path, default=None,
                        help="baseline.py to trace under fake tensors (kind and shapes then come from it)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.shapes is None and args.file is None:
        raise UsageError('Pass --shapes (e.g. --shapes "1024x4096,2048x8192") or --file baseline.py '
                         "to take the shapes from the baseline.")
    shapes = parse_shapes(args.shapes) if args.shapes is not None else None
    machine = get_machine_profile(on_measure=announce_measuring)
    report = analyze_op(args.op, shapes=shapes, dtype=args.dtype, baseline=args.file, machine=machine)
    if not report["shapes"]:
        raise UsageError(
            f"{args.file} could not be traced ({report['trace_error']}) and no --shapes were given, so there is "
            'nothing to analyse. Pass --shapes (e.g. --shapes "1024x4096") or make the baseline runnable on '
            "fake tensors (no .item()/.numpy() in get_inputs or the reference)."
        )
    print_report(report, console)
    write_json_report(args.json, report)
    return 0


if __name__ == "__main__":
    run_main(main)
