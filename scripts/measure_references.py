"""Measure the numbers quoted in references/*.yaml on this machine.

Runs the micro benchmarks of kernel_harness.snippets.measure (each one calls the
exact code of a reference entry) and prints one table per benchmark. Use it to
re-derive the `expected_effect` numbers on a new machine; it is a maintenance
tool for the knowledge base, not a way to time a kernel (benchmark_cpu.py is the
only timing source for kernels).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
from rich.table import Table

from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.snippets.measure import KEYS, run_all


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Re-measure the expected_effect numbers of references/.")
    parser.add_argument("--only", nargs="*", default=None, metavar="KEY",
                        help="run only these benchmarks (e.g. gemm fusion); default: all. Keys: " + " ".join(KEYS))
    add_json_option(parser)
    args = parser.parse_args(argv)
    results = run_all(set(args.only) if args.only else None)
    for m in results:
        table = Table(title=f"{m.key} [{m.entry_id}]: {m.description}")
        table.add_column("value")
        table.add_column("number", justify="right")
        for name, value in m.values.items():
            table.add_row(name, f"{value:.4g}")
        console.print(table)
    write_json_report(args.json, {"measurements": [m.as_dict() for m in results]})
    return 0


if __name__ == "__main__":
    run_main(main)
