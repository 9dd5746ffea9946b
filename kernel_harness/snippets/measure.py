"""Micro benchmarks behind the numbers in references/*.yaml (`expected_effect`).

Every benchmark calls the exact snippet code of an entry (built by
:func:`kernel_harness.snippets.build_shared`) through ctypes, times it with the
best of several runs (the machine is a shared 2-vCPU VM, so the minimum is the
least noisy statistic; an A/B pair whose ratio is small is instead timed
alternately and summarised by medians, :func:`interleaved_medians`) and returns
plain numbers.  ``scripts/measure_references.py``
prints them; the entries quote them.  Re-run it on another machine and update the
entries: a number in the knowledge base must have been measured where it is stated.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..bench.timing import round_order
from ..references import Entry, load_entries
from . import build_shared


@dataclass
class Measurement:
    key: str
    entry_id: str
    description: str
    values: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "entry": self.entry_id, "description": self.description, "values": self.values}


def bf16_rms_norm_case(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """bf16 rms_norm inputs and the float64 reference rounded once, as uint16 bit patterns.

    The same ground truth as ``examples/rms_norm/baseline.py``; used to show
    which implementations are correctly rounded.
    """
    import torch

    g = torch.Generator().manual_seed(29)
    x = torch.randn(rows, cols, generator=g).to(torch.bfloat16)
    w = (1.0 + 0.1 * torch.randn(cols, generator=g)).to(torch.bfloat16)
    xd = x.double()
    ref = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()).to(torch.bfloat16)

    def bits(t: "torch.Tensor") -> np.ndarray:
        return t.view(torch.int16).numpy().view(np.uint16)

    return bits(x), bits(w), bits(ref)


def best_seconds(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def interleaved_medians(fns: dict[str, Callable[[], Any]], rounds: int = 21, warmup: int = 2) -> dict[str, float]:
    """Median seconds of each function, timed in turn round after round.

    For A/B comparisons on the shared VM: a slow phase of the host hits every variant
    of the same round instead of one variant's whole series. The rounds go through
    every order of the variants (the benchmark's round_order): in a fixed order a
    variant inherits what the one before it leaves behind, and two builds of one
    linear kernel read 30 % apart that way.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name in round_order(r, 1, tuple(fns)):
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(ts)) for name, ts in times.items()}


class _Lib:
    def __init__(self, entry: Entry):
        self.cdll = ctypes.CDLL(str(build_shared(entry.code, entry.test_harness or "", entry.flags,
                                                 torch_headers=entry.needs_torch_headers, label=entry.id)))

    def __call__(self, name: str, *args, restype=None):
        fn = getattr(self.cdll, name)
        fn.restype = restype
        conv = []
        for a in args:
            if isinstance(a, np.ndarray):
                conv.append(ctypes.c_void_p(a.ctypes.data))
            elif isinstance(a, int):
                conv.append(ctypes.c_int64(a))
            elif isinstance(a, float):
                conv.append(ctypes.c_float(a))
            else:
                conv.append(a)
        return fn(*conv)


