"""Timing the baseline alone, for ``trial_manager.py baseline-us LABEL --refresh``.

The cached baseline time (``benchmark_cpu.py --baseline-us``) must be timed the
way the benchmark times the baseline: in a :class:`WorkerProcess` with the
same allocator settings and thread count, on fresh inputs drawn from seeds
outside the timed region, outputs kept (``keep=True``, as the benchmark's
spot rounds do), in rounds of calls whose median is reported
(:class:`stats.Measurement`).  Run as a module it prints one JSON object, so
the trial manager can run it under ``numactl`` (the worker inherits the
binding) and record the value with its conditions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from typing import Any

from ..cpu import cpu_model, supported_tiers
from ..errors import HarnessError
from . import stats
from .conditions import RunQueueSampler, Watch, assess
from .pinning import detect_pinning
from .process import WorkerProcess, worker_env

#: Enough rounds for a stable median in a few seconds; the benchmark's default is 20
#: rounds shared by two sides, so 10 rounds of one side cost about as much as its half.
DEFAULT_ROUNDS = 10
TARGET_ROUND_S = 0.03
MAX_CALLS = 50


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _calls_per_round(call_ns: float) -> int:
    return max(1, min(MAX_CALLS, math.ceil(TARGET_ROUND_S * 1e9 / max(call_ns, 1.0))))


def time_baseline(baseline_path: str, *, threads: int, rounds: int = DEFAULT_ROUNDS,
                  timeout: float = 120.0, seed: int | None = None) -> dict[str, Any]:
    """Median per-call time of the baseline in its own worker, with the run's conditions."""
    rng = random.Random(seed if seed is not None else random.SystemRandom().randrange(1, 2**31))

    def seeds(n: int) -> list[int]:
        return [rng.randrange(1, 2**31 - 1) for _ in range(n)]

    env = worker_env(threads)  # the benchmark's own worker settings, so the value compares
    pin = detect_pinning()
    load_before = _load()
    measurement = stats.Measurement("baseline")
    # the benchmark's own detector (run-queue wait of the timing thread, the run queue
    # sampled during the rounds, steal time), not the lagging load average: the value
    # every later --baseline-us run divides by must not come from a busy machine unnoticed
    watch = Watch(threads=threads, load_before=load_before)
    with WorkerProcess("baseline", timeout=timeout, env=env) as worker:
        loaded = worker.request("load", "loading the baseline", role="baseline", baseline_path=str(baseline_path),
                                kernel_spec="", op_path="", threads=threads)
        warm = worker.request("time", "the baseline's warm-up calls", source=("inputs", 0), seeds=seeds(5),
                              keep=False, warmup=2, cold=False)["times_ns"]
        calls = _calls_per_round(stats.Measurement("warm", [warm]).median_us * 1e3)
        with RunQueueSampler() as sampler:
            for index in range(rounds):
                reply = worker.request("time", f"baseline timing round {index + 1}", source=("inputs", 0),
                                       seeds=seeds(calls), keep=True, warmup=0, cold=False)
                measurement.add_round(reply["times_ns"])
                watch.side("baseline").add(reply["times_ns"], reply)
    watch.run_queue, watch.steal_fraction = sampler.samples, sampler.steal_fraction
    watch.load_after = _load()
    # os.cpu_count(), as the benchmark's record_watch: the sampled run queue is machine-wide
    measured, reasons, _ = assess(watch, os.cpu_count() or 1)
    summary = measurement.summary()
    return {
        "baseline_us": round(measurement.median_us, 3),
        "timing": summary,
        "conditions": {
            "cpu_model": cpu_model(),
            "supported_tiers": supported_tiers(),
            "tier_ran": None,
            # the worker's regime, as benchmark_cpu.py records it (eviction.py)
            "inputs_from_memory": loaded["persistent_inputs"],
            "threads": threads,
            "pinned": pin.pinned,
            "pinned_detail": pin.detail,
            **measured,
        },
        "reliable": not reasons,
        "unreliable_reasons": reasons,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time a baseline alone and print JSON (used by "
                                                 "trial_manager.py baseline-us --refresh).")
    parser.add_argument("baseline")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for the baseline (default: torch's default, as benchmark_cpu.py)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    if args.threads is None:
        import torch

        args.threads = torch.get_num_threads()
    if args.threads < 1 or args.rounds < 1:
        print(json.dumps({"error": "--threads and --rounds must be at least 1", "exit_code": 2}))
        return 2
    try:
        payload = time_baseline(args.baseline, threads=args.threads, rounds=args.rounds, timeout=args.timeout)
    except HarnessError as exc:
        print(json.dumps({"error": exc.message, "exit_code": int(exc.exit_code)}))
        return int(exc.exit_code)
    print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
