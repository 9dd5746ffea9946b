"""scripts/validate_cpu_kernel.py: one test per error and warning, each on a mutated copy of a good kernel."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_harness.validate import ERROR_CODES, WARNING_CODES, validate_kernel

GOOD_KERNEL = Path(__file__).parent / "data" / "build_kernels" / "kh_scale"
AVX512 = "kh_scale_cpu/kh_scale_avx512.cpp"
AVX2 = "kh_scale_cpu/kh_scale_avx2.cpp"
DISPATCH = "kh_scale_cpu/kh_scale_cpu.cpp"


@pytest.fixture
def kernel(tmp_path: Path) -> Path:
    target = tmp_path / "kernel"
    shutil.copytree(GOOD_KERNEL, target, ignore=shutil.ignore_patterns("build", "dist", "__pycache__"))
    return target


def edit(kernel: Path, rel: str, old: str, new: str) -> None:
    path = kernel / rel
    text = path.read_text()
    assert old in text, f"{old!r} not in {rel}"
    path.write_text(text.replace(old, new, 1))


def codes(kernel: Path) -> tuple[set[str], set[str]]:
    report = validate_kernel(kernel)
    return {f.code for f in report.errors}, {f.code for f in report.warnings}


def only_error(kernel: Path, code: str):
    report = validate_kernel(kernel)
    assert [f.code for f in report.errors] == [code], report.as_dict()
    return report.errors[0]


def test_good_kernel_is_clean(kernel: Path) -> None:
    report = validate_kernel(kernel)
    assert report.ok and report.errors == [] and report.warnings == [], report.as_dict()


# ----------------------------------------------------------------------------- errors


def test_no_build_toml(kernel: Path) -> None:
    (kernel / "build.toml").unlink()
    finding = only_error(kernel, "missing-build-toml")
    assert finding.file == "build.toml"


def test_unparsable_build_toml(kernel: Path) -> None:
    edit(kernel, "build.toml", "[torch]", "[torch")
    finding = only_error(kernel, "toml-syntax")
    assert finding.line == 9


def test_unknown_key(kernel: Path) -> None:
    edit(kernel, "build.toml", 'cxx-flags = ["-mavx2"', 'cxx_flags = ["-O3"]\ncxx-flags = ["-mavx2"')
    finding = only_error(kernel, "unknown-key")
    assert "cxx_flags" in finding.message and finding.line is not None


def test_missing_key(kernel: Path) -> None:
    edit(kernel, "build.toml", 'license = "apache-2.0"\n', "")
    finding = only_error(kernel, "missing-key")
    assert "'license'" in finding.message


def test_wrong_type(kernel: Path) -> None:
    edit(kernel, "build.toml", "version = 1", 'version = "1"')
    finding = only_error(kernel, "wrong-type")
    assert "general.version" in finding.message and finding.line == 4


def test_invalid_value(kernel: Path) -> None:
    edit(kernel, "build.toml", "edition = 5", "edition = 3")
    assert "must be 5" in only_error(kernel, "invalid-value").message


def test_no_cpu_kernel_section(kernel: Path) -> None:
    text = (kernel / "build.toml").read_text()
    (kernel / "build.toml").write_text(text[: text.index("[kernel.")])
    errors, _ = codes(kernel)
    assert "no-cpu-kernel" in errors


def test_no_torch_binding(kernel: Path) -> None:
    (kernel / "torch-ext" / "torch_binding.cpp").unlink()
    errors, _ = codes(kernel)
    assert "missing-binding" in errors


def test_listed_source_missing(kernel: Path) -> None:
    (kernel / AVX2).unlink()
    finding = only_error(kernel, "missing-source")
    assert AVX2 in finding.message and finding.file == "build.toml" and finding.line is not None


def test_cpp_on_disk_in_no_section(kernel: Path) -> None:
    (kernel / "kh_scale_cpu" / "extra.cpp").write_text("int extra() { return 1; }\n")
    finding = only_error(kernel, "unlisted-source")
    assert finding.file == "kh_scale_cpu/extra.cpp"


def test_simd_section_without_openmp(kernel: Path) -> None:
    edit(kernel, "build.toml", '"-mavx512vl", "-fopenmp"]', '"-mavx512vl"]')
    finding = only_error(kernel, "simd-without-openmp")
    assert "kernel.kh_scale_cpu_avx512" in finding.message


def test_section_without_include(kernel: Path) -> None:
    edit(kernel, "build.toml", 'include = ["kh_scale_cpu"]\nsrc = ["kh_scale_cpu/kh_scale_avx2.cpp"]', 'src = ["kh_scale_cpu/kh_scale_avx2.cpp"]')
    finding = only_error(kernel, "missing-include")
    assert 'include = ["kh_scale_cpu"]' in finding.message


def test_avx512_intrinsic_in_avx2_tier(kernel: Path) -> None:
    edit(kernel, AVX2, "  for (; i < n; ++i)", "  __m512 z = _mm512_setzero_ps(); (void)z;\n  for (; i < n; ++i)")
    report = validate_kernel(kernel)
    found = [f for f in report.errors if f.code == "isa-not-enabled"]
    assert found and found[0].file == AVX2 and "avx512f" in found[0].message and found[0].line is not None


def test_code_under_an_isa_macro_the_section_lacks_is_not_compiled_there(kernel: Path) -> None:
    """An op shared by both units keeps its AVX512/AMX part under `#if defined(__AMX_TILE__)`:
    the AVX2 section's flags do not define the macro, so GCC never sees that code there and the
    validator must not report it; the `#else` branch is compiled and checked, and the same code
    without the guard is still an error."""
    guarded = ("#if defined(__AVX512F__) && defined(__AMX_TILE__)\n"
               "  __m512 z = _mm512_setzero_ps(); (void)z; _tile_release();\n"
               "#else\n  int unused_ok = 0; (void)unused_ok;\n#endif\n  for (; i < n; ++i)")
    edit(kernel, AVX2, "  for (; i < n; ++i)", guarded)
    assert validate_kernel(kernel).ok, validate_kernel(kernel).as_dict()
    edit(kernel, AVX2, "  int unused_ok = 0; (void)unused_ok;", "  __m512 w = _mm512_setzero_ps(); (void)w;")
    finding = only_error(kernel, "isa-not-enabled")
    assert finding.file == AVX2 and "avx512f" in finding.message
    edit(kernel, AVX2, "#if defined(__AVX512F__) && defined(__AMX_TILE__)\n", "#if 1\n")
    found = {f.message.split()[0] for f in validate_kernel(kernel).errors if f.code == "isa-not-enabled"}
    assert "_tile_release" in found


def test_intrinsic_in_generic_unit(kernel: Path) -> None:
    edit(kernel, DISPATCH, "#include <cstdlib>", "#include <cstdlib>\n#include <immintrin.h>\nstatic __m256 g() { return _mm256_setzero_ps(); }")
    finding = only_error(kernel, "isa-not-enabled")
    assert finding.file == DISPATCH and "-mavx2" in finding.message


def test_intrinsic_in_binding_unit(kernel: Path) -> None:
    edit(kernel, "torch-ext/torch_binding.cpp", '#include "registration.h"', '#include "registration.h"\n#include <immintrin.h>\nstatic __m512 z() { return _mm512_setzero_ps(); }')
    finding = only_error(kernel, "isa-not-enabled")
    assert finding.file == "torch-ext/torch_binding.cpp" and "[torch]" in finding.message


def test_bf16_intrinsic_without_bf16_flag(kernel: Path) -> None:
    edit(kernel, "build.toml", '"-mavx512bf16", ', "")
    edit(kernel, AVX512, "namespace kh_scale_cpu {", "namespace kh_scale_cpu {\n__m256bh to_bf16(__m512 v) { return _mm512_cvtneps_pbh(v); }")
    finding = only_error(kernel, "isa-not-enabled")
    assert "avx512bf16" in finding.message and "-mavx512bf16" in finding.message


def generated_avx512_unit(tmp_path: Path, ops: tuple[str, ...] = ("rms_norm",)) -> tuple[Path, str]:
    from kernel_harness.scaffold import ScaffoldOptions, generate_project

    root = tmp_path / "gen"
    generate_project(ScaffoldOptions(ops=ops, name="gen_kernel", directory=root))
    return root, "gen_kernel_cpu/gen_kernel_avx512.cpp"


def test_generated_avx512_unit_guards_every_bf16_instruction(tmp_path: Path) -> None:
    """The template's own BF16 instructions all test kBf16: the unit runs on Ice Lake too."""
    root, unit = generated_avx512_unit(tmp_path)
    assert "#define kBf16 (bf16_on())" in (root / unit).read_text()
    assert "bf16-unguarded" not in {f.code for f in validate_kernel(root).errors}


