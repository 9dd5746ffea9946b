"""bk_native's C++ rms_norm with a documented busy spin in its body for
BK_SPIN_FRACTION (default 0.10) of the call's own compute time: a correct kernel
made measurably 10 % slower, for scripts/bench_harness_precision.py --mode slower."""

import os

from bk_common.native import extension

SPIN_FRACTION = float(os.environ.get("BK_SPIN_FRACTION", "0.10"))


def rms_norm(x, weight, eps):
    return extension().rms_norm(x, weight, float(eps), SPIN_FRACTION)


extension()
