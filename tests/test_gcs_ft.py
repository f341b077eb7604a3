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
gone. The server's certificate is signed by a CA of the test's own, which the head trusts as the product's head
trusts ElastiCache's Amazon-issued one: through the CA file RAY_REDIS_CA_CERT names (the product names the image's
system bundle, serve_config/pod_templates.py), with no SSL_CERT_FILE anywhere. Without it the TLS library's default
locations apply, which hold no test CA, and the head does not start: the variable is what makes it trust the store.
"""

from __future__ import annotations

import contextlib
import json
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
from typing import Any
from urllib.parse import urlparse

import pytest

from rehearsal.gcs_store import listening, tls_redis, tls_store
from serve_config import GCS_STORE_ADDRESS_PLACEHOLDER
from serve_config.pod_templates import IMAGE_CA_BUNDLE, REDIS_CA_CERT_ENV
from tests.conftest import rayservice_from, require_serve_deps, synth
from tools.in_pod import image_probe
from tools.verify_judgement import image_checks

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

    def gcs_said(self, incarnation: int) -> str:
        """What the GCS of that incarnation of the head wrote."""
        return "".join(
            p.read_text(errors="replace") for p in self.temp_dir.glob(f"head{incarnation}/session_*/logs/gcs_server.*")
        )

    def start_head_as_kuberay(self, incarnation: int) -> subprocess.Popen[str]:
        """The head as KubeRay's container runs it: `ray start --block`, which ends (and the container with it)
        when a Ray process of the head exits."""
        command = (
            f"{RAY} start --head --block --node-ip-address=127.0.0.1 --port={self.gcs_port} --num-cpus=1 "
            f"--include-dashboard=false --disable-usage-stats --temp-dir={self.temp_dir}/head{incarnation}"
            " --redis-password=$REDIS_PASSWORD"
        )
        env = {**self.base_env, **self.head_env, NODE_MARK: "head"}
        # To a file: the GCS's fatal stack traces fill a pipe, and a writer blocked on it never ends.
        with (self.temp_dir / f"head{incarnation}.out").open("w") as out:
            head = subprocess.Popen(["bash", "-c", command], env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        _wait(lambda: _listening(self.gcs_port) or head.poll() is not None, "the head's GCS listening")
        assert head.poll() is None, self.logs()
        return head

    def head_refused(self) -> str:
        """The head's start where it must fail: what `ray start` and the GCS's log said."""
        command = (
            f"{RAY} start --head --node-ip-address=127.0.0.1 --port={self.gcs_port} --num-cpus=1 "
            f"--include-dashboard=false --disable-usage-stats --temp-dir={self.temp_dir}/refused"
            " --redis-password=$REDIS_PASSWORD"
        )
        env = {**self.base_env, **self.head_env, NODE_MARK: "head"}
        started = subprocess.run(
            ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S
        )
        assert started.returncode != 0, "the head started against a store whose CA it was never given"
        return started.stdout + started.stderr + self.logs()

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
    # Nothing of this machine's own: no Ray settings, and no OpenSSL override of where trusted CAs are.
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SSL_CERT_"))}
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


def _head_container_env(**overrides: Any) -> dict[str, str]:
    """The plain values the synthesized RayService sets on the head container."""
    cluster = rayservice_from(synth(**overrides))["spec"]["rayClusterConfig"]
    env = cluster["headGroupSpec"]["template"]["spec"]["containers"][0].get("env", [])
    return {e["name"]: e["value"] for e in env if "value" in e}


def test_the_head_names_the_images_ca_bundle_for_the_store_where_gcs_fault_tolerance_is_on() -> None:
    assert _head_container_env()[REDIS_CA_CERT_ENV] == IMAGE_CA_BUNDLE
    assert REDIS_CA_CERT_ENV not in _head_container_env(gcs_fault_tolerance=False)


def _store_env(port: int, ca: Path | None) -> dict[str, str]:
    """The head's environment under gcsFaultToleranceOptions (KubeRay's variables and the product's CA variable, at
    this test's store and its CA), or with no CA named."""
    env = {
        # The scheme the stack writes (rediss: TLS), at this test's server.
        "RAY_REDIS_ADDRESS": f"{urlparse(GCS_STORE_ADDRESS_PLACEHOLDER).scheme}://127.0.0.1:{port}",
        "REDIS_PASSWORD": PASSWORD,
        "RAY_external_storage_namespace": "0b6c8a52-raycluster-uid",
    }
    if ca is not None:
        # The head container's own variable, pointed at this test's CA where the image's bundle would be.
        env[REDIS_CA_CERT_ENV] = str(ca)
    return env


