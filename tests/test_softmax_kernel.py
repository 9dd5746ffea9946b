"""The softmax template is exact: every knob setting, tier and dtype gives the float64 reference.

The reference (examples/softmax/baseline.py) is ``torch.softmax(x.double())``
rounded to the input dtype, and the benchmark's default rule for bf16/fp16 is
that rounding exactly. These tests build a softmax-only kernel once per
module, then one copy per knob variant (its ``#define SOFTMAX_*`` lines
rewritten, as a tuning trial would), and check each build in a fresh
subprocess (two builds of one package cannot share a Python process).
Every knob value appears in at least one variant.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures_kernels import edited_unit
from kernel_harness.config import load_config
from kernel_harness.cpu import has_isa
from kernel_harness.scaffold import ScaffoldOptions, plan_project, write_project

pytestmark = pytest.mark.slow

PACKAGE = "softmax_exact"
BUILD_TIMEOUT_S = 30 * 60

# Default knob values, read back from the rendered source (so the test follows the template).
KNOBS = (
    "SOFTMAX_MAX_ACCUMULATORS",
    "SOFTMAX_UNROLL",
    "SOFTMAX_STREAM_STORES",
    "SOFTMAX_PREFETCH_ROWS",
    "SOFTMAX_EXP_TABLE",
    "SOFTMAX_FP32_EXACT",
    "SOFTMAX_PARALLEL_MIN_ELEMENTS",
)
# Non-default values, grouped so that four builds cover every setting
# (PARALLEL_MIN_ELEMENTS=1 threads even the 33-row cases).
VARIANTS = {
    "defaults": {},
    "alternates": {
        "SOFTMAX_MAX_ACCUMULATORS": "1",
        "SOFTMAX_UNROLL": "1",
        "SOFTMAX_STREAM_STORES": "1",
        "SOFTMAX_PREFETCH_ROWS": "2",
        "SOFTMAX_PARALLEL_MIN_ELEMENTS": "1",
        "SOFTMAX_EXP_TABLE": "0",
        "SOFTMAX_FP32_EXACT": "1",
    },
    "unroll4": {"SOFTMAX_UNROLL": "4", "SOFTMAX_STREAM_STORES": "1", "SOFTMAX_EXP_TABLE": "2"},
    "regather": {"SOFTMAX_EXP_TABLE": "3", "SOFTMAX_MAX_ACCUMULATORS": "1"},
}

# Runs in a subprocess: loads the kernel at argv[1] and prints one JSON list of failures.
CHECK_SCRIPT = r"""
import json, os, sys
from pathlib import Path
import torch
import kernels

tiers = sys.argv[2].split(",")
fp32_exact = sys.argv[3] == "1"
m = kernels.get_local_kernel(Path(sys.argv[1]))
failures = []
for tier in tiers:
    os.environ["KERNEL_CPU_ISA"] = tier
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for seed in range(2):
            for rows in (1, 33):
                for cols in (1, 7, 4096, 4197):  # 4197: whole blocks, blocks of 2 * W, lanes
                    for scale in (3.0, 30.0):
                        g = torch.Generator().manual_seed(seed * 1000 + rows * 7 + cols)
                        x = (scale * torch.randn(rows, cols, generator=g)).to(dtype)
                        if cols > 2:
                            x[0, 1] = float("-inf")  # exp(-inf) = 0 must not disturb the row
                        ref = torch.softmax(x.double(), dim=-1).to(dtype)
                        y = m.softmax(x)
                        out = torch.full_like(x, float("nan"))
                        m.softmax(x, out=out)
                        for name, got in (("softmax", y), ("softmax(out=)", out)):
                            if dtype == torch.float32 and not fp32_exact:
                                # The fp32 fast path computes x - max in fp32 (as torch does): its
                                # relative error is ~|x - max| * 2^-24 plus ~1e-7, so ~1e-6 for the
                                # baseline's 3*randn rows; the benchmark allows 1e-6 + 1e-5 * |r|.
                                rtol = 2e-6 if scale == 3.0 else 1e-5
                                bad = (got.double() - ref.double()).abs() > rtol * ref.double().abs() + 1e-40
                            elif dtype == torch.float32:
                                # Correctly rounded up to a ~2^-40 relative error before
                                # rounding: allow the neighbouring float, nothing more.
                                up = torch.nextafter(ref, torch.full_like(ref, float("inf")))
                                down = torch.nextafter(ref, torch.full_like(ref, float("-inf")))
                                bad = ~((got == ref) | (got == up) | (got == down))
                            else:
                                bad = got != ref
                            n = int(bad.sum())
                            if n:
                                idx = bad.nonzero()[0].tolist()
                                failures.append(
                                    f"{name} tier={tier} dtype={dtype} rows={rows} cols={cols} scale={scale} "
                                    f"seed={seed}: {n} elements differ, first at {idx}: "
                                    f"got {float(got[tuple(idx)])!r}, want {float(ref[tuple(idx)])!r}"
                                )
    # Rows outside the exp table's safe range (the kernel falls back to its
    # polynomial), and a NaN row (all NaN, like the reference).
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        g = torch.Generator().manual_seed(7)
        base = 3.0 * torch.randn(4, 300, generator=g)
        x = torch.cat([base + 650.0, base - 650.0, base + 705.0, base]).to(dtype)
        x[-1, 5] = float("nan")
        ref = torch.softmax(x.double(), dim=-1).to(dtype)
        got = m.softmax(x)
        if dtype == torch.float32:
            same = torch.isclose(got.double(), ref.double(), rtol=1e-5, atol=1e-30, equal_nan=True)
        else:
            same = (got == ref) | (got.isnan() & ref.isnan())
        if not bool(same.all()):
            failures.append(f"extreme rows tier={tier} dtype={dtype}: {int((~same).sum())} elements differ")
    # Masked rows: a -inf stretch of whole vectors (the AVX2 fp32 exp returns
    # 0 for a vector at or below -104 without computing it), a ramp through
    # the underflow range [-104, -87] (denormal outputs), and a row in the
    # cheap exp's range [-87, 0] but for one NaN (its sum must notice).
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        g = torch.Generator().manual_seed(13)
        x = 3.0 * torch.randn(4, 4109, generator=g)
        x[0, 2000:] = float("-inf")
        x[1, :] = torch.linspace(-110.0, 0.0, 4109)
        x[2, 1:64] = -104.5
        x[3, 4100] = float("nan")
        x = x.to(dtype)
        ref = torch.softmax(x.double(), dim=-1).to(dtype)
        got = m.softmax(x)
        if dtype == torch.float32 and not fp32_exact:
            # Denormal outputs: two roundings to the denormal grid (e, then e / sum).
            same = (got.double() - ref.double()).abs() <= 1e-5 * ref.double().abs() + 3e-45
        elif dtype == torch.float32:
            same = (got - ref).abs() <= (torch.nextafter(ref, torch.full_like(ref, float("inf"))) - ref).abs()
        else:
            same = got == ref
        same = same | (got.isnan() & ref.isnan())
        if not bool(same.all()):
            bad_rows = sorted({int(i) for i in (~same).nonzero()[:, 0].tolist()})
            failures.append(f"masked rows tier={tier} dtype={dtype}: {int((~same).sum())} elements differ "
                            f"in rows {bad_rows}")
    # Many rows: threads take runs of rows (19 rows each at 300 rows and two
    # threads, see row_run), and a bf16 row's last pass prepares the next row
    # of its run; rows that need the double path (NaN, large, all very
    # negative) sit between ordinary ones and at run edges (37 | 38, 299).
    for dtype in (torch.bfloat16, torch.float16):
        g = torch.Generator().manual_seed(11)
        x = 3.0 * torch.randn(300, 4109, generator=g)
        x[37] += 705.0
        x[38, 3] = float("nan")
        x[40, 7] = float("nan")
        x[41] += 705.0
        x[42] -= 650.0
        x[43, ::5] = float("-inf")
        x[299] += 705.0
        x = x.to(dtype)
        ref = torch.softmax(x.double(), dim=-1).to(dtype)
        got = m.softmax(x)
        same = (got == ref) | (got.isnan() & ref.isnan())
        if not bool(same.all()):
            bad_rows = sorted({int(i) for i in (~same).nonzero()[:, 0].tolist()})
            failures.append(f"many rows tier={tier} dtype={dtype}: {int((~same).sum())} elements differ "
                            f"in rows {bad_rows[:10]}")
