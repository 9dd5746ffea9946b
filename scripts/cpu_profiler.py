"""Profile a built kernel: perf counters when available, the roofline profile always (procedure step 9).

    python scripts/cpu_profiler.py --kernel-package my_kernel --op my_kernel.rms_norm [--baseline baseline.py]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)

from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.config import load_config
from kernel_harness.machine import announce_measuring, get_machine_profile
from kernel_harness.profiling import print_profile, profile_op


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the kernel's op repeatedly in a child process; read perf stat counters (IPC, L1/LLC "
        "misses, branch misses) when the machine has them, and always report achieved GB/s and GFLOP/s "
        "against this machine's roofline, output-allocation cost and thread scaling, with the next change."
    )
    parser.add_argument("--kernel-package", required=True, help="installed package name or kernel directory")
    parser.add_argument("--op", required=True, help="<package>.<function>, e.g. my_kernel.rms_norm")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="baseline.py giving the inputs (default: the shipped example for the function, "
                             "or the only trial tree under ./trials)")
    parser.add_argument("--seconds", type=float, default=0.5, help="timing budget per measurement (default 0.5)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    config = load_config()
    machine = get_machine_profile(on_measure=announce_measuring)
    report = profile_op(args.kernel_package, args.op, args.baseline, config=config, machine=machine,
                        seconds=args.seconds)
    print_profile(report, console)
    write_json_report(args.json, report)
    return 0


if __name__ == "__main__":
    run_main(main)
