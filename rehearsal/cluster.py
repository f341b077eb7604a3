"""Ray as KubeRay runs it, on the two namespaces: start, logs, and killing what is left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from rehearsal.network import HEAD_IFACE, HEAD_IP, WORKER_IFACE, WORKER_IP, Nodes
from tools.cluster_access import RAY_METRICS_PORT


@contextlib.contextmanager
def ray_cluster(
    env: dict[str, str], temp_dir: Path, nodes: Nodes, head_env: dict[str, str]
) -> Iterator[Callable[[], None]]:
    """The Ray head with prefill's resource on node A, a worker with decode's on node B, as KubeRay's groups.

    head_env: what the head container sets beside the workers' environment. Yields what starts node B's
    Ray again after it was stopped (stop_node_b), as KubeRay recreates a worker pod that went away."""
    head = [
        _ray(), "start", "--head", f"--node-ip-address={HEAD_IP}", "--port=6379", f"--dashboard-host={HEAD_IP}",
        f"--temp-dir={temp_dir}", f"--resources={json.dumps(NODE_A_RESOURCES)}", f"--num-cpus={NODE_A_CPUS}", *_COMMON,
    ]  # fmt: skip
    # Started outside the repository, as in a pod: Ray hands its processes' directory to the workers'
    # import path, and this project's code must reach them only as the pods get it (ray_pods via PYTHONPATH).
    outside = temp_dir.parent

    def start_node_b() -> None:
        start_worker(env, temp_dir, nodes, ip=WORKER_IP, iface=WORKER_IFACE, resources={"decode": 1})

    try:
        subprocess.run(head, env={**env, **head_env, "FI_TCP_IFACE": HEAD_IFACE}, check=True, timeout=180, cwd=outside)
        start_node_b()
        yield start_node_b
    finally:
        # Not `ray stop`: it finds Ray processes by name on the whole machine, other
        # namespaces included, and would stop any other Ray running here.
        kill_namespace_processes(f"/proc/{nodes.holder.pid}/ns/net", nodes.holder.pid)


_COMMON = [f"--metrics-export-port={RAY_METRICS_PORT}", "--disable-usage-stats"]
# Node A stands in for the system nodes too: the OpenAI ingress lives there, off the GPU nodes, as the
# product's ingress group puts it (its replica asks for `ingress`), with room for one ingress replica more,
# as the group's maximum holds the surge replica's pod (serve_config/deployments.py, ingress_surge_room):
# prefill's bundle (5 CPUs) and two ingress replicas (1 CPU each). Node B has exactly the CPUs of
# decode's bundle (4 for the engine and 1 for the replica), so nothing else fits there: losing node B
# loses decode alone, never the ingress streaming to the client.
NODE_A_RESOURCES = {"prefill": 1, "ingress": 2}
NODE_A_CPUS = 7
NODE_B_CPUS = 5


def _ray() -> str:
    return str(Path(sys.executable).parent / "ray")


def start_worker(
    env: dict[str, str],
    temp_dir: Path,
    node: Nodes,
    *,
    ip: str,
    iface: str,
    resources: dict[str, int],
    num_cpus: int = NODE_B_CPUS,
) -> None:
    """A Ray worker node in the held namespace, joined to the head, as KubeRay starts a worker pod of a group
    that advertises `resources`: by default NODE_B_CPUS, exactly one engine replica's bundle."""
    command = [
        *node.node_b, _ray(), "start", f"--address={HEAD_IP}:6379", f"--node-ip-address={ip}",
        f"--resources={json.dumps(resources)}", f"--num-cpus={num_cpus}", *_COMMON,
    ]  # fmt: skip
    subprocess.run(command, env={**env, "FI_TCP_IFACE": iface}, check=True, timeout=180, cwd=temp_dir.parent)


def stop_node_b(nodes: Nodes) -> int:
    """Kill every process in the held network namespace (node B's, or node C's) but the one holding it
    open: that node's Ray (raylet, workers, its replicas and engines) is gone at once, as when its node
    fails. Chosen by namespace alone, so nothing on node A (the head, prefill) or elsewhere on this
    machine is touched."""
    namespace = nodes.node_b_namespace
    killed = 0
    for pid in _parents():
        if pid == nodes.holder.pid:
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/net") == namespace:
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def _parents() -> dict[int, int]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                found[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return found


def kill_namespace_processes(other: str, holder_pid: int) -> int:
    """Kill every process left in this network namespace and in node B's: Ray's daemons, the engines
    and vLLM's worker processes, which would otherwise slow every later case. Our own descendants
    (jsii's Node process) end with us and are spared; Ray's daemons were reparented."""
    namespaces = {os.readlink("/proc/self/ns/net"), os.readlink(other)}
    parents = _parents()

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == holder_pid:
                return False
            if pid == os.getpid():
                return True
            pid = parents.get(pid, 0)
        return False

    killed = 0
    for pid in parents:
        if pid in (os.getpid(), os.getppid()) or ours(pid):
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/net") in namespaces:
                os.kill(pid, signal.SIGKILL)
                killed += 1
        except OSError:
            continue
    return killed


def ray_logs(temp_dir: Path) -> str:
    """Every Ray, Serve and engine log of this run, as one text."""
    logs = temp_dir / "session_latest" / "logs"
    parts = []
    # old/: where Ray's log monitor moves the files of processes that have exited.
    for pattern in ("*.out", "*.err", "serve/*.log", "old/*.out", "old/*.err"):
        for path in sorted(logs.glob(pattern)):
            with contextlib.suppress(OSError):
                parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)
