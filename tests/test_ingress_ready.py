"""The ingress pods' readiness probe (ray_pods/ingress_ready.py), run as the kubelet runs it: the shipped
file, by path, in a process of its own, with the environment KubeRay and the stack give the container.

The proxy and the two dashboards are real HTTP servers on loopback addresses. Each dashboard answers
GET /api/version with Ray 2.58's own VersionResponse (dashboard/modules/job/job_head.py) and refuses a
missing or foreign token as Ray's token middleware does (401, 403). The rehearsal runs the same file
against Ray's real dashboard (rehearsal/readiness.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ray_pods import ingress_ready
from ray_pods.ingress_ready import OWN_HEAD_ENV, PROXY_HEALTH_ENV, SERVING_DASHBOARD_ENV
from serve_config import SERVE_PORT
from serve_config.endpoint_keys import RAY_PODS_CONFIGMAP, RAY_PODS_PACKAGE, RAY_PODS_PYTHONPATH
from serve_config.pod_templates import INGRESS_READY_SCRIPT, serving_dashboard
from settings import Settings, sizing
from settings.project import ROOT
from tests.conftest import manifests, rayservice_from, require_serve_deps, synth

SCRIPT = ROOT / RAY_PODS_PACKAGE / INGRESS_READY_SCRIPT
DASHBOARD_PORT = 8265


@dataclasses.dataclass
class Dashboard:
    """A head's dashboard: its session, the token it accepts (None: token auth off), whether it answers."""

    session: str
    token: str | None = None
    up: bool = True
    refuses: int | None = None  # a status it answers every call with, as Ray's token middleware refuses


_VERSION_RESPONSE: list[Any] = []


@pytest.fixture(autouse=True)
def ray_version_response() -> None:
    """Ray's own response type, loaded before any server thread needs it (the serve venv only)."""
    require_serve_deps()
    from ray.dashboard.modules.version import VersionResponse

    _VERSION_RESPONSE[:] = [VersionResponse]


def _version_body(session: str) -> bytes:
    (response,) = _VERSION_RESPONSE
    return json.dumps(dataclasses.asdict(response("4", "2.58.0", "commit", session))).encode()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        server: Any = self.server
        status, body = server.answer(self.path, self.headers.get("Authorization", ""))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serve(host: str, port: int, answer: Any) -> Iterator[None]:
    server: Any = ThreadingHTTPServer((host, port), _Handler)
    server.answer = answer
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def _dashboard_answer(dashboard: Dashboard) -> Any:
    def answer(path: str, authorization: str) -> tuple[int, bytes]:
        if not dashboard.up:
            return 503, b""
        if dashboard.refuses is not None:
            return dashboard.refuses, b"Forbidden: Invalid authentication token"
        if dashboard.token is not None:
            if not authorization:
                return 401, b"Unauthorized: Missing authentication token"
            if authorization != f"Bearer {dashboard.token}":
                return 403, b"Forbidden: Invalid authentication token"
        return (200, _version_body(dashboard.session)) if path == "/api/version" else (404, b"")

    return answer