def test_unguarded_bf16_instruction_in_generated_avx512_unit(tmp_path: Path) -> None:
    """A VDPBF16PS without the kBf16 test would SIGILL on AVX512 CPUs without BF16 (Ice Lake)."""
    root, unit = generated_avx512_unit(tmp_path)
    edit(root, unit, "  return kBf16 ? bf16_dot_insn(acc, a, b) : bf16_dot_split(acc, a, b);", "  return bf16_dot_insn(acc, a, b);")
    found = [f for f in validate_kernel(root).errors if f.code == "bf16-unguarded"]
    assert len(found) == 1 and found[0].file == unit and found[0].line is not None
    assert "bf16_dot_insn" in found[0].message and "kBf16" in found[0].message and "Ice Lake" in found[0].message


def test_local_copy_of_the_bf16_test_guards_a_hot_loop(tmp_path: Path) -> None:
    """linear's dot loop reads kBf16 once into `const bool insn` and tests that (the static's guard
    inside the loop spilled its accumulators): accepted; a copy of something else is not a guard."""
    root, unit = generated_avx512_unit(tmp_path, ops=("rms_norm", "linear"))
    text = (root / unit).read_text()
    assert "const bool insn = kBf16;" in text and "insn ? bf16_dot_insn(" in text
    assert "bf16-unguarded" not in {f.code for f in validate_kernel(root).errors}
    edit(root, unit, "const bool insn = kBf16;", "const bool insn = true;")
    found = [f for f in validate_kernel(root).errors if f.code == "bf16-unguarded"]
    assert len(found) == 1 and "bf16_dot_insn" in found[0].message
    assert (root / unit).read_text().splitlines()[found[0].line - 1].strip().startswith("acc[i][r] = insn ?")