print(json.dumps(failures))
"""


def _knob(directory: Path, name: str) -> str:
    match = re.search(rf"^#define {name} (\S+)$", _simd_units(directory)[0].read_text(), flags=re.M)
    assert match, f"no #define {name} in {directory}"
    return match.group(1)


def _tiers() -> list[str]:
    return [t for t in ("generic", "avx2", "avx512") if has_isa(t)]


def _build(directory: Path) -> None:
    command = load_config().build_command
    proc = subprocess.run(command, shell=True, cwd=directory, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if proc.returncode != 0:
        output = (proc.stdout + "\n" + proc.stderr).strip()
        pytest.fail(f"building {directory} with `{command}` failed (exit {proc.returncode}):\n{output[-6000:]}",
                    pytrace=False)


def _simd_units(directory: Path) -> list[Path]:
    units = sorted((directory / f"{PACKAGE}_cpu").glob(f"{PACKAGE}_avx*.cpp"))
    assert units, f"no SIMD units under {directory}"
    return units


def _set_knobs(directory: Path, knobs: dict[str, str]) -> None:
    """Rewrite one `#define NAME value` line per knob in every SIMD unit (the trial's one-line edit)."""
    for unit in _simd_units(directory):
        unit.write_text(edited_unit(unit.read_text(), knobs, {}))


@pytest.fixture(scope="module")
def base_kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("softmax") / "defaults"
    write_project(plan_project(ScaffoldOptions(ops=("softmax",), name=PACKAGE, directory=directory, force=True)),
                  force=True)
    _build(directory)
    return directory


def test_every_knob_is_a_one_line_define(base_kernel: Path) -> None:
    for unit in _simd_units(base_kernel):
        text = unit.read_text()
        for name in KNOBS:
            assert len(re.findall(rf"^#define {name} \S+$", text, flags=re.M)) == 1, (unit.name, name)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_softmax_is_correctly_rounded(base_kernel: Path, variant: str) -> None:
    directory = base_kernel
    if VARIANTS[variant]:
        directory = base_kernel.parent / variant
        if directory.exists():
            shutil.rmtree(directory)
        shutil.copytree(base_kernel, directory, ignore=shutil.ignore_patterns("dist"))
        _set_knobs(directory, VARIANTS[variant])
        _build(directory)
    fp32_exact = _knob(directory, "SOFTMAX_FP32_EXACT")
    proc = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, str(directory), ",".join(_tiers()), fp32_exact],
                          capture_output=True, text=True, timeout=20 * 60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failures == [], f"variant {variant} {VARIANTS[variant]}:\n" + "\n".join(failures[:20])
