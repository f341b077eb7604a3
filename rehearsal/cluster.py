"""Ray as KubeRay runs it, on the two namespaces: start, logs, and killing what is left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from rehearsal.network import HEAD_IFACE, HEAD_IP, WORKER_IFACE, WORKER_IP, Nodes
from tools.cluster_access import RAY_METRICS_PORT


@contextlib.contextmanager
def ray_cluster(env: dict[str, str], temp_dir: Path, nodes: Nodes, head_env: dict[str, str]) -> Iterator[None]:
    """The Ray head with prefill's resource on node A, a worker with decode's on node B, as KubeRay's groups.

    head_env: what the head container sets beside the workers' environment."""
    ray = str(Path(sys.executable).parent / "ray")
    common = ["--num-cpus=6", f"--metrics-export-port={RAY_METRICS_PORT}", "--disable-usage-stats"]
    head = [
        ray, "start", "--head", f"--node-ip-address={HEAD_IP}", "--port=6379", f"--dashboard-host={HEAD_IP}",
        f"--temp-dir={temp_dir}", f"--resources={json.dumps({'prefill': 1})}", *common,
    ]  # fmt: skip
    worker = [
        *nodes.node_b, ray, "start", f"--address={HEAD_IP}:6379", f"--node-ip-address={WORKER_IP}",
        f"--resources={json.dumps({'decode': 1})}", *common,
    ]  # fmt: skip
    # Started outside the repository, as in a pod: Ray hands its processes' directory to the workers'
    # import path, and this project's code must reach them only as the pods get it (ray_pods via PYTHONPATH).
    outside = temp_dir.parent
    try:
        subprocess.run(head, env={**env, **head_env, "FI_TCP_IFACE": HEAD_IFACE}, check=True, timeout=180, cwd=outside)
        subprocess.run(worker, env={**env, "FI_TCP_IFACE": WORKER_IFACE}, check=True, timeout=180, cwd=outside)
        yield
    finally:
        # Not `ray stop`: it finds Ray processes by name on the whole machine, other
        # namespaces included, and would stop any other Ray running here.
        kill_namespace_processes(f"/proc/{nodes.holder.pid}/ns/net", nodes.holder.pid)


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
