"""Honest kernel for baselines/model_form.py: softmax(0.5 * x) written out by hand."""

import torch


def softmax(x):
    y = x * 0.5
    e = torch.exp(y - y.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)
