"""SKILL.md must never drift from the code: its quick start runs, block by block."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROJECT_ROOT

SKILL = PROJECT_ROOT / "SKILL.md"
PACKAGE = "my_rmsnorm_kernel"


def quick_start_blocks() -> list[str]:
    text = SKILL.read_text(encoding="utf-8")
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert section, "SKILL.md has no '## Quick start' section"
    return re.findall(r"```bash\n(.*?)```", section.group(1), re.DOTALL)


def test_quick_start_names_only_existing_scripts_and_flags():
    blocks = "\n".join(quick_start_blocks())
    for script in set(re.findall(r"scripts/(\w+)\.py", blocks)):
        assert (PROJECT_ROOT / "scripts" / f"{script}.py").is_file(), script
    for path in set(re.findall(r"(examples/\S+\.py)", blocks)):
        assert (PROJECT_ROOT / path).is_file(), path


def test_skill_mentions_every_reference_it_names():
    text = SKILL.read_text(encoding="utf-8")
    for name in set(re.findall(r"references/([\w\-.]+\.(?:md|yaml))", text)):
        assert (PROJECT_ROOT / "references" / name).is_file(), name


@pytest.mark.slow
def test_quick_start_runs_in_order(tmp_path):
    workspace = tmp_path / "work"
    workspace.mkdir()
    for name in ("scripts", "examples", "references"):
        (workspace / name).symlink_to(PROJECT_ROOT / name)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    try:
        for index, block in enumerate(quick_start_blocks()):
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=workspace, env=env,
                                  capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"block {index} failed:\n{block}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        assert (workspace / "output" / "summary.json").is_file()
        assert (workspace / "trials" / "my_rmsnorm" / "t0").is_dir()
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", PACKAGE], capture_output=True)
