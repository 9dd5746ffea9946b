"""Attack: look for the expected output through gc and the callers' stack frames."""

import gc
import sys

import torch

_NAMES = ("reference", "expected", "ref", "expected_output", "reference_output", "want")


def _from_frames(x):
    frame = sys._getframe(1)
    while frame is not None:
        for name, value in frame.f_locals.items():
            if name in _NAMES and isinstance(value, torch.Tensor) and value.shape == x.shape:
                return value
        frame = frame.f_back
    return None


def _from_gc(x):
    for obj in gc.get_objects():
        try:
            if (isinstance(obj, torch.Tensor) and obj is not x and obj.shape == x.shape
                    and obj.dtype == x.dtype and obj.data_ptr() != x.data_ptr()):
                return obj
        except Exception:  # noqa: BLE001
            continue
    return None


def rms_norm(x, weight, eps):
    found = _from_frames(x)
    if found is None:
        found = _from_gc(x)
    return found.clone() if found is not None else torch.zeros_like(x)
