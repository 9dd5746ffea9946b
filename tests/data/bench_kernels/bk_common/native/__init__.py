"""The C++ rms_norm of bk_native / bk_native_spin, compiled on first use.

torch.utils.cpp_extension.load builds it once into a cache directory named after
the source's content hash (under KERNEL_HARNESS_TEST_CACHE or ~/.cache), and holds
a file lock while building, so the three workers of one --against run that import
it at once build it once."""

import hashlib
import os
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("rms_norm_spin.cpp")


@cache
def extension():
    from torch.utils.cpp_extension import load

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    root = Path(os.environ.get("KERNEL_HARNESS_TEST_CACHE",
                               Path.home() / ".cache" / "kernel_harness" / "test-kernels"))
    build = root / f"bk_native_{digest}"
    build.mkdir(parents=True, exist_ok=True)
    return load(name=f"bk_native_{digest}", sources=[str(SOURCE)], build_directory=str(build),
                extra_cflags=["-O3", "-std=c++20"], verbose=False)
