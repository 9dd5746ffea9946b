"""The emulated CPUs: QEMU user-mode models and what each one may run.

QEMU's TCG (7.2, Debian bookworm's ``qemu-user``) implements AVX, AVX2, FMA
and F16C but no AVX512 at all, so it can prove the fallbacks of a package on
any host, never its AVX512 tier. Two models cover the dispatcher's fallbacks:

* ``haswell``: AVX2 + FMA + F16C, no AVX512 -> the ``avx2`` tier (the generated
  ``cpu_features.hpp`` requires all three for it; measured: the catalogue
  package reports ``['generic', 'avx2']`` there and torch reports ``AVX2``);
* ``nehalem``: SSE4.2, no AVX -> the ``generic`` tier only (measured: torch
  2.13 imports there, ~27 s, and reports ``DEFAULT``).

``torch_capability`` is what ``torch.backends.cpu.get_cpu_capability()`` must
say inside the emulator; a different answer means the emulation is not the
CPU we think (e.g. QEMU was not given ``-cpu``), and the run is refused as
evidence instead of proving the wrong thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class CpuModel:
    key: str  # what --cpu accepts
    qemu_name: str  # what qemu-x86_64 -cpu accepts
    tiers: tuple[str, ...]  # dispatcher tiers this CPU can run, slowest first
    torch_capability: str
    description: str
    # OpenBLAS's core type for this CPU (OPENBLAS_CORETYPE): numpy's bundled OpenBLAS
    # picks its kernels at import, and under qemu-user on a Zen 5 host it chose
    # "Haswell" for an emulated Nehalem and died of SIGILL inside `import numpy`,
    # before the package was loaded at all; the emulated run names the core instead.
    openblas_core: str = ""

    @property
    def label(self) -> str:
        """How evidence names the CPU: ``QEMU Haswell (emulated)``."""
        return f"QEMU {self.qemu_name} (emulated)"


MODELS: dict[str, CpuModel] = {
    "haswell": CpuModel("haswell", "Haswell", ("generic", "avx2"), "AVX2",
                        "Intel Haswell: AVX2, FMA, F16C, no AVX512", openblas_core="Haswell"),
    "nehalem": CpuModel("nehalem", "Nehalem", ("generic",), "DEFAULT",
                        "Intel Nehalem: SSE4.2, no AVX", openblas_core="Nehalem"),
}

#: Why no emulated model can run the AVX512 tier (said in the evidence).
NO_AVX512_REASON = ("QEMU's TCG emulates no AVX512, so an emulated run proves the "
                    "fallback tiers only; run the benchmark on a CPU with AVX512 for this tier")


def models_for(choice: str) -> list[CpuModel]:
    """``--cpu haswell|nehalem|all`` as a list of models."""
    if choice == "all":
        return list(MODELS.values())
    try:
        return [MODELS[choice]]
    except KeyError:
        raise UsageError(f"--cpu {choice!r} is not an emulated CPU model; use one of "
                         f"{', '.join(MODELS)} or all.") from None
