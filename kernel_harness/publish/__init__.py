"""Publish a finished kernel to the Hugging Face Hub as a ``kernels`` repository.

One module per job: :mod:`.layout` reads a kernel or output directory,
:mod:`.staging` lays out the Hub repository locally, :mod:`.benchmark_file`
generates ``benchmarks/benchmark.py``, :mod:`.card` renders ``README.md``,
:mod:`.verify` proves the stage loads and is correct in fresh processes
(:mod:`.child` is what those processes run), :mod:`.upload` talks to the Hub,
:mod:`.plan` decides what to publish and :mod:`.pipeline` puts it all in order.  ``scripts/publish.py`` is the CLI.
"""

from .pipeline import publish
from .plan import PublishOptions

__all__ = ["PublishOptions", "publish"]
