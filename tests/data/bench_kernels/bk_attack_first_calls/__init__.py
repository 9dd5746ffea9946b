"""Attack: correct for the first calls (where a naive harness checks), then replays.

After 40 calls it returns the last result it computed, per shape, like a kernel
that "warms up" a cache once the correctness check is over.
"""

from bk_common import rms_norm_honest

_calls = 0
_last = {}


def rms_norm(x, weight, eps):
    global _calls
    _calls += 1
    key = (tuple(x.shape), x.dtype)
    if _calls > 40 and key in _last:
        return _last[key].clone()
    out = rms_norm_honest(x, weight, eps)
    _last[key] = out
    return out