def test_bf16_intrinsic_in_generated_avx512_unit_is_refused_even_when_guarded(tmp_path: Path) -> None:
    """An intrinsic behind `if (kBf16)` may still run speculatively: the unit must use the asm helpers."""
    root, unit = generated_avx512_unit(tmp_path)
    edit(root, unit, "  return kBf16 ? bf16_dot_insn(acc, a, b) : bf16_dot_split(acc, a, b);",
         "  return kBf16 ? _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b) : bf16_dot_split(acc, a, b);")
    found = [f for f in validate_kernel(root).errors if f.code in ("bf16-unguarded", "isa-not-enabled")]
    assert [f.code for f in found] == ["bf16-unguarded"]
    assert "speculatively" in found[0].message and "bf16_dot_insn" in found[0].message


def test_vnni_instructions_are_guarded_like_bf16_ones(tmp_path: Path) -> None:
    """linear_int8's VPDPWSSD (vnni_dot_insn) runs behind `const bool dot = kVnni;` (Skylake-SP lacks
    AVX512-VNNI): the template passes, a copy of something else or a VNNI intrinsic does not."""
    root, unit = generated_avx512_unit(tmp_path, ops=("rms_norm", "linear_int8"))
    text = (root / unit).read_text()
    assert "#define kVnni (vnni_on())" in text and text.count("const bool dot = kVnni;") == 2
    assert "dot ? vnni_dot_insn(" in text
    assert not {f.code for f in validate_kernel(root).errors} & {"vnni-unguarded", "isa-not-enabled"}
    (root / unit).write_text(text.replace("const bool dot = kVnni;", "const bool dot = true;"))
    found = [f for f in validate_kernel(root).errors if f.code == "vnni-unguarded"]
    assert len(found) == text.count("dot ? vnni_dot_insn(") >= 2
    assert all("vnni_dot_insn" in f.message and "Skylake-SP" in f.message for f in found)
    (root / unit).write_text(text)
    edit(root, unit, "  __asm__ volatile(\"vpdpwssd %2, %1, %0\" : \"+v\"(acc) : \"v\"(a), \"v\"(b));\n  return acc;",
         "  return _mm512_dpwssd_epi32(acc, a, b);")
    found = [f for f in validate_kernel(root).errors if f.code in ("vnni-unguarded", "isa-not-enabled")]
    assert [f.code for f in found] == ["vnni-unguarded"] and "speculatively" in found[0].message


