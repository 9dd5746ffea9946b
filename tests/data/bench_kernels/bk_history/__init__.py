"""Honest, but its speed depends on the process's history: once the harness has
traced one of its calls (a TorchDispatchMode was active during the call), every
later call in that process spins for four times its own time.  Timed against itself
with --against, it shows whether both builds are timed by workers with the same
history: a worker that ran the trace would read 5x slower than one that did not."""

import time

from bk_common import rms_norm_honest
from torch.utils._python_dispatch import _get_current_dispatch_mode

_traced = False


def rms_norm(x, weight, eps):
    global _traced
    if _get_current_dispatch_mode() is not None:
        _traced = True
    start = time.perf_counter()
    out = rms_norm_honest(x, weight, eps)
    if _traced:
        until = start + (time.perf_counter() - start) * 5.0
        while time.perf_counter() < until:
            pass
    return out
