"""scripts/new_kernel.py and kernel_harness.scaffold: what a generated project contains.

Fast tests (no compiler) check the files, build.toml and the refusal to
overwrite; the slow one builds an unknown-op skeleton to prove it compiles,
loads, and fails at run time with the KERNEL_TODO message.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from fixtures_kernels import edited_unit
from kernel_harness.errors import UsageError
from kernel_harness.scaffold import CATALOGUE, ScaffoldOptions, generate_project, plan_project
from kernel_harness.validate import validate_kernel
from kernel_harness.validate.isa import compiled_code

ALL_OPS = tuple(CATALOGUE)
#: The element-wise and reduction ops (their AVX512 unit is built without AMX flags).
ROWWISE_OPS = tuple(op for op, spec in CATALOGUE.items() if spec.kind in ("elementwise", "reduction"))


def make(tmp_path: Path, ops=("rms_norm",), name="my_kernel", **kw) -> Path:
    directory = tmp_path / "kernel"
    generate_project(ScaffoldOptions(ops=tuple(ops), name=name, directory=directory, **kw))
    return directory


def kernel_sections(build: dict) -> dict[str, dict]:
    return build["kernel"]


def test_layout_follows_kernel_builder_conventions(tmp_path):
    d = make(tmp_path, ALL_OPS)
    expected = [
        "build.toml",
        "torch-ext/torch_binding.cpp",
        "torch-ext/torch_binding.h",
        "torch-ext/my_kernel/__init__.py",
        "my_kernel_cpu/cpu_features.hpp",
        "my_kernel_cpu/my_kernel_cpu.cpp",
        "my_kernel_cpu/my_kernel_cpu_torch.cpp",
        "my_kernel_cpu/my_kernel_avx512.cpp",
        "my_kernel_cpu/my_kernel_avx2.cpp",
    ]
    for rel in expected:
        assert (d / rel).is_file(), rel
    every_cpp = {str(p.relative_to(d)) for p in d.rglob("*.cpp")}
    build = tomllib.loads((d / "build.toml").read_text())
    listed = {src for sec in kernel_sections(build).values() for src in sec["src"]} | set(build["torch"]["src"])
    assert every_cpp <= listed, "every .cpp must be in some build.toml section"
    assert all((d / src).is_file() for src in listed), "every listed source must exist"


def test_build_toml_schema_and_flags(tmp_path):
    d = make(tmp_path, ROWWISE_OPS)
    build = tomllib.loads((d / "build.toml").read_text())
    general = build["general"]
    # kernel-builder's spelling (dashes); the Python package keeps underscores.
    assert general["name"] == "my-kernel" and general["backends"] == ["cpu"]
    assert (d / "torch-ext" / "my_kernel" / "__init__.py").is_file()
    assert {"version", "license", "edition"} <= set(general)
    assert build["torch"]["src"] == ["torch-ext/torch_binding.cpp", "torch-ext/torch_binding.h"]
    sections = kernel_sections(build)
    assert set(sections) == {"my_kernel_cpu", "my_kernel_cpu_avx2", "my_kernel_cpu_avx512"}
    for sec in sections.values():
        assert sec["backend"] == "cpu" and sec["depends"] == ["torch"] and sec["include"] == ["my_kernel_cpu"]
    avx512 = sections["my_kernel_cpu_avx512"]["cxx-flags"]
    assert {"-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-fopenmp"} <= set(avx512)
    # nothing a Skylake-SP / Ice Lake lacks: the compiler could emit it anywhere in the unit
    assert not {"-mavx512bf16", "-mavx512vbmi", "-mavx512fp16"} & set(avx512)
    assert not any(flag.startswith("-mamx") for flag in avx512), "element-wise kernels need no AMX"
    assert {"-mavx2", "-mfma", "-mf16c", "-fopenmp"} <= set(sections["my_kernel_cpu_avx2"]["cxx-flags"])
    assert not any("avx512" in f for f in sections["my_kernel_cpu_avx2"]["cxx-flags"])


def test_build_toml_passes_the_shared_schema_checker(tmp_path):
    buildtoml = pytest.importorskip("kernel_harness.buildtoml")
    d = make(tmp_path, ALL_OPS)
    parsed, problems = buildtoml.check_build_toml(d / "build.toml")
    assert parsed is not None and problems == []


def test_gemm_kind_adds_amx_flags_only(tmp_path):
    """AMX intrinsics are volatile asm behind cpu_features().amx(); VBMI (which a Skylake-SP lacks) is not
    enabled, so the compiler cannot put a byte permute into a unit that runs there."""
    d = make(tmp_path, ("my_gemm",), kind="gemm")
    flags = tomllib.loads((d / "build.toml").read_text())["kernel"]["my_kernel_cpu_avx512"]["cxx-flags"]
    assert {"-mavx512dq", "-mavx512bw", "-mamx-tile", "-mamx-bf16", "-mamx-int8", "-fopenmp"} <= set(flags)
    assert not {"-mavx512vbmi", "-mavx512bf16"} & set(flags)


def test_tier_units_include_no_torch_headers(tmp_path):
    d = make(tmp_path, ALL_OPS)
    for tier in ("avx2", "avx512"):
        text = (d / f"my_kernel_cpu/my_kernel_{tier}.cpp").read_text()
        includes = re.findall(r'#include\s+[<"]([^>"]+)[>"]', text)
        assert not [i for i in includes if i.startswith(("torch", "ATen", "c10"))], includes
        # ...nor indirectly through the shared raw-pointer header
        tiers_hpp = (d / "my_kernel_cpu/my_kernel_tiers.hpp").read_text()
        assert "torch" not in "".join(re.findall(r"#include[^\n]*", tiers_hpp))
    # what the AVX2 unit compiles holds no AVX512 (linear's AMX path sits under
    # `#if defined(__AMX_TILE__) ...`, which its flags leave out)
    avx2_flags = tomllib.loads((d / "build.toml").read_text())["kernel"]["my_kernel_cpu_avx2"]["cxx-flags"]
    assert "_mm512_" not in compiled_code((d / "my_kernel_cpu/my_kernel_avx2.cpp").read_text(), avx2_flags)


def test_shared_simd_sections_are_pasted_once_into_each_unit(tmp_path):
    """cpu/simd_shared.inc holds vocabulary whose text is the same in both units:
    every section has a placeholder in both unit templates, every placeholder a
    section, and each generated unit holds the section's text exactly once."""
    from kernel_harness.scaffold.project import TEMPLATES_DIR, shared_simd_values

    shared = shared_simd_values(TEMPLATES_DIR / "project")
    assert {"simd_lookup", "simd_pairs"} <= set(shared)
    d = make(tmp_path, ALL_OPS)
    for tier in ("avx2", "avx512"):
        template = (TEMPLATES_DIR / "project" / f"cpu/{tier}.cpp.in").read_text()
        assert set(re.findall(r"\$\{(simd_\w+)\}", template)) == set(shared), tier
        unit = (d / f"my_kernel_cpu/my_kernel_{tier}.cpp").read_text()
        for key, text in shared.items():
            assert unit.count(text) == 1, (tier, key)
        assert "lookup_times_row(" in unit and "${" not in unit


