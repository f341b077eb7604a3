"""A lost Ray head with GCS fault tolerance, on Ray 2.58 itself, against Debian's redis-server with TLS and a password.

The head starts as KubeRay 1.7 starts it under `gcsFaultToleranceOptions` (common/pod.go, configureRedisFT):
RAY_REDIS_ADDRESS set to the stack's `rediss://host:port` form, `--redis-password=$REDIS_PASSWORD` expanded by
bash from the synced Secret, RAY_external_storage_namespace set; a worker node with
RAY_gcs_rpc_server_reconnect_timeout_s=600, as KubeRay sets on every worker. A detached actor on the worker
stands in for a Serve replica (the Serve controller is one too: detached, restarted by the GCS). The head's
processes are then killed, as when its pod is lost, and the head started again.

With the store the worker and its actor live on: the same process answers through the new head. Without it
(KubeRay's default timeout is Ray's 60 s; 20 s here to be quicker: 5 s was too short for a worker joining
a head slowed by a busy machine) the worker's raylet exits and the actor is
gone. The server's certificate is signed by a CA of the test's own, which the head trusts through OpenSSL's
default store (SSL_CERT_FILE), as the image's system store trusts ElastiCache's Amazon-issued certificate.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest

from rehearsal.gcs_store import listening, tls_redis
from serve_config import GCS_STORE_ADDRESS_PLACEHOLDER
from tests.conftest import require_serve_deps

pytestmark = [pytest.mark.serve, pytest.mark.xdist_group("ray")]

PASSWORD = "gcsFtTestPassword0123456789abcdef"  # letters and digits, as the stack generates it
# Which Ray node a process belongs to: every process a node's `ray start` spawns inherits its environment.
NODE_MARK = "PD_GCS_FT_TEST_NODE"
RAY = str(Path(sys.executable).parent / "ray")
# The time Ray gets to start a node or reconnect one; a run takes a few seconds.
START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _redis_with_tls(directory: Path) -> Iterator[tuple[int, Path]]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: `.ci/run` installs Debian's redis-server")
    port = _free_port()
    with tls_redis(directory, host="127.0.0.1", port=port, password=PASSWORD) as ca:
        yield port, ca


def _listening(port: int) -> bool:
    return listening("127.0.0.1", port)


def _wait(ready: object, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s")


def _processes(mark: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if f"{NODE_MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def _kill(mark: str) -> int:
    pids = _processes(mark)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _raylet_alive(mark: str) -> bool:
    for pid in _processes(mark):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                return True
    return False


@dataclass
class Cluster:
    base_env: dict[str, str]
    head_env: dict[str, str]
    gcs_port: int
    temp_dir: Path

    def start_head(self, incarnation: int) -> None:
        # KubeRay's head command, as bash runs it: the password expanded from the environment. A new head
        # container starts with an empty /tmp: each incarnation gets a temp dir of its own.
        command = (
            f"{RAY} start --head --node-ip-address=127.0.0.1 --port={self.gcs_port} --num-cpus=1 "
            f"--include-dashboard=false --disable-usage-stats --temp-dir={self.temp_dir}/head{incarnation}"
        )
        if "REDIS_PASSWORD" in self.head_env:
            command += " --redis-password=$REDIS_PASSWORD"
        env = {**self.base_env, **self.head_env, NODE_MARK: "head"}
        started = subprocess.run(
            ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S
        )
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:] + self.logs()

    def start_worker(self, reconnect_timeout_s: int) -> None:
        """A worker node joins, as a RayService worker pod starts. Ray gives a new node 30 s (a constant in
        node.py) to see itself registered; on a busy 2-core machine that once ran out in CI while the head was
        up. KubeRay restarts a worker container whose `ray start` fails, so a failed start is retried once, as
        the pod would be; a second failure fails the test with both nodes' logs."""
        env = {**self.base_env, NODE_MARK: "worker", "RAY_gcs_rpc_server_reconnect_timeout_s": str(reconnect_timeout_s)}
        failures = []
        for attempt in (1, 2):
            started = subprocess.run(
                [RAY, "start", f"--address=127.0.0.1:{self.gcs_port}", "--node-ip-address=127.0.0.1",
                 "--num-cpus=1", '--resources={"replica": 1}', "--disable-usage-stats",
                 f"--temp-dir={self.temp_dir}/worker{attempt}"],
                env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S,
            )  # fmt: skip
            if started.returncode == 0:
                return
            failures.append(f"attempt {attempt}: " + started.stdout[-1500:] + started.stderr[-1500:] + self.logs())
            _kill("worker")
        pytest.fail("\n".join(failures))

    def logs(self) -> str:
        """The last lines of every node's GCS and raylet logs: what a failed start leaves to read."""
        tails = []
        sessions = [s for s in sorted(self.temp_dir.glob("*/session_*")) if not s.is_symlink()]
        for log in (log for session in sessions for log in sorted((session / "logs").glob("*"))):
            if log.name.startswith(("gcs_server", "raylet")) and log.stat().st_size:
                lines = log.read_text(errors="replace").splitlines()[-15:]
                tails.append(f"\n--- {log.relative_to(self.temp_dir)}\n" + "\n".join(lines))
        return "".join(tails)

    def driver(self, code: str) -> str:
        """Run code in a fresh driver connected to the cluster; its last printed line."""
        # Named detached actors are found within a namespace: both drivers name the same one.
        connect = f"ray.init(address='127.0.0.1:{self.gcs_port}', namespace='gcs-ft', log_to_driver=False)"
        script = f"import ray\n{connect}\n{code}\n"
        result = subprocess.run(
            [sys.executable, "-c", script], env={**self.base_env, NODE_MARK: "driver"},
            capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout.strip().splitlines()[-1]


KEEPER = """
import os
@ray.remote(resources={"replica": 1}, num_cpus=0)
class Keeper:
    def pid(self):
        return os.getpid()
keeper = Keeper.options(name="keeper", lifetime="detached").remote()
print(ray.get(keeper.pid.remote()))
"""
FIND = """
try:
    print(ray.get(ray.get_actor("keeper").pid.remote(), timeout=60))
except ValueError:
    print("gone")
"""


@contextlib.contextmanager
def _cluster(tmp_path: Path, head_env: dict[str, str]) -> Iterator[Cluster]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # Ray's sockets live under the temp dir, and a Unix socket's path has at most 107 bytes: pytest's is too long.
    temp_dir = Path(tempfile.mkdtemp(prefix="gcsft-", dir="/tmp"))
    cluster = Cluster(base, head_env, _free_port(), temp_dir)
    try:
        yield cluster
    finally:
        for mark in ("driver", "worker", "head"):
            _kill(mark)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _head_loss(cluster: Cluster, reconnect_timeout_s: int, *, wait_s: float) -> tuple[str, str, bool]:
    """(the actor's pid before, the answer after the head came back, whether the worker's raylet lived)."""
    cluster.start_head(1)
    cluster.start_worker(reconnect_timeout_s)
    before = cluster.driver(KEEPER)
    assert _kill("head") > 0
    _wait(lambda: not _listening(cluster.gcs_port), "the head's GCS gone")
    time.sleep(wait_s)
    survived = _raylet_alive("worker")
    cluster.start_head(2)
    return before, cluster.driver(FIND), survived


def test_with_the_store_a_lost_head_comes_back_and_the_replica_lives_on(tmp_path: Path) -> None:
    require_serve_deps()
    with _redis_with_tls(tmp_path) as (port, ca):
        head_env = {
            # The scheme the stack writes (rediss: TLS), at this test's server.
            "RAY_REDIS_ADDRESS": f"{urlparse(GCS_STORE_ADDRESS_PLACEHOLDER).scheme}://127.0.0.1:{port}",
            "REDIS_PASSWORD": PASSWORD,
            "RAY_external_storage_namespace": "0b6c8a52-raycluster-uid",
            # OpenSSL's default verify store: Ray's Redis client trusts the system's CAs without RAY_REDIS_CA_CERT.
            "SSL_CERT_FILE": str(ca),
        }
        with _cluster(tmp_path, head_env) as cluster:
            # Longer than the 20 s a head takes to come back here, as KubeRay's 600 s outlasts a head pod's restart.
            before, after, survived = _head_loss(cluster, reconnect_timeout_s=600, wait_s=10)
    assert survived, "the worker's raylet exited while the head was away"
    assert after == before, f"the replica is not the same process: {before} before, {after} after"


def test_without_the_store_a_lost_head_takes_the_replica(tmp_path: Path) -> None:
    require_serve_deps()
    with _cluster(tmp_path, {}) as cluster:
        before, after, survived = _head_loss(cluster, reconnect_timeout_s=20, wait_s=30)
    assert before.isdigit()
    assert not survived, "the worker's raylet outlived its reconnect timeout without GCS fault tolerance"
    assert after == "gone"
