"""An fp32 rms_norm of a few hundred microseconds (256 x 4096): big enough that a
C++ kernel's own time, not the call overhead, is what is timed
(scripts/bench_harness_precision.py --mode slower). The reference, the baseline
op and BYTES are rms_norm_small.py's, loaded from beside this file."""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("_rms_norm_small", Path(__file__).with_name("rms_norm_small.py"))
_small = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_small)

EPS = _small.EPS
get_reference_output = _small.get_reference_output
run_baseline = _small.run_baseline
BYTES = _small.BYTES


def get_inputs():
    x = torch.randn(256, 4096)
    weight = 1.0 + 0.1 * torch.randn(4096)
    return [x, weight, EPS]


def get_correctness_inputs():
    return [[torch.randn(3, 7), torch.randn(7), EPS], [torch.randn(33, 300), torch.randn(300), EPS]]