def test_generated_avx512_section_may_not_enable_more_than_the_tier_checks(tmp_path: Path) -> None:
    """-mavx512bf16 (or VBMI, or -march=native) lets the compiler put those instructions anywhere in a
    unit the dispatcher runs on Ice Lake; the generated flags themselves are clean."""
    root, _unit = generated_avx512_unit(tmp_path)
    assert "isa-beyond-tier" not in {f.code for f in validate_kernel(root).errors}
    edit(root, "build.toml", '"-mavx512dq",', '"-mavx512dq", "-mavx512bf16", "-mavx512vbmi",')
    found = [f for f in validate_kernel(root).errors if f.code == "isa-beyond-tier"]
    assert len(found) == 1 and found[0].file == "build.toml" and found[0].line is not None
    assert "avx512bf16, avx512vbmi" in found[0].message and "kernel.gen_kernel_cpu_avx512" in found[0].message


def test_intrinsic_beyond_the_tier_in_generated_avx512_unit_points_to_asm_not_a_flag(tmp_path: Path) -> None:
    root, unit = generated_avx512_unit(tmp_path)
    text = (root / unit).read_text()
    (root / unit).write_text(text + "\nstatic __m512i vbmi_probe(__m512i a) { return _mm512_permutexvar_epi8(a, a); }\n")
    found = [f for f in validate_kernel(root).errors if f.code == "isa-not-enabled"]
    assert len(found) == 1 and "avx512vbmi" in found[0].message
    assert "may not be added" in found[0].message and "volatile asm" in found[0].message


def test_one_tier_mixing_isa_levels(kernel: Path) -> None:
    # the AVX2 unit moved into the AVX512 section: compiled with AVX512 flags
    edit(kernel, "build.toml", 'src = ["kh_scale_cpu/kh_scale_avx2.cpp"]\n', 'src = []\n')
    edit(kernel, "build.toml", 'src = ["kh_scale_cpu/kh_scale_avx512.cpp"]', 'src = ["kh_scale_cpu/kh_scale_avx512.cpp", "kh_scale_cpu/kh_scale_avx2.cpp"]')
    errors, _ = codes(kernel)
    assert "mixed-isa" in errors


def test_avx2_unit_in_avx512_section(kernel: Path) -> None:
    edit(kernel, "build.toml", 'cxx-flags = ["-mavx2", "-mfma", "-ffp-contract=off", "-mf16c", "-fopenmp"]', 'cxx-flags = ["-mavx512f", "-mavx2", "-mfma", "-ffp-contract=off", "-mf16c", "-fopenmp"]')
    finding = only_error(kernel, "mixed-isa")
    assert finding.file == AVX2 and "SIGILL" in finding.message


def test_unfinished_compute_body(kernel: Path) -> None:
    edit(kernel, AVX512, "  const __m512 a = _mm512_set1_ps(alpha);", '  KERNEL_TODO("write the AVX512 body");\n  const __m512 a = _mm512_set1_ps(alpha);')
    edit(kernel, AVX2, "  const __m256 a", '  KERNEL_TODO("write the AVX2 body");\n  const __m256 a')
    (kernel / "kh_scale_cpu" / "todo.hpp").write_text('#pragma once\n#define KERNEL_TODO(msg) static_assert(false, msg)\n')
    report = validate_kernel(kernel)
    todo = [f for f in report.errors if f.code == "unfinished-body"]
    assert {(f.file, f.line) for f in todo} == {(AVX512, 9), (AVX2, 8)}  # every occurrence, not the #define
    assert all(f.code == "unfinished-body" for f in report.errors)


