"""Static validation of a CPU kernel directory (scripts/validate_cpu_kernel.py)."""

from .findings import ERROR_CODES, WARNING_CODES, Finding, Report
from .validator import validate_kernel

__all__ = ["ERROR_CODES", "WARNING_CODES", "Finding", "Report", "validate_kernel"]
