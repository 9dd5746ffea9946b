"""GEMM baseline for the analysis tests: a bf16 linear layer (Model form, with bias)."""

import torch

M, N, K = 64, 4096, 2048


class Model(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.proj = torch.nn.Linear(in_features, out_features, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def get_init_inputs():
    return [K, N]


def get_inputs():
    return [torch.randn(M, K)]
