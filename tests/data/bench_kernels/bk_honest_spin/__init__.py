"""Honest and deliberately slower: bk_honest's rms_norm, then a busy spin for a
fixed share of the call's own time (BK_SPIN_FRACTION, default 0.25: the call
takes ~1.25x as long as bk_honest's). It spins rather than sleeps, so the call
keeps its CPU the whole time, as a slower kernel would. Used by the --against
tests and by scripts/bench_harness_precision.py --mode slower (0.10)."""

import os
import time

from bk_common import rms_norm_honest

SPIN_FRACTION = float(os.environ.get("BK_SPIN_FRACTION", "0.25"))


def rms_norm(x, weight, eps):
    start = time.perf_counter()
    out = rms_norm_honest(x, weight, eps)
    until = start + (time.perf_counter() - start) * (1.0 + SPIN_FRACTION)
    while time.perf_counter() < until:
        pass
    return out
