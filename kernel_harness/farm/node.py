"""Start, stop and list the Ray node of this machine (``farm node``, ``farm stop``, ``farm status``).

``farm node`` runs ``ray start --block`` as a detached child in its own
session and records its pid, address and log in a state file
(``~/.cache/kernel_harness/farm/node.json``, or ``$KERNEL_HARNESS_FARM_DIR``).
``farm stop`` stops exactly that process (SIGTERM: Ray drains and stops the
processes it spawned; SIGKILL to its process group after a grace period), never
"every Ray process on the machine" as ``ray stop`` would.  ``--cluster auto``
reads the address from the same file.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..atomic import atomic_write_json
from ..errors import KernelCrashed, UsageError
from . import HEAD_COMMAND
from .classes import NodeInfo, node_info, node_resources
from .remote import NODE_OMP_ENV

STATE_ENV = "KERNEL_HARNESS_FARM_DIR"
DEFAULT_PORT = 6379
#: A busy 2-core machine starts a Ray node in 5-20 s; give it room, but bounded.
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 30.0
READY_LINE = "Ray runtime started"
#: Ray's setting of its workers' niceness (its default is 15)
WORKER_NICENESS_ENV = "RAY_worker_niceness"


def state_dir() -> Path:
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".cache" / "kernel_harness" / "farm")


def state_file() -> Path:
    return state_dir() / "node.json"


@dataclass(frozen=True)
class NodeState:
    """What ``farm node`` started, so ``farm stop`` and ``--cluster auto`` find it."""

    pid: int
    address: str
    head: bool
    log: str
    resources: dict[str, float]
    started_at: str


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is not alive
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def read_state() -> NodeState | None:
    """The node this machine runs, or None (no state file, or its process is gone)."""
    try:
        data = json.loads(state_file().read_text(encoding="utf-8"))
        state = NodeState(**data)
    except (OSError, ValueError, TypeError):
        return None
    return state if _alive(state.pid) else None


def local_address() -> str | None:
    """``--cluster auto``: the address of the node ``farm node`` started here."""
    state = read_state()
    return state.address if state else None


def _free_port_check(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        if sock.connect_ex((host, port)) == 0:
            raise UsageError(f"Port {port} on {host} is already in use, so a head cannot listen there. "
                             "Pass another --port, or join the cluster that runs there with "
                             f"`python -m kernel_harness.farm node --address {host}:{port}`.")


def ray_start_command(*, head: bool, address: str | None, port: int, node_ip: str | None,
                      temp_dir: str | None, resources: dict[str, float]) -> list[str]:
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
           "--resources", json.dumps(resources), "--disable-usage-stats"]
    if head:
        cmd += ["--head", "--port", str(port), "--include-dashboard", "false"]
        if temp_dir:
            cmd += ["--temp-dir", temp_dir]
    else:
        cmd += ["--address", str(address)]
    if node_ip:
        cmd += ["--node-ip-address", node_ip]
    return cmd


def _wait_ready(proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        if READY_LINE in text:
            return
        if proc.poll() is not None:
            raise KernelCrashed(f"`ray start` exited with code {proc.returncode} before the node was up. "
                                f"Its output ({log}) ends with:\n{text[-3000:]}")
        time.sleep(0.5)
    _terminate(proc.pid)
    raise KernelCrashed(f"The Ray node did not come up within {timeout:g} s (log: {log}); it was stopped. "
                        "The machine may be overloaded: retry, or pass --start-timeout.")


def start_node(*, head: bool, address: str | None, port: int = DEFAULT_PORT, node_ip: str | None = None,
               temp_dir: str | None = None, timeout: float = START_TIMEOUT_S) -> NodeState:
    """Start this machine's Ray node with one bench slot and its class resources."""
    from ..build.toolchain import torch_info  # the variant this node's torch loads

    running = read_state()
    if running is not None:
        raise UsageError(f"This machine already runs a farm node (pid {running.pid}, cluster {running.address}). "
                         "Stop it first with `python -m kernel_harness.farm stop`.")
    if head:
        _free_port_check(node_ip or "127.0.0.1", port)
    resources = node_resources(torch_info().variant)
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "node.log"
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    # the operator's thread setting, so a worker can tell it from Ray's task cap (remote.benchmark_env)
    env[NODE_OMP_ENV] = os.environ.get("OMP_NUM_THREADS", "")
    # Ray runs its workers at nice 15 (so that its own daemons come first); the benchmark runs in a
    # worker and would inherit it, competing for the CPU at a lower priority than a local run does
    # (measured: nice 15 in every task). Workers at the node's own niceness, unless the operator says.
    env.setdefault(WORKER_NICENESS_ENV, "0")
    if _loopback(node_ip):
        if not head:
            raise UsageError("--node-ip-address 127.0.0.1 makes a single-machine farm; only a head can use it "
                             "(a joining node must announce an address the head reaches).")
        # Ray turns 127.0.0.1 into the machine's public address unless clusters are "off":
        # then every Ray process announces and connects through the loopback address only.
        env[LOOPBACK_ENV] = "0"
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            ray_start_command(head=head, address=address, port=port, node_ip=node_ip,
                              temp_dir=temp_dir, resources=resources),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env)
    _wait_ready(proc, log, timeout)
    joined = f"{node_ip or _default_ip()}:{port}" if head else str(address)
    state = NodeState(pid=proc.pid, address=joined, head=head, log=str(log), resources=resources,
                      started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    atomic_write_json(state_file(), asdict(state))
    return state


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _loopback(ip: str | None) -> bool:
    return bool(ip) and (ip.startswith("127.") or ip in ("localhost", "::1"))


def _default_ip() -> str:
    """The address Ray binds a head to when no --node-ip-address is given."""
    from ray.util import get_node_ip_address  # noqa: PLC0415 - optional dependency

    return get_node_ip_address()


def _terminate(pid: int, grace: float = STOP_GRACE_S) -> bool:
    """SIGTERM ``pid`` (Ray cleans up what it spawned), then SIGKILL its process group."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.3)
    try:
        os.killpg(pid, signal.SIGKILL)  # its own session: only what it started
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return True


def stop_node() -> NodeState | None:
    """Stop the node ``farm node`` started here; None when none runs."""
    state = read_state()
    if state is None:
        state_file().unlink(missing_ok=True)
        return None
    _terminate(state.pid)
    state_file().unlink(missing_ok=True)
    return state


def cluster_nodes(ray) -> list[NodeInfo]:
    """The alive nodes of the connected cluster, with their free slots."""
    from ray._private.state import available_resources_per_node  # noqa: PLC0415

    available = available_resources_per_node()
    nodes = []
    for raw in ray.nodes():
        if raw.get("Alive"):
            nodes.append(node_info({**raw, "Available": available.get(raw.get("NodeID"), {})}))
    return nodes


def no_cluster_error(address: str, reason: str) -> UsageError:
    return UsageError(f"No farm cluster answers at {address} ({reason}). Start a head on that machine with "
                      f"`{HEAD_COMMAND}` (it prints the address to join), or pass the address it printed; "
                      "--cluster auto uses the node started on this machine.")


#: How long a TCP connect to the head may take before "no cluster": Ray's own
#: connect retries for a minute or more, far too long to say "nothing there".
CONNECT_TIMEOUT_S = 3.0
#: The whole of ray.init once the port answers (a busy machine needs a few seconds).
RAY_INIT_BUDGET_S = 60.0


def resolve_address(address: str) -> str:
    """``auto`` -> the node started on this machine; otherwise HOST:PORT as given."""
    if address != "auto":
        return address
    found = local_address()
    if found is None:
        raise UsageError(f"--cluster auto found no farm node on this machine ({state_file()} names none "
                         f"running). Start one with `{HEAD_COMMAND}`, or pass --cluster HOST:PORT.")
    return found


def _loopback_driver() -> None:
    """Make this process announce 127.0.0.1, as the single-machine head does (see start_node)."""
    os.environ[LOOPBACK_ENV] = "0"  # read when ray is first imported ...
    if "ray" in sys.modules:  # ... and checked at call time by services.get_node_ip_address
        import ray._private.ray_constants as constants  # noqa: PLC0415

        constants.ENABLE_RAY_CLUSTER = False


def _watchdog(address: str, seconds: float) -> threading.Timer:
    """Ray's own connect retries without end when the head announces an unreachable address;
    after ``seconds`` this exits 2 (nothing has been written yet, so nothing is lost)."""
    def fire() -> None:
        sys.stderr.write(f"error: {no_cluster_error(address, f'Ray did not finish connecting within {seconds:g} s').message}\n")
        sys.stderr.flush()
        os._exit(2)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def connect(address: str):
    """Connect this process to the cluster at ``address`` as a Ray driver; returns the ray module."""
    from . import require_ray

    address = resolve_address(address)
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--cluster {address!r} is not HOST:PORT (e.g. 127.0.0.1:6379) or 'auto'.")
    if _loopback(host):
        _loopback_driver()
    ray = require_ray()
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise no_cluster_error(address, f"TCP connect failed: {exc.strerror or exc}") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import logging  # noqa: PLC0415

    timer = _watchdog(address, RAY_INIT_BUDGET_S)
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False,
                 namespace="kernel_harness_farm")
    except Exception as exc:  # noqa: BLE001 - any failure to join is "no cluster there"
        raise no_cluster_error(address, f"{type(exc).__name__}: {exc}") from None
    finally:
        timer.cancel()
    return ray
