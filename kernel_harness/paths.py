"""Where the project's own files are, independent of the working directory.

Scripts run as ``python scripts/<name>.py`` from anywhere; run-time state
(``trials/``, ``output/``) is relative to the working directory, while the
shipped files (config, templates, references, examples) are found here.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS_DIR = PROJECT_ROOT / "scripts"
TEMPLATES_DIR = PROJECT_ROOT / "templates"
REFERENCES_DIR = PROJECT_ROOT / "references"
EXAMPLES_DIR = PROJECT_ROOT / "examples"
DEFAULT_CONFIG_PATH = SCRIPTS_DIR / "config.yaml"


def trials_root() -> Path:
    """The trial trees live under ``./trials`` of the current working directory."""
    return Path.cwd() / "trials"
