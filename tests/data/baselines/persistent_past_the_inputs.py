"""A baseline whose PERSISTENT_INPUTS counts from 1: position 2 is past its two inputs."""

import torch

PERSISTENT_INPUTS = (2,)


def get_inputs():
    return [torch.randn(4, 8), torch.randn(8)]


def get_reference_output(x, weight):
    return x * weight
