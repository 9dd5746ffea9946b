"""Unsupported: a list of tensors of varying length."""
import torch


def get_inputs():
    return [[torch.randn(4, 8) for _ in range(3)]]


def get_correctness_inputs():
    return [[[torch.randn(4, 8) for _ in range(5)]]]


def get_reference_output(tensors):
    return torch.stack(tensors).sum(0)
