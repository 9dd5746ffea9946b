"""Measure build times: a cold build, then rebuild + install after one-line AVX512 edits.

By default a fresh rms_norm kernel is generated from the templates into a
temporary directory; --kernel-dir benchmarks a copy of an existing kernel. The
wheel is installed with `pip install --force-reinstall --no-deps --target TMP`
so the benchmark never touches the active environment; --install-into-env runs
the configured install_command instead (as the procedure does).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
from rich.table import Table

from kernel_harness.build.bench import run_bench
from kernel_harness.cli import add_json_option, console, run_main, write_json_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="rms_norm", help="catalogue op to generate (default rms_norm)")
    parser.add_argument("--kernel-dir", type=Path, default=None, help="benchmark a copy of this kernel instead")
    parser.add_argument("--rounds", type=int, default=3, help="incremental edit rounds (default 3)")
    parser.add_argument("--cold-ccache", action="store_true", help="allow ccache for the cold build (default: off)")
    parser.add_argument("--install-into-env", action="store_true", help="run the configured install_command")
    parser.add_argument("--keep", action="store_true", help="keep the temporary kernel directory")
    add_json_option(parser)
    args = parser.parse_args(argv)
    result = run_bench(
        op=args.op,
        kernel_dir=args.kernel_dir,
        rounds=args.rounds,
        cold_ccache=args.cold_ccache,
        install_mode="env" if args.install_into_env else "target",
        keep=args.keep,
    )
    table = Table(title=f"build benchmark: {result.kernel_dir}")
    table.add_column("step")
    table.add_column("wall seconds", justify="right")
    table.add_column("CPU seconds", justify="right")
    table.add_column("load avg", justify="right")
    table.add_row(
        f"cold build ({'ccache on' if result.cold_ccache else 'no ccache'})",
        f"{result.cold_seconds:.1f}",
        f"{result.cold_cpu_seconds:.1f}",
        f"{result.cold_load:.1f}",
    )
    for index, row in enumerate(result.rounds, 1):
        table.add_row(
            f"edit {index}: build + install ({', '.join(result.compiled_per_round[index - 1])})",
            f"{row['build']:.1f} + {row['install']:.1f} = {row['total']:.1f}",
            f"{row['cpu']:.1f}",
            f"{row['load']:.1f}",
        )
    table.add_row("median incremental build + install", f"{result.incremental_total_median:.1f}", "", "")
    console.print(
        "Wall times depend on what else runs on the machine; CPU seconds (compiler + pip) do not.",
        style="dim",
    )
    console.print(table)
    write_json_report(args.json, result.as_dict())
    return 0


if __name__ == "__main__":
    run_main(main)
