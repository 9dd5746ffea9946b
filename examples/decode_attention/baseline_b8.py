"""decode_attention at B = 8 (bf16, H = H_kv = 32, S = 2048, D = 128); same semantics as baseline.py.

The second headline of the README's table; correctness inputs are those of baseline.py.
"""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("_decode_attention_baseline", Path(__file__).with_name("baseline.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

HEADLINE = (8, 32, 32, 2048, 128)  # batch, heads, kv heads, keys, head dim
get_correctness_inputs = _base.get_correctness_inputs
get_reference_output = _base.get_reference_output
run_baseline = _base.run_baseline
FLOPS = _base.FLOPS
BYTES = _base.BYTES
PERSISTENT_INPUTS = _base.PERSISTENT_INPUTS


def get_inputs() -> list:
    return _base._case(*HEADLINE, torch.bfloat16)