def test_shared_simd_file_rejects_code_before_its_first_section(tmp_path):
    from kernel_harness.scaffold.project import shared_simd_values

    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (cpu / "simd_shared.inc").write_text("// what this file is\n//@@ one\nint a;\n")
    assert shared_simd_values(tmp_path) == {"simd_one": "int a;"}
    (cpu / "simd_shared.inc").write_text("int stray;\n//@@ one\nint a;\n")
    with pytest.raises(UsageError, match="before the first"):
        shared_simd_values(tmp_path)


def test_cpu_features_checks_os_support_and_amx_permission(tmp_path):
    text = (make(tmp_path) / "my_kernel_cpu/cpu_features.hpp").read_text()
    assert "namespace my_kernel_cpu" in text
    for needle in ("xgetbv", "__cpuid_count", "avx512bf16", "kArchReqXcompPerm", "kXfeatureXtiledata = 18", "static const CpuFeatures"):
        assert needle in text, needle


def test_dispatcher_reads_the_knob_per_call_and_has_a_threshold(tmp_path):
    text = (make(tmp_path) / "my_kernel_cpu/my_kernel_cpu.cpp").read_text()
    pick = text[text.index("Tier pick_tier("):]
    assert 'std::getenv("KERNEL_CPU_ISA")' in pick.split("\n}\n")[0], "the knob must be read inside pick_tier"
    assert "generic_threshold(op)" in pick
    assert "KERNEL_CPU_MASK" in text



