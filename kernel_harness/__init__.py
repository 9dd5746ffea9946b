"""kernel_harness: the loop around writing fast, correct CPU kernels for PyTorch.

Each concept lives in its own module; the CLIs in ``scripts/`` only parse
arguments and print.
"""

__version__ = "0.1.0"
