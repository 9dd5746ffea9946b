"""``python -m kernel_harness.demo --op rms_norm``: what ``make demo`` runs."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..cli import console, run_main
from ..paths import PROJECT_ROOT
from .procedure import EXAMPLE_OPS, run_demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run SKILL.md's procedure end to end on a shipped example.")
    parser.add_argument("--op", default="rms_norm", choices=EXAMPLE_OPS)
    parser.add_argument("--workspace", type=Path, default=PROJECT_ROOT / "demo-run",
                        help="fresh working directory for trials/, output/, the kernel and logs (default: demo-run/)")
    args = parser.parse_args(argv)
    return run_demo(args.op, args.workspace.resolve(), console)


if __name__ == "__main__":
    run_main(main)
