"""A stand-in for scripts/build_kernel.py used as build_command in tests/test_publish.py.

Run from a copy of tests/data/publish/tiny_kernel that has no build/: it writes
build/<variant of the running torch>/ from the pure-Python variant/ directory
and stamps metadata.json with the content id scripts/build_kernel.py would
compute and the kernels-data digest it records, which is all the publisher
needs to see a build made from these sources.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from kernel_harness.build.variant_digest import write_digest  # noqa: E402
from kernel_harness.publish.layout import expected_build_id  # noqa: E402

root = Path.cwd()
major, minor = torch.__version__.split(".")[:2]
abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
variant = root / "build" / f"torch{major}{minor}-{abi}-cpu-{os.uname().machine}-linux"
shutil.copytree(Path(__file__).resolve().parent / "tiny_kernel" / "variant", variant)
meta = json.loads((variant / "metadata.json").read_text())
meta["id"] = f"_tiny_kernel_cpu_{expected_build_id(root) or '0123abc'}"
(variant / "metadata.json").write_text(json.dumps(meta))
write_digest(variant)  # the last step of a real build, too
print(f"fake build: wrote {variant}")
