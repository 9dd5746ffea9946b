"""The Nix-free build (scripts/build_kernel.py): layout, loading, wheel, incremental, OpenMP, errors.

The tiny test kernel tests/data/build_kernels/kh_scale (out = x * alpha in generic,
AVX2 and AVX512 tiers, plus an op reporting OpenMP's thread count) is built
once per session; tests that mutate sources work on copies, which ccache
(CCACHE_BASEDIR = the kernel dir) turns into cache hits.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from kernel_harness import cpu
from kernel_harness.build import BuildFailed, build_kernel
from kernel_harness.build.toolchain import torch_info

SOURCE = Path(__file__).parent / "data" / "build_kernels" / "kh_scale"
AVX512 = "kh_scale_cpu/kh_scale_avx512.cpp"
STUB = "build/.objs/gen/_extension.c"


def copy_kernel(target: Path) -> Path:
    shutil.copytree(SOURCE, target, ignore=shutil.ignore_patterns("build", "dist", "__pycache__"))
    return target


def run_python(code: str, *, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (op registrations must not leak between tests)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, env=full_env,
    )


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The test kernel built once with the configured build_command, plus its --json report."""
    from kernel_harness.config import load_config

    root = copy_kernel(tmp_path_factory.mktemp("kh_scale_built") / "kh_scale")
    report = tmp_path_factory.mktemp("reports") / "build.json"
    command = f"{load_config().build_command} --json {report}"
    proc = subprocess.run(command, shell=True, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"built _kh_scale_cpu_[0-9a-f]{10} in \d+\.\d s", proc.stdout), proc.stdout
    return root, json.loads(report.read_text())


@pytest.mark.slow
def test_every_unit_starts_its_loops_on_64_byte_lines(built: tuple[Path, dict]) -> None:
    """Every C++ compile of the build aligns its loops (-falign-loops=64, COMMON_FLAGS): otherwise an
    edit elsewhere in a unit moves an unchanged hot loop across a line and its time by several
    per cent, which a trial would credit to its change."""
    root, _ = built
    flags = [line for line in (root / "build" / ".objs" / "build.ninja").read_text().splitlines()
             if line.strip().startswith("flags =") and "-std=c++20" in line.split()]  # not the C module stub
    assert flags, "build.ninja holds no C++ compile flags"
    assert all("-falign-loops=64" in line.split() for line in flags), flags


@pytest.mark.slow
def test_layout_metadata_and_ops_module(built: tuple[Path, dict]) -> None:
    root, report = built
    info = torch_info()
    variant = root / "build" / f"torch{info.major}{info.minor}-cxx11-cpu-{os.uname().machine}-linux"
    assert Path(report["variant_dir"]) == variant
    ext = report["ext_name"]
    assert re.fullmatch(r"_kh_scale_cpu_[0-9a-f]{10}", ext)
    assert sorted(p.name for p in variant.iterdir()) == sorted(
        ["__init__.py", "_ops.py", "metadata.json", "tier_units.json", f"{ext}.abi3.so"])
    metadata = json.loads((variant / "metadata.json").read_text())
    digest = metadata.pop("digest")  # kernels-data's digest of every other file (tests below check it verifies)
    assert digest["algorithm"] == "sha256"
    assert sorted(digest["files"]) == sorted(["__init__.py", "_ops.py", "tier_units.json", f"{ext}.abi3.so"])
    # issue 24: each tier's unit hash as compiled, so evidence of the installed package names its units
    from kernel_harness.portability import declared_units

    units = json.loads((variant / "tier_units.json").read_text())
    assert units["id"] == ext
    assert units["tiers"] == [u.to_dict() for u in declared_units(root)]
    assert [t["tier"] for t in units["tiers"]] == ["generic", "avx2", "avx512"]
    assert metadata == {
        "name": "kh-scale", "id": ext, "version": 1, "license": "apache-2.0",
        "python-depends": [], "backend": {"type": "cpu"},
    }
    ops = (variant / "_ops.py").read_text()
    assert f"ops = torch.ops.{ext}" in ops and "def add_op_namespace_prefix" in ops
    # objects and generated files are never published
    assert not list(variant.rglob("*.o"))
    assert (root / "build" / ".objs" / "gen" / "include" / "registration.h").is_file()
    # the .so links torch's libs and torch's OpenMP runtime, with no rpath into this venv
    dynamic = subprocess.run(["readelf", "-d", str(variant / f"{ext}.abi3.so")], capture_output=True, text=True).stdout
    for lib in ("libc10.so", "libtorch_cpu.so", "libgomp.so.1"):
        assert f"[{lib}]" in dynamic
    assert "RPATH" not in dynamic and "RUNPATH" not in dynamic
    # the report counts the prefetch instructions per tier: this kernel asks for none
    if shutil.which("objdump"):
        assert report["prefetch_instructions"] == {"avx2": 0, "avx512": 0, "other": 0}


