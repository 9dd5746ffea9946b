"""Raises on every call, like a TORCH_CHECK that rejects the input."""


def rms_norm(x, weight, eps):
    raise RuntimeError("rms_norm: expected a contiguous bfloat16 tensor")
