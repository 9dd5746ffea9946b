"""Attack: compute in place into the input and return the input itself."""

from bk_common import rms_norm_honest


def rms_norm(x, weight, eps):
    x.copy_(rms_norm_honest(x, weight, eps))
    return x
