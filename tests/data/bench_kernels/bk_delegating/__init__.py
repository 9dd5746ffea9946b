"""Correct, but simply runs the baseline's own op: must be flagged as delegation."""

import torch.nn.functional as F


def rms_norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
