"""A demo recipe: the sequence of one-change trials shipped with an example.

Each trial names its parent (a trial id, or ``best`` for the best so far) and
the compile-time knobs it changes in the AVX512 unit.  Knobs are ``#define``
lines of the generated source, so every trial is a real, different kernel and
the change is exactly one thing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import UsageError


@dataclass(frozen=True)
class RecipeTrial:
    strategy: str
    parent: str  # a trial id such as "t0", or "best"
    defines: dict[str, str]


@dataclass(frozen=True)
class Recipe:
    op: str
    package: str
    function: str
    dtype: str
    shapes: str
    source: str  # the AVX512 unit, relative to the kernel directory, with {name} for the package
    initial_strategy: str
    initial_defines: dict[str, str]
    trials: tuple[RecipeTrial, ...] = field(default_factory=tuple)
    large_baseline: str | None = None

    def source_path(self, kernel_dir: Path) -> Path:
        return kernel_dir / self.source.format(name=self.package)


def _defines(path: Path, where: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not value:
        raise UsageError(f"{path}: {where} must be a non-empty mapping of #define names to values.")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def load_recipe(path: Path) -> Recipe:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"Could not read the demo recipe {path}: {exc}") from exc
    required = ("op", "package", "function", "dtype", "shapes", "source", "initial", "trials")
    if not isinstance(data, dict) or any(key not in data for key in required):
        raise UsageError(f"The demo recipe {path} must be a mapping with the keys {', '.join(required)}.")
    initial = data["initial"]
    trials = tuple(
        RecipeTrial(
            strategy=str(item["strategy"]),
            parent=str(item.get("parent", "best")),
            defines=_defines(path, f"trials[{index}].defines", item.get("defines")),
        )
        for index, item in enumerate(data["trials"])
    )
    return Recipe(
        op=data["op"], package=data["package"], function=data["function"], dtype=data["dtype"],
        shapes=data["shapes"], source=data["source"],
        initial_strategy=str(initial["strategy"]),
        initial_defines=_defines(path, "initial.defines", initial.get("defines")),
        trials=trials,
        large_baseline=data.get("large_baseline"),
    )


def apply_defines(source_file: Path, defines: dict[str, str]) -> None:
    """Rewrite ``#define NAME value`` lines; a knob missing from the source is an error."""
    text = source_file.read_text(encoding="utf-8")
    for name, value in defines.items():
        pattern = re.compile(rf"^(\s*#\s*define\s+{re.escape(name)})\s+.*$", re.MULTILINE)
        text, count = pattern.subn(lambda m: f"{m.group(1)} {value}", text, count=1)
        if count == 0:
            raise UsageError(
                f"The recipe sets the knob {name}, but {source_file} has no '#define {name}' line. "
                "The template and the recipe disagree; fix the recipe."
            )
    source_file.write_text(text, encoding="utf-8")