def test_an_ops_library_rule_reaches_the_dispatcher(tmp_path):
    """linear's catalogue entry hands fp32 from 32 rows to the generic tier (MKL); the
    rule is generated into library_wins, and the bridge passes the dtype."""
    d = make(tmp_path, ["linear", "rms_norm"])
    text = (d / "my_kernel_cpu/my_kernel_cpu.cpp").read_text()
    assert ('if (op == "linear" && dt == DType::F32 && rows >= 32 && rows * cols >= 32768 && mkl_is_fast()) '
            'return true;') in text
    assert "library_wins(op, dt, rows, cols)" in text
    bridge = "".join(p.read_text() for p in (d / "my_kernel_cpu").glob("*.cpp"))
    assert 'pick_tier("linear", m, k, my_kernel_cpu::dtype_of(x))' in bridge
    assert 'pick_tier("rms_norm", rows, cols)' in bridge  # other ops decide by size alone


def test_catalogue_ops_are_complete_and_unknown_ops_are_marked(tmp_path):
    complete = make(tmp_path / "a", ALL_OPS)
    for path in complete.rglob("*.cpp"):
        assert "KERNEL_TODO(" not in path.read_text(), path
    skeleton = make(tmp_path / "b", ("fancy_op",))
    todo_files = {p.name for p in skeleton.rglob("*.cpp") if "KERNEL_TODO(" in p.read_text()}
    assert todo_files == {"my_kernel_avx512.cpp", "my_kernel_avx2.cpp", "my_kernel_cpu.cpp"}
    init = (skeleton / "torch-ext/my_kernel/__init__.py").read_text()
    assert "def fancy_op(x" in init and "def available_tiers" in init and "def dispatch_tier" in init
    binding = (skeleton / "torch-ext/torch_binding.cpp").read_text()
    assert 'ops.def("fancy_op(Tensor x) -> Tensor")' in binding


def test_several_ops_in_one_package(tmp_path):
    d = make(tmp_path, ("rms_norm", "softmax", "my_extra"))
    init = (d / "torch-ext/my_kernel/__init__.py").read_text()
    for fn in ("def rms_norm(", "def softmax(", "def my_extra("):
        assert fn in init
    compile(init, "__init__.py", "exec")  # valid Python
    binding = (d / "torch-ext/torch_binding.cpp").read_text()
    assert "TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops)" in binding and "REGISTER_EXTENSION(TORCH_EXTENSION_NAME)" in binding
    assert binding.count("c10::kCPU") == 6  # op and op_out for each of the three


def test_tiers_and_dtypes_options(tmp_path):
    d = make(tmp_path, ("rms_norm",), tiers=("generic", "avx512"), dtypes=("fp32", "bf16"))
    assert not (d / "my_kernel_cpu/my_kernel_avx2.cpp").exists()
    build = tomllib.loads((d / "build.toml").read_text())
    assert set(build["kernel"]) == {"my_kernel_cpu", "my_kernel_cpu_avx512"}
    assert "#define KERNEL_HAVE_AVX2 0" in (d / "my_kernel_cpu/my_kernel_tiers.hpp").read_text()
    bridge = (d / "my_kernel_cpu/my_kernel_cpu_torch.cpp").read_text()
    assert "at::kFloat" in bridge and "at::kBFloat16" in bridge and "at::kHalf" not in bridge


