"""Loading the kernel under test and finding its function.

``--kernel-package`` is either the name of an installed package (``my_kernel``)
or a kernel directory, loaded the way users of the ``kernels`` library load it,
with ``kernels.get_local_kernel(Path(dir))`` (the directory's ``build/`` must hold
the variant for this torch).  ``--op`` is ``<package>.<function>``; for a
directory the part before the first dot is the kernel's ``[general] name`` from
its ``build.toml`` with dashes as underscores (``my-kernel`` is the package
``my_kernel``), because the module ``kernels`` imports gets another name.

Loading failures are :class:`KernelCrashed` (exit 3: the kernel could not be
loaded); a wrong ``--op`` is a :class:`UsageError` (exit 2).
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from .buildtoml import python_package_name
from .errors import KernelCrashed, UsageError

#: Attribute set on a module loaded from a directory: the name ``--op`` must use.
KERNEL_NAME_ATTR = "__kernel_harness_name__"


def _is_directory_spec(spec: str) -> bool:
    # a bare name is a package unless a kernel directory of that name is right here:
    # running from the parent of the kernel's sources must not shadow the installed package
    return "/" in spec or spec.startswith(".") or (Path(spec) / "build.toml").is_file()


def kernel_name_from_build_toml(directory: Path) -> str:
    """The Python package of the kernel in ``directory``: ``[general] name``
    with dashes as underscores (kernel-builder spells ``my-kernel`` the
    package ``my_kernel``, which is what ``--op`` names)."""
    toml_path = directory / "build.toml"
    try:
        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KernelCrashed(f"Kernel directory {directory} has no build.toml, so it is not a "
                            "kernel directory. Pass the directory that holds build.toml, or an "
                            "installed package name.") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise KernelCrashed(f"Could not read {toml_path}: {exc}. Fix build.toml "
                            "(scripts/validate_cpu_kernel.py names the problem).") from exc
    name = data.get("general", {}).get("name")
    if not isinstance(name, str) or not name:
        raise KernelCrashed(f"{toml_path} has no [general] name; add name = \"my-kernel\" (dashes; the package is my_kernel).")
    return python_package_name(name)


def load_kernel_module(spec: str) -> ModuleType:
    """Import the kernel: an installed package name or a kernel directory."""
    if _is_directory_spec(spec):
        directory = Path(spec).resolve()
        if not directory.is_dir():
            raise KernelCrashed(f"Kernel directory {spec} does not exist. Pass an existing "
                                "kernel directory or an installed package name.")
        name = kernel_name_from_build_toml(directory)
        try:
            import kernels  # imported lazily: it is slow and only needed here
        except ImportError as exc:
            raise KernelCrashed(f"Loading a kernel directory needs the 'kernels' library, which "
                                f"is not importable: {exc}. Install it in this environment.") from exc
        try:
            module = kernels.get_local_kernel(directory)
        except Exception as exc:  # noqa: BLE001 - any failure here means "could not load"
            raise KernelCrashed(
                f"kernels.get_local_kernel could not load {directory}: {type(exc).__name__}: "
                f"{exc}. Build it first (scripts/build_kernel.py in that directory) so that "
                "build/<variant>/ exists for this torch, then rerun."
            ) from exc
        setattr(module, KERNEL_NAME_ATTR, name)
        return module
    if not spec.replace("_", "a").replace(".", "a").isalnum():
        raise UsageError(f"--kernel-package {spec!r} is neither a directory nor a Python package "
                         "name. Pass e.g. my_kernel or ./my_kernel_dir.")
    try:
        module = importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name and spec.split(".")[0] == exc.name:
            raise KernelCrashed(
                f"Package {spec!r} is not installed in this Python. Build and install the wheel "
                "with the configured build_command and install_command (scripts/config.py shows "
                "them), or pass the kernel directory instead."
            ) from exc
        raise KernelCrashed(f"Importing {spec!r} failed: {exc}.") from exc
    except Exception as exc:  # noqa: BLE001
        raise KernelCrashed(f"Importing {spec!r} raised {type(exc).__name__}: {exc}. A kernel "
                            "that cannot be imported cannot be benchmarked; fix the import "
                            "error (often an undefined symbol: rebuild and reinstall).") from exc
    setattr(module, KERNEL_NAME_ATTR, getattr(module, KERNEL_NAME_ATTR, spec.split(".")[0]))
    return module


def resolve_op(module: ModuleType, op_path: str) -> Callable[..., Any]:
    """The callable ``<package>.<function>`` (``<package>.sub.function`` works too)."""
    package, _, rest = op_path.partition(".")
    name = getattr(module, KERNEL_NAME_ATTR, module.__name__.split(".")[0])
    if not rest:
        raise UsageError(f"--op {op_path!r} must be <package>.<function>, e.g. {name}.rms_norm.")
    if package != name:
        raise UsageError(f"--op {op_path!r} names package {package!r} but the loaded kernel is "
                         f"{name!r}; use --op {name}.{rest}.")
    target: Any = module
    walked = name
    for part in rest.split("."):
        if not hasattr(target, part):
            public = sorted(a for a in dir(target) if not a.startswith("_")
                            and callable(getattr(target, a, None)))
            raise UsageError(f"{walked} has no attribute {part!r} (from --op {op_path}). "
                             f"Its public callables: {', '.join(public) or 'none'}.")
        target = getattr(target, part)
        walked += "." + part
    if not callable(target):
        raise UsageError(f"--op {op_path} is a {type(target).__name__}, not a function.")
    return target
