"""The suggested SIMD strategy for a kind of op on this machine, and what to read.

The advice is deliberately concrete (vector width, lanes, masks, threading
axis and threshold, which GEMM path for which M) because the agent turns it
directly into the AVX512 tier.  Reference ids must be ids the references
helper ships; :data:`KNOWN_REFERENCE_IDS` is that contract and
:func:`check_reference_ids` verifies suggestions against the live catalogue
when ``kernel_harness.references`` exists.
"""

from __future__ import annotations

import math
from typing import Any

from ..machine import MachineProfile
from ..portability.host import narrower_tier_note, widest_tier
from .roofline import AMX_MIN_M

KNOWN_REFERENCE_IDS: frozenset[str] = frozenset(
    {
        "bf16-rne-conversion", "bf16-truncation-bug", "fp16-f16c-conversion", "horizontal-sum",
        "horizontal-max", "masked-tail", "vectorized-exp", "vectorized-tanh", "vectorized-erf",
        "vectorized-sigmoid", "reduction-order", "multiple-accumulators", "unroll-and-prefetch",
        "software-prefetch", "non-temporal-stores", "first-touch-page-faults", "out-parameter-api",
        "single-pass-row-in-cache", "cache-blocking", "omp-row-parallel", "omp-small-size-threshold",
        "shared-openmp-runtime", "avx512-bf16-dot", "bf16-widen-fma-avx2", "bf16-accumulate-fp32", "fp16-accumulate-fp32",
        "amx-tile-config", "amx-linux-permission", "cpublas-brgemm", "vnni-packing",
        "int8-dequant-gemm", "int8-dequant-gemm-avx2-exact", "int4-dequant-gemm", "level-vectorize", "level-threading",
        "level-memory-traffic", "level-fusion", "level-algorithm", "online-softmax-merge", "bf16-correct-rounding",
        "nta-prefetch-read-once-stream", "cpuid-xgetbv-detection",
    }
)

#: Work below this many microseconds on one thread is not worth an OpenMP fork/join
#: (a parallel region costs a few microseconds to start and join on this class of machine).
PARALLEL_MIN_US = 20.0


def check_reference_ids(ids: list[str]) -> list[str]:
    """Drop ids the live catalogue does not know (never invent a cross-reference)."""
    allowed = set(KNOWN_REFERENCE_IDS)
    try:
        from ..references import reference_ids  # owned by the references helper
    except ImportError:
        pass
    else:
        try:
            live = set(reference_ids())
        except Exception:  # noqa: BLE001 - a broken catalogue must not break the analysis
            live = set()
        if live:
            allowed &= live
    return [ref for ref in dict.fromkeys(ids) if ref in allowed]