def test_refuses_to_overwrite_without_force(tmp_path):
    d = make(tmp_path)
    unit = d / "my_kernel_cpu/my_kernel_avx512.cpp"
    unit.write_text("// the agent's work\n")
    with pytest.raises(UsageError, match="--force"):
        generate_project(ScaffoldOptions(ops=("rms_norm",), name="my_kernel", directory=d))
    assert unit.read_text() == "// the agent's work\n"
    generate_project(ScaffoldOptions(ops=("rms_norm",), name="my_kernel", directory=d, force=True))
    assert "rms_norm_rows" in unit.read_text()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "My-Kernel"}, "--name"),
        ({"name": "class"}, "--name"),
        ({"ops": ("bad op",)}, "op name"),
        ({"ops": ()}, "at least one op"),
        ({"ops": ("rms_norm", "rms_norm")}, "twice"),
        ({"kind": "convolution"}, "--kind"),
        ({"dtypes": ("fp8",)}, "--dtypes"),
        ({"tiers": ("avx2", "avx512")}, "must include generic"),
        ({"tiers": ("generic", "neon")}, "--tiers"),
    ],
)
def test_bad_options_are_usage_errors(tmp_path, kwargs, message):
    options = {"ops": ("rms_norm",), "name": "my_kernel", "directory": tmp_path / "k", **kwargs}
    with pytest.raises(UsageError, match=message):
        plan_project(ScaffoldOptions(**options))
    assert not (tmp_path / "k").exists()