def _bf16(x: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


#: Benchmark keys, in the order they run (``--only`` accepts these).
KEYS: tuple[str, ...] = (
    "dot_accumulators", "stream_prefetch", "gather_prefetch", "nt_stores", "first_touch", "single_pass",
    "row_pipelining", "output_prefetch", "cache_blocking", "omp_rows", "omp_threshold", "bf16_dot", "bf16_fp16_accumulate", "ziv",
    "gemm", "quant_gemv", "vectorize", "fusion", "nta_stream",
)


def run_all(only: set[str] | None = None) -> list[Measurement]:
    """Run every benchmark (or those whose key is in ``only``)."""
    import torch

    from ..errors import UsageError

    unknown = sorted((only or set()) - set(KEYS))
    if unknown:
        raise UsageError(f"Unknown benchmark key(s) {unknown}; the keys are: {', '.join(KEYS)}.")

    entries = {e.id: e for e in load_entries()}
    libs: dict[str, _Lib] = {}

    def lib(entry_id: str) -> _Lib:
        if entry_id not in libs:
            libs[entry_id] = _Lib(entries[entry_id])
        return libs[entry_id]

    rng = np.random.default_rng(0)
    results: list[Measurement] = []
    threads_before = torch.get_num_threads()

    def want(key: str) -> bool:
        return only is None or key in only

    try:
        torch.set_num_threads(1)
        if want("dot_accumulators"):
            a, b = rng.standard_normal((2, 4096)).astype(np.float32)
            L = lib("multiple-accumulators")
            t1 = best_seconds(lambda: L("bench_dot", a, b, 4096, 20000, ctypes.c_int(1), restype=ctypes.c_double))
            t8 = best_seconds(lambda: L("bench_dot", a, b, 4096, 20000, ctypes.c_int(8), restype=ctypes.c_double))
            flops = 2 * 4096 * 20000
            results.append(Measurement("dot_accumulators", "multiple-accumulators", "dot 4096 x 20000 reps",
                                       {"one_acc_gflops": flops / t1 / 1e9, "eight_acc_gflops": flops / t8 / 1e9,
                                        "speedup": t1 / t8}))
        if want("stream_prefetch"):
            n = 1 << 24
            a, b, c = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
            out = np.empty(n, np.float32)
            L = lib("unroll-and-prefetch")
            t0 = best_seconds(lambda: L("fma_stream_c", a, b, c, out, n, 0), repeats=5)
            tp = best_seconds(lambda: L("fma_stream_c", a, b, c, out, n, 1024), repeats=5)
            results.append(Measurement("stream_prefetch", "unroll-and-prefetch", "a*b+c over 16M fp32",
                                       {"no_prefetch_ms": t0 * 1e3, "prefetch_4KiB_ms": tp * 1e3,
                                        "speedup": t0 / tp, "GBps_no_prefetch": 16 * n / t0 / 1e9}))
            del a, b, c, out
        if want("gather_prefetch"):
            rows, dim = 1 << 20, 32
            table = rng.standard_normal((rows, dim)).astype(np.float32)
            idx = rng.integers(0, rows, rows).astype(np.int64)
            out = np.empty((rows, dim), np.float32)
            L = lib("software-prefetch")
            t0 = best_seconds(lambda: L("gather_rows_c", table, idx, out, rows, dim, 0))
            t8 = best_seconds(lambda: L("gather_rows_c", table, idx, out, rows, dim, 8))
            results.append(Measurement("gather_prefetch", "software-prefetch", "random row gather 1M x 32",
                                       {"no_prefetch_ms": t0 * 1e3, "prefetch_8_rows_ms": t8 * 1e3, "speedup": t0 / t8}))
            del table, out
        if want("nt_stores"):
            L = lib("non-temporal-stores")
            n = 1 << 26
            x = rng.standard_normal(n).astype(np.float32)
            raw = np.empty(n + 16, np.float32)
            y = raw[(-raw.ctypes.data % 64) // 4:][:n]
            y.fill(0)
            tr = best_seconds(lambda: L("scale_regular_c", x, y, n, 2.0), repeats=4)
            ts = best_seconds(lambda: L("scale_stream_c", x, y, n, 2.0), repeats=4)
            del x, raw, y
            m = 1 << 18
            xs = rng.standard_normal(m).astype(np.float32)
            raw = np.empty(m + 16, np.float32)
            ys = raw[(-raw.ctypes.data % 64) // 4:][:m]

            def small(fn: str) -> None:
                for _ in range(200):
                    L(fn, xs, ys, m, 2.0)
                    float(ys.sum())

            sr = best_seconds(lambda: small("scale_regular_c"), repeats=3)
            ss = best_seconds(lambda: small("scale_stream_c"), repeats=3)
            results.append(Measurement("nt_stores", "non-temporal-stores", "y=2x, 256 MiB once; 1 MiB written+read x200",
                                       {"large_regular_ms": tr * 1e3, "large_stream_ms": ts * 1e3,
                                        "large_speedup": tr / ts, "small_regular_ms": sr * 1e3,
                                        "small_stream_ms": ss * 1e3, "small_speedup": sr / ss}))
        if want("first_touch"):
            L = lib("first-touch-page-faults")
            warm = ctypes.c_double()
            best_fresh, best_warm = float("inf"), float("inf")
            for _ in range(3):
                fresh = L("first_touch_cost_c", 256 << 20, ctypes.byref(warm), restype=ctypes.c_double)
                best_fresh, best_warm = min(best_fresh, fresh), min(best_warm, warm.value)
            pages = (256 << 20) // 4096
            xt = torch.randn(1 << 24)
            buf = torch.empty_like(xt)
            t_alloc = best_seconds(lambda: torch.mul(xt, 2.0), repeats=7)
            t_out = best_seconds(lambda: torch.mul(xt, 2.0, out=buf), repeats=7)
            results.append(Measurement("first_touch", "first-touch-page-faults", "256 MiB memset fresh vs mapped; torch.mul 64 MiB",
                                       {"fresh_ms": best_fresh / 1e6, "warm_ms": best_warm / 1e6,
                                        "fault_ns_per_4k_page": (best_fresh - best_warm) / pages,
                                        "torch_mul_alloc_ms": t_alloc * 1e3, "torch_mul_out_ms": t_out * 1e3,
                                        "out_speedup": t_alloc / t_out}))
        if want("single_pass"):
            L = lib("single-pass-row-in-cache")
            rows, cols = 8192, 4096
            x = rng.standard_normal((rows, cols)).astype(np.float32)
            w = rng.standard_normal(cols).astype(np.float32)
            y = np.empty_like(x)
            inv = np.empty(rows, np.float32)
            t1 = best_seconds(lambda: L("rms_rowwise_c", x, w, y, rows, cols, 1e-6))
            t2 = best_seconds(lambda: L("rms_two_sweeps_c", x, w, y, inv, rows, cols, 1e-6))
            results.append(Measurement("single_pass", "single-pass-row-in-cache", "rms_norm 8192x4096 1 thread",
                                       {"rowwise_ms": t1 * 1e3, "two_sweeps_ms": t2 * 1e3, "speedup": t2 / t1}))
            del x, y
        if want("row_pipelining"):
            L = lib("row-pipelining")
            vals = {}
            # 64 MiB inputs (beyond L2): 4096-wide rows (the pipelined pass touches 4 x 16 KiB)
            # and 1024-wide rows (4 x 4 KiB); plus a 1 MiB input that stays in L2, called 64x.
            for rows, cols, calls in ((4096, 4096, 1), (16384, 1024, 1), (64, 4096, 64)):
                x = rng.standard_normal((rows, cols)).astype(np.float32)
                w = rng.standard_normal(cols).astype(np.float32)
                y = np.empty_like(x)

                def plain() -> None:
                    for _ in range(calls):
                        L("rms_plain_c", x, w, y, rows, cols, 1e-6)

                def pipelined() -> None:
                    for _ in range(calls):
                        L("rms_pipelined_c", x, w, y, rows, cols, 1e-6, 64)

                med = interleaved_medians({"plain": plain, "pipelined": pipelined}, rounds=31)
                vals[f"{rows}x{cols}_plain_ms"] = med["plain"] * 1e3 / calls
                vals[f"{rows}x{cols}_pipelined_ms"] = med["pipelined"] * 1e3 / calls
                vals[f"{rows}x{cols}_speedup"] = med["plain"] / med["pipelined"]
                del x, y
            results.append(Measurement("row_pipelining", "row-pipelining",
                                       "fp32 rms_norm plain vs pipelined (64 runs), 1 thread, interleaved medians", vals))
        if want("output_prefetch"):
            L = lib("output-prefetch")
            vals = {}
            torch.set_num_threads(2)
            for rows, cols in ((1024, 4096), (4096, 4096)):
                x = rng.standard_normal((rows, cols)).astype(np.float32)
                w = rng.standard_normal(cols).astype(np.float32)
                y = np.empty_like(x)
                calls = max(1, (64 << 20) // x.nbytes)

                def timed(ahead: int) -> Callable[[], None]:
                    def run() -> None:
                        for _ in range(calls):
                            L("rms_prefetch_out_c", x, w, y, rows, cols, 1e-6, ahead)
                    return run

                med = interleaved_medians({"off": timed(0), "on": timed(2048)}, rounds=31)
                vals[f"{rows}x{cols}_off_ms"] = med["off"] * 1e3 / calls
                vals[f"{rows}x{cols}_on_ms"] = med["on"] * 1e3 / calls
                vals[f"{rows}x{cols}_speedup"] = med["off"] / med["on"]
                del x, y
            torch.set_num_threads(1)
            results.append(Measurement("output_prefetch", "output-prefetch",
                                       "fp32 rms_norm, output prefetch off vs 2 KiB ahead, 2 threads, interleaved medians", vals))
        if want("cache_blocking"):
            L = lib("cache-blocking")
            a = rng.standard_normal((4096, 4096)).astype(np.float32)
            b = np.empty_like(a)
            tn = best_seconds(lambda: L("transpose_naive_c", a, b, 4096, 4096), repeats=3)
            tb = best_seconds(lambda: L("transpose_blocked_c", a, b, 4096, 4096), repeats=3)
            results.append(Measurement("cache_blocking", "cache-blocking", "transpose 4096^2",
                                       {"naive_ms": tn * 1e3, "blocked_ms": tb * 1e3, "speedup": tn / tb}))
        if want("omp_rows"):
            L = lib("omp-row-parallel")
            rows, cols = 8192, 4096
            x = rng.standard_normal((rows, cols)).astype(np.float32)
            w = rng.standard_normal(cols).astype(np.float32)
            y = np.empty_like(x)
            torch.set_num_threads(1)
            t1 = best_seconds(lambda: L("rms_parallel_c", x, w, y, rows, cols, 1e-6))
            torch.set_num_threads(2)
            t2 = best_seconds(lambda: L("rms_parallel_c", x, w, y, rows, cols, 1e-6))
            torch.set_num_threads(1)
            Lm = lib("level-threading")
            tm1 = best_seconds(lambda: Lm("mul_rows_c", x, w, y, rows, cols, 1))
            tm2 = best_seconds(lambda: Lm("mul_rows_c", x, w, y, rows, cols, 2))
            results.append(Measurement("omp_rows", "omp-row-parallel", "rms_norm / mul_rows 8192x4096, 1 vs 2 threads",
                                       {"rms_1t_ms": t1 * 1e3, "rms_2t_ms": t2 * 1e3, "rms_speedup": t1 / t2,
                                        "mul_1t_ms": tm1 * 1e3, "mul_2t_ms": tm2 * 1e3, "mul_speedup": tm1 / tm2}))
            del x, y
        if want("omp_threshold"):
            L = lib("omp-small-size-threshold")
            x = rng.standard_normal((1024, 4096)).astype(np.float32)
            y = np.empty_like(x)
            vals: dict[str, float] = {}
            crossover = None
            for rows in (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024):
                t1 = L("time_scale_rows", x, y, rows, 4096, 1, 200, restype=ctypes.c_double)
                t2 = L("time_scale_rows", x, y, rows, 4096, 2, 200, restype=ctypes.c_double)
                vals[f"rows{rows}_1t_us"] = t1 / 1e3
                vals[f"rows{rows}_2t_us"] = t2 / 1e3
                if crossover is None and t2 < t1:
                    crossover = rows
            vals["first_rows_where_2t_wins"] = float(crossover or -1)
            results.append(Measurement("omp_threshold", "omp-small-size-threshold", "y=2x rows x 4096, best of 200", vals))
        if want("bf16_dot"):
            L = lib("avx512-bf16-dot")
            n = 1 << 20
            a, b = _bf16(rng.standard_normal(n)), _bf16(rng.standard_normal(n))
            fa = (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            fb = (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            ref = float(fa @ fb)
            got = L("dot_bf16_c", a, b, n, restype=ctypes.c_float)
            t = best_seconds(lambda: L("dot_bf16_c", a, b, n, restype=ctypes.c_float), repeats=20)
            results.append(Measurement("bf16_dot", "avx512-bf16-dot", "dot of 1M bf16",
                                       {"abs_err": abs(got - ref), "rel_err_vs_l1": abs(got - ref) / float(np.abs(fa) @ np.abs(fb)),
                                        "GBps": 4 * n / t / 1e9}))
        if want("bf16_fp16_accumulate"):
            rows, cols = 256, 4096
            vals = {}
            xb = _bf16(rng.standard_normal((rows, cols))).reshape(rows, cols)
            wb = _bf16(rng.standard_normal(cols))
            yb = np.empty_like(xb)
            lib("bf16-accumulate-fp32")("rms_norm_bf16_c", xb, wb, yb, rows, cols, 1e-6)
            tb = torch.nn.functional.rms_norm(torch.from_numpy(xb.view(np.int16)).view(torch.bfloat16), (cols,),
                                              torch.from_numpy(wb.view(np.int16)).view(torch.bfloat16), 1e-6)
            vals["bf16_fraction_differing_from_torch"] = float((tb.view(torch.int16).numpy().view(np.uint16) != yb).mean())
            xf = (rng.standard_normal((rows, cols)) * 8).astype(np.float16)
            wf = rng.standard_normal(cols).astype(np.float16)
            yf = np.empty((rows, cols), np.uint16)
            lib("fp16-accumulate-fp32")("rms_norm_fp16_c", xf.view(np.uint16), wf.view(np.uint16), yf, rows, cols, 1e-6)
            tf = torch.nn.functional.rms_norm(torch.from_numpy(xf), (cols,), torch.from_numpy(wf), 1e-6).numpy()
            vals["fp16_fraction_differing_from_torch"] = float((tf.view(np.uint16) != yf).mean())
            with np.errstate(over="ignore"):
                vals["fp16_rows_overflowing_fp16_accumulator"] = float(np.isinf((xf.astype(np.float32) ** 2).sum(-1).astype(np.float16)).mean())
            results.append(Measurement("bf16_fp16_accumulate", "bf16-accumulate-fp32", "rms_norm 256x4096", vals))
        if want("ziv"):
            rows, cols = 1024, 4096
            xb, wb, ref_bits = bf16_rms_norm_case(rows, cols)
            x = torch.from_numpy(xb.view(np.int16)).view(torch.bfloat16)
            w = torch.from_numpy(wb.view(np.int16)).view(torch.bfloat16)
            y = np.empty_like(xb)
            Lz, Lp = lib("bf16-correct-rounding"), lib("bf16-accumulate-fp32")
            tz = best_seconds(lambda: Lz("rms_norm_bf16_exact_c", xb, wb, y, rows, cols, ctypes.c_double(1e-6)), repeats=10)
            exact_wrong = int((y != ref_bits).sum())
            tp = best_seconds(lambda: Lp("rms_norm_bf16_c", xb, wb, y, rows, cols, 1e-6), repeats=10)
            plain_wrong = int((y != ref_bits).sum())
            tt = best_seconds(lambda: torch.nn.functional.rms_norm(x, (cols,), w, 1e-6), repeats=10)
            torch_wrong = int((torch.nn.functional.rms_norm(x, (cols,), w, 1e-6).view(torch.int16).numpy().view(np.uint16)
                               != ref_bits).sum())
            results.append(Measurement("ziv", "bf16-correct-rounding", "rms_norm bf16 1024x4096 vs float64 reference, 1 thread",
                                       {"exact_ms": tz * 1e3, "fp32_only_ms": tp * 1e3, "torch_1t_ms": tt * 1e3,
                                        "exact_wrong": exact_wrong, "fp32_only_wrong": plain_wrong,
                                        "torch_wrong": torch_wrong, "elements": float(rows * cols)}))
        if want("gemm"):
            M = N = K = 512
            a = _bf16(rng.standard_normal((M, K))).reshape(M, K)
            b = _bf16(rng.standard_normal((K, N))).reshape(K, N)
            bp = np.ascontiguousarray(b.reshape(K // 2, 2, N).transpose(0, 2, 1))
            bt = np.ascontiguousarray(b.T)
            c = np.empty((M, N), np.float32)
            Lb = lib("cpublas-brgemm")
            Ld = lib("level-algorithm")
            t_amx = best_seconds(lambda: Lb("gemm_bf16_brgemm_c", a, bp, c, M, N, K, restype=ctypes.c_int), repeats=10)
            t_dot = best_seconds(lambda: Ld("gemm_bf16_dot_c", a, bt, c, M, N, K), repeats=3)
            ta = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            tb_ = torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)
            t_torch = best_seconds(lambda: torch.matmul(ta, tb_), repeats=10)
            flops = 2 * M * N * K
            results.append(Measurement("gemm", "cpublas-brgemm", "bf16 GEMM 512^3, 1 thread",
                                       {"brgemm_amx_gflops": flops / t_amx / 1e9, "dpbf16_dot_gflops": flops / t_dot / 1e9,
                                        "torch_matmul_bf16_gflops": flops / t_torch / 1e9, "amx_vs_dot_speedup": t_dot / t_amx,
                                        "amx_vs_torch": t_torch / t_amx}))
        if want("quant_gemv"):
            N = K = 4096
            x = rng.standard_normal((1, K)).astype(np.float32)
            w8 = rng.integers(-128, 128, (N, K)).astype(np.int8)
            s8 = rng.uniform(0.001, 0.02, N).astype(np.float32)
            q4 = rng.integers(0, 16, (N, K)).astype(np.uint8)
            g = q4.reshape(N, K // 32, 2, 16)
            w4 = (g[:, :, 0, :] | (g[:, :, 1, :] << 4)).astype(np.uint8).reshape(N, K // 2)
            s4 = rng.uniform(0.01, 0.1, (N, K // 32)).astype(np.float32)
            z4 = rng.integers(0, 16, (N, K // 32)).astype(np.float32)
            y = np.empty((1, N), np.float32)
            L8, L4 = lib("int8-dequant-gemm"), lib("int4-dequant-gemm")
            t8 = best_seconds(lambda: L8("gemm_int8_weight_c", x, w8, s8, y, 1, N, K), repeats=10)
            t4 = best_seconds(lambda: L4("gemm_int4_weight_c", x, w4, s4, z4, y, 1, N, K), repeats=10)
            wt = torch.from_numpy(w8.astype(np.float32) * s8[:, None])
            xt = torch.from_numpy(x)
            t32 = best_seconds(lambda: torch.nn.functional.linear(xt, wt), repeats=10)
            results.append(Measurement("quant_gemv", "int8-dequant-gemm", "GEMV 1x4096x4096, 1 thread",
                                       {"int8_ms": t8 * 1e3, "int4_ms": t4 * 1e3, "torch_fp32_linear_ms": t32 * 1e3,
                                        "int8_speedup": t32 / t8, "int4_speedup": t32 / t4}))
        if want("vectorize"):
            L = lib("level-vectorize")
            vals = {}
            for rows in (64, 8192):
                x = rng.standard_normal((rows, 4096)).astype(np.float32)
                w = rng.standard_normal(4096).astype(np.float32)
                y = np.empty_like(x)
                reps = 3 if rows > 1000 else 20
                ts = best_seconds(lambda: L("rms_scalar_c", x, w, y, rows, 4096, 1e-6), repeats=reps)
                tv = best_seconds(lambda: L("rms_avx512_c", x, w, y, rows, 4096, 1e-6), repeats=reps)
                tt = best_seconds(lambda: torch.nn.functional.rms_norm(torch.from_numpy(x), (4096,), torch.from_numpy(w), 1e-6), repeats=reps)
                vals[f"rows{rows}_scalar_ms"] = ts * 1e3
                vals[f"rows{rows}_avx512_ms"] = tv * 1e3
                vals[f"rows{rows}_torch_1t_ms"] = tt * 1e3
                vals[f"rows{rows}_speedup"] = ts / tv
                vals[f"rows{rows}_vs_torch"] = tt / tv
            results.append(Measurement("vectorize", "level-vectorize", "rms_norm scalar vs AVX-512, 1 thread", vals))
        if want("fusion"):
            L = lib("level-fusion")
            vals = {}
            for rows, d in ((64, 4096), (2048, 11008)):
                x = rng.standard_normal((rows, 2 * d)).astype(np.float32)
                out, tmp = np.empty((rows, d), np.float32), np.empty((rows, d), np.float32)
                reps = 3 if rows > 1000 else 20
                tf = best_seconds(lambda: L("silu_mul_fused_c", x, out, rows, d), repeats=reps)
                tu = best_seconds(lambda: L("silu_mul_unfused_c", x, tmp, out, rows, d), repeats=reps)
                xt = torch.from_numpy(x)
                tt = best_seconds(lambda: torch.nn.functional.silu(xt[:, :d]) * xt[:, d:], repeats=reps)
                vals[f"{rows}x{d}_fused_ms"] = tf * 1e3
                vals[f"{rows}x{d}_unfused_ms"] = tu * 1e3
                vals[f"{rows}x{d}_torch_unfused_ms"] = tt * 1e3
                vals[f"{rows}x{d}_speedup"] = tu / tf
                vals[f"{rows}x{d}_vs_torch"] = tt / tf
            results.append(Measurement("fusion", "level-fusion", "silu_and_mul fused vs unfused, 1 thread", vals))
        if want("nta_stream"):
            L = lib("nta-prefetch-read-once-stream")
            vals = {}
            for k in (2048, 4096, 8192):
                n = (1 << 26) // k  # 256 MiB of fp32 weight: every call reads it from memory
                x = rng.standard_normal((2, k)).astype(np.float32)
                w = np.ones((n, k), np.float32)
                y = np.empty((2, n), np.float32)
                med = interleaved_medians({"off": lambda: L("gemv2_c", y, x, w, n, k, 0),
                                           "on": lambda: L("gemv2_c", y, x, w, n, k, 4096)}, rounds=10)
                vals[f"K{k}_x_KiB"] = 2 * k * 4 / 1024
                vals[f"K{k}_off_GBps"] = 4 * n * k / med["off"] / 1e9
                vals[f"K{k}_on_GBps"] = 4 * n * k / med["on"] / 1e9
                vals[f"K{k}_speedup"] = med["off"] / med["on"]
                del w
            results.append(Measurement("nta_stream", "nta-prefetch-read-once-stream",
                                       "two-row fp32 GEMV over a 256 MiB weight, 1 thread", vals))
    finally:
        torch.set_num_threads(threads_before)
    return results
