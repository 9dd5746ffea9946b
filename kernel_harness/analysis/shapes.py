"""Shape strings and the FLOP/byte model of an op known only by name and shape.

Shape conventions per category (also in ``docs/analysis.md``):

* element-wise, norm, softmax: the input shape, reduced over the last dim
  (``1024x4096`` = 1024 rows of 4096).  Gated activations (``silu_and_mul``)
  split the last dim: the output is half as wide.  ``add_rms_norm``-style
  names (``add`` + norm) also read and write a residual of the same shape.
* gemm / linear / matmul: ``MxNxK`` (M rows of activations, N output
  features, K reduction); ``MxK`` means a square weight (N = K); a leading
  4th dim is a batch: ``BxMxNxK``.
* attention: ``BxHxSxD`` (batch, heads, sequence, head dim) with L = S;
  ``BxHxLxSxD`` for different query/key lengths; ``SxD`` / ``BxSxD`` add 1s.
* moe / megablocks: ``TxNxKxE[xTOPK]`` (tokens, expert out features, in
  features, experts, experts per token, default 2).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .names import NameMatch, is_gated
from .opcost import POINTWISE_COST, REDUCTION_COST

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}

_SHAPE = re.compile(r"^\d+(x\d+)*$")


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """``"1024x4096,2048x8192"`` -> ``[(1024, 4096), (2048, 8192)]``."""
    shapes = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        part = part.lower().replace("*", "x")
        if not _SHAPE.match(part) or any(int(d) == 0 for d in part.split("x")):
            raise UsageError(
                f"--shapes: {part!r} is not a shape. Write positive sizes joined by 'x' and separate "
                "shapes with commas, for example --shapes \"1024x4096,2048x8192\"."
            )
        shapes.append(tuple(int(d) for d in part.split("x")))
    if not shapes:
        raise UsageError('--shapes is empty; pass for example --shapes "1024x4096,2048x8192".')
    return shapes


def shape_str(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


@dataclass(frozen=True)
class ShapeCost:
    """FLOPs and minimum bytes of one op instance, plus the sizes the strategy needs."""

    flops: float
    input_bytes: int
    output_bytes: int
    rows: int  # independent rows / tokens (the threading axis)
    row_len: int  # elements reduced or processed per row
    gemm_mnk: tuple[int, int, int] | None = None
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"flops": int(self.flops), "input_bytes": self.input_bytes, "output_bytes": self.output_bytes,
                "rows": self.rows, "row_len": self.row_len,
                "gemm_mnk": list(self.gemm_mnk) if self.gemm_mnk else None, "model": self.description}


def _activation_cost(name: str, category: str) -> float:
    if category in POINTWISE_COST:
        return POINTWISE_COST[category]
    return 1.0


def formula_cost(match: NameMatch, shape: tuple[int, ...], dtype: str) -> ShapeCost:
    """Cost of the op named ``match.name`` at ``shape`` from the conventions above."""
    es = DTYPE_BYTES[dtype]
    category = match.category
    numel = math.prod(shape)
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    last = shape[-1]
    lowered = match.name.lower()
    if category in ("gemm", "moe") or match.kind == "gemm":
        return _gemm_cost(match, shape, es)
    if category == "attention" or match.kind == "attention":
        return _attention_cost(shape, es)
    if category in ("norm", "softmax") or match.kind == "reduction":
        layer = "layer" in lowered or "group" in lowered or "batch" in lowered
        per = REDUCTION_COST["_softmax"] if category == "softmax" else REDUCTION_COST["native_layer_norm" if layer else "rms_norm"]
        flops = per * numel
        in_bytes = numel * es
        out_bytes = numel * es
        what = "softmax over the last dim" if category == "softmax" else ("layer norm" if layer else "RMS norm")
        if category == "norm":
            in_bytes += last * es * (2 if layer else 1)  # weight (and bias)
            if "add" in lowered or "residual" in lowered:
                in_bytes += numel * es
                out_bytes += numel * es
                flops += numel
                what = "residual add + " + what
        return ShapeCost(flops, in_bytes, out_bytes, rows, last, None, f"{what}: {per:g} FLOPs/element")
    # element-wise
    gated = is_gated(lowered)
    out_numel = numel // 2 if gated and last % 2 == 0 else numel
    per = _activation_cost(lowered, category)
    flops = out_numel * (per + (1 if gated else 0))
    what = f"{'gated ' if gated else ''}{category}: {per:g} FLOPs/output element" + (" + 1 multiply" if gated else "")
    return ShapeCost(flops, numel * es, out_numel * es, rows, last, None, what)


def _gemm_cost(match: NameMatch, shape: tuple[int, ...], es: int) -> ShapeCost:
    if match.category == "moe":
        if len(shape) < 4:
            raise UsageError(
                f"--shapes {shape_str(shape)!r}: an MoE shape is TOKENSxNxKxEXPERTS[xTOPK], for example "
                "\"64x14336x4096x8x2\" (64 tokens, 8 experts, 2 experts per token)."
            )
        tokens, n, k, experts = shape[:4]
        topk = shape[4] if len(shape) > 4 else 2
        rows = tokens * topk
        touched = min(experts, rows)  # experts that receive at least one token (best case for weights)
        flops = 2.0 * rows * n * k
        in_bytes = (tokens * k + touched * n * k) * es
        out_bytes = rows * n * es
        m_per_expert = max(1, math.ceil(rows / experts))
        return ShapeCost(flops, in_bytes, out_bytes, rows, k, (m_per_expert, n, k),
                         f"MoE: {experts} experts, top-{topk}, ~{m_per_expert} rows per expert GEMM")
    if len(shape) == 2:
        m, k = shape
        n, batch = k, 1
        note = "MxK given: square weight assumed (N = K)"
    elif len(shape) == 3:
        (m, n, k), batch, note = shape, 1, "MxNxK"
    elif len(shape) == 4:
        batch, m, n, k = shape
        note = "BxMxNxK (batched)"
    else:
        raise UsageError(f"--shapes {shape_str(shape)!r}: a GEMM shape is MxNxK (or MxK, BxMxNxK).")
    flops = 2.0 * batch * m * n * k
    in_bytes = batch * (m * k + n * k) * es
    out_bytes = batch * m * n * es
    return ShapeCost(flops, in_bytes, out_bytes, batch * m, k, (m, n, k), f"GEMM {note}: 2*M*N*K FLOPs")


def _attention_cost(shape: tuple[int, ...], es: int) -> ShapeCost:
    dims = list(shape)
    if len(dims) == 5:
        b, h, length, source, d = dims
    elif 2 <= len(dims) <= 4:
        dims = [1] * (4 - len(dims)) + dims
        b, h, length, d = dims
        source = length
    else:
        raise UsageError(f"--shapes {shape_str(shape)!r}: an attention shape is BxHxSxD (or BxHxLxSxD).")
    scores = b * h * length * source
    flops = 4.0 * scores * d + REDUCTION_COST["_softmax"] * scores
    in_bytes = (b * h * length * d + 2 * b * h * source * d) * es
    out_bytes = b * h * length * d * es
    return ShapeCost(flops, in_bytes, out_bytes, b * h * length, source, (length, source, d),
                     "attention: QK^T and PV (4*L*S*D per head) + softmax over L x S")


def scaled_trace_cost(trace_flops: float, trace_in: int, trace_out: int, trace_numel: int,
                      shape: tuple[int, ...], trace_dtype_bytes: int, dtype_bytes: int) -> ShapeCost:
    """Element-wise/reduction cost at another shape: the traced cost scaled by element count."""
    numel = math.prod(shape)
    ratio = numel / max(1, trace_numel)
    byte_ratio = ratio * dtype_bytes / trace_dtype_bytes
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    return ShapeCost(trace_flops * ratio, int(trace_in * byte_ratio), int(trace_out * byte_ratio), rows,
                     shape[-1], None, "baseline trace scaled by element count")
