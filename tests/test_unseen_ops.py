"""Ops outside the catalogue: new_kernel.py --from-baseline / --signature (issue 20).

Eight baselines of different shapes (tests/data/unseen/): one to four tensor
inputs, int, float and bool scalars, a tuple result, a Model class, inputs of
a fixed dtype other than the result's, a result shaped from input dimensions.
The fast tests check the signature each one yields and the generated files;
the slow ones build ONE package holding all eight ops (cached like the
catalogue kernel) and prove each function accepts its baseline's every input
set and stops at the KERNEL_TODO of the tier that ran, and that
benchmark_cpu.py fails with exit 1 and one line per unfinished body.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fixtures_kernels import build_cached_package, compile_tier_unit
from kernel_harness.errors import UsageError
from kernel_harness.scaffold import ScaffoldOptions, plan_project
from kernel_harness.scaffold.bodies import splice_bodies
from kernel_harness.scaffold.from_baseline import signature_from_baseline
from kernel_harness.scaffold.signature import parse_signature

DATA = Path(__file__).resolve().parent / "data" / "unseen"
OPS = ("rope", "scale", "group_norm", "add_norm", "gated", "masked_softmax", "row_sum", "fused_gate")
PACKAGE = "unseen_ops"


def sig(op: str):
    return signature_from_baseline(DATA / f"{op}.py", op)


# ---------------------------------------------------------------- the signature model


def test_rope_three_tensors_primary_dtype_and_shared_dims():
    s = sig("rope")
    assert [p.name for p in s.params] == ["q", "cos", "sin"]
    q, cos, sin = s.params
    assert q.dtypes == ("bf16", "fp32") and q.rank == 3 and s.primary is q
    assert cos.dtypes == ("fp32",) and not cos.follows and cos.rank == 2  # fixed fp32, unlike the result
    assert ("cos.0", "q.0") in s.shared and ("sin.1", "cos.1") in s.shared
    assert len(s.outputs) == 1 and s.outputs[0].like == "q" and s.outputs[0].dtype is None


def test_scalars_ranks_and_defaults():
    scale = sig("scale")
    x, alpha = scale.params
    assert x.rank is None and x.dtypes == ("fp32", "bf16")  # 2-d, 3-d and 1-d sets: any rank
    assert alpha.kind == "float"
    gn = sig("group_norm")
    assert [(p.name, p.kind) for p in gn.params] == [
        ("x", "tensor"), ("weight", "tensor"), ("bias", "tensor"), ("num_groups", "int"), ("eps", "float")]
    assert gn.param("eps").default == 1e-5 and not gn.param("num_groups").has_default
    assert ("weight.0", "x.1") in gn.shared
    assert sig("fused_gate").param("use_gate").kind == "bool"


def test_tuple_result_model_class_and_output_dtype_other_than_inputs():
    add = sig("add_norm")
    assert add.tuple_output and [o.name for o in add.outputs] == ["out0", "out1"]
    assert all(p.follows for p in add.params[1:3])  # residual and weight always have x's dtype
    gated = sig("gated")
    assert [p.name for p in gated.params] == ["x", "gate"] and "Model.forward" in gated.source
    row = sig("row_sum")
    assert row.params[0].dtypes == ("bf16",)
    assert row.outputs[0].dtype == "fp32" and row.outputs[0].dims == ("x.0",)
    fused = sig("fused_gate")
    assert len(fused.tensors) == 4 and fused.param("expert").dtypes == ("int64",)
    masked = sig("masked_softmax")
    assert masked.param("mask").dtypes == ("bool",) and ("mask.3", "x.3") in masked.shared


def test_explicit_signature_matches_the_baseline():
    text = "q: Tensor[bf16,fp32](T,H,D), cos: Tensor[fp32](T,D2), sin: Tensor[fp32](T,D2) -> Tensor(like q)"
    explicit = parse_signature("rope", text)
    traced = sig("rope")
    assert [(p.name, p.kind, p.dtypes, p.rank) for p in explicit.params] == \
        [(p.name, p.kind, p.dtypes, p.rank) for p in traced.params]
    assert set(explicit.shared) == set(traced.shared)
    assert explicit.outputs[0].like == "q"
    pair = parse_signature("two", "x: Tensor(N, D), n: int = 3 -> (Tensor(like x), Tensor(N; fp32))")
    assert pair.tuple_output and pair.outputs[1].dims == ("x.0",) and pair.outputs[1].dtype == "fp32"
    assert pair.param("n").default == 3
    with pytest.raises(UsageError, match="'like y'"):
        parse_signature("bad", "x: Tensor -> Tensor(like y)")


@pytest.mark.parametrize(("baseline", "words"), [
    ("bad_list.py", ["'tensors'", "list of tensors", "supported parameters"]),
    ("bad_string.py", ["str", "non-tensor result", "supported results"]),
])
def test_inexpressible_baselines_exit_2_naming_the_parameter(script, tmp_path, baseline, words):
    run = script("new_kernel", "--op", "odd", "--name", "odd_k", "--dir", tmp_path / "k",
                 "--from-baseline", DATA / baseline, cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "k").exists()
    for word in words:
        assert word in run.stderr, run.stderr


# ---------------------------------------------------------------- the generated package


def generate(directory: Path, script) -> subprocess.CompletedProcess:
    args = ["--op", ",".join(OPS), "--name", PACKAGE, "--dir", directory, "--force", "--json", directory.parent / "gen.json"]
    for op in OPS:
        args += ["--from-baseline", DATA / f"{op}.py"]
    return script("new_kernel", *args, cwd=directory.parent)


def test_generated_layers_follow_the_baseline(script, tmp_path):
    d = tmp_path / "kernel"
    run = generate(d, script)
    assert run.returncode == 0, run.stderr
    init = (d / f"torch-ext/{PACKAGE}/__init__.py").read_text()
    assert "def rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None)" in init
    assert ("def group_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int, "
            "eps: float = 1e-05, out: torch.Tensor | None = None)") in init
    assert "out: tuple[torch.Tensor, torch.Tensor] | None = None" in init
    binding = (d / "torch-ext/torch_binding.cpp").read_text()
    assert 'ops.def("fused_gate(Tensor x, Tensor w_up, Tensor w_gate, Tensor expert, bool use_gate) -> Tensor")' in binding
    assert 'ops.def("add_norm_out(Tensor! out0, Tensor! out1, Tensor x, Tensor residual, Tensor weight, float eps) -> ()")' in binding
    bridge = (d / f"{PACKAGE}_cpu/{PACKAGE}_cpu_torch.cpp").read_text()
    assert 'check_arg(cos, op, "cos", {at::kFloat}, "float32", 2);' in bridge
    assert 'check_dim(cos, 0, "cos", q, 0, "q", op);' in bridge
    assert 'check_result(out, std::vector<int64_t>{x.size(0)}, at::kFloat, op, "out");' in bridge
    # an out= over an input (out=q: RoPE in place) reruns on copies of every tensor input
    assert ("if (aliased({q, cos, sin}, {out})) return ::rope_out(out, q.clone(), cos.clone(), sin.clone());"
            in bridge)
    assert "return ::add_norm_out(out0, out1, x.clone(), residual.clone(), weight.clone(), eps);" in bridge
    tiers = (d / f"{PACKAGE}_cpu/{PACKAGE}_tiers.hpp").read_text()
    assert ("void rope(DType dt_, void* out, const void* q, int64_t q_size0, int64_t q_size1, int64_t q_size2, "
            "const float* cos, int64_t cos_size0, int64_t cos_size1") in tiers
    assert "const bool* mask" in tiers and "const int64_t* expert" in tiers
    report = json.loads((tmp_path / "gen.json").read_text())
    assert report["unfinished_ops"] == list(OPS) and set(report["signatures"]) == set(OPS)


def test_generated_package_validates_with_only_the_unwritten_bodies(script, tmp_path):
    d = tmp_path / "kernel"
    assert generate(d, script).returncode == 0
    run = script("validate_cpu_kernel", d, "--json", tmp_path / "v.json", cwd=tmp_path)
    report = json.loads((tmp_path / "v.json").read_text())
    assert {e["code"] for e in report["errors"]} == {"unfinished-body"}, report["errors"]
    assert len(report["errors"]) == 3 * len(OPS)  # generic, avx2, avx512 per op
    assert run.returncode == 1


# ---------------------------------------------------------------- built once, shared


@pytest.fixture(scope="session")
def unseen_kernel_dir() -> Path:
    """The eight ops in one package, generated and built once (cached by content)."""
    signatures = tuple(signature_from_baseline(DATA / f"{op}.py", op) for op in OPS)

    def options(directory: Path) -> ScaffoldOptions:
        return ScaffoldOptions(ops=OPS, name=PACKAGE, directory=directory, force=True, signatures=signatures)

    return build_cached_package(options, "the unseen-op package", prefix="unseen-")


CALL_EVERY_SET = textwrap.dedent("""
    import importlib.util, os, sys, torch, kernels
    from pathlib import Path
    k = kernels.get_local_kernel(Path(sys.argv[1]))
    data = Path(sys.argv[2])
    for op in sys.argv[3].split(","):
        spec = importlib.util.spec_from_file_location(op, data / f"{op}.py")
        m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
        sets = [m.get_inputs()] + (m.get_correctness_inputs() if hasattr(m, "get_correctness_inputs") else [])
        for tier in k.available_tiers():
            os.environ["KERNEL_CPU_ISA"] = tier
            for i, inputs in enumerate(sets):
                for use_out in (False, True):
                    kwargs = {}
                    if use_out:
                        ref = m.get_reference_output(*inputs) if hasattr(m, "get_reference_output") else None
                        if ref is None:
                            ref = inputs[0]
                        kwargs["out"] = tuple(torch.empty_like(r) for r in ref) if isinstance(ref, tuple) else torch.empty_like(ref)
                    try:
                        getattr(k, op)(*inputs, **kwargs)
                    except RuntimeError as e:
                        text = str(e)
                        want = f": {op} {tier} compute body"
                        if "KERNEL_TODO at " not in text or want not in text:
                            sys.exit(f"{op} set {i} tier {tier} out={use_out}: not the KERNEL_TODO error: {text}")
                    else:
                        sys.exit(f"{op} set {i} tier {tier}: no KERNEL_TODO error")
        print("ok", op)
