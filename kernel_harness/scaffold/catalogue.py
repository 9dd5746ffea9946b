"""The ops the templates know how to write completely, and the kernel kinds.

A catalogue op has finished, tested compute bodies in every tier; any other op
name gets a wired-up skeleton whose bodies are ``KERNEL_TODO(...)`` for the
agent to write. The kind decides the compiler flags of the AVX512 tier (GEMM
and attention kernels may use AMX) and, for skeletons, the op's signature.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cpu import AVX512_TIER_FEATURES

KINDS: tuple[str, ...] = ("elementwise", "reduction", "gemm", "attention")
DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")
TIERS: tuple[str, ...] = ("generic", "avx2", "avx512")

#: torch dtype names the bridge accepts, per --dtypes value.
DTYPE_TORCH = {"fp32": "at::kFloat", "bf16": "at::kBFloat16", "fp16": "at::kHalf"}
DTYPE_HUMAN = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DTYPE_ENUM = {"fp32": "DType::F32", "bf16": "DType::BF16", "fp16": "DType::F16"}

#: Exactly the tier's requirement (cpu_features.hpp: avx512_tier), nothing a Skylake-SP
#: lacks: with -mavx512bf16 or -mavx512vbmi the compiler may emit those instructions
#: where it likes (it ran a guarded VCVTNEPS2BF16 speculatively on an Ice Lake). The
#: unit's AVX512-BF16 instructions are volatile asm behind kBf16 (avx512.cpp.in).
_ELEMENTWISE_AVX512 = tuple(f"-m{feature}" for feature in AVX512_TIER_FEATURES)
#: AMX intrinsics are volatile asm in GCC's headers and run only behind amx_instructions() (cpu_features.hpp).
_GEMM_EXTRA = ("-mamx-tile", "-mamx-bf16", "-mamx-int8")
AVX2_FLAGS: tuple[str, ...] = ("-mavx2", "-mfma", "-mf16c", "-fopenmp")


def fp_contract_flag(all_catalogue: bool) -> str:
    """The SIMD units' explicit floating-point contraction setting [ref:fp-contraction].

    GCC contracts ``a * b + c`` into one FMA inside ``-mfma`` units by default (even with
    ``-std=c++20``), which rounds once where eager PyTorch rounds twice (separate mul and
    add kernels) and flips bf16 results by one ulp on a few elements. ``off`` keeps every
    written operation as written, so element-wise code an agent writes for an op outside
    the catalogue matches eager bit for bit, and an FMA happens only where the code asks
    for one (``vfmadd``). Packages of catalogue ops only keep ``fast``: their bodies were
    measured and checked with it (the compiler's previous default), and they spell their
    FMAs explicitly anyway.
    """
    return "-ffp-contract=fast" if all_catalogue else "-ffp-contract=off"


def avx512_flags(kind: str) -> tuple[str, ...]:
    """The AVX512 section's cxx-flags: GEMM/attention kernels add AMX."""
    extra = _GEMM_EXTRA if kind in ("gemm", "attention") else ()
    return (*_ELEMENTWISE_AVX512, *extra, "-fopenmp")


@dataclass(frozen=True)
class LibraryRule:
    """In ``dtype``, from ``min_rows`` rows and ``min_elements`` elements of the first
    input (rows x cols, the sizes pick_tier sees), the library call wins; with
    ``intel_only``, only on Intel CPUs (the rule rests on MKL, whose fast kernels run
    there: on a Zen 5 EPYC the SIMD tiers beat ATen's fp32 GEMM at every M measured)."""

    dtype: str
    min_rows: int
    min_elements: int
    intel_only: bool = False


@dataclass(frozen=True)
class OpSpec:
    """One op of the catalogue: its template file and what a caller sees."""

    name: str
    kind: str
    signature: str  # the generated Python function, for docs and --help
    template: str  # file under templates/ops/
    generic_threshold: int  # below rows*cols elements the dispatcher uses the generic tier
    complete: bool = True  # False: a skeleton with KERNEL_TODO bodies
    # When the generic tier's library call (oneDNN/MKL through ATen) is faster than the
    # SIMD tiers, so the dispatcher runs it (an op whose bridge passes the dtype to
    # pick_tier; KERNEL_CPU_ISA still forces a tier)
    library_rules: tuple[LibraryRule, ...] = ()
    # The op's bridge registers <name>_dispatch_tier(<the op's inputs>) -> str, the
    # function its calls pick their tier with, because the tier depends on more than the
    # first input's size and dtype (linear: the weight's layout and N); the package's
    # dispatch_tier() asks it, so the query and the call cannot disagree
    dispatch_query: bool = False
    # Dtypes whose avx512 body loses to the avx2 one where vector gathers are slow
    # (fast_gathers() false: Skylake-SP to Ice Lake, Zen 4): there the dispatcher runs avx2
    slow_gather_avx2_dtypes: tuple[str, ...] = ()


CATALOGUE: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec("rms_norm", "reduction", "rms_norm(x, weight, eps=1e-6, out=None)", "rms_norm.op", 1),
        OpSpec(
            "add_rms_norm",
            "reduction",
            "add_rms_norm(x, residual, weight, eps=1e-6, out=None) -> (normalised, new_residual)",
            "add_rms_norm.op",
            1,
        ),
        # bf16 by 65536-entry tables: on an Ice Lake Xeon VM (scalar-load lookups in both
        # units, since its gathers are slow) the avx2 unit beat the avx512 one side by side,
        # intervals apart: silu_and_mul 1.77x vs 1.51x eager, gelu_and_mul 2.28x vs 1.92x,
        # softmax 1.18x vs 1.04x (bench_catalogue.py --tier all, 2026-12-02)
        OpSpec("silu_and_mul", "elementwise", "silu_and_mul(x, out=None)", "silu_and_mul.op", 1,
               slow_gather_avx2_dtypes=("bf16",)),
        OpSpec("gelu_and_mul", "elementwise", "gelu_and_mul(x, out=None)", "gelu_and_mul.op", 1,
               slow_gather_avx2_dtypes=("bf16",)),
        OpSpec("softmax", "reduction", "softmax(x, out=None)", "softmax.op", 1,
               slow_gather_avx2_dtypes=("bf16",)),
        OpSpec("layer_norm", "reduction", "layer_norm(x, weight, bias, eps=1e-5, out=None)", "layer_norm.op", 1),
        # fp32 from M = 32 and 32K elements of x with the plain weight: MKL's fp32 GEMM ties
        # or beats both SIMD tiers there (examples/linear/sweep.py on an Ice Lake Xeon, quiet,
        # 2026-12-02, N = K = 4096, ms: M = 16 F.linear 7.31, avx512 5.34; M = 32 8.60 vs
        # 8.42; M = 128 19.65 vs 27.17, avx2 44.09), while a small GEMM's call overhead favours
        # ours (33x100x65: avx2 148 us, generic 263 us); bf16 stays ours (avx512 M = 1024
        # 224.75 plain, 149.64 packed, F.linear 580.27). A prepacked weight stays ours at every
        # M: the generic tier unpacks it per call (fp32 M = 32 36.93 against avx512's 7.17)
        OpSpec("linear", "gemm", "linear(x, weight, bias=None, out=None); prepack(weight)", "linear.op", 1,
               library_rules=(LibraryRule("fp32", 32, 32768, intel_only=True),), dispatch_query=True),
        OpSpec(
            "linear_int8",
            "gemm",
            "linear_int8(x, qweight, scales, bias=None, out=None)",
            "linear_int8.op",
            1,
            dispatch_query=True,  # below kLinearInt8Avx512MinWork multiply-adds the avx2 unit runs
        ),
        OpSpec(
            "decode_attention",
            "attention",
            "decode_attention(q, k_cache, v_cache, scale, out=None)",
            "decode_attention.op",
            1,
        ),
    )
}

#: Skeleton template per kind for ops outside the catalogue.
SKELETONS: dict[str, str] = {
    "elementwise": "_skeleton_rowwise.op",
    "reduction": "_skeleton_rowwise.op",
    "gemm": "_skeleton_gemm.op",
    "attention": "_skeleton_attention.op",
}


def op_spec(name: str, kind: str | None) -> OpSpec:
    """The catalogue entry for ``name``, or a skeleton spec of ``kind`` (default elementwise)."""
    if name in CATALOGUE:
        return CATALOGUE[name]
    kind = kind or "elementwise"
    signatures = {
        "elementwise": f"{name}(x, out=None)",
        "reduction": f"{name}(x, out=None)",
        "gemm": f"{name}(a, b, out=None)",
        "attention": f"{name}(q, k, v, out=None)",
    }
    return OpSpec(name, kind, signatures[kind], SKELETONS[kind], 1, complete=False)
