"""The CPU classes of a node and the Ray resources that advertise them.

A *class* is a kernel tier a node can run (:mod:`kernel_harness.cpu` decides,
with the same flag sets the generated dispatcher checks: ``avx512`` needs
AVX512 F/BW/VL/DQ, so an Ice Lake Xeon is an ``avx512`` node and a Zen 3 an
``avx2`` one) plus ``amx``.  A node
advertises, with quantity 1 each:

* ``bench_slot`` - the one slot every benchmark holds, so jobs on a node run
  one after another;
* ``isa_<class>`` for every class it has (``--cpu-class`` asks for one);
* ``cpu_class:<top>`` - its highest class (``--all-cpu-classes`` runs once per
  distinct top class);
* ``cpu_model:<slug>`` - the CPU model, for ``farm status``;
* ``torch_variant:<variant>`` - the build variant its torch loads
  (``torch213-cxx11-cpu-x86_64-linux``), so a package only goes where it loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import cpu

SLOT = "bench_slot"
ISA_PREFIX = "isa_"
CLASS_PREFIX = "cpu_class:"
MODEL_PREFIX = "cpu_model:"
VARIANT_PREFIX = "torch_variant:"
#: Selectable classes, lowest first; ``generic`` is the top class of a node without AVX2.
CLASSES: tuple[str, ...] = ("avx2", "avx512", "amx")
#: Fraction of a class/variant resource a job asks for: the slot serialises, these only select.
SELECT = 0.01


def machine_classes() -> list[str]:
    """The classes this machine has (honours ``KERNEL_HARNESS_CPU_FLAGS``), lowest first."""
    return [name for name in CLASSES if cpu.has_isa(name)]


def top_class(classes: list[str]) -> str:
    """The highest class of ``classes`` (``generic`` when empty)."""
    ranked = [name for name in CLASSES if name in classes]
    return ranked[-1] if ranked else "generic"


def slug(text: str) -> str:
    """A resource-name-safe form of a CPU model name."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unknown"


def node_resources(variant: str) -> dict[str, float]:
    """The custom resources ``farm node`` starts this machine's Ray node with."""
    classes = machine_classes()
    resources = {SLOT: 1.0}
    resources.update({ISA_PREFIX + name: 1.0 for name in classes})
    resources[CLASS_PREFIX + top_class(classes)] = 1.0
    resources[MODEL_PREFIX + slug(cpu.cpu_model())] = 1.0
    resources[VARIANT_PREFIX + variant] = 1.0
    return resources


@dataclass(frozen=True)
class NodeInfo:
    """One alive Ray node as the farm sees it (from ``ray.nodes()``)."""

    node_id: str
    address: str
    hostname: str
    classes: tuple[str, ...]
    top: str
    model: str
    variant: str | None
    slots: int
    free_slots: int

    @property
    def is_bench_node(self) -> bool:
        return self.slots > 0


def _suffix(resources: dict[str, float], prefix: str) -> str | None:
    return next((key[len(prefix):] for key in resources if key.startswith(prefix)), None)


def node_info(raw: dict) -> NodeInfo:
    """Read one entry of ``ray.nodes()`` (with the available resources merged in by the caller)."""
    total: dict[str, float] = raw.get("Resources", {}) or {}
    available: dict[str, float] = raw.get("Available", {}) or {}
    classes = tuple(name for name in CLASSES if ISA_PREFIX + name in total)
    return NodeInfo(
        node_id=raw.get("NodeID", "?"),
        address=raw.get("NodeManagerAddress", "?"),
        hostname=raw.get("NodeManagerHostname", "?"),
        classes=classes,
        top=_suffix(total, CLASS_PREFIX) or top_class(list(classes)),
        model=_suffix(total, MODEL_PREFIX) or "unknown",
        variant=_suffix(total, VARIANT_PREFIX),
        slots=int(total.get(SLOT, 0)),
        free_slots=int(available.get(SLOT, 0) + 1e-9),
    )
