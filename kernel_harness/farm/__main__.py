"""``python -m kernel_harness.farm``: see :mod:`kernel_harness.farm.cli`."""

from kernel_harness.cli import run_main
from kernel_harness.farm.cli import main

run_main(main)
