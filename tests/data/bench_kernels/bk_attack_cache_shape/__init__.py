"""Attack: cache the result per shape and dtype (correct only for the first input of a shape)."""

from bk_common import rms_norm_honest

_cache = {}


def rms_norm(x, weight, eps):
    key = (tuple(x.shape), x.dtype)
    if key not in _cache:
        _cache[key] = rms_norm_honest(x, weight, eps)
    return _cache[key].clone()
