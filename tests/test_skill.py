"""SKILL.md must never drift from the code: its quick start runs, block by block."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PROJECT_ROOT

SKILL = PROJECT_ROOT / "SKILL.md"
PACKAGE = "my_rmsnorm_kernel"


def section_blocks(title: str) -> list[str]:
    """The bash blocks of one SKILL.md section, in order."""
    text = SKILL.read_text(encoding="utf-8")
    section = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert section, f"SKILL.md has no '## {title}' section"
    return re.findall(r"```bash\n(.*?)```", section.group(1), re.DOTALL)


def quick_start_blocks() -> list[str]:
    return section_blocks("Quick start")


def assert_named_files_exist(blocks: list[str]) -> None:
    """Every script and example file a section's commands name exists."""
    text = "\n".join(blocks)
    for script in set(re.findall(r"scripts/(\w+)\.py", text)):
        assert (PROJECT_ROOT / "scripts" / f"{script}.py").is_file(), script
    for path in set(re.findall(r"(examples/\S+\.py)", text)):
        assert (PROJECT_ROOT / path).is_file(), path


UNRELIABLE_ATTEMPTS = 3
UNRELIABLE_PAUSE_S = 20.0


def run_block_until_reliable(block: str, workspace: Path, env: dict, *, timeout: float) -> subprocess.CompletedProcess:
    """One block, run again (after a pause for the other tenant's burst to pass) while
    the harness refuses its timing as unreliable; skips the test if it never stops."""
    for attempt in range(UNRELIABLE_ATTEMPTS):
        if attempt:
            time.sleep(UNRELIABLE_PAUSE_S)
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=workspace, env=env,
                              capture_output=True, text=True, timeout=timeout)
        said = proc.stdout + proc.stderr
        if proc.returncode == 0 or "unreliable" not in said:
            return proc
    assert "Nothing was recorded" in said, f"an unreliable run's refusal must say nothing was recorded:\n{said[-3000:]}"
    # the report's UNRELIABLE paragraph, unwrapped (rich folds it at the terminal width)
    found = re.search(r"UNRELIABLE:(.*?)(?:\n\s*what to do|\Z)", said, re.DOTALL)
    reason = " ".join(found.group(1).split()) if found else "the timing was unreliable"
    pytest.skip(f"the harness refused {UNRELIABLE_ATTEMPTS} timings in a row on this busy host ({reason})")


def run_blocks_in_order(blocks: list[str], workspace: Path, *, timeout: float) -> list[str]:
    """Run each block with bash -euo pipefail in a workspace that links the project's
    scripts, examples and references, as a user in a checkout would; their outputs.

    A block that fails because a benchmark run was marked unreliable (another job
    took the CPUs of this shared machine, and ``result`` refused to record it) is
    run again after a pause, as SKILL.md tells the user to: its blocks are cut so
    that a rerun records nothing twice. If the host stays that busy for every
    attempt, the refusal itself is checked (it must say nothing was recorded) and
    the test is skipped with the harness's own reason: the quick start cannot be
    judged on a machine the harness rightly refuses to time."""
    workspace.mkdir()
    for name in ("scripts", "examples", "references"):
        (workspace / name).symlink_to(PROJECT_ROOT / name)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    outputs = []
    for index, block in enumerate(blocks):
        proc = run_block_until_reliable(block, workspace, env, timeout=timeout)
        assert proc.returncode == 0, f"block {index} failed:\n{block}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout + proc.stderr)
    return outputs


def test_quick_start_names_only_existing_scripts_and_flags():
    assert_named_files_exist(quick_start_blocks())


def test_skill_mentions_every_reference_it_names():
    text = SKILL.read_text(encoding="utf-8")
    for name in set(re.findall(r"references/([\w\-.]+\.(?:md|yaml))", text)):
        assert (PROJECT_ROOT / "references" / name).is_file(), name


@pytest.mark.slow
def test_quick_start_runs_in_order(tmp_path):
    workspace = tmp_path / "work"
    try:
        run_blocks_in_order(quick_start_blocks(), workspace, timeout=900)
        assert (workspace / "output" / "summary.json").is_file()
        assert (workspace / "trials" / "my_rmsnorm" / "t0").is_dir()
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", PACKAGE], capture_output=True)


# --------------------------------------------------------------------------- an op outside the catalogue


def unseen_blocks() -> list[str]:
    return section_blocks("An op outside the catalogue")


def test_unseen_op_section_names_existing_files_and_the_editable_ones():
    assert_named_files_exist(unseen_blocks())
    solution = PROJECT_ROOT / "examples" / "rope" / "solution" / "rope_kernel_cpu"
    assert sorted(p.name for p in solution.iterdir()) == ["rope_kernel_avx2.cpp", "rope_kernel_avx512.cpp", "rope_kernel_cpu.cpp"]
    head = SKILL.read_text(encoding="utf-8").split("## Three names", 1)[0]
    for editable in ("<package>_cpu/<package>_cpu.cpp", "<package>_cpu/<package>_avx2.cpp", "<package>_cpu/<package>_avx512.cpp"):
        assert editable in head, editable


@pytest.mark.slow
def test_unseen_op_section_runs_in_order(tmp_path):
    import json

    workspace = tmp_path / "work"
    outputs = run_blocks_in_order(unseen_blocks(), workspace, timeout=1200)
    # before the bodies: validation names exactly the three unwritten bodies
    assert outputs[0].count("unfinished-body") == 3 and "exit 1" in outputs[0]
    report = json.loads((workspace / "rope.json").read_text())
    assert report["correct"] is True and report["coverage"]["warnings"] == []
    assert "generic" in report["tiers"]["swept"]
