"""Build the kernel in the current directory (or --dir): the configured build_command.

Reads build.toml, compiles every source with ninja (+ ccache), and writes
build/torch<MAJ><MIN>-cxx11-cpu-<arch>-linux/ (what kernels.get_local_kernel
imports; its metadata.json carries a kernels-data sha256 digest of the variant's
files) and a wheel in dist/. A compiler error prints file:line and the
message first, then the raw compiler output, exits 1 and keeps the previous
build.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kernel_harness.build import BuildFailed, build_kernel
from kernel_harness.cli import add_json_option, console, err_console, run_main, write_json_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="kernel directory (default: the current directory)")
    parser.add_argument(
        "--release",
        action="store_true",
        help="accepted for kernel-builder compatibility; builds are always optimised (-O3)",
    )
    parser.add_argument("--jobs", "-j", type=int, default=None, help="parallel compile jobs (default: ninja's)")
    parser.add_argument("--no-wheel", action="store_true", help="skip writing dist/*.whl")
    add_json_option(parser)
    args = parser.parse_args(argv)

    progress = Progress(
        TextColumn("[bold blue]build"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = progress.add_task("starting", total=None)

    def on_step(done: int, total: int, kind: str, what: str) -> None:
        progress.update(task, completed=done, total=total, description=f"{kind} {what}")
        if not console.is_terminal:
            console.print(f"[{done}/{total}] {kind} {what}", highlight=False)

    try:
        with progress:
            result = build_kernel(args.dir, jobs=args.jobs, wheel=not args.no_wheel, on_step=on_step)
    except BuildFailed as failure:
        err_console.print(f"[bold red]build failed:[/bold red] {failure.message}", soft_wrap=True)
        err_console.rule("compiler output")
        sys.stderr.write(failure.raw if failure.raw.endswith("\n") else failure.raw + "\n")
        sys.stderr.flush()
        write_json_report(
            args.json,
            {
                "ok": False,
                "error": {"file": failure.error.file, "line": failure.error.line, "message": failure.error.message},
            },
        )
        return 1

    compiled = ", ".join(result.compiled) if result.compiled else "nothing (all objects up to date)"
    console.print(f"compiled: {compiled}", soft_wrap=True)
    console.print(f"variant:  {result.variant_dir}", soft_wrap=True)
    if result.wheel:
        console.print(f"wheel:    {result.wheel}", soft_wrap=True)
    if result.prefetches is not None:
        # a prefetch knob trial that leaves these counts unchanged tested nothing (machine_code)
        counts = ", ".join(f"{tier} {n}" for tier, n in result.prefetches.items())
        console.print(f"prefetch instructions: {counts}", soft_wrap=True)
    console.print(
        f"[bold green]built[/bold green] {result.ext_name} in {result.seconds:.1f} s"
        + (" (ccache on)" if result.ccache else ""),
    )
    write_json_report(args.json, result.as_dict())
    return 0


if __name__ == "__main__":
    run_main(main)
