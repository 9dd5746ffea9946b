"""Which edge cases the checked input sets reach, per tensor input (issue 20).

A kernel is proven only on the inputs it is checked with. A SIMD body has three
paths that the headline shape rarely reaches: the tail (a last dimension that
is not a multiple of the vector width), size-1 dimensions (broadcasts, single
rows) and strided inputs. This module reads the baseline's ``get_inputs()`` and
``get_correctness_inputs()`` under fake tensors (shapes, dtypes and strides,
nothing allocated) and reports, for every tensor input, whether some checked
set has

* ``tail``: a last dimension that is not a multiple of the widest tier's vector
  width in that dtype (AVX512: 64 bytes, i.e. 16 fp32 or 32 bf16 lanes);
* ``size_one``: a dimension of size 1;
* ``non_contiguous``: a non-contiguous layout (informational: the generated
  bridges require contiguous inputs, so it is no warning).

A missing tail or size-1 case is a warning: add a ``get_correctness_inputs()``
set that has it.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

#: The widest tier's vector: AVX512, 64 bytes.
VECTOR_BYTES = 64


def lanes(dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in one widest-tier vector (16 fp32, 32 bf16/fp16, 64 bool/int8)."""
    size = torch.empty((), dtype=dtype).element_size()
    return max(1, VECTOR_BYTES // size)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _names(module: Any, count: int) -> list[str]:
    fn = getattr(module, "get_reference_output", None)
    if not callable(fn) and isinstance(getattr(module, "Model", None), type):
        fn = module.Model.forward
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"input {i}" for i in range(count)]


def input_coverage(sets: list[list[Any]], names: list[str]) -> list[dict[str, Any]]:
    """One entry per tensor input position: what the sets reach, and what is missing."""
    result = []
    width = max((len(s) for s in sets), default=0)
    for i in range(width):
        tensors = [s[i] for s in sets if i < len(s) and isinstance(s[i], torch.Tensor)]
        if not tensors:
            continue
        tail = any(t.dim() > 0 and t.shape[-1] % lanes(t.dtype) != 0 for t in tensors)
        size_one = any(t.dim() == 0 or 1 in tuple(t.shape) for t in tensors)
        strided = any(not t.is_contiguous() for t in tensors)
        widths = sorted({lanes(t.dtype) for t in tensors})
        missing = []
        if not tail:
            missing.append(f"a last dimension that is not a multiple of {'/'.join(map(str, widths))} "
                           "(the widest tier's vector width in its dtype) — the tail path")
        if not size_one:
            missing.append("a dimension of size 1")
        result.append({"input": names[i] if i < len(names) else f"input {i}", "index": i, "tail": tail,
                       "size_one": size_one, "non_contiguous": strided, "lanes": widths, "missing": missing})
    return result


def baseline_coverage(path: str | Path) -> dict[str, Any]:
    """``{"inputs": [...], "warnings": [...]}`` for a baseline file, or ``{"error": ...}``."""
    from ..analysis.trace import _import_baseline

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            module = _import_baseline(Path(path))
            sets = [_as_list(module.get_inputs())]
            if callable(getattr(module, "get_correctness_inputs", None)):
                sets += [_as_list(s) for s in module.get_correctness_inputs()]
    except Exception as exc:  # noqa: BLE001 - coverage is advice; never fail the benchmark for it
        return {"inputs": [], "warnings": [], "error": f"{type(exc).__name__}: {exc}"}
    inputs = input_coverage(sets, _names(module, max(len(s) for s in sets)))
    warnings = [f"coverage: no checked input set gives {item['input']} {gap}; add a get_correctness_inputs() "
                "case with one" for item in inputs for gap in item["missing"]]
    return {"inputs": inputs, "warnings": warnings, "vector_bytes": VECTOR_BYTES}