def _vector(machine: MachineProfile, dtype: str) -> dict[str, Any]:
    # the widest tier the dispatcher runs here, not the widest flag: advice for a
    # unit that never executes on this machine is noise (issue 24)
    tier = widest_tier(machine.has_flag)
    avx512 = tier == "avx512"
    bits = 512 if avx512 else 256
    lanes_fp32 = bits // 32
    data: dict[str, Any] = {
        "isa": "avx512" if avx512 else "avx2",
        "tier": tier,
        "tier_note": narrower_tier_note(machine.has_flag),
        "vector_bits": bits,
        "lanes": {"fp32": lanes_fp32, "bf16": bits // 16, "fp16": bits // 16},
        "compute_lanes_fp32": lanes_fp32,
        "accumulate_dtype": "fp64" if dtype == "fp64" else "fp32",
    }
    if dtype == "bf16":
        data["load_store"] = (
            f"load {lanes_fp32} bf16 (a {bits // 2}-bit half register), widen to fp32 by a 16-bit left shift "
            "(cvtepu16 + slli), compute in fp32, narrow with round-to-nearest-even"
            + " with the integer RNE sequence (bf16-rne-conversion; _mm512_cvtneps_pbh flushes fp32 denormals "
            "to zero, so use it only when the outputs cannot be denormal) - never by truncation"
        )
    elif dtype == "fp16":
        data["load_store"] = (
            f"load {lanes_fp32} fp16, widen with {'_mm512_cvtph_ps' if avx512 else '_mm256_cvtph_ps (F16C)'}, "
            "compute in fp32, narrow with cvtps_ph(_MM_FROUND_TO_NEAREST_INT)"
        )
    else:
        data["load_store"] = f"{lanes_fp32} fp32 per {'zmm' if avx512 else 'ymm'} register, unaligned loads"
    data["tail"] = (
        "mask the last partial vector: __mmask16 m = (1u << rem) - 1 with _mm512_maskz_loadu_ps / _mm512_mask_storeu_ps"
        if avx512 else "mask the last partial vector with _mm256_maskload_ps / _mm256_maskstore_ps (or a scalar loop)"
    )
    return data


def _threading(machine: MachineProfile, row_bytes: int | None, axis: str) -> dict[str, Any]:
    bw_1t = machine.bandwidth.copy_prealloc_gbs_1t or 1.0
    min_bytes = int(bw_1t * 1e3 * PARALLEL_MIN_US)  # bytes one thread streams in PARALLEL_MIN_US
    data: dict[str, Any] = {
        "threads": machine.logical_cpus,
        "axis": axis,
        "single_thread_below_bytes": min_bytes,
        "rule": (
            f"run on one thread when the op moves fewer than ~{min_bytes // 1024} KiB (about "
            f"{PARALLEL_MIN_US:g} us of single-thread streaming here); if the kernel is still slower than the "
            "baseline on such sizes, dispatch them to the ATen fallback"
        ),
    }
    if row_bytes:
        data["num_tokens_threshold"] = max(1, math.ceil(min_bytes / row_bytes))
    return data


#: Up to this many rows a GEMM reads each weight element so few times that reading
#: the weight is the whole cost (decode): the kernel streams it once.
STREAM_MAX_M = 8


#: Where a benchmark's weights come from decides which GEMM wins (bench/eviction.py).
PERSISTENT_ADVICE = ("name the {what} in the baseline's PERSISTENT_INPUTS (examples/README.md): each timed "
                     "call then reads them from memory, as a model does; copied just before the call they sit "
                     "dirty in the L3, where oneDNN beat the catalogue's bf16 tiles at M = 128 on a Zen 4 that "
                     "they beat with the weight from memory")


def gemm_path(dtype: str, m: int | None, machine: MachineProfile) -> tuple[str, str]:
    """Which GEMM micro-kernel fits this dtype and row count M here, and why.

    The FMA paths follow the tier the generated dispatcher runs (AVX512 F/BW/VL/DQ
    for the avx512 unit), not the CPU's widest vectors.
    """
    amx = machine.has_flag("amx_bf16") and machine.has_flag("amx_tile")
    if dtype == "bf16" and amx and (m is None or m >= AMX_MIN_M):
        return "amx-brgemm", (f"M {'>= ' + str(AMX_MIN_M) if m is None else '= ' + str(m)}: AMX bf16 tiles via "
                              "at::native::cpublas::brgemm, or hand-written tile code as in the catalogue's linear "
                              "(templates/ops/linear.op, lin_amx: 32 x 32 blocks in four TDPBF16PS "
                              "accumulators; a plain [N, K] weight's rows are the first operand in place, x's "
                              "rows transposed once into k-pairs, the sums stored transposed; the weight made "
                              "the k-pair operand instead, converted per step, took 1.10-1.26x the time at M = 5-128)")
    if dtype == "bf16" and machine.has_flag("avx512_bf16"):
        path, why = "avx512-bf16-dot", (
            f"M = {m} < {AMX_MIN_M}: a GEMV-like shape; AMX tiles would be mostly empty, "
            "VDPBF16PS over pairs of K with fp32 accumulators is faster"
            if amx else "no AMX here: VDPBF16PS over pairs of K with fp32 accumulators; from M ~16 a register-"
            "blocked tile (the catalogue's linear, lin_dp: 12 rows x 32 columns in 24 zmm accumulators, x's "
            "k-pairs broadcast, the weight converted per thread to k-pair blocks kept in L2, the next block "
            "prefetched while the tiles run) reached 0.8x the probe's VDPBF16PS peak, oneDNN's speed")
        why += (" (in a generated avx512 unit: bf16_dot_insn on a line that tests kBf16, the widening FMA "
                "path as the other branch, since the unit also runs on AVX512 CPUs without BF16)")
    elif widest_tier(machine.has_flag) == "avx512":
        path, why = "avx512-fma", "register-blocked FMA micro-kernel (e.g. 4 rows x 2-3 vector columns) or cpublas brgemm"
    else:
        path, why = "avx2-fma", ("register-blocked FMA micro-kernel on 256-bit vectors (e.g. 6 rows x 2 vectors "
                                 "of 8: 12 accumulators of the 16 ymm registers) over a packed weight panel")
    if path != "avx512-bf16-dot" and path != "amx-brgemm" and dtype in ("bf16", "fp16"):
        why += ("; no BF16 dot product here: widen bf16 to fp32 (zero-extend each 16-bit value and shift it "
                "into the high half) or fp16 with F16C, then FMA, accumulating in fp32")
    if m is not None and m <= STREAM_MAX_M:
        why = (f"M = {m} <= {STREAM_MAX_M} (decode): each weight element is used only {m} time(s), so the call is "
               "bound by reading the weight: stream it once, threaded over N, with the M rows' accumulators "
               "in registers; floor = weight bytes / read bandwidth. The weight's layout decides how close: "
               "a row-major [N, K] weight read several rows at a time is several streams, which the hardware "
               "prefetchers follow less far (1.3-1.45x the floor at M = 4, Zen 5), while k-major panels of 32 "
               "columns (the catalogue's prepack) are one sequential stream per thread, each panel row serving "
               "every row of x by broadcasts (1.0-1.2x at M = 1-8 on a Zen 5; examples/linear/README.md; on a Xeon "
               "with AMX the plain bf16 weight was the faster one at every M, 1.31 / 1.37 ms at M = 1 and "
               "1.32 / 1.64 at M = 4). At M = 1 a "
               "row-major weight can be one stream per segment: split each thread's rows into four runs of "
               "consecutive rows and read row i of every run at once, leaving the prefetching to the hardware "
               "(0.88-0.90x the time of blocks of four adjacent rows prefetched a block ahead, in fast memory "
               "phases on a Zen 4). " + why)
        if path == "avx512-bf16-dot":
            why += ("; a plain weight read one row at a time is one stream too, but every weight row rereads all "
                    "rows of x: once they pass ~16 KiB, prefetch the weight non-temporal (prefetchnta, ~4 KiB "
                    "ahead) so its lines leave the L1 first (M = 3-4, K = 4096: 1.0-1.1x the floor against "
                    "1.2-1.3x for row blocks, and 2x without the hint)")
        if path == "avx2-fma":
            why += ("; when the rows' sums outgrow the 16 ymm registers (4 rows x 32 columns = 16), run the rows "
                    "in passes over chunks of K that stay in L1 and let the last pass prefetch the next chunk, "
                    "or the memory stream idles while the later passes run (fp32 M = 4: 1.1x the floor, "
                    "against 1.3-1.5x)")
    return path, why


def simd_strategy(kind: str, category: str, dtype: str, machine: MachineProfile, *,
                  row_bytes: int | None = None, gemm_m: int | None = None, name: str = "") -> dict[str, Any]:
    """The strategy block of the report (stable keys, see docs/analysis.md)."""
    vector = _vector(machine, dtype)
    lowered = name.lower()
    refs: list[str] = ["level-vectorize"]
    steps: list[str] = []
    if dtype == "bf16":
        refs += ["bf16-rne-conversion", "bf16-truncation-bug", "bf16-accumulate-fp32"]
    elif dtype == "fp16":
        refs += ["fp16-f16c-conversion", "fp16-accumulate-fp32"]
    gemm: dict[str, Any] | None = None

    if kind == "elementwise":
        threading = _threading(machine, row_bytes, "flat index range (or rows), contiguous chunks per thread")
        steps = [
            f"one pass: load {vector['compute_lanes_fp32']} elements, compute in fp32, store; unroll 2-4x",
            "masked tail instead of a scalar remainder loop",
            "accept out= so callers can reuse the output buffer (fresh outputs page-fault)",
        ]
        refs += ["masked-tail", "unroll-and-prefetch", "omp-row-parallel", "omp-small-size-threshold",
                 "out-parameter-api", "first-touch-page-faults", "non-temporal-stores", "level-memory-traffic"]
        if "silu" in lowered or "sigmoid" in lowered or "swish" in lowered:
            refs.append("vectorized-sigmoid")
            refs.append("vectorized-exp")
        if "gelu" in lowered:
            refs += ["vectorized-erf", "vectorized-tanh"]
        if "and_mul" in lowered or "glu" in lowered:
            steps.append("gated: read both halves of each row in the same pass and write half a row")
            refs.append("level-fusion")
    elif kind == "reduction":
        threading = _threading(machine, row_bytes, "rows (tokens): one thread owns whole rows, no cross-thread reduction")
        steps = [
            "per row: accumulate in fp32 with 2-4 independent vector accumulators, then one horizontal reduce",
            "keep the row in L1/L2 between the statistics pass and the normalise pass (one DRAM read)",
            "masked tail for the row remainder",
        ]
        refs += ["multiple-accumulators", "horizontal-sum", "reduction-order", "single-pass-row-in-cache",
                 "masked-tail", "omp-row-parallel", "omp-small-size-threshold", "out-parameter-api",
                 "first-touch-page-faults", "level-memory-traffic"]
        if category == "softmax" or "softmax" in lowered:
            refs += ["horizontal-max", "vectorized-exp"]
            steps.insert(0, "online or two-pass softmax: row max, exp(x - max) and sum, then scale by 1/sum")
        if "add" in lowered:
            refs.append("level-fusion")
    elif kind == "gemm":
        m = gemm_m
        path, why = gemm_path(dtype, m, machine)
        gemm = {"path": path, "why": why, "amx_min_m": AMX_MIN_M, "m": m}
        threading = _threading(machine, None, "N blocks of the weight (each thread owns output columns); "
                                               "add M blocks when M is large")
        steps = [why, "block K and N so the weight panel stays in L2 (cache blocking)",
                 "accumulate in fp32; convert to the output dtype once per tile",
                 PERSISTENT_ADVICE.format(what="weight (and bias)")]
        refs += ["cpublas-brgemm", "cache-blocking", "level-algorithm", "omp-row-parallel"]
        if "linear" in lowered:
            steps.append("the catalogue op linear (new_kernel.py --op linear) is complete in every tier: a dot path "
                         "for the plain weight, prepack's k-major panels for the register-blocked micro-kernel "
                         "(examples/linear/README.md)")
        if path == "amx-brgemm":
            refs += ["amx-tile-config", "amx-linux-permission", "vnni-packing"]
        if m is not None and m <= STREAM_MAX_M:
            refs.append("nta-prefetch-read-once-stream")  # the weight streams past the rows of x it rereads
        if path == "avx512-bf16-dot" or dtype == "bf16":
            refs += ["avx512-bf16-dot", "vnni-packing"]
        if path in ("avx2-fma", "avx512-fma") and dtype == "bf16":
            refs.append("bf16-widen-fma-avx2")  # the widening is the same at 512 bits
        if any(q in lowered for q in ("int8", "w8", "i8", "quant", "q8")):
            refs += ["int8-dequant-gemm", "int8-dequant-gemm-avx2-exact"]
            steps += [
                "int8 weights: widen them in registers (never write W * scale to memory) and apply the "
                "per-channel scale once per finished sum; at small M the int8 weight stream (1 byte per "
                "weight) is the floor",
                "bf16 outputs under the half-ulp rule: sum x * q exactly (in double, or as the catalogue op "
                "linear_int8 does: x as 15-bit integer digits times the int8 weights in int32 lanes) and round "
                "once; fp32 sums flip ~1e-4 of the outputs. linear_int8 does all this (new_kernel.py --op "
                "linear_int8), with VPDPWSSD for VPMADDWD + VPADDD where the CPU has AVX512-VNNI (volatile asm "
                "behind kVnni: the avx512 tier also runs on Skylake-SP, which lacks it)",
            ]
        if any(q in lowered for q in ("int4", "w4", "q4", "awq", "gptq")):
            refs.append("int4-dequant-gemm")
        if category == "moe":
            steps.append("MoE: group tokens by expert first; each expert's GEMM has few rows, pick the path per expert M")
    else:  # attention
        threading = _threading(machine, None, "(batch, head, query block): each thread owns query blocks")
        # One query per sequence (decode): from the traced shapes, else from the name.
        decode = gemm_m <= 1 if gemm_m is not None else "decode" in lowered
        attn_path = "amx-brgemm" if dtype == "bf16" and machine.has_flag("amx_bf16") and not decode else (
            "avx512-fma" if widest_tier(machine.has_flag) == "avx512" else "avx2-fma")
        gemm = {"path": attn_path, "why": "QK^T and PV are GEMMs over a block of queries", "amx_min_m": AMX_MIN_M, "m": gemm_m}
        steps = [
            "flash-attention blocking: for a block of queries, loop over key blocks, QK^T, online softmax "
            "(running max and sum), accumulate P.V in fp32; never materialise the L x S matrix",
            "vectorised exp for the softmax; rescale the accumulator when the running max changes",
        ]
        if decode:
            gemm["why"] = "one query per sequence: q.k and p.v are dot products, bound by reading the KV cache"
            threading = _threading(machine, None, "(batch, kv head); split the keys into chunks when there are "
                                                  "fewer pairs than threads, merged by log-sum-exp")
            steps = [
                "decode (one query token): one pass over the KV cache with an online softmax (running max, running "
                "sum, accumulator of D values); floor = KV cache bytes / read bandwidth; start from the catalogue "
                "op: new_kernel.py --op decode_attention",
                "grouped-query attention: serve the H/H_kv query heads of a group together so each kv head's "
                "cache is read once, not once per query head",
                "when batch x kv heads is below the thread count, split S into chunks per thread and merge the "
                "partial (max, sum, acc) exactly: m = max(m1, m2), sum = s1 e^(m1-m) + s2 e^(m2-m), likewise acc",
                "bf16 outputs are judged to half an ulp of a float64 reference: accumulate in double (the catalogue "
                "op; fp32 sums round about one output in a few thousand the other way), or in fp32 with a proven "
                "error bound and exact fix-ups of near-tie outputs",
                "widen bf16 caches in registers (straight to double: one load split into even and odd "
                "elements, two conversions, no widening shuffle), and prefetch each head's K and V rows ~16 keys "
                "ahead into the L2 (prefetcht1), not the L1: an L1 prefetch holds one of the core's few fill "
                "buffers per line and tied with no prefetch on a Zen 4, where the L2 took 0.70-0.90x the time",
                "prefetch each stream in the loop that reads it (K rows in the scores loop, V rows in the "
                "accumulate loop): V prefetched from the scores loop arrived too late for half of each block, "
                "and moving it took the catalogue op to 0.60-0.75x the time at B = 8 on a Zen 4 (1.05x its "
                "KV-streaming floor)",
                PERSISTENT_ADVICE.format(what="k_cache and v_cache"),
                "time the kernel and its floor on the same buffers: 2 MiB pages (torch: THP_MEM_ALLOC_ENABLE=1 "
                "where THP is in madvise mode) made both ~0.9x at B = 8 on a Zen 4",
            ]
        refs += ["cache-blocking", "cpublas-brgemm", "vectorized-exp", "horizontal-max", "horizontal-sum",
                 "omp-row-parallel", "level-fusion", "level-algorithm"]
        if attn_path == "amx-brgemm":
            refs += ["amx-tile-config", "amx-linux-permission", "vnni-packing"]
        if attn_path == "avx2-fma" and dtype == "bf16":
            refs.append("bf16-widen-fma-avx2")
        if decode:  # no GEMM blocking left to read about
            refs = [r for r in refs if r not in ("cpublas-brgemm", "cache-blocking")]
            refs += ["online-softmax-merge", "bf16-correct-rounding"]
    refs.append("shared-openmp-runtime")
    return {
        "vector": vector,
        "threading": threading,
        "gemm": gemm,
        "steps": steps,
        "references": check_reference_ids(refs),
    }
