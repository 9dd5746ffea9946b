"""Side-by-side timings of linear: F.linear against the kernel's tiers, plain and packed.

    python examples/linear/sweep.py <kernel dir> [--m 1,4,16,128,1024] [--n 4096] [--k 4096]
        [--dtypes bf16,fp32] [--reps 7] [--threads T] [--json FILE]

For each dtype and M, in one process and interleaved round by round (so a busy
machine slows every column alike): F.linear (oneDNN/MKL), and the kernel with
the plain weight and with ``prepack(weight)`` on every tier this CPU runs
(forced through KERNEL_CPU_ISA). Medians of ``--reps`` rounds, and the
weight-streaming floor (weight bytes / the machine probe's all-thread read
bandwidth, ``python -m kernel_harness.machine``) and GFLOP/s. ``prepack`` is
timed separately: steady-state calls do not pay it. The rows name the CPU,
the threads and the load average, which are part of every number.

Before every timed call the caches are scrubbed (a read of three times the
last-level cache, kernel_harness/bench/eviction.py) and x rewritten, so the
weight comes from memory and x from the cache, as in a model: a weight reused
call after call stays in the L3, which changed which GEMM won at M = 32 and
128 on a Zen 4 EPYC. ``--weight-in-cache`` times without the scrub.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _time_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def sweep(kernel, ms: list[int], n: int, k: int, dtypes: list[str], reps: int, read_gbs: float | None,
          scrubber=None) -> list[dict]:
    tiers = kernel.available_tiers()
    rows = []
    for name in dtypes:
        dtype = DTYPES[name]
        w = (torch.randn(n, k) / k**0.5).to(dtype)
        b = torch.randn(n).to(dtype)
        pack_ms = statistics.median(_time_ms(lambda: kernel.prepack(w)) for _ in range(3))
        wp = kernel.prepack(w)
        floor_ms = w.numel() * w.element_size() / (read_gbs * 1e9) * 1e3 if read_gbs else None
        for m in ms:
            x = torch.randn(m, k).to(dtype)
            calls = {"F.linear": lambda: F.linear(x, w, b)}
            for tier in tiers:
                calls[f"{tier} plain"] = (tier, lambda: kernel.linear(x, w, b))
                calls[f"{tier} packed"] = (tier, lambda: kernel.linear(x, wp, b))
            times: dict[str, list[float]] = {label: [] for label in calls}
            order, shuffler = list(calls), random.Random(m)
            for _ in range(reps + 1):  # the first round warms up and is dropped
                shuffler.shuffle(order)  # a fixed order biases (examples/linear/README.md)
                for label in order:
                    call = calls[label]
                    if isinstance(call, tuple):
                        os.environ["KERNEL_CPU_ISA"] = call[0]
                        call = call[1]
                    else:
                        os.environ.pop("KERNEL_CPU_ISA", None)
                    if scrubber is not None:
                        scrubber.scrub()  # the weight from memory,
                        x.mul_(1)  # x (exactly unchanged) in the cache, dirty as a layer's output
                    times[label].append(_time_ms(call))
            os.environ.pop("KERNEL_CPU_ISA", None)
            flops = 2 * m * n * k
            row = {"dtype": name, "m": m, "n": n, "k": k, "prepack_ms": pack_ms, "floor_ms": floor_ms,
                   "median_ms": {label: statistics.median(t[1:]) for label, t in times.items()}}
            row["gflops"] = {label: flops / (t * 1e6) for label, t in row["median_ms"].items()}
            rows.append(row)
            shown = "  ".join(f"{label} {t:8.2f}" for label, t in row["median_ms"].items())
            floor = f"  floor {floor_ms:.2f}" if floor_ms else ""
            print(f"{name} M={m:5d}  ms: {shown}{floor}", flush=True)
        print(f"{name} prepack of [{n}, {k}]: {pack_ms:.1f} ms (once, not in the rows above)", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernel_dir", type=Path)
    p.add_argument("--m", default="1,4,16,128,1024")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--weight-in-cache", action="store_true",
                   help="no cache scrub before each call: the weight stays wherever the last call left it")
    args = p.parse_args()
    import kernels

    from kernel_harness.bench.eviction import CacheScrubber
    from kernel_harness.machine import get_machine_profile

    if args.threads:
        torch.set_num_threads(args.threads)
    profile = get_machine_profile()
    kernel = kernels.get_local_kernel(args.kernel_dir)
    print(f"CPU {profile.cpu_model}, {torch.get_num_threads()} threads, load average {os.getloadavg()}, "
          f"read bandwidth {profile.bandwidth.read_gbs:.1f} GB/s, tiers {kernel.available_tiers()}")
    scrubber = None if args.weight_in_cache else CacheScrubber()
    print("weight " + ("left in the cache between calls" if scrubber is None else
                       f"from memory: {scrubber.nbytes >> 20} MiB read before each call"))
    rows = sweep(kernel, [int(m) for m in args.m.split(",")], args.n, args.k, args.dtypes.split(","), args.reps,
                 profile.bandwidth.read_gbs, scrubber)
    if args.json:
        args.json.write_text(json.dumps({"cpu": profile.cpu_model, "threads": torch.get_num_threads(),
                                         "weight_from_memory": scrubber is not None,
                                         "load_average_after": os.getloadavg(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
