"""Malformed: get_inputs() ignores the seeded generators."""

import os

import torch


def get_inputs():
    return [torch.frombuffer(bytearray(os.urandom(64)), dtype=torch.float32).clone()]


def get_reference_output(x):
    return x * 2
