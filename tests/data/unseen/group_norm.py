"""Three tensors plus an int and a float scalar (group norm)."""
import torch


def get_inputs():
    return [torch.randn(4, 32, 16), torch.randn(32), torch.randn(32), 8, 1e-5]


def get_correctness_inputs():
    return [[torch.randn(3, 12, 7), torch.randn(12), torch.randn(12), 4, 1e-6]]


def get_reference_output(x, weight, bias, num_groups, eps=1e-5):
    return torch.nn.functional.group_norm(x, num_groups, weight, bias, eps)
