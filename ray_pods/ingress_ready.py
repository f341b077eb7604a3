"""The ingress pods' readiness probe: ready while the local Serve proxy is healthy and this pod's Ray
cluster is the one the RayService serves from.

Run by the kubelet as `python3 .../ray_pods/ingress_ready.py` (serve_config/pod_templates.py); exit
0 is ready. Standard library only: it runs beside Ray, not in it.

Why not KubeRay's own probe (the raylet's health and the proxy's /-/healthz): during a blue/green
upgrade both Ray clusters' ingress pods match the client Services' selector (serve_config.
ingress_selector names no cluster), and the new cluster's proxy is healthy as soon as its ingress
replica runs, minutes before its engines load. KubeRay itself sends traffic to the new cluster only
once every application there is RUNNING: it then points `<rayservice>-head-svc` at the new cluster's
head (rayservice_controller.go, reconcileServicesToReadyCluster, v1.7.0), and deletes the old one
rayClusterDeletionDelaySeconds later. So this probe asks both heads' dashboards for their session:
the same session means this pod's cluster is the serving one. A new cluster's ingress turns ready when
KubeRay switches to it, and the old one's turns unready then, while its streams finish.

When a head does not answer (lost, restarting under GCS fault tolerance, not up yet), the probe
keeps its last answer, in a file in the container's temporary directory: a head loss never takes
the serving cluster's ingress out of the endpoint, and a pod that never had an answer is not ready.
The raylet is not checked here: the proxy actor dies with it, and KubeRay's liveness probe, which
it keeps, checks it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

# Set by the stack on the ingress container: the dashboard behind the RayService's own head Service.
SERVING_DASHBOARD_ENV = "PD_SERVING_DASHBOARD"
# Set by KubeRay on every worker: this cluster's own head Service (common/pod.go, setContainerEnvVars).
OWN_HEAD_ENV = "FQ_RAY_IP"
DASHBOARD_PORT = 8265
PROXY_HEALTH = "http://127.0.0.1:8000/-/healthz"
PROXY_HEALTH_ENV = "PD_PROXY_HEALTH_URL"  # the rehearsal's proxy is not on 127.0.0.1
TIMEOUT_S = 2.0
STATE_FILE = "pd-inference-serving-cluster"
SERVING, NOT_SERVING = "serving", "not-serving"


class NoAnswerError(Exception):
    """A dashboard did not answer (connection, timeout, a server error): no verdict from it."""


class RefusedError(Exception):
    """A dashboard refused this cluster's token: it belongs to another Ray cluster."""


def _get(url: str) -> tuple[int, bytes]:
    headers = {}
    token = os.environ.get("RAY_AUTH_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - an http URL the stack sets
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), b""
    except (OSError, ValueError) as error:
        raise NoAnswerError(f"{url}: {error}") from error


def session(dashboard: str) -> str:
    """The Ray session a dashboard belongs to (GET /api/version, Ray 2.58 job_head.py)."""
    status, body = _get(f"{dashboard}/api/version")
    if status in (401, 403):
        raise RefusedError(f"{dashboard} refused this cluster's token (HTTP {status})")
    if status != 200:
        raise NoAnswerError(f"{dashboard}: HTTP {status}")
    try:
        return str(json.loads(body)["session_name"])
    except (ValueError, KeyError, TypeError) as error:
        raise NoAnswerError(f"{dashboard}: no session_name in {body[:120]!r}") from error


def serving_verdict(own_dashboard: str, serving_dashboard: str) -> str | None:
    """SERVING, NOT_SERVING, or None when either head did not answer."""
    try:
        own = session(own_dashboard)
    except (NoAnswerError, RefusedError):
        return None
    try:
        serving = session(serving_dashboard)
    except RefusedError:
        return NOT_SERVING
    except NoAnswerError:
        return None
    return SERVING if own == serving else NOT_SERVING


def proxy_healthy(url: str) -> bool:
    try:
        status, _ = _get(url)
    except NoAnswerError:
        return False
    return status == 200


def main() -> int:
    state = Path(tempfile.gettempdir()) / STATE_FILE
    if not proxy_healthy(os.environ.get(PROXY_HEALTH_ENV, PROXY_HEALTH)):
        print("not ready: the Serve proxy is not healthy")
        return 1
    own = f"http://{os.environ[OWN_HEAD_ENV]}:{DASHBOARD_PORT}"
    verdict = serving_verdict(own, os.environ[SERVING_DASHBOARD_ENV])
    if verdict is None:
        verdict = state.read_text().strip() if state.exists() else NOT_SERVING
        print(f"a head did not answer: keeping the last verdict, {verdict}")
    else:
        state.write_text(verdict)
        print(verdict)
    return 0 if verdict == SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
