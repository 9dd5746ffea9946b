"""``python -m kernel_harness.farm node | status | stop``: this machine's farm node.

* ``node --head [--port P] [--node-ip-address IP]`` starts a head and prints the
  address the other machines join with;
* ``node --address HOST:PORT`` joins a cluster;
* ``status [--cluster ADDRESS|auto] [--json FILE]`` lists nodes, classes, free/busy slots;
* ``stop`` stops the node started here (only it: by its recorded pid).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict

from rich.table import Table

from ..cli import add_json_option, console, write_json_report
from ..errors import UsageError
from . import require_ray
from .node import DEFAULT_PORT, START_TIMEOUT_S, cluster_nodes, connect, start_node, stop_node


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kernel_harness.farm",
                                description="Run this machine as a benchmark farm node (one bench slot) on Ray.")
    sub = p.add_subparsers(dest="command", required=True)
    node = sub.add_parser("node", help="start this machine's Ray node with one bench slot and its CPU classes")
    role = node.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start a new cluster here (its head)")
    role.add_argument("--address", metavar="HOST:PORT", help="join the cluster whose head printed HOST:PORT")
    node.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the head's port (default {DEFAULT_PORT})")
    node.add_argument("--node-ip-address", default=None, metavar="IP",
                      help="the address this node binds and announces (default: Ray's pick; 127.0.0.1 for a "
                           "single-machine farm)")
    node.add_argument("--temp-dir", default=None, help="Ray's session directory (head only; default /tmp/ray)")
    node.add_argument("--start-timeout", type=float, default=START_TIMEOUT_S, metavar="S",
                      help=f"give up when the node is not up after S seconds (default {START_TIMEOUT_S:g})")
    status = sub.add_parser("status", help="list the cluster's nodes, CPU classes and free/busy bench slots")
    status.add_argument("--cluster", default="auto", metavar="ADDRESS",
                        help="HOST:PORT of the cluster, or 'auto' for the node started here (default)")
    add_json_option(status)
    sub.add_parser("stop", help="stop the node started on this machine")
    return p


def _node(args: argparse.Namespace) -> int:
    require_ray()
    if args.temp_dir and not args.head:
        raise UsageError("--temp-dir only applies to a head (joining nodes use the head's).")
    state = start_node(head=args.head, address=args.address, port=args.port, node_ip=args.node_ip_address,
                       temp_dir=args.temp_dir, timeout=args.start_timeout)
    classes = sorted(k for k in state.resources if ":" in k or k.startswith("isa_"))
    console.print(f"[bold green]farm node up[/bold green] (pid {state.pid}), resources: bench_slot=1, "
                  f"{', '.join(classes)}")
    if state.head:
        console.print(f"Cluster address: [bold]{state.address}[/bold]\n"
                      f"  join from another machine: python -m kernel_harness.farm node --address {state.address}\n"
                      f"  benchmark on it: scripts/benchmark_cpu.py BASELINE --kernel-package DIR --op PKG.FN "
                      f"--cluster {state.address}")
    else:
        console.print(f"Joined the cluster at [bold]{state.address}[/bold].")
    console.print("Stop it with: python -m kernel_harness.farm stop")
    return 0


def _status(args: argparse.Namespace) -> int:
    ray = connect(args.cluster)
    try:
        nodes = cluster_nodes(ray)
    finally:
        ray.shutdown()
    table = Table(title="farm nodes")
    for column in ("node", "address", "classes", "top", "cpu model", "variant", "slots free/total"):
        table.add_column(column)
    for n in nodes:
        table.add_row(n.hostname, n.address, ", ".join(n.classes) or "generic", n.top, n.model,
                      n.variant or "-", f"{n.free_slots}/{n.slots}" + ("" if n.slots else " (not a farm node)"))
    console.print(table)
    busy = sum(n.slots - n.free_slots for n in nodes)
    console.print(f"{len(nodes)} node(s), {sum(n.slots for n in nodes)} bench slot(s), {busy} busy.")
    write_json_report(args.json, {"nodes": [asdict(n) for n in nodes]})
    return 0


def _stop(_: argparse.Namespace) -> int:
    state = stop_node()
    if state is None:
        console.print("No farm node runs on this machine (nothing to stop).")
    else:
        console.print(f"Stopped the farm node (pid {state.pid}, cluster {state.address}).")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return {"node": _node, "status": _status, "stop": _stop}[args.command](args)