def test_cli_writes_the_project_and_json(script, tmp_path):
    run = script("new_kernel", "--op", "rms_norm,silu_and_mul", "--name", "cli_kernel", "--json", "out.json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "kernel/build.toml").is_file()  # default --dir kernel/
    report = json.loads((tmp_path / "out.json").read_text())
    assert [op["name"] for op in report["ops"]] == ["rms_norm", "silu_and_mul"]
    assert report["unfinished_ops"] == [] and "build.toml" in report["files"]
    again = script("new_kernel", "--op", "rms_norm", "--name", "cli_kernel", cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr
    forced = script("new_kernel", "--op", "rms_norm", "--name", "cli_kernel", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr


def test_cli_reports_a_bad_name_without_traceback(script, tmp_path):
    run = script("new_kernel", "--op", "rms_norm", "--name", "9lives", cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "--name" in run.stderr


@pytest.mark.slow
def test_unknown_op_skeleton_builds_and_reports_todo_at_run_time(script, tmp_path):
    from kernel_harness.config import load_config
    import subprocess
    import sys

    if not (Path(__file__).resolve().parent.parent / "scripts/build_kernel.py").is_file():
        pytest.skip("scripts/build_kernel.py does not exist yet")
    d = make(tmp_path, ("fancy_op",), name="skeleton_kernel", tiers=("generic", "avx512"))
    build = subprocess.run(load_config().build_command, shell=True, cwd=d, capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stdout + build.stderr
    check = (
        "import os, sys, torch, kernels; from pathlib import Path\n"
        f"k = kernels.get_local_kernel(Path({str(d)!r}))\n"
        "for tier in k.available_tiers():\n"
        "    os.environ['KERNEL_CPU_ISA'] = tier\n"
        "    try:\n"
        "        k.fancy_op(torch.randn(4, 40))\n"
        "    except RuntimeError as e:\n"
        "        assert 'fancy_op ' + tier + ' compute body' in str(e) and 'KERNEL_TODO at ' in str(e), str(e)\n"
        "    else:\n"
        "        sys.exit('no KERNEL_TODO error in tier ' + tier)\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr
    validate = script("validate_cpu_kernel", d, "--json", tmp_path / "v.json", cwd=tmp_path)
    assert validate.returncode == 1 and "KERNEL_TODO" in validate.stdout + validate.stderr
    codes = {e["code"] for e in json.loads((tmp_path / "v.json").read_text())["errors"]}
    assert codes == {"unfinished-body"}, codes


def test_avx512_unit_exposes_one_define_per_tuning_knob(tmp_path):
    """The demo's trials change exactly one '#define NAME value' line of the AVX512 unit."""
    d = make(tmp_path, ("rms_norm", "silu_and_mul", "softmax", "layer_norm", "add_rms_norm", "gelu_and_mul"))
    text = (d / "my_kernel_cpu/my_kernel_avx512.cpp").read_text()
    for knob in (
        "RMS_NORM_FAST_SUMSQ", "RMS_NORM_ACCUMULATORS", "RMS_NORM_UNROLL", "RMS_NORM_PREFETCH_ROWS",
        "RMS_NORM_STREAM_STORES", "RMS_NORM_PARALLEL_MIN_ELEMENTS", "SILU_AND_MUL_UNROLL",
        "SILU_AND_MUL_STREAM_STORES", "SILU_AND_MUL_TABLE", "SILU_AND_MUL_PARALLEL_MIN_ELEMENTS",
        "SOFTMAX_PARALLEL_MIN_ELEMENTS", "RMS_NORM_PREFETCH_OUT_BYTES", "SOFTMAX_PREFETCH_OUT_BYTES",
        "RMS_NORM_PREFETCH_NEXT_BYTES", "SOFTMAX_PREFETCH_NEXT_BYTES", "LAYER_NORM_STREAM_STORES",
        "ADD_RMS_NORM_STREAM_STORES", "GELU_AND_MUL_UNROLL", "GELU_AND_MUL_FP32_FAST", "GELU_AND_MUL_TABLE",
        "LAYER_NORM_EXACT_ROUNDING",
    ):
        assert len(re.findall(rf"^#define {knob} \d+$", text, re.MULTILINE)) == 1, knob


def test_generated_catalogue_validates_clean(script, tmp_path):
    if not (Path(__file__).resolve().parent.parent / "scripts/validate_cpu_kernel.py").is_file():
        pytest.skip("scripts/validate_cpu_kernel.py does not exist yet")
    d = make(tmp_path, ALL_OPS)
    run = script("validate_cpu_kernel", d, "--json", tmp_path / "v.json", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "v.json").read_text())
    assert report["ok"] is True and report["errors"] == []


KNOB_VARIANT = {
    "RMS_NORM_FAST_SUMSQ": "0",
    "RMS_NORM_ACCUMULATORS": "1",
    "RMS_NORM_UNROLL": "2",
    "RMS_NORM_PREFETCH_ROWS": "0",
    "RMS_NORM_STREAM_STORES": "1",
    "RMS_NORM_PARALLEL_MIN_ELEMENTS": "64",
    "SILU_AND_MUL_UNROLL": "2",
    "GELU_AND_MUL_UNROLL": "1",
    "GELU_AND_MUL_FP32_FAST": "0",
    "GELU_AND_MUL_TABLE": "0",
    "SILU_AND_MUL_STREAM_STORES": "1",
    "SILU_AND_MUL_TABLE": "0",
    "SILU_AND_MUL_PARALLEL_MIN_ELEMENTS": "64",
    "SOFTMAX_PARALLEL_MIN_ELEMENTS": "64",
    "RMS_NORM_PREFETCH_OUT_BYTES": "64",
    "SOFTMAX_PREFETCH_OUT_BYTES": "64",
    "RMS_NORM_PREFETCH_NEXT_BYTES": "4096",
    "SOFTMAX_PREFETCH_NEXT_BYTES": "4096",
    "LAYER_NORM_PIPELINE": "0",
    "LAYER_NORM_STREAM_STORES": "1",
    "ADD_RMS_NORM_STREAM_STORES": "1",
    "LAYER_NORM_PREFETCH_OUT_BYTES": "0",
    "LAYER_NORM_PREFETCH_NEXT_BYTES": "4096",
    "LAYER_NORM_EXACT_ROUNDING": "0",
}


def build_knob_variant(tmp_path: Path, ops: tuple[str, ...], knobs: dict[str, str]) -> Path:
    """Generate ``ops`` as knob_kernel with ``knobs`` set in both SIMD units, and build it."""
    import subprocess

    from kernel_harness.config import load_config

    if not (Path(__file__).resolve().parent.parent / "scripts/build_kernel.py").is_file():
        pytest.skip("scripts/build_kernel.py does not exist yet")
    d = make(tmp_path, ops, name="knob_kernel")
    for path in sorted((d / "knob_kernel_cpu").glob("knob_kernel_avx*.cpp")):
        path.write_text(edited_unit(path.read_text(), knobs, {}))
    build = subprocess.run(load_config().build_command, shell=True, cwd=d, capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stdout + build.stderr
    return d


def run_check(d: Path, body: str) -> None:
    """Run ``body`` in a fresh interpreter with the built kernel as ``k`` (one op namespace per process)."""
    import subprocess
    import sys

    check = (
        "import os, torch, torch.nn.functional as F, kernels; from pathlib import Path\n"
        f"k = kernels.get_local_kernel(Path({str(d)!r}))\n"
        "torch.manual_seed(0)\n" + body + "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr


RMS_NORM_REFERENCE = (
    "            x = torch.randn(rows, cols).to(dt); w = (1 + 0.1 * torch.randn(cols)).to(dt)\n"
    "            xd = x.double(); ref = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()).to(dt)\n"
    "            got = k.rms_norm(x, w, 1e-6)\n"
)


@pytest.mark.slow
def test_every_tuning_knob_setting_stays_correct(tmp_path):
    """The demo flips these knobs; the non-default settings must stay exact too."""
    d = build_knob_variant(tmp_path, ("rms_norm", "silu_and_mul", "softmax", "layer_norm", "add_rms_norm",
                                      "gelu_and_mul"), KNOB_VARIANT)
    run_check(d, (
        "for tier in k.available_tiers():\n"
        "    os.environ['KERNEL_CPU_ISA'] = tier\n"
        "    for dt in (torch.float32, torch.bfloat16, torch.float16):\n"
        "        for rows, cols in ((1, 7), (33, 4096 + 13), (64, 4096)):\n"
        + RMS_NORM_REFERENCE +
        "            if dt != torch.float32: assert torch.equal(got, ref), ('rms_norm', tier, dt, rows, cols)\n"
        "            else: torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)\n"
        "            x2 = (2 * torch.randn(rows, 2 * cols)).to(dt); x2d = x2.double()\n"
        "            ref2 = (F.silu(x2d[..., :cols]) * x2d[..., cols:]).to(dt)\n"
        "            got2 = k.silu_and_mul(x2)\n"
        "            if dt != torch.float32: assert torch.equal(got2, ref2), ('silu', tier, dt, rows, cols)\n"
        "            else: torch.testing.assert_close(got2, ref2, atol=1e-6, rtol=1e-5)\n"
        "            ref6 = (F.gelu(x2d[..., :cols]) * x2d[..., cols:]).to(dt)\n"
        "            got6 = k.gelu_and_mul(x2)\n"
        "            if dt != torch.float32: assert torch.equal(got6, ref6), ('gelu', tier, dt, rows, cols)\n"
        "            else: torch.testing.assert_close(got6, ref6, atol=1e-6, rtol=1e-5)\n"
        "            x3 = (3 * torch.randn(rows, cols)).to(dt)\n"
        "            torch.testing.assert_close(k.softmax(x3).double(), torch.softmax(x3.double(), -1), atol=1e-6,\n"
        "                                       rtol=torch.finfo(dt).eps if dt != torch.float32 else 1e-5)\n"
        "            b = torch.randn(cols).to(dt)\n"
        "            ref4 = F.layer_norm(x3.double(), (cols,), w.double(), b.double(), 1e-5)\n"
        "            tol = 1e-5 if dt == torch.float32 else torch.finfo(dt).eps\n"
        "            torch.testing.assert_close(k.layer_norm(x3, w, b, 1e-5).double(), ref4, atol=tol, rtol=tol)\n"
        "            h = x.double() + x3.double()\n"
        "            y5, h5 = k.add_rms_norm(x, x3, w, 1e-6)\n"
        "            assert torch.equal(h5, h.to(dt)), ('add_rms_norm residual', tier, dt, rows, cols)\n"
        "            ref5 = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()).to(dt)\n"
        "            if dt != torch.float32: assert torch.equal(y5, ref5), ('add_rms_norm', tier, dt, rows, cols)\n"
        "            else: torch.testing.assert_close(y5, ref5, atol=1e-6, rtol=1e-5)\n"
    ))


@pytest.mark.slow
def test_rms_norm_without_exact_rounding_is_faithful(tmp_path):
    """RMS_NORM_EXACT_ROUNDING 0 drops the tie screen: every bf16/fp16 output within one ulp of the
    correctly rounded one, the differences rare (lanes near a rounding tie), and some present — the
    knob must change what it says it changes."""
    d = build_knob_variant(tmp_path, ("rms_norm",), {"RMS_NORM_EXACT_ROUNDING": "0"})
    run_check(d, (
        "def ordered(t):\n"
        "    b = t.view(torch.int16).int()\n"
        "    return torch.where(b < 0, -(b & 0x7FFF), b)\n"
        "for tier in [t for t in k.available_tiers() if t != 'generic']:\n"
        "    os.environ['KERNEL_CPU_ISA'] = tier\n"
        "    for dt in (torch.bfloat16, torch.float16):\n"
        "        off = 0\n"
        "        for rows, cols in ((1, 7), (33, 4096 + 13), (512, 4096)):\n"
        + RMS_NORM_REFERENCE +
        "            ulps = (ordered(got) - ordered(ref)).abs()\n"
        "            assert ulps.max() <= 1 and (ulps > 0).float().mean() < 1e-3, ('rms_norm', tier, dt, rows, cols)\n"
        "            off += int((ulps > 0).sum())\n"
        "        assert off > 0, ('no lane differs: the knob did not drop the screen', tier, dt)\n"
    ))


def test_ops_with_a_layer_section_get_kernelize_layers(tmp_path):
    """kernels.kernelize finds layers as <kernel>.layers: stateless classes, imported by __init__."""
    d = make(tmp_path, ("rms_norm", "silu_and_mul", "softmax"))
    layers = (d / "torch-ext/my_kernel/layers.py").read_text()
    assert "class RMSNorm(torch.nn.Module):" in layers and "class SiluAndMul(torch.nn.Module):" in layers
    assert "def __init__" not in layers and "from . import rms_norm, silu_and_mul" in layers
    assert "from . import layers" in (d / "torch-ext/my_kernel/__init__.py").read_text()
    compile(layers, "layers.py", "exec")

    only_softmax = make(tmp_path / "s", ("softmax",))
    assert not (only_softmax / "torch-ext/my_kernel/layers.py").exists()
    assert "layers" not in (only_softmax / "torch-ext/my_kernel/__init__.py").read_text()


def test_scaffolded_project_validates_without_warnings(tmp_path):
    # An agent's first validate run must be clean: a warning on generated code
    # (such as kernel-builder's name rule) would teach it to ignore warnings.
    report = validate_kernel(make(tmp_path, ALL_OPS))
    assert report.errors == [] and report.warnings == [], report.as_dict()
