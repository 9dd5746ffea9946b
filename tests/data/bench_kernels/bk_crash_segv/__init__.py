"""Crashes the process with a segmentation fault (a write through a NULL-ish pointer)."""

import ctypes


def rms_norm(x, weight, eps):
    ctypes.memset(16, 0, 8)
    return x
