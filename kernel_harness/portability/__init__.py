"""Which tiers of a kernel package ran, where, and proof on CPUs this machine is not.

* :mod:`.units` - the tiers ``build.toml`` declares and each unit's content hash;
* :mod:`.evidence` - ``tier_evidence`` for a benchmark run or an emulated run;
* :mod:`.models` - the emulated CPU models (QEMU Haswell: AVX2; Nehalem: generic);
* :mod:`.emulate` - running and judging one emulated process per model;
* :mod:`.child` - the process inside ``qemu-x86_64 -cpu <model>``;
* :mod:`.check` - ``scripts/check_portability.py``'s logic.
"""

from .evidence import (bench_tier_evidence, emulated_tier_evidence, host_cpu, record_tier_evidence,
                       unrun_tiers_note)
from .units import TierUnit, declared_units, tier_of_flags, units_for_spec

__all__ = ["TierUnit", "bench_tier_evidence", "declared_units", "emulated_tier_evidence",
           "host_cpu", "record_tier_evidence", "tier_of_flags", "units_for_spec", "unrun_tiers_note"]
