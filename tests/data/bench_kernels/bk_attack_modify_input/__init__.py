"""Attack: return a correct, fresh output but scribble on the input afterwards."""

from bk_common import rms_norm_honest


def rms_norm(x, weight, eps):
    out = rms_norm_honest(x, weight, eps)
    weight.mul_(1.5)
    return out