# ----------------------------------------------------------------------------- warnings


def only_warning(kernel: Path, code: str):
    report = validate_kernel(kernel)
    assert report.errors == [], report.as_dict()
    assert [f.code for f in report.warnings] == [code], report.as_dict()
    return report.warnings[0]


def test_aligned_load_on_unknown_pointer(kernel: Path) -> None:
    edit(kernel, AVX512, "_mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), a))", "_mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_load_ps(x + i), a))")
    finding = only_warning(kernel, "aligned-access")
    assert finding.file == AVX512 and finding.line == 13 and "_mm512_load_ps" in finding.message


def test_aligned_access_on_alignas_buffer_is_fine(kernel: Path) -> None:
    edit(kernel, AVX512, "  if (full < n) {", "  alignas(64) float buf[16];\n  _mm512_store_ps(buf, a);\n  if (full < n) {")
    assert validate_kernel(kernel).warnings == []


def test_simd_loop_without_tail(kernel: Path) -> None:
    edit(kernel, AVX2, "  for (; i < n; ++i) out[i] = x[i] * alpha;  // tail\n", "")
    finding = only_warning(kernel, "no-tail-handling")
    assert finding.file == AVX2 and finding.line == 10


def test_dispatcher_without_threshold(kernel: Path) -> None:
    edit(kernel, DISPATCH, "constexpr int64_t kMinSimdElements = 64;\n", "")
    edit(kernel, DISPATCH, "input.numel() < kMinSimdElements && ", "")
    finding = only_warning(kernel, "no-size-threshold")
    assert finding.file == DISPATCH


def test_torch_header_in_tier_unit(kernel: Path) -> None:
    edit(kernel, AVX512, "#include <omp.h>", "#include <omp.h>\n#include <ATen/ATen.h>")
    finding = only_warning(kernel, "torch-in-tier")
    assert finding.file == AVX512 and finding.line == 4


