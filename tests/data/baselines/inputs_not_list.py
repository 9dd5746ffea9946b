import torch

def get_inputs():
    return torch.randn(4)

def get_reference_output(x):
    return x
