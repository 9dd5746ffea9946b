"""Print the resolved harness configuration (procedure step 1)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
from rich.table import Table

from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.config import CONFIG_ENV_VAR, load_config


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=f"Print the resolved values of scripts/config.yaml (or of ${CONFIG_ENV_VAR})."
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    config = load_config()
    table = Table(title=f"Configuration from {config.source}")
    table.add_column("key")
    table.add_column("value")
    for key, value in config.as_dict().items():
        if key != "source":
            table.add_row(key, str(value))
    console.print(table)
    write_json_report(args.json, config.as_dict())
    return 0


if __name__ == "__main__":
    run_main(main)
