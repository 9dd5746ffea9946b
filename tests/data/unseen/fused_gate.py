"""Four tensors, an int index tensor of fixed dtype and a bool scalar."""
import torch


def get_inputs():
    N, D = 64, 96
    return [torch.randn(N, D), torch.randn(D), torch.randn(D), torch.randint(0, 4, (N,)), True]


def get_correctness_inputs():
    return [[torch.randn(3, 10), torch.randn(10), torch.randn(10), torch.randint(0, 4, (3,)), False]]


def get_reference_output(x, w_up, w_gate, expert, use_gate):
    y = x * w_up
    if use_gate:
        y = y * torch.sigmoid(x * w_gate)
    return y * (expert[:, None] + 1).to(x.dtype)