def test_the_head_trusts_the_store_through_the_ca_it_names_and_not_without_it(tmp_path: Path) -> None:
    require_serve_deps()
    with _redis_with_tls(tmp_path) as (port, _), _cluster(tmp_path, _store_env(port, None)) as cluster:
        said = cluster.head_refused()
    # BoringSSL's verdict, in `ray start`'s own check of the store (redis_store_client.cc), as the GCS would meet it.
    assert "CERTIFICATE_VERIFY_FAILED" in said, said[-3000:]


def test_with_the_store_a_lost_head_comes_back_and_the_replica_lives_on(tmp_path: Path) -> None:
    require_serve_deps()
    with _redis_with_tls(tmp_path) as (port, ca):
        head_env = _store_env(port, ca)
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


def test_verify_fails_an_image_without_the_ca_bundle_the_head_names() -> None:
    """verify's image probe, run here (this Debian host has the bundle, as the image must), and a probe answer from
    an image without it."""
    assert IMAGE_CA_BUNDLE in image_probe.CA_BUNDLES
    found = image_probe.probe(s3=False)
    assert found["ca_bundles"] == [b for b in image_probe.CA_BUNDLES if Path(b).is_file()]
    assert IMAGE_CA_BUNDLE in found["ca_bundles"]
    without = {**found, "ca_bundles": ["/etc/pki/tls/certs/ca-bundle.crt"]}
    rows = image_checks(json.dumps(without), pod="w", s3=False, pins={})
    assert [(row.name, row.ok) for row in rows if "CA bundle" in row.name] == [("image: CA bundle", False)]
    assert not any("CA bundle" in row.name for row in image_checks(json.dumps(found), pod="w", s3=False, pins={}))


def test_a_store_failover_that_keeps_the_data_ends_the_head_and_its_restart_brings_everything_back(
    tmp_path: Path,
) -> None:
    """A failover of the store (ElastiCache moving its primary endpoint to a replica that holds the data): here the
    store killed and started again at the same address with its append-only file. Ray 2.58's GCS does not wait for
    it: once its Redis retries run out, seconds later, it fails ("Failed to run redis cmds") and stops answering,
    and the head's `ray start --block` ends when its own GCS client gives up (Ray's 60 s on the head). Nothing
    brings that GCS back: it takes the head's restart (the kubelet's, on EKS), which finds the data, and the worker
    and its replica carry on as after a lost head (docs/operations.md, "GCS fault tolerance")."""
    require_serve_deps()
    port = _free_port()
    with (
        tls_store(tmp_path / "store", host="127.0.0.1", port=port, password=PASSWORD, persistent=True) as store,
        _cluster(tmp_path, _store_env(port, store.ca)) as cluster,
    ):
        head = cluster.start_head_as_kuberay(1)
        cluster.start_worker(600)
        before = cluster.driver(KEEPER)
        lost = time.monotonic()
        store.kill()
        # Ray's 60 s, and room for a busy machine.
        _wait(lambda: head.poll() is not None, "the head's `ray start --block` ending after the store went", 180)
        head_ended_s = time.monotonic() - lost
        said = cluster.gcs_said(1)
        store.start()
        cluster.start_head(2)
        after = cluster.driver(FIND)
        survived = _raylet_alive("worker")
    print(f"store lost: the head's ray start ended after {head_ended_s:.1f} s")
    assert "Failed to run redis cmds" in said, said[-2000:]
    assert survived, "the worker's raylet exited while the head was away"
    assert after == before, f"the replica is not the same process: {before} before, {after} after"