""")


@pytest.mark.slow
def test_every_op_accepts_its_baselines_inputs_and_stops_at_the_todo(unseen_kernel_dir, tmp_path):
    # out= tensors are shaped like the reference's result (every baseline here returns its
    # result in the kernel's dtype), or like the first input for the Model baseline
    run = subprocess.run([sys.executable, "-c", CALL_EVERY_SET, str(unseen_kernel_dir), str(DATA), ",".join(OPS)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == [w for op in OPS for w in ("ok", op)]


@pytest.mark.slow
def test_bridge_messages_name_the_parameter(unseen_kernel_dir):
    check = textwrap.dedent("""
        import sys, torch, kernels
        from pathlib import Path
        k = kernels.get_local_kernel(Path(sys.argv[1]))
        q, cos, sin = torch.randn(4, 2, 8), torch.randn(4, 4), torch.randn(4, 4)
        cases = [((q, cos.bfloat16(), sin), "cos has dtype"), ((q, cos[:3], sin), "cos.size(0) is 3"),
                 ((q.transpose(0, 1), cos, sin), "q is not contiguous"), ((q[0], cos, sin), "q must have 3")]
        for args, words in cases:
            try:
                k.rope(*args)
            except RuntimeError as e:
                assert words in str(e), (words, str(e))
            else:
                sys.exit("accepted " + words)
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", check, str(unseen_kernel_dir)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr


