"""linear_int8 at M = 16 (batched decode / a short prefill): bf16, N = K = 4096.

Same semantics and correctness cases as baseline.py (loaded by path: the
benchmark imports baseline files by path, not as a package).
"""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("_linear_int8_baseline", Path(__file__).with_name("baseline.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

HEADLINE_M = 16
get_correctness_inputs = _base.get_correctness_inputs
get_reference_output = _base.get_reference_output
run_baseline = _base.run_baseline
FLOPS = _base.FLOPS
BYTES = _base.BYTES
PERSISTENT_INPUTS = _base.PERSISTENT_INPUTS


def get_inputs() -> list:
    return _base.make_inputs((HEADLINE_M, _base.K), _base.N, False, torch.bfloat16)
