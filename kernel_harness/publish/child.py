"""Work that must run in a FRESH interpreter: ``python -m kernel_harness.publish.child``.

Loading a kernel can crash the process (a bad ``.so``), and a kernel already
imported in the parent (for example the installed wheel of the same name)
would hide a broken staged copy.  So the publisher never imports the kernel or
the baseline itself; it runs one of these commands in a new process and reads
one JSON line, prefixed with :data:`RESULT_PREFIX`, from its stdout.

Commands:

``load STAGE``
    ``kernels.get_local_kernel(STAGE)``; reports the module, its functions and
    ``available_tiers()``.
``workloads BASELINE``
    imports the baseline and describes its inputs: the headline workload and,
    per dtype, the largest correctness case (what ``benchmarks/benchmark.py``
    times), plus every floating dtype the baseline checks.
``kernels-benchmark STAGE``
    runs ``STAGE/benchmarks/benchmark*.py`` through the functions
    ``kernels benchmark ./STAGE`` uses for a local path.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from kernel_harness.publish.wire import RESULT_PREFIX


def _emit(payload: dict[str, Any]) -> None:
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(payload, sort_keys=True), flush=True)


def _load(stage: Path) -> dict[str, Any]:
    from kernels import get_local_kernel

    module = get_local_kernel(stage)
    functions = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
    tiers: list[str] | None = None
    if callable(getattr(module, "available_tiers", None)):
        tiers = [str(t) for t in module.available_tiers()]
    return {
        "module": module.__name__,
        "file": str(getattr(module, "__file__", "")),
        "functions": functions,
        "available_tiers": tiers,
    }


def import_baseline(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("kh_publish_baseline", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tensor_leaves(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _tensor_leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _tensor_leaves(item)]
    return []


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _describe(inputs: Any) -> dict[str, Any]:
    leaves = _tensor_leaves(inputs)
    first = leaves[0] if leaves else None
    return {
        "dtype": _dtype_name(first.dtype) if first is not None else "none",
        "shape": list(first.shape) if first is not None else [],
        "numel": sum(int(t.numel()) for t in leaves),
        "shapes": [list(t.shape) for t in leaves],
    }


def _describe_args(inputs: Any) -> list[dict[str, Any]]:
    """Each top-level argument, for the card's runnable example."""
    import torch

    described: list[dict[str, Any]] = []
    for value in inputs if isinstance(inputs, (list, tuple)) else [inputs]:
        if isinstance(value, torch.Tensor):
            described.append({"kind": "tensor", "shape": list(value.shape), "dtype": _dtype_name(value.dtype)})
        elif isinstance(value, (bool, int, float, str)) or value is None:
            described.append({"kind": "value", "repr": repr(value)})
        else:
            described.append({"kind": "other", "type": type(value).__name__})
    return described


def _workloads(baseline_path: Path) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    baseline = import_baseline(baseline_path)
    headline_inputs = baseline.get_inputs()
    headline = _describe(headline_inputs)
    workloads = [{"source": "headline", "index": None, **headline}]
    dtypes = {headline["dtype"]}
    correctness = list(baseline.get_correctness_inputs()) if hasattr(baseline, "get_correctness_inputs") else []
    largest: dict[str, dict[str, Any]] = {}
    for index, inputs in enumerate(correctness):
        info = _describe(inputs)
        dtypes.add(info["dtype"])
        best = largest.get(info["dtype"])
        if best is None or info["numel"] > best["numel"]:
            largest[info["dtype"]] = {"source": "correctness", "index": index, **info}
    workloads += [largest[d] for d in sorted(largest)]
    has_reference = callable(getattr(baseline, "get_reference_output", None)) or hasattr(baseline, "Model")
    return {
        "workloads": workloads,
        "dtypes": sorted(d for d in dtypes if d != "none"),
        "correctness_cases": len(correctness),
        "has_reference": has_reference,
        "has_run_baseline": callable(getattr(baseline, "run_baseline", None)),
        "headline_args": _describe_args(headline_inputs),
        "doc": (baseline.__doc__ or "").strip(),
    }


def _kernels_benchmark(stage: Path, iterations: int, warmup: int) -> dict[str, Any]:
    # The same functions `kernels benchmark ./STAGE` calls for a local path
    # (run_benchmark -> discover_benchmark_scripts -> run_benchmark_script ->
    # discover_benchmark_classes -> run_benchmark_class; kernels_cli finds their
    # module). run_benchmark itself is not called because it first insists on the
    # optional `tabulate` package only to print its table.
    from kernel_harness.publish.kernels_cli import benchmark_runner

    runner = benchmark_runner()
    stage = stage.resolve()
    results: dict[str, Any] = {}
    for script in runner.discover_benchmark_scripts(str(stage), stage):
        timings, _sha = runner.run_benchmark_script(
            script,
            iterations=iterations,
            warmup=warmup,
            cwd=stage,
            repo_id=str(stage),
            is_local=True,
            revision="local",
        )
        for name, timing in timings.items():
            results[name] = {
                "verified": timing.verified,
                "mean_ms": timing.mean_ms,
                "ref_mean_ms": timing.ref_mean_ms,
            }
    return {"workloads": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernel_harness.publish.child")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("load").add_argument("stage", type=Path)
    sub.add_parser("workloads").add_argument("baseline", type=Path)
    bench = sub.add_parser("kernels-benchmark")
    bench.add_argument("stage", type=Path)
    bench.add_argument("--iterations", type=int, default=5)
    bench.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        if args.command == "load":
            payload = _load(args.stage)
        elif args.command == "workloads":
            payload = _workloads(args.baseline)
        else:
            payload = _kernels_benchmark(args.stage, args.iterations, args.warmup)
    except SystemExit as exc:  # kernels' CLI helpers exit instead of raising
        _emit({"ok": False, "error": f"exited with status {exc.code}", "traceback": ""})
        return 1
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as data
        _emit({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return 1
    _emit({"ok": True, **payload})
    return 0


if __name__ == "__main__":
    sys.exit(main())
