"""A baseline whose PERSISTENT_INPUTS is not a tuple of input positions (a name instead)."""

import torch

PERSISTENT_INPUTS = ("weight",)


def get_inputs():
    return [torch.randn(4, 8), torch.randn(8)]


def get_reference_output(x, weight):
    return x * weight
