"""A demo recipe: the sequence of one-change trials shipped with an example.

Each trial names its parent (a trial id, or ``best`` for the best so far) and
the compile-time knobs it changes in the unit of the tier this machine runs
(``{tier}`` in ``source``: the AVX512 unit on a CPU with the avx512 tier, the
AVX2 unit on an AVX2-only host; the generated units share the knob names).
Editing a unit the machine never executes would record noise as results.
Knobs are ``#define`` lines of the generated source, so every trial is a real,
different kernel and the change is exactly one thing. A strategy is one text
(``{TIER}`` becomes ``AVX512``/``AVX2``) or a mapping tier -> text when the
change means different instructions per tier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import UsageError
from ..portability.host import widest_tier


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
    source: str  # the tier's unit, relative to the kernel directory, with {name} and {tier}
    initial_strategy: str
    initial_defines: dict[str, str]
    trials: tuple[RecipeTrial, ...] = field(default_factory=tuple)
    large_baseline: str | None = None
    tier: str = "avx512"  # the tier whose unit the trials edit

    def source_path(self, kernel_dir: Path) -> Path:
        return kernel_dir / self.source.format(name=self.package, tier=self.tier)


def _defines(path: Path, where: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not value:
        raise UsageError(f"{path}: {where} must be a non-empty mapping of #define names to values.")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def _strategy(path: Path, where: str, value: Any, tier: str) -> str:
    if isinstance(value, dict):
        if tier not in value:
            raise UsageError(f"{path}: {where} has no text for the {tier} tier (it has {', '.join(value)}).")
        value = value[tier]
    return str(value).replace("{TIER}", tier.upper())


def load_recipe(path: Path, tier: str | None = None) -> Recipe:
    """The recipe for the unit of ``tier`` (default: the widest tier this machine runs)."""
    tier = tier or widest_tier()
    if tier not in ("avx2", "avx512"):
        raise UsageError("The demo's trials change knobs of a SIMD unit, but this machine runs only the "
                         "generic tier (the avx2 tier needs AVX2, FMA and F16C). Run make demo on an x86-64 "
                         "CPU with AVX2.")
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
            strategy=_strategy(path, f"trials[{index}].strategy", item["strategy"], tier),
            parent=str(item.get("parent", "best")),
            defines=_defines(path, f"trials[{index}].defines", item.get("defines")),
        )
        for index, item in enumerate(data["trials"])
    )
    return Recipe(
        op=data["op"], package=data["package"], function=data["function"], dtype=data["dtype"],
        shapes=data["shapes"], source=data["source"],
        initial_strategy=_strategy(path, "initial.strategy", initial["strategy"], tier),
        initial_defines=_defines(path, "initial.defines", initial.get("defines")),
        trials=trials,
        large_baseline=data.get("large_baseline"),
        tier=tier,
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
