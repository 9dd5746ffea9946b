"""An element-wise baseline with a name the table does not know (tests the trace-based verdict)."""

import torch


def get_inputs():
    return [torch.randn(4096, 4096)]


def get_reference_output(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
