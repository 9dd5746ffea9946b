"""What every command-line script shares: error reporting, exit codes, ``--json``.

A script's ``main(argv) -> int`` does the work through package functions and
raises :class:`~kernel_harness.errors.HarnessError` for anything a person must
fix.  :func:`run_main` turns that into one clear paragraph on stderr and the
matching exit code.  An unexpected exception is still reported as a paragraph
(the traceback is shown only with ``KERNEL_HARNESS_DEBUG=1``) because an agent
reading a bare traceback tends to "fix" the harness instead of its kernel.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from .atomic import atomic_write_json
from .errors import ExitCode, HarnessError

#: Columns for output that is not a terminal (a log, a pipe an agent reads):
#: rich would give it 80 and cut a table's numbers to "7.58-…".
LOG_WIDTH = 160


def console_width(stream: Any) -> int | None:
    """The width for a console on ``stream``: rich's own choice for a terminal or
    when COLUMNS says, LOG_WIDTH for anything else."""
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return LOG_WIDTH


console = Console(highlight=False, width=console_width(sys.stdout))
err_console = Console(stderr=True, highlight=False, width=console_width(sys.stderr))


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        metavar="FILE",
        type=Path,
        default=None,
        help="also write the result as JSON with stable keys to FILE",
    )


def write_json_report(path: Path | None, payload: dict[str, Any]) -> None:
    """Write the machine-readable report when ``--json FILE`` was given."""
    if path is None:
        return
    try:
        atomic_write_json(Path(path), payload)
    except OSError as exc:
        raise HarnessError(
            f"Could not write the JSON report to {path}: {exc.strerror or exc}. "
            "Pass --json a path in a writable directory."
        ) from exc


def report_error(error: HarnessError) -> None:
    label = {
        ExitCode.CHECK_FAILED: "check failed",
        ExitCode.BAD_INPUT: "error",
        ExitCode.KERNEL_CRASHED: "kernel failure",
    }.get(error.exit_code, "error")
    err_console.print(f"[bold red]{label}:[/bold red] {error.message}", soft_wrap=True)


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> None:
    """Run a script's ``main`` and exit with the contract's exit code."""
    try:
        code = main(argv)
    except HarnessError as error:
        report_error(error)
        code = int(error.exit_code)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/bold red]: nothing further was written.")
        code = 130
    except Exception as error:  # noqa: BLE001 - last line of defence, see module docstring
        if os.environ.get("KERNEL_HARNESS_DEBUG"):
            traceback.print_exc()
        err_console.print(
            f"[bold red]internal error:[/bold red] {type(error).__name__}: {error}. "
            "This is a bug in the harness, not in your kernel; rerun with "
            "KERNEL_HARNESS_DEBUG=1 to see the traceback and report it.",
            soft_wrap=True,
        )
        code = int(ExitCode.BAD_INPUT)
    sys.exit(code)
