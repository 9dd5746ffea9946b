import torch

def get_reference_output(x):
    return x
