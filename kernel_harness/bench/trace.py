"""Which ATen ops does a call dispatch?  And does the kernel just run the baseline's?

A ``TorchDispatchMode`` sees every op that reaches the dispatcher from Python:
a custom C++ op shows up as ``<namespace>.<op>`` (what happens inside it is
invisible, as it should be), a Python "kernel" that calls torch shows up as
the ATen ops it runs.  A kernel is flagged as *delegating* when its call
dispatched every compute op of the baseline's call, i.e. it does what the
baseline does instead of being a kernel of its own.  Views, allocation and
copies are not compute and are ignored in the comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

#: Ops that move or describe data without computing anything.
NON_COMPUTE = frozenset({
    "aten.empty", "aten.empty_like", "aten.empty_strided", "aten.zeros", "aten.zeros_like",
    "aten.ones", "aten.ones_like", "aten.full", "aten.full_like", "aten.new_empty",
    "aten.new_zeros", "aten.new_empty_strided", "aten.scalar_tensor", "aten.lift_fresh",
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten.detach", "aten.alias", "aten.t",
    "aten.transpose", "aten.permute", "aten.expand", "aten.as_strided", "aten.clone",
    "aten.copy", "aten._to_copy", "aten.to", "aten.contiguous", "aten.select", "aten.slice",
    "aten.unsqueeze", "aten.squeeze", "aten.split", "aten.split_with_sizes", "aten.chunk",
    "aten.unbind", "aten.narrow", "aten.resize", "aten.set", "aten.fill", "aten.zero",
    "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.is_same_size",
})


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps __torch_dispatch__ in torch._disable_dynamo by default, which
        # imports torch._dynamo (2+ s) on the first call; nothing here is compiled
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops.append(str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func))
        return func(*args, **(kwargs or {}))


def trace_ops(fn: Callable[..., Any], *args: Any) -> tuple[list[str], Any]:
    """Run ``fn(*args)`` and return (op names in call order, the result)."""
    recorder = _Recorder()
    with recorder:
        result = fn(*args)
    return recorder.ops, result


def normalize(op: str) -> str:
    """``aten.add_`` and ``aten.add`` are the same computation."""
    return op[:-1] if op.endswith("_") and not op.endswith("__") else op


def compute_ops(ops: list[str]) -> set[str]:
    return {normalize(op) for op in ops} - NON_COMPUTE


def unique_in_order(ops: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for op in ops:
        seen.setdefault(op, None)
    return list(seen)


def is_delegation(kernel_ops: list[str], baseline_ops: list[str]) -> bool:
    """True when the kernel's call ran every compute op of the baseline's call."""
    base = compute_ops(baseline_ops)
    return bool(base) and base <= compute_ops(kernel_ops)
