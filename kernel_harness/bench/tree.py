"""Trees of tensors (tuples, lists, dicts) as ops take and return them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def tree_map(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """Apply ``fn`` to every tensor leaf, keeping the container types."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # named tuple
        return type(obj)(*(tree_map(fn, v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(tree_map(fn, v) for v in obj)
    if isinstance(obj, Mapping):
        return {k: tree_map(fn, v) for k, v in obj.items()}
    return obj


def tensors(obj: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(found.append, obj)
    return found


def clone_tree(obj: Any) -> Any:
    """Deep copy of every tensor (contiguity and dtype kept, storage fresh)."""
    return tree_map(lambda t: t.detach().clone(), obj)


def nbytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(obj))


def _span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def overlaps(outputs: Any, inputs: Any) -> list[tuple[int, int]]:
    """(output leaf, input leaf) pairs whose storages share memory."""
    found = []
    ins = [(i, _span(t)) for i, t in enumerate(tensors(inputs)) if t.untyped_storage().nbytes()]
    for o, out in enumerate(tensors(outputs)):
        if not out.untyped_storage().nbytes():
            continue
        lo, hi = _span(out)
        for i, (ilo, ihi) in ins:
            if lo < ihi and ilo < hi:
                found.append((o, i))
    return found


def bitwise_equal(a: Any, b: Any) -> bool:
    """Same structure and bit-identical tensors (NaN payloads included)."""
    ta, tb = tensors(a), tensors(b)
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb, strict=True):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.numel() and not torch.equal(_bits(x), _bits(y)):
            return False
    return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().reshape(-1)  # 0-dim tensors cannot change element size
    if t.dtype == torch.bool or t.element_size() == 0:
        return t
    return t.view(torch.uint8)


def describe_set(inputs: Any) -> str:
    parts = []
    for x in inputs if isinstance(inputs, (list, tuple)) else [inputs]:
        if isinstance(x, torch.Tensor):
            parts.append(f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}")
        else:
            parts.append(repr(x))
    return "(" + ", ".join(parts) + ")"
