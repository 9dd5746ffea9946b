"""A tiered Python kernel for the tier sweep: each tier sleeps a known time.

KERNEL_CPU_ISA picks the tier at each call and is what dispatch_tier() reports
when set, like the generated dispatchers; otherwise BK_TIERED_PICK says which
tier dispatch_tier() reports (default: the fastest);
BK_TIERED_JITTER adds a random sleep of up to that many seconds to every call.
"""

import os
import random
import time

from bk_common import rms_norm_honest

_DELAY = {"generic": 0.0, "avx2": 0.002, "avx512": 0.004}


def available_tiers():
    return ["generic", "avx2", "avx512"]


def dispatch_tier(op_name, *inputs):
    return os.environ.get("KERNEL_CPU_ISA") or os.environ.get("BK_TIERED_PICK", "generic")


def rms_norm(x, weight, eps):
    tier = os.environ.get("KERNEL_CPU_ISA") or dispatch_tier("rms_norm", x, weight, eps)
    if tier not in _DELAY:
        raise RuntimeError(f"unknown tier {tier}")
    out = rms_norm_honest(x, weight, eps)
    delay = _DELAY[tier] + random.uniform(0.0, float(os.environ.get("BK_TIERED_JITTER", "0")))
    if delay:
        time.sleep(delay)
    return out
