"""Test kernel: ``scale(x, alpha)`` in generic/AVX2/AVX512 tiers."""

import torch

from ._ops import add_op_namespace_prefix, ops

__all__ = ["scale", "omp_threads_in_region", "active_tier", "add_op_namespace_prefix"]


def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return ops.scale(x, alpha)


def omp_threads_in_region() -> int:
    return ops.omp_threads_in_region()


def active_tier() -> str:
    return ops.active_tier()
