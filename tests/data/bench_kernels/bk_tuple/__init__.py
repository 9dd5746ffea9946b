"""Kernels for baselines/tuple_out.py: `add_twice` is right, `add_twice_bad` writes a wrong second output."""

import torch


def add_twice(x, r):
    s = torch.add(x, r)
    return s, s * 2


def add_twice_bad(x, r):
    s = torch.add(x, r)
    return s, s * 3
