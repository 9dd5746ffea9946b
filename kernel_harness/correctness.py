"""The correctness comparison of procedure step 6, and nothing else.

A kernel output is compared with the reference output leaf by leaf:

* tuples, lists and dicts are walked element-wise and must have the same
  structure (a tuple is not a list, dict keys must match);
* every tensor leaf must have the reference's dtype and shape, and is judged in
  its own dtype with the rules in :data:`DEFAULT_TOLERANCES` (the same table is
  written out in ``references/correctness.yaml``; a test keeps the two equal);
* non-tensor leaves (ints, floats, strings, None) compare exactly.

The difference itself is computed in float64, where the difference of two
bf16/fp16/fp32 numbers is exact, so the verdict depends only on the rule and
never on how the comparison rounds.

On failure each failing leaf gets a :class:`LeafFailure` with its path
(``out[1]['h']``), the count and fraction of bad elements, the worst element
and its distance in ulps, and a diagnosis from the procedure's failure table
(:data:`DIAGNOSES`, applied in order, first match wins).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Tolerance:
    """``|k - r| <= atol + rtol * |r|`` (or exact equality when ``exact``)."""

    atol: float
    rtol: float
    exact: bool = False

    def formula(self) -> str:
        if self.exact:
            return "k == r (exact)"
        if self.atol == 0.0:
            return f"|k - r| <= {self.rtol:.12g} * |r|"
        return f"|k - r| <= {self.atol:g} + {self.rtol:.12g} * |r|"


HALF_ULP_BF16 = 2.0**-8  # torch.finfo(torch.bfloat16).eps / 2
HALF_ULP_FP16 = 2.0**-11  # torch.finfo(torch.float16).eps / 2

#: Per-dtype rules, exactly as procedure step 6 states them.  "Half an ulp
#: relative" is half the format's machine epsilon (eps = 2^-7 for bf16, 2^-10
#: for fp16) times |r|, with no absolute term: a result whose reference is 0
#: must be 0.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "bfloat16": Tolerance(atol=0.0, rtol=HALF_ULP_BF16),
    "float16": Tolerance(atol=0.0, rtol=HALF_ULP_FP16),
    "float32": Tolerance(atol=1e-6, rtol=1e-5),
    "float64": Tolerance(atol=1e-12, rtol=1e-9),
    "integer": Tolerance(atol=0.0, rtol=0.0, exact=True),
    "bool": Tolerance(atol=0.0, rtol=0.0, exact=True),
}

NAN_RULE = "NaN matches only NaN at the same index"
INF_RULE = "an infinity matches only the same infinity (same sign) at the same index"
WIDEN_RULE = (
    "--atol A / --rtol R widen floating-point rules only: "
    "|k - r| <= max(atol_dtype, A) + max(rtol_dtype, R) * |r|; integers and bool stay exact"
)
#: ``--accept-if-as-accurate``: the kernel's worst absolute error against the
#: float64 oracle may be at most this many times the baseline's own.
AS_ACCURATE_FACTOR = 2.0


def dtype_class(dtype: torch.dtype) -> str:
    """The row of :data:`DEFAULT_TOLERANCES` that judges ``dtype``."""
    if dtype == torch.bool:
        return "bool"
    if dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        return str(dtype).removeprefix("torch.")
    if dtype.is_complex:
        return dtype_class(torch.empty(0, dtype=dtype).real.dtype)
    if dtype.is_floating_point:
        # float8 and other narrow formats: the same "half an ulp relative" rule
        return "narrow-float"
    return "integer"


def tolerance_for(
    dtype: torch.dtype, *, atol: float | None = None, rtol: float | None = None
) -> Tolerance:
    """The rule for ``dtype``, widened by the user's ``--atol``/``--rtol``."""
    cls = dtype_class(dtype)
    if cls == "narrow-float":
        base = Tolerance(atol=0.0, rtol=torch.finfo(dtype).eps / 2)
    else:
        base = DEFAULT_TOLERANCES[cls]
    if base.exact or (atol is None and rtol is None):
        return base
    return Tolerance(
        atol=max(base.atol, atol if atol is not None else 0.0),
        rtol=max(base.rtol, rtol if rtol is not None else 0.0),
    )


