"""Which tiers of a kernel package ran, where, and proof on CPUs this machine is not.

* :mod:`.units` - the tiers ``build.toml`` declares, each unit's content hash, and the
  hashes a build recorded (``tier_units.json``);
* :mod:`.resolve` - which units a ``--kernel-package`` spec stands for (the build's record or
  the sources), and whether its build is stale;
* :mod:`.evidence` - ``tier_evidence`` for a benchmark run or an emulated run;
* :mod:`.models` - the emulated CPU models (QEMU Haswell: AVX2; Nehalem: generic);
* :mod:`.emulate` - running and judging one emulated process per model;
* :mod:`.child` - the process inside ``qemu-x86_64 -cpu <model>``;
* :mod:`.check` - ``scripts/check_portability.py``'s logic.
"""

from .evidence import (bench_tier_evidence, emulated_tier_evidence, host_cpu, record_tier_evidence,
                       unrun_tiers_note)
from .resolve import KnownUnits, resolve_units, units_for_spec
from .units import TierUnit, declared_units, tier_of_flags

__all__ = ["KnownUnits", "TierUnit", "bench_tier_evidence", "declared_units", "emulated_tier_evidence",
           "host_cpu", "record_tier_evidence", "resolve_units", "tier_of_flags", "units_for_spec",
           "unrun_tiers_note"]