@pytest.mark.slow
def test_benchmark_fails_with_one_line_per_unfinished_body(unseen_kernel_dir, script, tmp_path):
    run = script("benchmark_cpu", "--kernel-package", unseen_kernel_dir, "--op", f"{PACKAGE}.masked_softmax",
                 DATA / "masked_softmax.py", "--json", tmp_path / "b.json", cwd=tmp_path, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    text = run.stdout + run.stderr
    lines = [line for line in text.splitlines() if "KERNEL_TODO at " in line]
    assert len(lines) == 3, text
    for tier, unit in (("generic", f"{PACKAGE}_cpu.cpp"), ("avx2", f"{PACKAGE}_avx2.cpp"),
                       ("avx512", f"{PACKAGE}_avx512.cpp")):
        hit = [line for line in lines if line.endswith(f": masked_softmax {tier} compute body")]
        assert len(hit) == 1 and f"{PACKAGE}_cpu/{unit}:" in hit[0], lines
        rel, number = hit[0].split("KERNEL_TODO at ", 1)[1].split(":")[:2]
        assert "KERNEL_TODO(" in (unseen_kernel_dir / rel).read_text().splitlines()[int(number) - 1]
    assert "Traceback" not in text
    payload = json.loads((tmp_path / "b.json").read_text())
    assert payload["correct"] is False
    assert [f["check"] for f in payload["failures"]] == ["unfinished-body"]
    assert payload["failures"][0]["message"].count("KERNEL_TODO at ") == 3
    coverage = {item["input"]: item for item in payload["coverage"]["inputs"]}
    assert set(coverage) == {"x", "mask"} and coverage["x"]["tail"] and coverage["mask"]["size_one"]
    assert payload["coverage"]["warnings"] == []


# ---------------------------------------------------------------- floating-point contraction


def test_simd_units_set_fp_contract_explicitly_and_the_validator_warns_without(tmp_path):
    from kernel_harness.scaffold import generate_project
    from kernel_harness.validate import validate_kernel

    unseen = tmp_path / "unseen"
    generate_project(ScaffoldOptions(ops=("rope",), name="fpc", directory=unseen, signatures=(sig("rope"),)))
    catalogue = tmp_path / "catalogue"
    generate_project(ScaffoldOptions(ops=("rms_norm",), name="fpc", directory=catalogue))
    for directory, wanted in ((unseen, "-ffp-contract=off"), (catalogue, "-ffp-contract=fast")):
        toml = (directory / "build.toml").read_text()
        assert toml.count(f'"{wanted}"') == 2, toml  # both SIMD sections, not the generic one
        assert "fp-contract-implicit" not in {w.code for w in validate_kernel(directory).warnings}
    toml = unseen / "build.toml"
    toml.write_text(toml.read_text().replace(', "-ffp-contract=off"', ""))
    warnings = [w for w in validate_kernel(unseen).warnings if w.code == "fp-contract-implicit"]
    assert len(warnings) == 2 and all("-ffp-contract=off" in w.message for w in warnings)


# ---------------------------------------------------------------- coverage of the checked inputs


def test_coverage_warns_per_tensor_input_about_missing_edge_cases():
    from kernel_harness.bench.coverage import baseline_coverage

    gated = baseline_coverage(DATA / "gated.py")  # only 32 x 512 fp32: no tail, no size-1 dim
    assert [(i["input"], i["tail"], i["size_one"]) for i in gated["inputs"]] == [("x", False, False), ("gate", False, False)]
    assert len(gated["warnings"]) == 4 and all("get_correctness_inputs()" in w for w in gated["warnings"])
    assert any("gate" in w and "multiple of 16" in w for w in gated["warnings"])
    rope = baseline_coverage(DATA / "rope.py")
    assert rope["warnings"] == [] and [i["input"] for i in rope["inputs"]] == ["q", "cos", "sin"]
    # the shipped catalogue examples reach every case
    for example in ("rms_norm", "softmax", "silu_and_mul"):
        path = Path(__file__).resolve().parent.parent / "examples" / example / "baseline.py"
        assert baseline_coverage(path)["warnings"] == [], example


def test_coverage_lanes_and_strides():
    import torch

    from kernel_harness.bench.coverage import input_coverage, lanes

    assert (lanes(torch.float32), lanes(torch.bfloat16), lanes(torch.bool)) == (16, 32, 64)
    x = torch.randn(4, 64)
    sets = [[x, 2.0], [torch.randn(64, 4).t(), 1.0]]
    (item,) = input_coverage(sets, ["x", "alpha"])
    assert item["non_contiguous"] and not item["tail"] and not item["size_one"]
    assert item["input"] == "x" and len(item["missing"]) == 2
    bf16 = input_coverage([[torch.randn(3, 48).bfloat16()]], ["x"])[0]
    assert bf16["tail"] and bf16["lanes"] == [32]  # 48 is a multiple of 16 fp32 lanes, not of 32 bf16 lanes


# ---------------------------------------------------------------- the shipped unseen-op examples

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE_PACKAGES = {"rope": "rope_kernel", "masked_softmax": "masked_softmax_kernel"}


@pytest.mark.parametrize("op", sorted(EXAMPLE_PACKAGES))
def test_example_solutions_fit_the_generated_package(script, tmp_path, op):
    """The solutions hold only the op parts of the three editable units (no copy of the
    template vocabulary to go stale); new_kernel.py --bodies splices them into a package
    generated from today's templates, which then validates clean, complete."""
    package = EXAMPLE_PACKAGES[op]
    solution = EXAMPLES / op / "solution" / f"{package}_cpu"
    editable = sorted(p.name for p in solution.iterdir())
    assert editable == sorted([f"{package}_cpu.cpp", f"{package}_avx2.cpp", f"{package}_avx512.cpp"])
    for name in editable:
        assert (solution / name).read_text().startswith(f"// {op}"), f"{name} holds template text"
    d = tmp_path / "kernel"
    run = script("new_kernel", "--op", op, "--name", package, "--dir", d, "--from-baseline",
                 EXAMPLES / op / "baseline.py", "--bodies", solution, "--json", tmp_path / "n.json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "n.json").read_text())["unfinished_ops"] == []
    for name in editable:
        text = (d / f"{package}_cpu" / name).read_text()
        assert text.endswith((solution / name).read_text()) and "KERNEL_TODO(\"" not in text, name
    check = script("validate_cpu_kernel", d, "--json", tmp_path / "v.json", cwd=tmp_path)
    report = json.loads((tmp_path / "v.json").read_text())
    assert check.returncode == 0 and report["errors"] == [] and report["warnings"] == [], report


def test_bodies_regenerate_a_kernel_keeping_its_code_and_refuse_a_file_without_an_op(script, tmp_path):
    """An agent's edited units (whole files) go through --bodies into a fresh generation:
    the op code survives, the template part is today's; a unit with no op section is
    refused with exit 2, naming the file, and nothing is written."""
    first, again = tmp_path / "k1", tmp_path / "k2"
    gen = ("new_kernel", "--op", "rope", "--name", "rope_kernel", "--from-baseline", EXAMPLES / "rope" / "baseline.py")
    assert script(*gen, "--dir", first, cwd=tmp_path).returncode == 0
    unit = first / "rope_kernel_cpu" / "rope_kernel_avx2.cpp"
    unit.write_text(unit.read_text().replace('KERNEL_TODO("rope", "avx2");', "/* the agent's loop */"))
    assert script(*gen, "--dir", again, "--bodies", first / "rope_kernel_cpu", cwd=tmp_path).returncode == 0
    assert (again / "rope_kernel_cpu" / "rope_kernel_avx2.cpp").read_text() == unit.read_text()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rope_kernel_avx2.cpp").write_text("int main() {}\n")
    bad = script(*gen, "--dir", tmp_path / "k3", "--bodies", tmp_path / "bad", cwd=tmp_path)
    assert bad.returncode == 2 and "rope_kernel_avx2.cpp" in bad.stderr + bad.stdout
    assert not (tmp_path / "k3").exists()


WRAPPERS = {
    "rope": ('extern "C" void run(float* out, const float* q, int64_t T, int64_t H, int64_t D, const float* c, '
             'const float* s) {{ {ns}::{tier}::rope({ns}::DType::F32, out, q, T, H, D, c, T, D / 2, s, T, D / 2); }}'),
    "masked_softmax": ('extern "C" void run(float* out, const float* x, int64_t B, int64_t H, int64_t T, int64_t S, '
                       'const bool* m, double scale) {{ {ns}::{tier}::masked_softmax({ns}::DType::F32, out, x, B, H, '
                       'T, S, m, B, 1, T, S, scale); }}'),
}


@pytest.mark.slow
def compile_example_unit(tmp_path: Path, op: str, package: str, tier: str, wrapper: str):
    """One example's solution unit of ``tier``, compiled with its generated build.toml
    flags next to a C wrapper, loaded with ctypes; with the example's baseline module.
    Skips where this CPU cannot run the tier's instructions."""
    import importlib.util

    ns = f"{package}_cpu"
    plan = plan_project(ScaffoldOptions(ops=(op,), name=package, directory=tmp_path,
                                        signatures=(signature_from_baseline(EXAMPLES / op / "baseline.py", op),)))
    splice_bodies(plan, EXAMPLES / op / "solution" / ns)
    lib = compile_tier_unit(plan, package, tier, wrapper, tmp_path)
    spec = importlib.util.spec_from_file_location(f"{op}_baseline", EXAMPLES / op / "baseline.py")
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    return lib, baseline


@pytest.mark.parametrize("tier", ["avx2", "avx512"])
@pytest.mark.parametrize("op", sorted(EXAMPLE_PACKAGES))
def test_example_simd_bodies_match_the_float64_reference_bit_for_bit(tmp_path, op, tier):
    """Each SIMD unit, compiled with its build.toml flags, on every fp32 correctness set."""
    import ctypes

    import torch

    package = EXAMPLE_PACKAGES[op]
    ns = f"{package}_cpu"
    lib, baseline = compile_example_unit(tmp_path, op, package, tier,
                                         WRAPPERS[op].format(ns=ns, tier=tier))
    torch.manual_seed(0)
    sets = [s for s in baseline.get_correctness_inputs() if s[0].dtype == torch.float32]
    sets += [[s[0].float(), *s[1:]] for s in baseline.get_correctness_inputs() if s[0].dtype != torch.float32]
    assert len(sets) >= 3
    for inputs in sets:
        first = inputs[0]
        out = torch.empty_like(first)
        ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
        dims = [ctypes.c_int64(v) for v in first.shape]
        if op == "rope":
            lib.run(ptr(out), ptr(first), *dims, ptr(inputs[1]), ptr(inputs[2]))
        else:
            lib.run(ptr(out), ptr(first), *dims, ptr(inputs[1]), ctypes.c_double(inputs[2]))
        reference = baseline.get_reference_output(*inputs)
        assert torch.equal(out, reference), (op, tier, tuple(first.shape), (out - reference).abs().max().item())


def test_cli_signature_and_count_mismatch(script, tmp_path):
    sig_text = "q: Tensor[bf16,fp32](T,H,D), cos: Tensor[fp32](T,D2), sin: Tensor[fp32](T,D2) -> Tensor(like q)"
    run = script("new_kernel", "--op", "rope", "--name", "sig_k", "--dir", tmp_path / "k", "--signature", sig_text,
                 "--json", tmp_path / "g.json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    init = (tmp_path / "k/torch-ext/sig_k/__init__.py").read_text()
    assert "def rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None)" in init
    assert json.loads((tmp_path / "g.json").read_text())["signatures"]["rope"]["source"] == "--signature"
    two = script("new_kernel", "--op", "rope,rms_norm,other", "--name", "sig_k", "--dir", tmp_path / "k2",
                 "--signature", sig_text, cwd=tmp_path)
    assert two.returncode == 2 and "one per such op" in two.stderr and not (tmp_path / "k2").exists()
    bad = script("new_kernel", "--op", "x", "--name", "sig_k", "--dir", tmp_path / "k3",
                 "--signature", "x: Tensor, n: complex -> Tensor", cwd=tmp_path)
    assert bad.returncode == 2 and "complex" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["avx2", "avx512"])
def test_masked_softmax_bf16_fast_path_is_bit_equal_to_the_float64_reference(tmp_path, tier):
    """Each SIMD body's bf16 rows (fp32 exp, screened stores, fix-ups in double) on every bf16 set plus
    enough headline-like rows that the screen flags lanes (about 1 in 4400) and fix-ups run. On a
    CPU without AVX512-BF16 the AVX512 unit's bf16 stores take their integer path (kBf16)."""
    import ctypes

    import torch

    package, op = "masked_softmax_kernel", "masked_softmax"
    ns = f"{package}_cpu"
    lib, baseline = compile_example_unit(
        tmp_path, op, package, tier,
        f'extern "C" void run(void* out, const void* x, int64_t B, int64_t H, '
        f'int64_t T, int64_t S, const bool* m, double scale) {{ {ns}::{tier}::masked_softmax({ns}::DType::BF16, out, '
        f'x, B, H, T, S, m, B, 1, T, S, scale); }}')
    torch.manual_seed(0)
    sets = [[s[0].bfloat16(), *s[1:]] for s in baseline.get_correctness_inputs()]
    sets += [baseline._case(1, 4, 256, 512, torch.bfloat16, scale=scale) for scale in (0.125, 0.0883883)]
    sets.append(baseline._case(2, 2, 8, 77, torch.bfloat16, scale=-0.5))  # scale <= 0: the double path
    for x, mask, scale in sets:
        out = torch.empty_like(x)
        ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
        lib.run(ptr(out), ptr(x), *[ctypes.c_int64(v) for v in x.shape], ptr(mask), ctypes.c_double(scale))
        reference = baseline.get_reference_output(x, mask, scale)
        assert torch.equal(out, reference), (tuple(x.shape), scale, (out.float() - reference.float()).abs().max().item())


def test_entry_point_without_a_dtype_to_dispatch_on_still_enters_the_unit(tmp_path):
    """An op whose tensors are all of fixed non-float dtypes has no KERNEL_DISPATCH_DTYPE, whose first
    step (KERNEL_UNIT_ENTER) fills the avx512 unit's CPU answers: its entry point must take that step
    itself, before the body, or its loops read kBf16 and kFastGather as false until another op ran."""
    signature = parse_signature("count_set", "x: Tensor[int32](N) -> Tensor(N; int64)")
    assert signature.primary is None
    plan = plan_project(ScaffoldOptions(ops=("count_set",), name="noprim", directory=tmp_path / "k",
                                        signatures=(signature,), force=True))
    for tier in ("avx2", "avx512"):
        unit = plan.files[f"noprim_cpu/noprim_{tier}.cpp"]
        entry = unit[unit.index("void count_set("):]
        entry = entry[:entry.index("\n}\n")]
        assert entry.index("KERNEL_UNIT_ENTER();") < entry.index("count_set_body("), (tier, entry)
