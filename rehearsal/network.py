"""Two network namespaces joined by a veth pair, as the prefill and decode pods are on two nodes.

libfabric's tcp provider refuses the loopback interface, an address of one node is
remote to the other, and no traffic leaves the sandbox. Also the addresses the
rehearsal reaches inside them, and its small HTTP client.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve_config import SERVE_PORT
from tools.cluster_access import RAY_METRICS_PORT, NixlSnapshot

# Node A (this namespace): the Ray head and prefill. Node B (a second namespace): decode.
HEAD_IP, HEAD_IFACE = "10.99.0.1", "rh0"
WORKER_IP, WORKER_IFACE = "10.99.0.2", "rh1"
# Node C (a third namespace, the scaling case only): the node a scaled-up side's new replica lands on,
# as Ray's autoscaler and Cluster Autoscaler would add one. Its own veth pair to node A, which routes
# between B and C: every node reaches every other, as pods on three nodes do.
NODE_C_GATEWAY_IP, NODE_C_GATEWAY_IFACE = "10.99.1.1", "rh2"
NODE_C_IP, NODE_C_IFACE = "10.99.1.2", "rh3"
DASHBOARD = f"http://{HEAD_IP}:8265"
SERVE = f"http://{HEAD_IP}:{SERVE_PORT}"
# Each node exports its own processes' metrics, as each pod does on EKS.
PREFILL_METRICS = f"http://{HEAD_IP}:{RAY_METRICS_PORT}/metrics"
DECODE_METRICS = f"http://{WORKER_IP}:{RAY_METRICS_PORT}/metrics"
NODE_C_METRICS = f"http://{NODE_C_IP}:{RAY_METRICS_PORT}/metrics"
IN_NAMESPACE = "PD_REHEARSAL_IN_NETNS"


class RehearsalError(RuntimeError):
    """One line saying what failed."""


def in_namespace(argv: list[str]) -> int:
    """Run `rehearsal.run` again inside a new network namespace (node A); its exit code."""
    command = ["unshare", "--net"]
    if os.geteuid() != 0:
        command.append("--map-root-user")
    env = {**os.environ, IN_NAMESPACE: "1"}
    return subprocess.run([*command, sys.executable, "-m", "rehearsal.run", *argv], env=env, check=False).returncode


@dataclass
class Nodes:
    """Node A is this namespace (Ray head, prefill); node B a second one (decode), held open by a sleeper."""

    holder: subprocess.Popen[bytes]

    @property
    def node_b(self) -> list[str]:
        """A command prefix that runs its command in the held namespace (node B's, or node C's)."""
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net"]

    @property
    def node_b_namespace(self) -> str:
        """Node B's network namespace, as /proc/<pid>/ns/net reads it."""
        return os.readlink(f"/proc/{self.holder.pid}/ns/net")


@contextlib.contextmanager
def two_nodes() -> Iterator[Nodes]:
    """Two namespaces joined by a veth pair, as two pods on two nodes: every address of one is remote to the other.

    Node B's holder ends with the block: left running, it would keep the output pipe of
    `python -m rehearsal` open, and a case that failed early would hang until its timeout."""
    holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
    try:
        yield _connect(holder)
    finally:
        holder.kill()
        holder.wait()


@contextlib.contextmanager
def third_node(nodes: Nodes) -> Iterator[Nodes]:
    """Node C: a namespace of its own on a second veth pair to node A, routed to node B through A. Node B's
    route to it outlives it (a route via node A), so a second node C in the same case replaces it."""
    holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
    try:
        node_c = Nodes(_held(holder))
        for command in (
            *_veth_pair(node_c, (NODE_C_GATEWAY_IFACE, NODE_C_GATEWAY_IP), (NODE_C_IFACE, NODE_C_IP)),
            [*node_c.node_b, "ip", "route", "add", f"{_subnet(HEAD_IP)}/24", "via", NODE_C_GATEWAY_IP],
            [*nodes.node_b, "ip", "route", "replace", f"{_subnet(NODE_C_IP)}/24", "via", HEAD_IP],
        ):
            subprocess.run(command, check=True)
        # Node A forwards between B and C; this namespace's own setting, nothing outside it.
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        yield node_c
    finally:
        holder.kill()
        holder.wait()


def _veth_pair(node: Nodes, near: tuple[str, str], far: tuple[str, str]) -> list[list[str]]:
    """The commands for a veth pair from this namespace (near: interface, address) to the held one's (far), /24."""
    (near_iface, near_ip), (far_iface, far_ip) = near, far
    return [
        ["ip", "link", "add", near_iface, "type", "veth", "peer", "name", far_iface],
        ["ip", "link", "set", far_iface, "netns", str(node.holder.pid)],
        ["ip", "addr", "add", f"{near_ip}/24", "dev", near_iface],
        ["ip", "link", "set", near_iface, "up"],
        [*node.node_b, "ip", "link", "set", "lo", "up"],
        [*node.node_b, "ip", "addr", "add", f"{far_ip}/24", "dev", far_iface],
        [*node.node_b, "ip", "link", "set", far_iface, "up"],
    ]


def _subnet(ip: str) -> str:
    return ip.rsplit(".", 1)[0] + ".0"


def _held(holder: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """The holder, once its namespace is a new one."""
    mine = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{holder.pid}/ns/net") == mine:
        if time.monotonic() > deadline:
            raise RehearsalError("a network namespace for another node did not come up")
        time.sleep(0.05)
    return holder


def _connect(holder: subprocess.Popen[bytes]) -> Nodes:
    nodes = Nodes(_held(holder))
    for command in (
        ["ip", "link", "set", "lo", "up"],
        *_veth_pair(nodes, (HEAD_IFACE, HEAD_IP), (WORKER_IFACE, WORKER_IP)),
    ):
        subprocess.run(command, check=True)
    return nodes


def http(
    url: str,
    body: Any = None,
    method: str | None = None,
    timeout: float = 30.0,
    headers: dict[str, str] | None = None,
) -> Any:
    """One JSON call to an address inside the namespaces; its decoded answer (None when empty)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310 - an address inside our own namespace
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        text = response.read().decode()
    return json.loads(text) if text.strip() else None


def status_of(url: str, body: Any, method: str, headers: dict[str, str]) -> int:
    """The HTTP status of one call (an error status is an answer here, not a failure)."""
    try:
        http(url, body, method=method, headers=headers)
    except urllib.error.HTTPError as err:
        return err.code
    return 200


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - our namespaces
        return str(response.read().decode())


def decode_nixl_counters() -> tuple[float, float]:
    """Decode's NIXL (transfers, failed transfers), from decode's node's exporter."""

    nixl = NixlSnapshot.of(metrics_text(DECODE_METRICS))
    return nixl.transfers, nixl.failed
