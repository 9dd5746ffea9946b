"""Benchmarking on a Ray cluster: one quiet slot per machine, every CPU class.

One machine is not enough twice over: several tenants on one machine distort
each other's timings, and one CPU runs only some of a kernel's tiers.  The
farm runs the *same* benchmark (``scripts/benchmark_cpu.py --json``, child
process isolation included) on a Ray node that holds the node's only
``bench_slot`` resource, so no two benchmarks ever share a machine, and a job
can ask for a CPU class.  We use Ray's scheduler rather than writing one.

Modules, one job each:

* :mod:`.classes` - the CPU classes and Ray resources a node advertises;
* :mod:`.node` - start, stop and list the Ray node of this machine;
* :mod:`.remote` - the task that runs the benchmark on a node;
* :mod:`.submit` - the driver side of ``benchmark_cpu.py --cluster``;
* :mod:`.merge` - the returned report: ``remote`` object, file names, exit code.
* :mod:`.identity` - the harness code, torch and variant a node must share with the driver;
* :mod:`.agreement` - remote vs local speedup over N runs a side (``scripts/farm_agreement.py``).

Ray is the optional extra ``cluster``; everything else works without it.
"""

from __future__ import annotations

from types import ModuleType

from ..errors import UsageError

#: The install hint every "Ray is missing" error gives.
INSTALL_HINT = "pip install -e '.[cluster]' (or pip install 'ray>=2.60')"
#: The command that starts a head node, named by every "no cluster" error.
HEAD_COMMAND = "python -m kernel_harness.farm node --head"


def require_ray() -> ModuleType:
    """Import Ray or raise a :class:`UsageError` that says how to install it."""
    try:
        import ray  # noqa: PLC0415 - optional dependency, imported on use
    except ImportError as exc:
        raise UsageError(
            f"Benchmarking on a cluster needs Ray, which is not importable here ({exc}). "
            f"Install the optional extra: {INSTALL_HINT}, then rerun; without --cluster the "
            "benchmark runs locally and needs no Ray."
        ) from None
    return ray
