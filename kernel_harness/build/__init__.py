"""Build CPU kernels from build.toml without Nix or kernel-builder (see docs/build.md)."""

from .builder import BuildFailed, BuildResult, build_kernel, prepare

__all__ = ["BuildFailed", "BuildResult", "build_kernel", "prepare"]
