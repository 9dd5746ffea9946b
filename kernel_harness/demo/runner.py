"""Running the procedure's commands as an agent would, with progress and logs.

Every command is a real ``python scripts/<name>.py`` (or the configured build
and install commands) in the demo workspace; its output goes to a numbered log
file and the console shows a spinner with the elapsed time, so a 15-minute run
is never silent and a failure points at the exact log.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from ..errors import HarnessError
from ..paths import SCRIPTS_DIR


@dataclass
class StepLog:
    label: str
    command: str
    seconds: float
    returncode: int
    log_file: Path


@dataclass
class DemoRunner:
    workspace: Path
    console: Console
    env: dict[str, str] = field(default_factory=dict)
    steps: list[StepLog] = field(default_factory=list)

    @property
    def log_dir(self) -> Path:
        return self.workspace / "logs"

    def script(self, name: str, *args: Any) -> list[str]:
        return [sys.executable, str(SCRIPTS_DIR / f"{name}.py"), *map(str, args)]

    def run(self, label: str, argv: list[str] | str, *, cwd: Path | None = None, ok_codes: tuple[int, ...] = (0,),
            shell: bool = False) -> subprocess.CompletedProcess:
        """Run one step; raise with the log's tail when its exit code is not in ``ok_codes``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        index = len(self.steps) + 1
        log_file = self.log_dir / f"{index:02d}-{_slug(label)}.log"
        command = argv if isinstance(argv, str) else shlex.join(argv)
        env = {**os.environ, **self.env}
        start = time.perf_counter()
        with self.console.status(f"[bold]{label}[/bold]  [dim]{_short(command)}[/dim]"):
            proc = subprocess.run(argv, cwd=cwd or self.workspace, env=env, shell=shell,
                                  capture_output=True, text=True)
        seconds = time.perf_counter() - start
        log_file.write_text(f"$ {command}\n(cwd {cwd or self.workspace})\n\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        self.steps.append(StepLog(label, command, seconds, proc.returncode, log_file))
        mark = "[green]ok[/green]" if proc.returncode in ok_codes else f"[red]exit {proc.returncode}[/red]"
        self.console.print(f"  {mark}  {label}  [dim]({seconds:.1f} s, log {log_file.relative_to(self.workspace)})[/dim]")
        if proc.returncode not in ok_codes:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise HarnessError(
                f"Demo step '{label}' failed with exit code {proc.returncode}. Command: {command}\n"
                f"Full log: {log_file}\n{tail}",
                exit_code=proc.returncode if proc.returncode in (1, 2, 3) else None,
            )
        return proc

    def run_json(self, label: str, argv: list[str], json_file: Path, **kwargs: Any) -> dict[str, Any]:
        self.run(label, [*argv, "--json", str(json_file)], **kwargs)
        return json.loads(json_file.read_text())


def _slug(label: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in label.lower()).strip("-")[:48]


def _short(command: str, limit: int = 110) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."
