"""The child process of ``cpu_profiler.py``: loads the kernel and calls it repeatedly.

A kernel is native code that may crash or hang, so it never runs in the
profiler's own process.  Two modes:

* ``measure``: time the op with all threads and with one thread, time it
  with ``out=`` a preallocated buffer when the function accepts one, and time
  allocating + first-touching a buffer of the output's size; write the numbers
  as JSON to ``--result``.
* ``loop``: warm up (so the OpenMP pool exists), print ``READY`` on stdout,
  then call the op until ``--seconds`` have passed while the parent attaches
  ``perf stat -p`` or ``perf record -p`` for a fixed window; write calls/second and
  the kernel's library file names to ``--result``.

Both modes call the op on input lists in turn: with the baseline's
``PERSISTENT_INPUTS`` (weights, KV caches) each list has its own copy of
those, enough copies that every call reads them from memory as in a model
(bench/eviction.py: ``rotated_sets``); without, the one drawn list.

Run as ``python -m kernel_harness.profiling.child --kernel-package P --op P.f --baseline B ...``.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..baseline import load_baseline
from ..bench.eviction import rotated_sets
from ..kernel_loader import load_kernel_module, resolve_op


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _time_calls(fn: Callable[[], Any], *, min_seconds: float, max_calls: int = 100000) -> dict[str, float]:
    """Median and min per-call microseconds over at least ``min_seconds`` (after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    samples: list[float] = []
    start = time.perf_counter()
    while (time.perf_counter() - start < min_seconds or len(samples) < 5) and len(samples) < max_calls:
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return {"median_us": statistics.median(samples), "min_us": min(samples), "calls": len(samples)}


def accepts_out(fn: Callable[..., Any]) -> bool:
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins / torch ops without a Python signature
        return False


def _in_turn(sets: list[list[Any]]) -> Callable[[], list[Any]]:
    """The next input list on each call, round and round."""
    turn = itertools.cycle(sets)
    return lambda: next(turn)


def measure(op: Callable[..., Any], sets: list[list[Any]], *, seconds: float) -> dict[str, Any]:
    threads = torch.get_num_threads()
    result: dict[str, Any] = {"threads": threads, "input_copies": len(sets)}
    inputs = _in_turn(sets)
    output = op(*inputs())
    out_tensor = _first_tensor(output)
    result["output_bytes"] = int(out_tensor.numel() * out_tensor.element_size()) if out_tensor is not None else 0
    result["output_is_single_tensor"] = isinstance(output, torch.Tensor)
    result["all_threads"] = _time_calls(lambda: op(*inputs()), min_seconds=seconds)
    try:
        torch.set_num_threads(1)  # the kernel's OpenMP regions share torch's runtime and see this
        result["one_thread"] = _time_calls(lambda: op(*inputs()), min_seconds=seconds)
    finally:
        torch.set_num_threads(threads)
    result["accepts_out"] = accepts_out(op) and isinstance(output, torch.Tensor)
    if result["accepts_out"]:
        buffer = torch.empty_like(output)
        try:
            result["with_out"] = _time_calls(lambda: op(*inputs(), out=buffer), min_seconds=seconds)
        except Exception as exc:  # noqa: BLE001 - report, do not fail the profile
            result["accepts_out"] = False
            result["out_error"] = f"{type(exc).__name__}: {exc}"
    if out_tensor is not None:
        # The cost of a fresh output: allocate and first-touch it (page faults), vs writing a warm buffer.
        shape, dtype = out_tensor.shape, out_tensor.dtype
        warm = torch.empty(shape, dtype=dtype)
        warm.zero_()
        result["alloc_touch"] = _time_calls(lambda: torch.empty(shape, dtype=dtype).zero_(), min_seconds=seconds / 2)
        result["touch_prealloc"] = _time_calls(lambda: warm.zero_(), min_seconds=seconds / 2)
    return result


def loop(op: Callable[..., Any], sets: list[list[Any]], *, seconds: float) -> dict[str, Any]:
    inputs = _in_turn(sets)
    for _ in range(3):
        op(*inputs())
    print("READY", flush=True)
    calls = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        op(*inputs())
        calls += 1
    elapsed = time.perf_counter() - start
    return {"calls": calls, "seconds": elapsed, "us_per_call": elapsed / max(1, calls) * 1e6}


def kernel_libraries(module: Any) -> list[str]:
    """File names of the native libraries in the kernel package's directory: the parent
    picks the kernel's own functions out of a perf report by them."""
    origin = getattr(module, "__file__", None)
    if not origin:
        return []
    return sorted({path.name for path in Path(origin).resolve().parent.rglob("*.so")})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel-package", required=True)
    parser.add_argument("--op", required=True)
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--mode", choices=("measure", "loop"), required=True)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result", required=True, type=Path)
    args = parser.parse_args(argv)
    payload: dict[str, Any]
    try:
        module = load_kernel_module(args.kernel_package)
        op = resolve_op(module, args.op)
        baseline = load_baseline(args.baseline)
        sets = rotated_sets(baseline.draw_inputs(args.seed), baseline.persistent_inputs)
        with torch.no_grad():
            payload = (measure if args.mode == "measure" else loop)(op, sets, seconds=args.seconds)
        payload["libraries"] = kernel_libraries(module)
        payload["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the parent turns this into a clear message
        payload = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                   "harness_error": getattr(exc, "exit_code", None) is not None,
                   "exit_code": int(getattr(exc, "exit_code", 3))}
    args.result.write_text(json.dumps(payload), encoding="utf-8")
    return 0 if payload.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
