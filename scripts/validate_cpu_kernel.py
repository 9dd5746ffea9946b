"""Check a CPU kernel directory before building it (procedure step 4).

Errors (exit 1) are things that will not build or will misbehave: schema
problems in build.toml, missing/unlisted sources, SIMD sections without
-fopenmp or without include = ["<kernel>_cpu"], intrinsics the unit's flags
do not enable, a tier mixing ISA levels, KERNEL_TODO(...) bodies, a
[general] name kernels_data.KernelName refuses, and an existing
build/<variant>/ whose metadata.json kernels-data cannot read or whose files
differ from its digest. Warnings are likely performance or correctness problems
worth a look.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
from rich.markup import escape

from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.errors import UsageError
from kernel_harness.validate import validate_kernel


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel_dir", type=Path, help="the kernel directory (holding build.toml)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if not args.kernel_dir.is_dir():
        raise UsageError(f"{args.kernel_dir} is not a directory; pass the kernel directory that holds build.toml.")
    report = validate_kernel(args.kernel_dir)

    console.print(f"validating {escape(report.kernel_dir)}", soft_wrap=True)
    for label, findings in (("[bold red]error[/]", report.errors), ("[yellow]warning[/]", report.warnings)):
        for finding in findings:
            where = f" {escape(finding.location())}:" if finding.location() else ""
            console.print(f"{label} [bold]{finding.code}[/]{where} {escape(finding.message)}", soft_wrap=True)
    summary = f"{len(report.errors)} error(s), {len(report.warnings)} warning(s)"
    if report.ok:
        console.print(f"[bold green]valid[/bold green]: {summary}")
    else:
        console.print(f"[bold red]invalid[/bold red]: {summary}; fix the named files or build.toml sections and rerun.")
    write_json_report(args.json, report.as_dict())
    return 0 if report.ok else 1


if __name__ == "__main__":
    run_main(main)
