"""Attack: cache the result keyed by the input's data pointer.

With BK_ATTACK_LOG set, each call appends to that file "miss", "hit" (a cached
result was served and happened to be right: the same values at the same
address), or "stale" (a cached result that is wrong for these values was
served), so a test can tell an attack that was caught from one that never got
to serve a stale result (the timing workers move every input to a new page
offset per call, so pointers rarely repeat there).
"""

import os

import torch
from bk_common import rms_norm_honest

_cache = {}


def rms_norm(x, weight, eps):
    key = (x.data_ptr(), tuple(x.shape))
    hit = key in _cache
    if not hit:
        _cache[key] = rms_norm_honest(x, weight, eps)
    log = os.environ.get("BK_ATTACK_LOG")
    if log:
        what = "miss"
        if hit:
            what = "hit" if torch.equal(_cache[key], rms_norm_honest(x, weight, eps)) else "stale"
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(what + "\n")
    return _cache[key].clone()
