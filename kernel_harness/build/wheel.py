"""Write a wheel of the variant directory with the standard library's ``zipfile``.

The wheel installs the package ``<python_name>`` (the variant's files: the
Python modules, ``_ops.py``, the .so and metadata.json) so that the configured
``install_command`` (``pip install dist/*.whl --force-reinstall --no-deps``)
makes ``import <python_name>`` work.  Older wheels of the same package are
removed from ``dist/`` because ``dist/*.whl`` matching two versions of one
package makes pip refuse to install.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import zipfile
from pathlib import Path

from .plan import BuildPlan

_EPOCH = (1980, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def wheel_version(plan: BuildPlan) -> str:
    # The local label carries the content id, so `pip show` says which build is installed.
    return f"{plan.toml.general.version}.0.0+{plan.names.build_id}"


def wheel_tag(plan: BuildPlan) -> str:
    return f"{plan.torch.python_tag}-abi3-linux_{plan.torch.arch}"


def _metadata(plan: BuildPlan, version: str) -> str:
    general = plan.toml.general
    torch_next = f"{plan.torch.major}.{plan.torch.minor + 1}"
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {plan.names.python_name}",
        f"Version: {version}",
        f"Summary: CPU kernel {general.name} built by kernel_harness ({plan.variant})",
        f"License: {general.license}",
        "Requires-Python: >=3.9",
        # the .so is tied to torch's C++ ABI of this minor version
        f"Requires-Dist: torch>={plan.torch.major}.{plan.torch.minor},<{torch_next}",
        *(f"Requires-Dist: {dep}" for dep in general.python_depends),
        "",
    ]
    return "\n".join(lines)


def _wheel_file(tag: str) -> str:
    return "\n".join(
        ["Wheel-Version: 1.0", "Generator: kernel_harness", "Root-Is-Purelib: false", f"Tag: {tag}", ""]
    )


def write_wheel(plan: BuildPlan, variant_dir: Path, dist_dir: Path) -> Path:
    name = plan.names.python_name
    version = wheel_version(plan)
    tag = wheel_tag(plan)
    dist_dir.mkdir(parents=True, exist_ok=True)
    filename = f"{name}-{version}-{tag}.whl"
    dist_info = f"{name}-{version}.dist-info"
    records: list[str] = []
    tmp = dist_dir / f".{filename}.{os.getpid()}.tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:

        def add(arcname: str, data: bytes, mode: int = 0o644) -> None:
            info = zipfile.ZipInfo(arcname, date_time=_EPOCH)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
            records.append(f"{arcname},{_record_hash(data)},{len(data)}")

        for path in sorted(p for p in variant_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            rel = path.relative_to(variant_dir).as_posix()
            mode = 0o755 if path.suffix == ".so" else 0o644
            add(f"{name}/{rel}", path.read_bytes(), mode)
        add(f"{dist_info}/METADATA", _metadata(plan, version).encode())
        add(f"{dist_info}/WHEEL", _wheel_file(tag).encode())
        add(f"{dist_info}/top_level.txt", f"{name}\n".encode())
        record_name = f"{dist_info}/RECORD"
        records.append(f"{record_name},,")
        info = zipfile.ZipInfo(record_name, date_time=_EPOCH)
        info.external_attr = (0o100644) << 16
        archive.writestr(info, "\n".join(records) + "\n")
    final = dist_dir / filename
    os.replace(tmp, final)
    pattern = re.compile(rf"^{re.escape(name)}-[^-]+-.*\.whl$")
    for other in dist_dir.glob("*.whl"):
        if other != final and pattern.match(other.name):
            other.unlink(missing_ok=True)
    return final