LOAD_AND_CHECK = """
import os, sys, torch
from pathlib import Path
import kernels
from kernel_harness import cpu
mod = kernels.get_local_kernel(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(os.environ["KDIR"]))
results = {}
for tier in cpu.supported_tiers():
    os.environ["KERNEL_CPU_ISA"] = tier
    assert mod.active_tier() == tier
    for n in (1, 7, 4096, 4096 + 13):
        for rows in (1, 33):
            x = torch.randn(rows, n)
            torch.testing.assert_close(mod.scale(x, 1.5), x * 1.5, rtol=0, atol=0)
    results[tier] = True
threads = {}
for n in (1, 2):
    torch.set_num_threads(n)
    threads[n] = mod.omp_threads_in_region()
gomp = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}
print("RESULT", results, threads, len(gomp), mod.add_op_namespace_prefix("scale"))
"""


@pytest.mark.slow
def test_get_local_kernel_loads_every_supported_tier(built: tuple[Path, dict]) -> None:
    root, report = built
    proc = run_python(LOAD_AND_CHECK, env={"KDIR": str(root), "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    for tier in cpu.supported_tiers():
        assert f"'{tier}': True" in line
    # torch.set_num_threads governs the kernel's OpenMP threads: one shared runtime
    assert "{1: 1, 2: 2}" in line
    # exactly one libgomp mapped (torch's), never a second runtime
    assert " 1 " + report["ext_name"] + "::scale" in line


@pytest.mark.slow
def test_wheel_installs_as_importable_package(built: tuple[Path, dict], tmp_path: Path) -> None:
    root, report = built
    wheel = Path(report["wheel"])
    assert wheel.parent == root / "dist" and list(root.glob("dist/*.whl")) == [wheel]
    assert wheel.name.startswith("kh_scale-1.0.0+") and wheel.name.endswith("-abi3-linux_x86_64.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        assert {f"{dist_info}/METADATA", f"{dist_info}/WHEEL", "kh_scale/__init__.py", "kh_scale/_ops.py",
                "kh_scale/tier_units.json"} <= names
        record = archive.read(f"{dist_info}/RECORD").decode()
        import base64, hashlib
        for row in record.strip().splitlines():
            name, digest, size = row.rsplit(",", 2)
            if not digest:
                continue
            data = archive.read(name)
            expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == expected and int(size) == len(data), name
        assert "Name: kh_scale" in archive.read(f"{dist_info}/METADATA").decode()
    target = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", str(wheel), "--force-reinstall", "--no-deps", "--target", str(target), "-q"],
        capture_output=True, text=True, timeout=300,
    )
    assert pip.returncode == 0, pip.stderr
    proc = run_python(
        """
        import torch, kh_scale
        x = torch.randn(3, 4096 + 13)
        torch.testing.assert_close(kh_scale.scale(x, -2.0), x * -2.0, rtol=0, atol=0)
        print("OK", kh_scale.__file__)
        """,
        env={"PYTHONPATH": str(target)},
    )
    assert proc.returncode == 0, proc.stderr
    assert f"OK {target}" in proc.stdout
    # the same build from the wheel AND from build/ in one process: no TORCH_LIBRARY abort
    proc = run_python(
        f"""
        import torch, kh_scale, kernels
        from pathlib import Path
        local = kernels.get_local_kernel(Path({str(root)!r}))
        x = torch.randn(50)
        assert torch.equal(kh_scale.scale(x, 3.0), local.scale(x, 3.0))
        print("BOTH", kh_scale.ops.__name__ == local.ops.__name__)
        """,
        env={"PYTHONPATH": str(target)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "BOTH True" in proc.stdout


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, built) -> Path:
    """A second copy, built in-process (ccache hits): the incremental tests mutate it."""
    root = copy_kernel(tmp_path_factory.mktemp("kh_scale_work") / "kh_scale")
    build_kernel(root)
    return root


@pytest.mark.slow
def test_noop_rebuild_compiles_nothing(work: Path) -> None:
    result = build_kernel(work)
    assert result.compiled == [] and not result.linked


@pytest.mark.slow
def test_one_line_avx512_edit_recompiles_that_unit_only(work: Path, tmp_path: Path) -> None:
    before = build_kernel(work)
    old_variant = tmp_path / "old_variant"
    shutil.copytree(before.variant_dir, old_variant)
    path = work / AVX512
    path.write_text(path.read_text().replace("// masked tail", "// masked tail (edited)"))
    after = build_kernel(work)
    # the edited unit, plus the generated stub that carries the new content id -- nothing else
    assert sorted(after.compiled) == sorted([AVX512, STUB])
    assert after.linked
    assert after.build_id != before.build_id
    sos = sorted(p.name for p in after.variant_dir.glob("*.so"))
    assert sos == [f"{after.ext_name}.abi3.so"]  # the previous build's .so is gone
    assert [p.name for p in (work / "dist").glob("*.whl")] == [after.wheel.name]
    # two builds load side by side in one process: distinct op namespaces
    proc = run_python(
        f"""
        import torch, kernels
        from pathlib import Path
        a = kernels.get_local_kernel(Path({str(old_variant)!r}))
        b = kernels.get_local_kernel(Path({str(work)!r}))
        x = torch.randn(100)
        assert torch.equal(a.scale(x, 2.0), b.scale(x, 2.0))
        print(a.add_op_namespace_prefix("s"), b.add_op_namespace_prefix("s"))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{before.ext_name}::s {after.ext_name}::s" in proc.stdout


@pytest.mark.slow
def test_header_edit_recompiles_its_includers(work: Path) -> None:
    header = work / "kh_scale_cpu" / "kh_scale_cpu.hpp"
    header.write_text(header.read_text() + "\n// touched\n")
    result = build_kernel(work)
    assert sorted(result.compiled) == sorted(
        ["kh_scale_cpu/kh_scale_cpu.cpp", "kh_scale_cpu/kh_scale_avx2.cpp", AVX512, STUB]
    )


@pytest.mark.slow
def test_flag_change_recompiles_that_section_only(work: Path) -> None:
    toml = work / "build.toml"
    toml.write_text(toml.read_text().replace('"-mf16c", "-fopenmp"]', '"-mf16c", "-fopenmp", "-DKH_EXTRA=1"]'))
    result = build_kernel(work)
    assert sorted(result.compiled) == sorted(["kh_scale_cpu/kh_scale_avx2.cpp", STUB])


@pytest.mark.slow
def test_compile_error_reports_file_line_first_and_keeps_previous_build(work: Path, script) -> None:
    good = build_kernel(work)
    before = sorted(p.name for p in good.variant_dir.iterdir())
    path = work / AVX512
    source = path.read_text()
    path.write_text(source.replace("const __m512 a = _mm512_set1_ps(alpha);", "const __m512 a = _mm512_set1_ps(alpha)"))
    try:
        proc = script("build_kernel", "--release", "--json", work / "fail.json", cwd=work)
        assert proc.returncode == 1
        failure = json.loads((work / "fail.json").read_text())
        assert failure["ok"] is False
        assert failure["error"]["file"] == AVX512 and failure["error"]["line"] == 10
        first = proc.stderr.strip().splitlines()[0]
        assert first.startswith("build failed: kh_scale_cpu/kh_scale_avx512.cpp:10: expected"), proc.stderr
        assert "compiler output" in proc.stderr and "FAILED:" in proc.stderr  # raw output follows
        assert sorted(p.name for p in good.variant_dir.iterdir()) == before
        with pytest.raises(BuildFailed) as info:
            build_kernel(work)
        assert info.value.error.file == AVX512 and info.value.error.line == 10
        assert "previous build" in info.value.message
    finally:
        path.write_text(source)
    proc = run_python(LOAD_AND_CHECK, env={"KDIR": str(work), "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert proc.returncode == 0, proc.stderr


def test_build_dir_option_and_bad_build_toml(tmp_path: Path, script) -> None:
    root = copy_kernel(tmp_path / "k")
    toml = root / "build.toml"
    toml.write_text(toml.read_text().replace("edition = 5", "edition = 5\nedtion = 5"))
    proc = script("build_kernel", "--dir", root, cwd=tmp_path)
    assert proc.returncode == 2
    assert "general.edtion" in proc.stderr and "unknown key" in proc.stderr
    assert not (root / "build").exists() or not list((root / "build").glob("torch*"))


@pytest.mark.slow
def test_bench_measures_an_incremental_round() -> None:
    from kernel_harness.build.bench import run_bench

    result = run_bench(kernel_dir=SOURCE, rounds=1, cold_ccache=True)
    payload = result.as_dict()
    assert payload["avx512_unit"] == AVX512
    assert [sorted(units) for units in payload["compiled_per_round"]] == [sorted([STUB, AVX512])]
    assert payload["rounds"][0]["total"] > 0 and payload["cold_build_seconds"] > 0


# ----------------------------------------------------------------------------- fast unit tests


def test_first_error_names_file_line_relative_to_the_kernel(tmp_path: Path) -> None:
    from kernel_harness.build.diagnostics import first_error

    objs = tmp_path / "build" / ".objs"
    output = (
        "[1/3] CXX k_cpu/k_avx512.cpp\n"
        "FAILED: obj/x.o\n"
        "g++ ... -c ../../k_cpu/k_avx512.cpp\n"
        "../../k_cpu/k_avx512.cpp: In function 'void f()':\n"
        "../../k_cpu/k_avx512.cpp:12:5: error: 'foo' was not declared in this scope\n"
        "../../k_cpu/k_avx512.cpp:13:5: error: second error\n"
    )
    error = first_error(output, tmp_path, objs)
    assert (error.file, error.line) == ("k_cpu/k_avx512.cpp", 12)
    assert error.headline() == "k_cpu/k_avx512.cpp:12: 'foo' was not declared in this scope"
    assert error.raw == output


def test_first_error_reports_link_errors(tmp_path: Path) -> None:
    from kernel_harness.build.diagnostics import first_error

    output = "FAILED: kernel.so\n/usr/bin/ld: obj/a.o: in function `f':\na.cpp:(.text+0x5): undefined reference to `g()'\ncollect2: error: ld returned 1 exit status\n"
    error = first_error(output, tmp_path)
    assert error.file is None and error.message == "link error: undefined reference to `g()'"


def test_generated_registration_and_ops_module() -> None:
    from kernel_harness.build.codegen import Names, extension_c, metadata_json, ops_py, registration_h

    names = Names(python_name="my_kernel", metadata_name="my-kernel", build_id="0123456789")
    header = registration_h(names)
    assert "Only a single TORCH_LIBRARY" in header  # a second load of the same build is skipped, not fatal
    for macro in ("TORCH_LIBRARY_EXPAND(NAME, MODULE)", "TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE)", "REGISTER_EXTENSION(NAME)", "STRINGIFY(A)", "CONCAT(A, B)"):
        assert f"#define {macro}" in header
    assert "0123456789" not in header  # the binding unit never depends on the id
    stub = extension_c(names)
    assert "PyInit__my_kernel_cpu_0123456789(void)" in stub and '"_my_kernel_cpu_0123456789"' in stub
    ops = ops_py(names)
    assert "from . import _my_kernel_cpu_0123456789" in ops and "ops = torch.ops._my_kernel_cpu_0123456789" in ops
    meta = json.loads(metadata_json(names, version=2, license="mit", python_depends=("einops",)))
    assert meta == {"name": "my-kernel", "id": "_my_kernel_cpu_0123456789", "version": 2, "license": "mit",
                    "python-depends": ["einops"], "backend": {"type": "cpu"}}


# ----------------------------------------------------------------------------- the variant digest

DIGEST_AND_LOAD = """
import json, sys
from pathlib import Path
import kernels, kernels_data
from kernels import _rust
root, variant = Path(sys.argv[1]), Path(sys.argv[2])
for lib in (kernels_data, _rust):  # the standalone package and the copy kernels.verify uses
    meta = lib.Metadata.read_from_file(variant / "metadata.json")
    meta.digest.validate(lib.Digest.hash_variant(meta.digest.algorithm, variant))
mod = kernels.get_local_kernel(root)
# importing leaves __pycache__/ in the variant; the digest (like kernels) ignores byte code
meta = kernels_data.Metadata.read_from_file(variant / "metadata.json")
meta.digest.validate(kernels_data.Digest.hash_variant(meta.digest.algorithm, variant))
print("RESULT", json.dumps({"name": str(meta.name), "algorithm": str(meta.digest.algorithm),
      "files": sorted(meta.digest.files), "ops": sorted(n for n in dir(mod) if not n.startswith("_"))}))
"""


@pytest.mark.slow
def test_catalogue_variant_carries_a_digest_kernels_verifies_and_still_loads(catalogue_kernel_dir: Path, tmp_path: Path) -> None:
    # a copy, so importing it never writes byte code into the shared cached build
    root = tmp_path / "harness_catalogue"
    shutil.copytree(catalogue_kernel_dir, root, ignore=shutil.ignore_patterns("dist", "__pycache__", ".objs"))
    (variant,) = [p.parent for p in (root / "build").glob("torch*/metadata.json")]
    proc = run_python(DIGEST_AND_LOAD.replace("sys.argv[1]", repr(str(root))).replace("sys.argv[2]", repr(str(variant))))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))[len("RESULT "):])
    assert result["name"] == "harness-catalogue" and result["algorithm"] == "sha256"
    so = [f for f in result["files"] if f.endswith(".abi3.so")]
    assert len(so) == 1 and "__init__.py" in result["files"] and "_ops.py" in result["files"]
    assert "metadata.json" not in result["files"] and not any("__pycache__" in f for f in result["files"])
    assert {"rms_norm", "softmax"} <= set(result["ops"])
