"""Make ``kernel_harness`` importable when a script runs from any directory.

``python scripts/<name>.py`` puts ``scripts/`` on ``sys.path``; importing this
module adds the project root too, so the scripts work from a fresh clone even
before ``pip install -e .``.
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