@dataclasses.dataclass
class Pod:
    """One ingress pod: its cluster's dashboard, the RayService head Service's, its proxy, its /tmp."""

    own: Dashboard
    serving: Dashboard
    tmp: Path
    proxy_healthy: bool = True

    def probe(self, hosts: dict[str, str], token: str | None) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "TMPDIR": str(self.tmp),
            OWN_HEAD_ENV: hosts["own"],
            SERVING_DASHBOARD_ENV: f"http://{hosts['serving']}:{DASHBOARD_PORT}",
            PROXY_HEALTH_ENV: f"http://{hosts['proxy']}:{SERVE_PORT}/-/healthz",
        }
        if token is not None:
            env["RAY_AUTH_TOKEN"] = token
        return subprocess.run(
            [sys.executable, "-I", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=False
        )


@contextlib.contextmanager
def running(pod: Pod) -> Iterator[dict[str, str]]:
    """The three servers on loopback addresses of their own (the dashboards' port is fixed, as in a pod)."""
    base = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
    hosts = {"own": f"{base}.1", "serving": f"{base}.2", "proxy": f"{base}.3"}

    def proxy(path: str, authorization: str) -> tuple[int, bytes]:
        return (200, b"success") if pod.proxy_healthy else (503, b"This node is being drained.")

    with (
        _serve(hosts["own"], DASHBOARD_PORT, _dashboard_answer(pod.own)),
        _serve(hosts["serving"], DASHBOARD_PORT, _dashboard_answer(pod.serving)),
        _serve(hosts["proxy"], SERVE_PORT, proxy),
    ):
        yield hosts


pytestmark = pytest.mark.xdist_group("ingress-ready")


def test_ready_when_the_serving_head_is_its_own_cluster_and_the_proxy_is_healthy(tmp_path: Path) -> None:
    blue = Dashboard("session_blue", token="blue-token")
    pod = Pod(own=blue, serving=blue, tmp=tmp_path)
    with running(pod) as hosts:
        result = pod.probe(hosts, "blue-token")
        assert result.returncode == 0, result.stdout + result.stderr
        pod.proxy_healthy = False
        assert pod.probe(hosts, "blue-token").returncode == 1, "a draining proxy is never ready"


def test_during_a_switch_only_the_serving_clusters_ingress_is_ready(tmp_path: Path) -> None:
    """KubeRay points <rayservice>-head-svc at the new cluster once its app is RUNNING: before that only
    blue's pods are ready, after it only green's, token auth on and off."""
    for token_auth in (True, False):
        blue = Dashboard("session_blue", token="blue-token" if token_auth else None)
        green = Dashboard("session_green", token="green-token" if token_auth else None)
        for serving, ready in ((blue, {"blue"}), (green, {"green"})):
            found = set()
            for name, own in (("blue", blue), ("green", green)):
                pod = Pod(own=own, serving=serving, tmp=tmp_path / f"{token_auth}-{serving.session}-{name}")
                pod.tmp.mkdir()
                with running(pod) as hosts:
                    if pod.probe(hosts, own.token).returncode == 0:
                        found.add(name)
            assert found == ready, (token_auth, serving.session)


def test_a_head_that_does_not_answer_keeps_the_last_verdict(tmp_path: Path) -> None:
    """A lost head (or one restarting under GCS fault tolerance) leaves the serving cluster's ingress in
    the endpoint and a pod that never had a verdict out of it."""
    blue = Dashboard("session_blue", token="blue-token")
    green = Dashboard("session_green", token="green-token")
    serving_pod = Pod(own=blue, serving=blue, tmp=tmp_path / "serving")
    new_pod = Pod(own=green, serving=blue, tmp=tmp_path / "new")
    fresh_pod = Pod(own=blue, serving=blue, tmp=tmp_path / "fresh")
    for pod in (serving_pod, new_pod, fresh_pod):
        pod.tmp.mkdir()
    with running(serving_pod) as hosts:
        assert serving_pod.probe(hosts, "blue-token").returncode == 0
        blue.up = False
        result = serving_pod.probe(hosts, "blue-token")
        assert result.returncode == 0 and "keeping the last verdict" in result.stdout, result.stdout
    with running(fresh_pod) as hosts:
        assert fresh_pod.probe(hosts, "blue-token").returncode == 1, "no verdict yet: not ready"
    blue.up = True
    with running(new_pod) as hosts:
        assert new_pod.probe(hosts, "green-token").returncode == 1
        green.up = False
        assert new_pod.probe(hosts, "green-token").returncode == 1, "its last verdict was not-serving"


@pytest.mark.parametrize("status", [401, 403])
def test_a_serving_head_that_refuses_ends_a_served_pods_readiness_whatever_its_last_verdict(
    tmp_path: Path, status: int
) -> None:
    """After a blue/green switch the head Service points at green, whose token blue's pods do not hold: its 401 or
    403 is an answer (this pod is not the serving cluster), not a missing one, so blue's ingress leaves the
    endpoint even though its last verdict was serving."""
    blue = Dashboard("session_blue", token="blue-token")
    serving = Dashboard("session_blue", token="blue-token")
    pod = Pod(own=blue, serving=serving, tmp=tmp_path)
    with running(pod) as hosts:
        assert pod.probe(hosts, "blue-token").returncode == 0
        # The switch: the head Service now reaches green, which refuses blue's token with this status.
        serving.refuses = status
        refused = pod.probe(hosts, "blue-token")
        assert refused.returncode == 1, refused.stdout
        assert "keeping the last verdict" not in refused.stdout


def test_three_calls_that_each_answer_just_before_their_timeout_stay_within_the_probes_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe makes up to three calls (the proxy, its own head, the serving head), each bounded by the module's
    timeout; the kubelet kills the probe at timeoutSeconds and counts a failure. Each server here answers just
    before that timeout, the serving head not at all."""
    delay = ingress_ready.TIMEOUT_S * 0.9
    blue = Dashboard("session_blue", token="blue-token")
    pod = Pod(own=blue, serving=blue, tmp=tmp_path)
    (tmp_path / ingress_ready.STATE_FILE).write_text(ingress_ready.SERVING)
    slow = _dashboard_answer(blue)

    def answer_late(path: str, authorization: str) -> tuple[int, bytes]:
        time.sleep(delay)
        status, body = slow(path, authorization)
        return int(status), bytes(body)

    def proxy_late(path: str, authorization: str) -> tuple[int, bytes]:
        time.sleep(delay)
        return 200, b"success"

    def never(path: str, authorization: str) -> tuple[int, bytes]:
        time.sleep(sizing.INGRESS_READINESS_TIMEOUT_S * 2)
        return 503, b""

    base = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
    hosts = {"own": f"{base}.1", "serving": f"{base}.2", "proxy": f"{base}.3"}
    with (
        _serve(hosts["own"], DASHBOARD_PORT, answer_late),
        _serve(hosts["serving"], DASHBOARD_PORT, never),
        _serve(hosts["proxy"], SERVE_PORT, proxy_late),
    ):
        started = time.monotonic()
        result = pod.probe(hosts, "blue-token")
        elapsed = time.monotonic() - started
    assert "keeping the last verdict" in result.stdout, result.stdout + result.stderr
    assert elapsed < sizing.INGRESS_READINESS_TIMEOUT_S, f"{elapsed:.1f} s"


def test_the_ingress_container_runs_the_shipped_probe_with_the_serving_dashboard() -> None:
    """The probe's command runs the file the ConfigMap mounts, the variable it reads is the one the template
    sets, and its timing is sizing's; the GPU workers keep KubeRay's own probe (not endpoints)."""
    template = synth()
    cluster = rayservice_from(template)["spec"]["rayClusterConfig"]
    groups = {g["groupName"]: g["template"]["spec"]["containers"][0] for g in cluster["workerGroupSpecs"]}
    probe = groups.pop("ingress")["readinessProbe"]
    script = f"{RAY_PODS_PYTHONPATH}/{RAY_PODS_PACKAGE}/{INGRESS_READY_SCRIPT}"
    assert probe["exec"]["command"][-1].endswith(script)
    (configmap,) = [m for m in manifests(template) if m["metadata"]["name"] == RAY_PODS_CONFIGMAP]
    assert configmap["data"][INGRESS_READY_SCRIPT] == SCRIPT.read_text()
    assert (probe["periodSeconds"], probe["timeoutSeconds"], probe["failureThreshold"]) == (
        sizing.INGRESS_READINESS_PERIOD_S,
        sizing.INGRESS_READINESS_TIMEOUT_S,
        1,
    )
    ingress = next(g for g in cluster["workerGroupSpecs"] if g["groupName"] == "ingress")
    env = {e["name"]: e["value"] for e in ingress["template"]["spec"]["containers"][0]["env"] if "value" in e}
    assert env[SERVING_DASHBOARD_ENV] == serving_dashboard(Settings()) == "http://pd-llm-head-svc:8265"
    assert all("readinessProbe" not in container for container in groups.values())
