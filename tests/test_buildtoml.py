"""build.toml parsing: kernel-builder's edition-5 schema with precise errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_harness.buildtoml import BuildTomlError, check_text, load_build_toml
from kernel_harness.errors import ExitCode, UsageError

GOOD = """\
[general]
name = "my-kernel"
version = 1
license = "apache-2.0"
backends = ["cpu"]
edition = 5
python-depends = ["einops"]

[general.hub]
repo-id = "me/my-kernel"

[torch]
src = ["torch-ext/torch_binding.cpp", "torch-ext/torch_binding.h"]

[kernel.my_kernel_cpu]
backend = "cpu"
depends = ["torch"]
include = ["my_kernel_cpu"]
src = ["my_kernel_cpu/my_kernel_cpu.cpp"]

[kernel.my_kernel_cpu_avx512]
backend = "cpu"
depends = ["torch"]
include = ["my_kernel_cpu"]
src = ["my_kernel_cpu/my_kernel_avx512.cpp"]
cxx-flags = ["-mavx512f", "-mavx512bf16", "-mavx512vl", "-fopenmp"]
"""


def problems(text: str):
    result, found = check_text(text, Path("build.toml"))
    assert result is None, "expected the text to be rejected"
    return found


def test_good_file_parses_into_typed_sections() -> None:
    result, found = check_text(GOOD, Path("/k/build.toml"))
    assert found == []
    assert result is not None
    assert result.general.name == "my-kernel"
    assert result.general.python_name == "my_kernel"
    assert result.general.metadata_name == "my-kernel"
    assert result.general.python_depends == ("einops",)
    assert result.general.hub_repo_id == "me/my-kernel"
    assert result.torch is not None and result.torch.src[0] == "torch-ext/torch_binding.cpp"
    assert [k.key for k in result.cpu_kernels] == ["my_kernel_cpu", "my_kernel_cpu_avx512"]
    avx512 = result.cpu_kernels[1]
    assert avx512.cxx_flags == ("-mavx512f", "-mavx512bf16", "-mavx512vl", "-fopenmp")
    assert avx512.include == ("my_kernel_cpu",)
    assert avx512.line == GOOD.splitlines().index("[kernel.my_kernel_cpu_avx512]") + 1


def test_dashed_name_gives_underscored_python_name() -> None:
    result, _ = check_text(GOOD.replace('name = "my-kernel"', 'name = "relu2d-x"'), Path("b.toml"))
    assert result is not None
    assert result.general.python_name == "relu2d_x"


@pytest.mark.parametrize("name", ["my_kernel", "My Kernel", "a", "kernel-", "2d-relu"])
def test_name_is_checked_by_kernels_data_with_its_own_message(name: str) -> None:
    import kernels_data

    with pytest.raises(ValueError) as refused:
        kernels_data.KernelName(name)
    (problem,) = problems(GOOD.replace('name = "my-kernel"', f'name = "{name}"'))
    assert problem.where == "general.name" and problem.kind == "name"
    assert str(refused.value) in problem.message
    assert problem.line == GOOD.splitlines().index('name = "my-kernel"') + 1
    if name == "my_kernel":  # the fix is spelled out
        assert "name = 'my-kernel'" in problem.message and "'my_kernel'" in problem.message


def test_unknown_key_in_kernel_section_names_key_line_and_known_keys() -> None:
    text = GOOD.replace('cxx-flags = ["-mavx512f"', 'cxxflags = ["-O2"]\ncxx-flags = ["-mavx512f"')
    (problem,) = problems(text)
    assert problem.kind == "unknown-key"
    assert problem.where == "kernel.my_kernel_cpu_avx512.cxxflags"
    assert problem.line == text.splitlines().index('cxxflags = ["-O2"]') + 1
    assert "cxx-flags" in problem.message  # the known keys are listed


def test_unknown_top_level_and_general_keys() -> None:
    text = GOOD.replace("edition = 5", "edition = 5\nauthor = \"me\"") + "\n[cmake]\nx = 1\n"
    kinds = {(p.where, p.kind) for p in problems(text)}
    assert ("general.author", "unknown-key") in kinds
    assert ("cmake", "unknown-key") in kinds


def test_cuda_only_key_in_cpu_section_is_unknown() -> None:
    text = GOOD.replace('src = ["my_kernel_cpu/my_kernel_cpu.cpp"]', 'src = ["my_kernel_cpu/my_kernel_cpu.cpp"]\ncuda-capabilities = ["9.0"]')
    (problem,) = problems(text)
    assert problem.where == "kernel.my_kernel_cpu.cuda-capabilities"
    assert problem.kind == "unknown-key"


def test_missing_required_keys() -> None:
    text = GOOD.replace("edition = 5\n", "").replace('depends = ["torch"]\ninclude = ["my_kernel_cpu"]\nsrc = ["my_kernel_cpu/my_kernel_cpu.cpp"]', 'include = ["my_kernel_cpu"]')
    found = {(p.where, p.kind): p for p in problems(text)}
    assert ("general", "missing-key") in found
    assert "'edition'" in found[("general", "missing-key")].message
    messages = [p.message for p in problems(text) if p.where == "kernel.my_kernel_cpu"]
    assert any("'depends'" in m for m in messages) and any("'src'" in m for m in messages)


def test_missing_backend_in_kernel_section() -> None:
    text = GOOD.replace('[kernel.my_kernel_cpu]\nbackend = "cpu"\n', "[kernel.my_kernel_cpu]\n")
    (problem,) = problems(text)
    assert problem.kind == "missing-key" and "'backend'" in problem.message


def test_wrong_types_are_named() -> None:
    text = GOOD.replace("version = 1", 'version = "1"').replace('backends = ["cpu"]', 'backends = "cpu"')
    found = {p.where: p for p in problems(text)}
    assert found["general.version"].kind == "type"
    assert "must be an integer, found a string '1'" in found["general.version"].message
    assert found["general.backends"].kind == "type"


def test_list_with_non_string_is_a_type_error() -> None:
    text = GOOD.replace('"-mavx512vl", "-fopenmp"]', '"-mavx512vl", 3]')
    (problem,) = problems(text)
    assert problem.where == "kernel.my_kernel_cpu_avx512.cxx-flags" and problem.kind == "type"


def test_values_the_schema_does_not_allow() -> None:
    text = (
        GOOD.replace("edition = 5", "edition = 4")
        .replace('backends = ["cpu"]', 'backends = ["cpu", "tpux"]')
        .replace('depends = ["torch"]\ninclude = ["my_kernel_cpu"]\nsrc = ["my_kernel_cpu/my_kernel_cpu.cpp"]',
                 'depends = ["torch", "eigen"]\ninclude = ["my_kernel_cpu"]\nsrc = ["my_kernel_cpu/my_kernel_cpu.cpp"]')
    )
    messages = " | ".join(p.message for p in problems(text))
    assert "must be 5" in messages
    assert "unknown backend 'tpux'" in messages
    assert "unknown dependency 'eigen'" in messages


def test_kernel_backend_must_be_known() -> None:
    text = GOOD.replace('[kernel.my_kernel_cpu]\nbackend = "cpu"', '[kernel.my_kernel_cpu]\nbackend = "gpu"')
    assert any("unknown backend 'gpu'" in p.message for p in problems(text))


def test_syntax_error_reports_a_line() -> None:
    text = GOOD.replace("[torch]", "[torch")
    (problem,) = problems(text)
    assert problem.kind == "syntax"
    assert problem.line == text.splitlines().index("[torch") + 1


def test_load_raises_usage_error_with_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "build.toml"
    path.write_text(GOOD.replace("version = 1", "version = true").replace("edition = 5", "editon = 5"))
    with pytest.raises(BuildTomlError) as info:
        load_build_toml(path)
    assert info.value.exit_code == ExitCode.BAD_INPUT
    assert "general.version" in info.value.message and "general.editon" in info.value.message
    assert str(path) in info.value.message


def test_load_missing_file_is_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_build_toml(tmp_path / "build.toml")


def test_the_test_kernel_parses() -> None:
    toml = load_build_toml(Path(__file__).parent / "data" / "build_kernels" / "kh_scale" / "build.toml")
    assert toml.general.python_name == "kh_scale"
    assert len(toml.cpu_kernels) == 3


def test_missing_torch_table() -> None:
    text = GOOD.replace('[torch]\nsrc = ["torch-ext/torch_binding.cpp", "torch-ext/torch_binding.h"]\n', "")
    (problem,) = problems(text)
    assert problem.kind == "missing-key" and "[torch]" in problem.message
