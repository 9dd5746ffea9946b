"""What the validator reports: findings with stable codes, and the report around them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finding:
    """One error or warning.  ``code`` is stable (tests and agents match on it)."""

    code: str
    file: str | None
    line: int | None
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "file": self.file, "line": self.line, "message": self.message}

    def location(self) -> str:
        if self.file and self.line:
            return f"{self.file}:{self.line}"
        return self.file or ""


#: Every code the validator can emit, with its severity; the README lists them.
ERROR_CODES = {
    "missing-build-toml": "no build.toml in the kernel directory",
    "toml-syntax": "build.toml is not parseable by tomllib",
    "unknown-key": "a key kernel-builder's schema does not know",
    "missing-key": "a required key is missing",
    "wrong-type": "a key has the wrong type",
    "invalid-value": "a key has a value the schema does not allow",
    "invalid-kernel-name": "[general] name that kernels_data.KernelName refuses",
    "no-cpu-kernel": "no [kernel.*] section with backend = \"cpu\"",
    "missing-binding": "no torch-ext/torch_binding.cpp",
    "missing-source": "a source listed in build.toml does not exist",
    "unlisted-source": "a .cpp file on disk is in no section",
    "simd-without-openmp": "a SIMD section without -fopenmp",
    "missing-include": "a section without include = [\"<kernel>_cpu\"]",
    "isa-not-enabled": "intrinsics of an ISA the unit's flags do not enable",
    "mixed-isa": "one tier mixes ISA levels",
    "isa-beyond-tier": "a generated avx512 section's flags enable an ISA beyond AVX512 F/BW/VL/DQ (+AMX)",
    "bf16-unguarded": "an AVX512-BF16 instruction in a generated avx512 unit without the kBf16 test on its line",
    "vnni-unguarded": "an AVX512-VNNI instruction in a generated avx512 unit without the kVnni test on its line",
    "unfinished-body": "a compute body still marked KERNEL_TODO(...)",
    "invalid-metadata": "a build variant's metadata.json that kernels-data cannot parse",
    "digest-mismatch": "a build variant's files differ from the digest in its metadata.json",
}
WARNING_CODES = {
    "aligned-access": "aligned load/store on a pointer not known to be aligned",
    "no-tail-handling": "no tail handling seen in a SIMD loop",
    "no-size-threshold": "no small-size threshold in the dispatcher",
    "torch-in-tier": "torch headers included in a SIMD tier unit",
    "no-digest": "a build variant's metadata.json without a digest (built by an older builder)",
    "fp-contract-implicit": "a SIMD section without an explicit -ffp-contract= flag",
}


@dataclass
class Report:
    kernel_dir: str
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, code: str, file: str | None, line: int | None, message: str) -> None:
        assert code in ERROR_CODES, code
        self.errors.append(Finding(code, file, line, message))

    def warning(self, code: str, file: str | None, line: int | None, message: str) -> None:
        assert code in WARNING_CODES, code
        self.warnings.append(Finding(code, file, line, message))

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "kernel_dir": self.kernel_dir,
            "errors": [f.as_dict() for f in self.errors],
            "warnings": [f.as_dict() for f in self.warnings],
        }
