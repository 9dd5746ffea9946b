"""Honest C++ rms_norm (fp32): bk_common/native, no spin. The fast side of
scripts/bench_harness_precision.py --mode slower."""

from bk_common.native import extension


def rms_norm(x, weight, eps):
    return extension().rms_norm(x, weight, float(eps), 0.0)


extension()  # compile (or load the cached build) at import, not in the first timed call