def help_text() -> str:
    """The exact formulas, for ``--help`` and the report."""
    rows = [
        f"bf16: {DEFAULT_TOLERANCES['bfloat16'].formula()}  (2^-8, half an ulp relative)",
        f"fp16: {DEFAULT_TOLERANCES['float16'].formula()}  (2^-11, half an ulp relative)",
        f"fp32: {DEFAULT_TOLERANCES['float32'].formula()}",
        f"fp64: {DEFAULT_TOLERANCES['float64'].formula()}",
        "integers, bool and non-tensor leaves: k == r (exact)",
        NAN_RULE + "; " + INF_RULE,
        WIDEN_RULE,
    ]
    return "; ".join(rows)


# --------------------------------------------------------------------------- diagnosis


@dataclass(frozen=True)
class Diagnosis:
    id: str
    condition: str
    advice: str


#: The procedure's failure table, in the order the rules are tried.
DIAGNOSES: tuple[Diagnosis, ...] = (
    Diagnosis(
        "binding-or-dispatcher",
        "structure, type, dtype or shape differs from the reference",
        "a binding or dispatcher bug: check torch_binding.cpp's schema, the output "
        "allocation in the bridge and the dtype the dispatcher returns",
    ),
    Diagnosis(
        "missing-tail-handling",
        "every mismatch lies in the last partial vector of its row (the last "
        "n mod W elements of the last dimension n, W = 64 or 32 bytes / itemsize, n > W)",
        "missing tail handling: process the remainder with a masked load/store (masked-tail)",
    ),
    Diagnosis(
        "double-rounding",
        "bf16/fp16 leaf whose every mismatch is exactly one ulp and mismatches are rare "
        "(< 0.1 % of the elements)",
        "rare one-ulp flips: the kernel rounds an fp32 result once while the reference "
        "rounds a float64 result; if that is the only difference, rerun with --oracle fp64 "
        "--accept-if-as-accurate (and say so in the trial's --strategy)",
    ),
    Diagnosis(
        "rounding-or-conversion",
        "bf16/fp16 leaf whose every mismatch is exactly one ulp, on many elements (>= 0.1 %)",
        "a rounding-mode or conversion bug: convert fp32 to bf16 with round-to-nearest-even "
        "(bf16-rne-conversion), not truncation (bf16-truncation-bug)",
    ),
    Diagnosis(
        "wrong-second-output",
        "an output other than the first is wrong while the first output is correct",
        "a binding or dispatcher bug: the second output is not written, or written to the "
        "wrong tensor",
    ),
    Diagnosis(
        "non-finite",
        "every mismatch involves a NaN or an infinity on one side only",
        "overflow (exp without max subtraction), division by zero or uninitialised memory",
    ),
    Diagnosis(
        "accumulation-order",
        "fp32/fp64 leaf whose every mismatch is a near miss: |k - r| at most 16 times "
        "the allowed difference",
        "the accumulation order differs from the reference: if that is legitimate, widen "
        "with --atol/--rtol and record why in the trial's --strategy, or use "
        "--accept-if-as-accurate",
    ),
    Diagnosis(
        "alignment-or-indexing",
        "anything else: large or scattered differences",
        "an alignment or indexing bug: check pointer arithmetic, strides, row offsets and "
        "aligned loads on unaligned data",
    ),
)
DIAGNOSIS_BY_ID = {d.id: d for d in DIAGNOSES}
ACCUMULATION_ORDER_MAX_EXCESS = 16.0
DOUBLE_ROUNDING_MAX_FRACTION = 0.001

# --------------------------------------------------------------------------- results


@dataclass
class LeafFailure:
    """One failing leaf: everything an agent needs to pick the fix."""

    path: str
    kind: str  # "structure" | "type" | "dtype" | "shape" | "values" | "value"
    message: str
    dtype: str | None = None
    shape: list[int] | None = None
    mismatches: int = 0
    elements: int = 0
    fraction: float = 0.0
    worst_index: list[int] | None = None
    kernel_value: Any = None
    reference_value: Any = None
    ulps: float | None = None
    tolerance: str | None = None
    diagnosis: str = "binding-or-dispatcher"
    advice: str = ""
    leaf_index: int = 0  # position of the leaf in walk order (for "second output")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("kernel_value", "reference_value"):
            data[key] = _json_number(data[key])
        if self.ulps is not None and not math.isfinite(self.ulps):
            data["ulps"] = None
        return data


@dataclass
class Comparison:
    """The verdict for one kernel output against one reference output."""

    failures: list[LeafFailure] = field(default_factory=list)
    leaves: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "nan", "inf", "-inf": JSON has no spelling for them
    return value


# --------------------------------------------------------------------------- ulps

