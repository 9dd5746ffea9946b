"""The demo's recipes: every shipped recipe loads and its knobs exist in the generated source."""

from __future__ import annotations

import pytest

from conftest import PROJECT_ROOT
from kernel_harness.demo.procedure import EXAMPLE_OPS
from kernel_harness.demo.recipe import apply_defines, load_recipe
from kernel_harness.errors import UsageError
from kernel_harness.scaffold import ScaffoldOptions, generate_project


def test_apply_defines_rewrites_only_named_knobs(tmp_path):
    source = tmp_path / "k.cpp"
    source.write_text("#define ACCUMULATORS 4\n#define PREFETCH 0\nint x;\n")
    apply_defines(source, {"ACCUMULATORS": "8"})
    assert source.read_text() == "#define ACCUMULATORS 8\n#define PREFETCH 0\nint x;\n"
    with pytest.raises(UsageError, match="no '#define MISSING'"):
        apply_defines(source, {"MISSING": "1"})


@pytest.mark.parametrize("tier", ["avx512", "avx2"])
@pytest.mark.parametrize("op", EXAMPLE_OPS)
def test_recipe_knobs_exist_in_the_generated_unit_of_each_tier(op, tier, tmp_path):
    recipe = load_recipe(PROJECT_ROOT / "examples" / op / "recipe.yaml", tier=tier)
    assert recipe.source_path(tmp_path).name == f"{recipe.package}_{tier}.cpp"
    assert recipe.initial_strategy.startswith(tier.upper())
    assert not any("{" in t.strategy for t in recipe.trials)
    if tier == "avx2":
        assert not any("VDPBF16PS" in t.strategy for t in recipe.trials)
    assert len(recipe.trials) >= 4
    assert len({tuple(sorted(t.defines.items())) for t in recipe.trials}) == len(recipe.trials)
    kernel = tmp_path / "kernel"
    generate_project(ScaffoldOptions(ops=(recipe.op,), name=recipe.package, directory=kernel))
    source = recipe.source_path(kernel)
    apply_defines(source, recipe.initial_defines)
    for trial in recipe.trials:
        apply_defines(source, trial.defines)


def test_the_demo_edits_the_unit_of_the_widest_tier_this_machine_runs(monkeypatch):
    monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", "avx avx2 fma f16c avx512f avx512cd")
    recipe = load_recipe(PROJECT_ROOT / "examples" / "rms_norm" / "recipe.yaml")
    assert recipe.tier == "avx2"  # AVX512F without BW/VL/DQ (Knights Landing): the avx512 tier never runs
    monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", "avx2 fma f16c avx512f avx512bw avx512vl avx512dq")
    assert load_recipe(PROJECT_ROOT / "examples" / "rms_norm" / "recipe.yaml").tier == "avx512"  # Ice Lake
    monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", "sse4_2")
    with pytest.raises(UsageError, match="only the generic tier"):
        load_recipe(PROJECT_ROOT / "examples" / "rms_norm" / "recipe.yaml")
