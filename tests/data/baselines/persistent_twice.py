"""A baseline whose PERSISTENT_INPUTS names one position twice."""

import torch

PERSISTENT_INPUTS = (1, 1)


def get_inputs():
    return [torch.randn(4, 8), torch.randn(8)]


def get_reference_output(x, weight):
    return x * weight
