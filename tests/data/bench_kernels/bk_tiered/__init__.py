"""A tiered Python kernel for the tier sweep: each tier sleeps a known time.

KERNEL_CPU_ISA picks the tier at each call, like the generated dispatchers;
BK_TIERED_PICK says which tier dispatch_tier() reports (default: the fastest).
"""

import os
import time

from bk_common import rms_norm_honest

_DELAY = {"generic": 0.0, "avx2": 0.002, "avx512": 0.004}


def available_tiers():
    return ["generic", "avx2", "avx512"]


def dispatch_tier(op_name, *inputs):
    return os.environ.get("BK_TIERED_PICK", "generic")


def rms_norm(x, weight, eps):
    tier = os.environ.get("KERNEL_CPU_ISA") or dispatch_tier("rms_norm", x, weight, eps)
    if tier not in _DELAY:
        raise RuntimeError(f"unknown tier {tier}")
    out = rms_norm_honest(x, weight, eps)
    if _DELAY[tier]:
        time.sleep(_DELAY[tier])
    return out
