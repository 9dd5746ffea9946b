"""Errors that carry the exit code the procedure's contract assigns them.

Every script exits 0 when all is well, 1 when the check failed (incorrect
kernel, validation error), 2 on bad usage or bad input files and 3 when the
kernel crashed, hung or could not be loaded.  Raising one of these classes is
how package code chooses that code; ``kernel_harness.cli`` turns it into a
one-paragraph message and the exit status, never a traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    CHECK_FAILED = 1
    BAD_INPUT = 2
    KERNEL_CRASHED = 3


class HarnessError(Exception):
    """Base class: a message for a person plus the exit code to use."""

    exit_code: ExitCode = ExitCode.BAD_INPUT

    def __init__(self, message: str, *, exit_code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(HarnessError):
    """A wrong flag, a malformed or missing input file (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class CheckFailed(HarnessError):
    """The thing under test is wrong: an incorrect kernel, a validation error (exit 1)."""

    exit_code = ExitCode.CHECK_FAILED


class KernelCrashed(HarnessError):
    """The kernel crashed, hung or could not be loaded (exit 3)."""

    exit_code = ExitCode.KERNEL_CRASHED
