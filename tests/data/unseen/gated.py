"""A Model class: forward(x, gate) -> x * sigmoid(gate)."""
import torch


class Model(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, gate):
        return x * torch.sigmoid(gate) * self.scale


def get_init_inputs():
    return [2.0]


def get_inputs():
    return [torch.randn(32, 512), torch.randn(32, 512)]
