"""Honest but slower than the baseline: correct, and must still pass."""

import time

from bk_common import rms_norm_honest


def rms_norm(x, weight, eps):
    out = rms_norm_honest(x, weight, eps)
    time.sleep(0.0005)
    return out