_INT_VIEW = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def _ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """Map floats to integers whose difference counts representable values between them."""
    bits = t.contiguous().view(_INT_VIEW[t.dtype]).to(torch.int64)
    width = t.element_size() * 8
    magnitude = bits & ((1 << (width - 1)) - 1)
    return torch.where(bits < 0, -magnitude, magnitude)


def ulp_distance(k: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Number of representable ``k.dtype`` values between ``k`` and ``r`` (float64 result).

    +0 and -0 are 0 apart.  Defined for fp16, bf16, fp32 and fp64; NaN positions
    give ``inf``.
    """
    if k.dtype not in _INT_VIEW:
        raise TypeError(f"ulp distance is defined for fp16/bf16/fp32/fp64, not {k.dtype}")
    if k.dtype == torch.float64:
        # int64 differences of opposite-sign doubles overflow: go through float64
        dist = (_ordered_bits(k).double() - _ordered_bits(r).double()).abs()
    else:
        dist = (_ordered_bits(k) - _ordered_bits(r)).abs().double()
    return torch.where(torch.isnan(k) | torch.isnan(r), torch.full_like(dist, math.inf), dist)


# --------------------------------------------------------------------------- walk


def _fmt_key(key: Any) -> str:
    return f"[{key!r}]"


def iter_leaves(obj: Any, path: str = "out") -> Iterator[tuple[str, Any]]:
    """Leaves of a tuple/list/dict tree in walk order, with their paths."""
    if isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield from iter_leaves(item, f"{path}[{i}]")
    elif isinstance(obj, Mapping):
        for key in obj:
            yield from iter_leaves(obj[key], path + _fmt_key(key))
    else:
        yield path, obj


def compare_outputs(
    kernel: Any,
    reference: Any,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    root: str = "out",
) -> Comparison:
    """Compare a kernel output tree with the reference tree (see module docstring)."""
    result = Comparison()
    _walk(kernel, reference, root, result, atol, rtol)
    _apply_second_output_rule(result)
    return result


def _walk(k: Any, r: Any, path: str, result: Comparison, atol, rtol) -> None:
    index = result.leaves
    if isinstance(r, (tuple, list)):
        if type(k) is not type(r) and not (isinstance(k, tuple) and isinstance(r, tuple)):
            result.leaves += 1
            result.failures.append(_structure(path, index, f"expected a {type(r).__name__} of "
                                              f"{len(r)} items, got {_describe(k)}"))
            return
        if len(k) != len(r):
            result.leaves += 1
            result.failures.append(_structure(path, index, f"expected {len(r)} items, got {len(k)}"))
            return
        for i, (ki, ri) in enumerate(zip(k, r, strict=True)):
            _walk(ki, ri, f"{path}[{i}]", result, atol, rtol)
        return
    if isinstance(r, Mapping):
        if not isinstance(k, Mapping) or set(k) != set(r):
            result.leaves += 1
            got = sorted(map(repr, k)) if isinstance(k, Mapping) else _describe(k)
            result.failures.append(_structure(path, index, f"expected a dict with keys "
                                              f"{sorted(map(repr, r))}, got {got}"))
            return
        for key in r:
            _walk(k[key], r[key], path + _fmt_key(key), result, atol, rtol)
        return
    result.leaves += 1
    if isinstance(r, torch.Tensor):
        failure = compare_tensor(k, r, path=path, atol=atol, rtol=rtol)
    else:
        failure = _compare_plain(k, r, path)
    if failure is not None:
        failure.leaf_index = index
        result.failures.append(failure)


def _describe(obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        return f"a {str(obj.dtype).removeprefix('torch.')} tensor of shape {list(obj.shape)}"
    return f"a {type(obj).__name__}"


def _structure(path: str, index: int, message: str) -> LeafFailure:
    d = DIAGNOSIS_BY_ID["binding-or-dispatcher"]
    return LeafFailure(path=path, kind="structure", message=message, diagnosis=d.id,
                       advice=d.advice, leaf_index=index)


def _compare_plain(k: Any, r: Any, path: str) -> LeafFailure | None:
    if isinstance(k, torch.Tensor) or type(k) is not type(r):
        return _structure(path, 0, f"expected {_describe(r)} ({r!r}), got {_describe(k)}")
    same = k == r or (isinstance(r, float) and math.isnan(r) and math.isnan(k))
    if same:
        return None
    failure = _structure(path, 0, f"expected {r!r}, got {k!r} (non-tensor leaves compare exactly)")
    failure.kind = "value"
    failure.kernel_value, failure.reference_value = k, r
    return failure


def compare_tensor(
    k: Any,
    r: torch.Tensor,
    *,
    path: str = "out",
    atol: float | None = None,
    rtol: float | None = None,
) -> LeafFailure | None:
    """Judge one tensor leaf; ``None`` when it passes."""
    dname = str(r.dtype).removeprefix("torch.")
    if not isinstance(k, torch.Tensor):
        return _structure(path, 0, f"expected {_describe(r)}, got {_describe(k)}")
    if k.dtype != r.dtype:
        f = _structure(path, 0, f"dtype {str(k.dtype).removeprefix('torch.')} where the "
                                f"reference has {dname}")
        f.kind, f.dtype, f.shape = "dtype", dname, list(r.shape)
        return f
    if k.shape != r.shape:
        f = _structure(path, 0, f"shape {list(k.shape)} where the reference has {list(r.shape)}")
        f.kind, f.dtype, f.shape = "shape", dname, list(r.shape)
        return f
    tol = tolerance_for(r.dtype, atol=atol, rtol=rtol)
    kc, rc = k.detach().cpu().contiguous(), r.detach().cpu().contiguous()
    if kc.is_complex():
        kc, rc = torch.view_as_real(kc).contiguous(), torch.view_as_real(rc).contiguous()
    kf, rf = kc.reshape(-1), rc.reshape(-1)
    bad = _mismatching(kf, rf, tol)
    if bad.numel() == 0:
        return None
    return _describe_values(path, kf, rf, bad, tol, dname, list(kc.shape))


def _bits(t: torch.Tensor) -> torch.Tensor:
    view = _INT_VIEW.get(t.dtype)
    return t.view(view) if view is not None else t


def _mismatching(k: torch.Tensor, r: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """Flat indices of the elements that break the rule.

    Only elements whose bits differ can break it, so the float64 arithmetic runs
    on those alone (usually few: this keeps a 4M-element check well under a second).
    """
    if tol.exact or not r.dtype.is_floating_point:
        return (k != r).nonzero().reshape(-1)
    differ = (_bits(k) != _bits(r)).nonzero().reshape(-1)
    if differ.numel() == 0:
        return differ
    kd, rd = k[differ].double(), r[differ].double()
    return differ[~_close(kd, rd, tol)]


def _close(kd: torch.Tensor, rd: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    k_nan, r_nan = torch.isnan(kd), torch.isnan(rd)
    inf = torch.isinf(kd) | torch.isinf(rd)
    close = (kd - rd).abs() <= tol.atol + tol.rtol * rd.abs()
    return torch.where(k_nan | r_nan, k_nan & r_nan, torch.where(inf, kd == rd, close))


def _describe_values(path, k, r, bad, tol, dname, shape) -> LeafFailure:
    total = k.numel()
    count = int(bad.numel())
    kb, rb = k[bad], r[bad]
    if r.dtype.is_floating_point:
        diff = (kb.double() - rb.double()).abs()
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
        pos = int(torch.argmax(diff))
    else:
        pos = 0
    flat = int(bad[pos])
    worst = _unravel(flat, shape)
    kv, rv = kb[pos].item(), rb[pos].item()
    ulps_bad = ulp_distance(kb, rb) if k.dtype in _INT_VIEW else None
    ulps = float(ulps_bad[pos]) if ulps_bad is not None else None
    diag = _diagnose(kb, rb, bad, total, shape, ulps_bad, tol)
    d = DIAGNOSIS_BY_ID[diag]
    frac = count / total if total else 0.0
    message = (f"{count} of {total} elements ({frac:.2%}) outside {tol.formula()}; worst at "
               f"{worst}: kernel {kv!r} vs reference {rv!r}"
               + (f" ({ulps:g} ulps)" if ulps is not None else ""))
    return LeafFailure(
        path=path, kind="values", message=message, dtype=dname, shape=shape,
        mismatches=count, elements=total, fraction=frac, worst_index=worst,
        kernel_value=kv, reference_value=rv, ulps=ulps, tolerance=tol.formula(),
        diagnosis=d.id, advice=d.advice,
    )


def _unravel(flat: int, shape: Sequence[int]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return list(reversed(out))


def _diagnose(kb: torch.Tensor, rb: torch.Tensor, bad: torch.Tensor, total: int,
              shape: Sequence[int], ulps: torch.Tensor | None, tol: Tolerance) -> str:
    """First matching row of :data:`DIAGNOSES` for the mismatching elements ``kb``/``rb``."""
    if _tail_only(bad, shape, kb.element_size()):
        return "missing-tail-handling"
    if ulps is not None and kb.dtype in (torch.bfloat16, torch.float16) and bool((ulps == 1).all()):
        if bad.numel() < DOUBLE_ROUNDING_MAX_FRACTION * total:
            return "double-rounding"
        return "rounding-or-conversion"
    if rb.dtype.is_floating_point:
        kd, rd = kb.double(), rb.double()
        if bool((~torch.isfinite(kd) | ~torch.isfinite(rd)).all()):
            return "non-finite"
        if kb.dtype in (torch.float32, torch.float64):
            allowed = tol.atol + tol.rtol * rd.abs()
            if bool(((kd - rd).abs() <= ACCUMULATION_ORDER_MAX_EXCESS * allowed).all()):
                return "accumulation-order"
    return "alignment-or-indexing"


def _tail_only(bad: torch.Tensor, shape: Sequence[int], itemsize: int) -> bool:
    if not shape or shape[-1] == 0:
        return False
    n = shape[-1]
    cols = bad % n
    for vector_bytes in (64, 32):
        width = max(vector_bytes // itemsize, 1)
        rem = n % width
        if rem and n > width and bool((cols >= n - rem).all()):
            return True
    return False


#: Diagnoses that come after "wrong-second-output" in :data:`DIAGNOSES` order.
_AFTER_SECOND_OUTPUT = tuple(
    d.id for d in DIAGNOSES[[x.id for x in DIAGNOSES].index("wrong-second-output") + 1 :]
)


def _apply_second_output_rule(result: Comparison) -> None:
    """A wrong later output next to a correct first one points at the binding."""
    failed = {f.leaf_index for f in result.failures}
    if 0 in failed or result.leaves < 2:
        return
    d = DIAGNOSIS_BY_ID["wrong-second-output"]
    for f in result.failures:
        if f.kind == "values" and f.diagnosis in _AFTER_SECOND_OUTPUT:
            f.diagnosis, f.advice = d.id, d.advice


# --------------------------------------------------------------------------- oracle


@dataclass
class OracleLeaf:
    """Worst absolute errors of one leaf against the float64 oracle."""

    path: str
    kernel_error: float
    baseline_error: float

    @property
    def as_accurate(self) -> bool:
        return self.kernel_error <= AS_ACCURATE_FACTOR * self.baseline_error

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kernel_error": _json_number(self.kernel_error),
            "baseline_error": _json_number(self.baseline_error),
            "as_accurate": self.as_accurate,
        }


def worst_error(value: torch.Tensor, oracle: torch.Tensor) -> float:
    """Largest |value - oracle| computed in float64; NaN where exactly one side is NaN -> inf."""
    v, o = value.detach().double().reshape(-1), oracle.detach().double().reshape(-1)
    if v.numel() == 0:
        return 0.0
    diff = (v - o).abs()
    if bool(torch.isfinite(diff).all()):
        return float(diff.max())  # the common case, one pass
    v_nan, o_nan = torch.isnan(v), torch.isnan(o)
    if bool((v_nan != o_nan).any()):
        return math.inf
    same = v_nan | (torch.isinf(v) & (v == o))  # NaN with NaN, or the same infinity
    diff = torch.where(same, torch.zeros_like(diff), diff)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    return float(diff.max())


def oracle_errors(kernel: Any, baseline: Any, oracle: Any, root: str = "out") -> list[OracleLeaf]:
    """Per floating tensor leaf, the kernel's and the baseline's worst error against the oracle.

    The trees must already have equal structure (``compare_outputs`` checks that first).
    """
    leaves = []
    for (path, k), (_, b), (_, o) in zip(
        iter_leaves(kernel, root), iter_leaves(baseline, root), iter_leaves(oracle, root), strict=False
    ):
        if isinstance(k, torch.Tensor) and isinstance(o, torch.Tensor) and isinstance(b, torch.Tensor):
            if k.shape != o.shape or b.shape != o.shape or not o.dtype.is_floating_point:
                continue
            leaves.append(OracleLeaf(path, worst_error(k, o), worst_error(b, o)))
    return leaves


def passes_as_accurate(comparison: Comparison, leaves: list[OracleLeaf]) -> bool:
    """``--accept-if-as-accurate``: every value failure is on a leaf as accurate as the baseline."""
    by_path = {leaf.path: leaf for leaf in leaves}
    for failure in comparison.failures:
        if failure.kind != "values":
            return False
        leaf = by_path.get(failure.path)
        if leaf is None or not leaf.as_accurate or not math.isfinite(leaf.kernel_error):
            return False
    return True
