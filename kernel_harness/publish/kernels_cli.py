"""Where the installed ``kernels`` keeps the code behind ``kernels benchmark``.

The publish check runs a staged kernel's ``benchmarks/benchmark.py`` through the
same functions as the ``kernels benchmark`` command, so that what passes here
passes there. Those functions are not public API and moved: ``kernels.cli.benchmark``
up to 0.18, ``kernels._internals.cli.benchmark`` from 0.19 on (same names and
signatures). This module is the one place that knows both.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Newest layout first: a kernels release that keeps an old alias still gets the new code.
BENCHMARK_MODULES = ("kernels._internals.cli.benchmark", "kernels.cli.benchmark")
REQUIRED_FUNCTIONS = ("discover_benchmark_scripts", "discover_benchmark_classes", "run_benchmark_script")


class BenchmarkRunnerMissing(RuntimeError):
    """The installed kernels has no benchmark runner this harness knows how to call."""


def _installed_kernels_version() -> str:
    try:
        return importlib.import_module("kernels").__version__
    except (ImportError, AttributeError):
        return "not installed"


def benchmark_runner() -> ModuleType:
    """The module with ``discover_benchmark_scripts`` / ``run_benchmark_script``."""
    for name in BENCHMARK_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if all(callable(getattr(module, fn, None)) for fn in REQUIRED_FUNCTIONS):
            return module
    raise BenchmarkRunnerMissing(
        f"the installed kernels ({_installed_kernels_version()}) has none of {', '.join(BENCHMARK_MODULES)} "
        f"with {', '.join(REQUIRED_FUNCTIONS)}, which `kernels benchmark` runs and publish's check reuses. "
        "Install a tested version (pip install 'kernels>=0.17.2,<0.20') or report the new layout."
    )