def test_underscore_name_is_refused_with_kernels_data_message(kernel: Path, script, tmp_path: Path) -> None:
    import kernels_data

    with pytest.raises(ValueError) as refused:
        kernels_data.KernelName("kh_scale")
    edit(kernel, "build.toml", 'name = "kh-scale"', 'name = "kh_scale"')
    finding = only_error(kernel, "invalid-kernel-name")
    assert finding.file == "build.toml" and finding.line == 3
    assert str(refused.value) in finding.message and "name = 'kh-scale'" in finding.message
    proc = script("validate_cpu_kernel", kernel, "--json", tmp_path / "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (error,) = json.loads((tmp_path / "r.json").read_text())["errors"]
    assert error["code"] == "invalid-kernel-name" and str(refused.value) in error["message"]


# ----------------------------------------------------------------------------- an existing build


def fake_variant(kernel: Path) -> Path:
    """A build/<variant>/ with the files the builder writes (a stand-in .so) and its kernels-data digest."""
    from kernel_harness.build.codegen import Names, metadata_json
    from kernel_harness.build.variant_digest import write_digest

    variant = kernel / "build" / "torch213-cxx11-cpu-x86_64-linux"
    variant.mkdir(parents=True)
    names = Names(python_name="kh_scale", metadata_name="kh-scale", build_id="0123456789")
    (variant / "__init__.py").write_text("from ._ops import ops\n")
    (variant / "_ops.py").write_text("ops = None\n")
    (variant / f"{names.ext_name}.abi3.so").write_bytes(b"\x7fELF" + bytes(64))
    (variant / "metadata.json").write_text(metadata_json(names, version=1, license="apache-2.0", python_depends=()))
    write_digest(variant)
    return variant


def test_built_variant_with_its_digest_is_clean(kernel: Path) -> None:
    variant = fake_variant(kernel)
    (variant / "__pycache__").mkdir()  # what importing it leaves behind; kernels ignores it too
    (variant / "__pycache__" / "_ops.cpython-311.pyc").write_bytes(b"x")
    report = validate_kernel(kernel)
    assert report.ok and report.warnings == [], report.as_dict()


def test_built_variant_changed_after_the_build(kernel: Path) -> None:
    variant = fake_variant(kernel)
    so = next(variant.glob("*.so"))
    so.write_bytes(so.read_bytes()[:-1] + b"\x01")
    (variant / "extra.py").write_text("")
    (variant / "_ops.py").unlink()
    report = validate_kernel(kernel)
    found = {(f.code, f.file) for f in report.errors}
    rel = variant.relative_to(kernel).as_posix()
    assert found == {
        ("digest-mismatch", f"{rel}/{so.name}"),
        ("digest-mismatch", f"{rel}/extra.py"),
        ("digest-mismatch", f"{rel}/_ops.py"),
    }, report.as_dict()
    messages = " ".join(f.message for f in report.errors)
    for words in (f"File hash mismatch for {so.name}", "Unknown file: extra.py", "Missing file: _ops.py"):
        assert words in messages  # kernels-data's own wording
    assert "scripts/build_kernel.py" in messages


def test_built_variant_without_digest_or_with_bad_metadata(kernel: Path) -> None:
    variant = fake_variant(kernel)
    meta = json.loads((variant / "metadata.json").read_text())
    del meta["digest"]
    (variant / "metadata.json").write_text(json.dumps(meta))
    finding = only_warning(kernel, "no-digest")
    assert "has no digest" in finding.message and "scripts/build_kernel.py" in finding.message
    meta["name"] = "kh_scale"
    (variant / "metadata.json").write_text(json.dumps(meta))
    finding = only_error(kernel, "invalid-metadata")
    assert "Invalid kernel name `kh_scale`" in finding.message


def test_implicit_fp_contract_warns(kernel: Path) -> None:
    edit(kernel, "build.toml", '"-mavx512bf16", "-ffp-contract=off",', '"-mavx512bf16",')
    finding = only_warning(kernel, "fp-contract-implicit")
    assert "kernel.kh_scale_cpu_avx512" in finding.message and "-ffp-contract=off" in finding.message


def test_every_code_has_a_test() -> None:
    source = Path(__file__).read_text()
    untested = [c for c in [*ERROR_CODES, *WARNING_CODES] if f'"{c}"' not in source.replace("'", '"')]
    assert untested == []


# ----------------------------------------------------------------------------- CLI


def test_cli_json_and_exit_codes(kernel: Path, script, tmp_path: Path) -> None:
    ok = script("validate_cpu_kernel", kernel, "--json", tmp_path / "ok.json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    payload = json.loads((tmp_path / "ok.json").read_text())
    assert payload["ok"] is True and payload["errors"] == [] and payload["warnings"] == []

    edit(kernel, "build.toml", '"-mavx512vl", "-fopenmp"]', '"-mavx512vl"]')
    (kernel / "kh_scale_cpu" / "extra.cpp").write_text("int extra();\n")
    bad = script("validate_cpu_kernel", kernel, "--json", tmp_path / "bad.json", cwd=tmp_path)
    assert bad.returncode == 1
    assert "simd-without-openmp" in bad.stdout and "unlisted-source" in bad.stdout
    payload = json.loads((tmp_path / "bad.json").read_text())
    assert payload["ok"] is False
    assert {e["code"] for e in payload["errors"]} == {"simd-without-openmp", "unlisted-source"}
    assert all(set(e) == {"code", "file", "line", "message"} for e in payload["errors"])


def test_cli_on_missing_directory_is_usage_error(script, tmp_path: Path) -> None:
    result = script("validate_cpu_kernel", tmp_path / "nope", cwd=tmp_path)
    assert result.returncode == 2
    assert "not a directory" in result.stderr
