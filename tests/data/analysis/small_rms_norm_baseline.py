"""A small rms_norm baseline (fp32 256 x 1024) so profiler tests run in a few seconds."""

import torch
import torch.nn.functional as F


def get_inputs():
    return [torch.randn(256, 1024), torch.randn(1024), 1e-6]


def get_reference_output(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
