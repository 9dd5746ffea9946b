"""What a node must share with the driver for a remote run to be *the same* benchmark.

A remote run executes the node's own ``scripts/benchmark_cpu.py`` under the
node's torch.  Its report is only comparable with a local one (and only fit
for the same trial) when the node runs the same harness code and the same
torch as the driver, and loads the build variant the package was built for.
The variant is matched before submitting (the ``torch_variant:`` resource of
:mod:`.classes`); all three are checked again on the node, at run time,
because a node's checkout or torch can change after ``farm node`` started
(the benchmark subprocess always runs the node's current files).

The harness is named by its version and a hash of its code (every ``.py``
file of the package and of ``scripts/``, plus ``scripts/*.yaml``): the
version alone stays 0.1.0 across every commit of a development checkout.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import __version__
from ..paths import PROJECT_ROOT, SCRIPTS_DIR

PACKAGE_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Identity:
    """One side of the comparison: the harness and torch a process runs, and the variant it loads."""

    harness_version: str
    #: first 12 hex digits of the sha256 over the harness code (see :func:`harness_source_id`)
    harness_source: str
    torch_version: str
    variant: str

    def describe(self) -> str:
        return (f"kernel-harness {self.harness_version} (code {self.harness_source}), torch {self.torch_version} "
                f"({self.variant})")

    def as_json(self) -> dict[str, str]:
        return asdict(self)


def _code_files() -> list[Path]:
    files = [p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts]
    files += [*SCRIPTS_DIR.glob("*.py"), *SCRIPTS_DIR.glob("*.yaml")]
    return sorted(set(files), key=lambda p: p.relative_to(PROJECT_ROOT).as_posix())


def harness_source_id() -> str:
    """A hash of the harness code: paths and contents, independent of where the checkout lives."""
    digest = hashlib.sha256()
    for path in _code_files():
        digest.update(path.relative_to(PROJECT_ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def local_identity(variant: str | None = None) -> Identity:
    """This process's side; ``variant`` is the package's (driver) or None for this torch's (node)."""
    from ..build.toolchain import torch_info  # noqa: PLC0415 - a cached probe, no torch import here

    info = torch_info()
    return Identity(harness_version=__version__, harness_source=harness_source_id(),
                    torch_version=info.torch_version, variant=variant or info.variant)


def differences(driver: Identity, node: Identity) -> list[str]:
    """The fields in which the node differs from the driver (empty: the same benchmark)."""
    labels = {"harness_version": "harness version", "harness_source": "harness code",
              "torch_version": "torch version", "variant": "build variant (torch / C++ ABI)"}
    return [label for key, label in labels.items() if getattr(driver, key) != getattr(node, key)]


def mismatch_message(driver: Identity, node: Identity, node_name: str) -> str:
    """The exit-2 paragraph naming both sides and the fix."""
    return (f"Node {node_name} cannot run the same benchmark: its {', '.join(differences(driver, node))} "
            f"differ(s) from this driver's. The node runs {node.describe()}; this driver runs "
            f"{driver.describe()} with a package built for {driver.variant}. Nothing was run or recorded. "
            "Check out the same harness commit and install the same torch on both (then restart the node with "
            "`python -m kernel_harness.farm stop` and `farm node ...`), or rebuild the package with the node's "
            "torch.")
