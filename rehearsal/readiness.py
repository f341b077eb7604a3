"""The ingress pods' readiness probe (ray_pods/ingress_ready.py) against Ray's real dashboard and Serve proxy.

The file is the ConfigMap's copy that this run lays out as the pods' mount (rehearsal/keys.py prepare),
run by path in a process of its own as the kubelet runs it, with what KubeRay sets in the container
(FQ_RAY_IP, RAY_AUTH_TOKEN) and the stack's PD_SERVING_DASHBOARD. On the one deployed app:
- this cluster serving (both dashboards are the real head): ready;
- another cluster serving (a stand-in dashboard of another session): not ready;
- the serving head gone after a verdict of serving (a closed port): still ready, the last verdict kept.
The first proves the field and the token header on Ray 2.58's real GET /api/version; the unit tests
(tests/test_ingress_ready.py) hold the rest of the logic.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ray_pods.ingress_ready import OWN_HEAD_ENV, PROXY_HEALTH_ENV, SERVING_DASHBOARD_ENV
from rehearsal.context import Context
from rehearsal.network import HEAD_IP
from serve_config.endpoint_keys import RAY_PODS_PACKAGE
from serve_config.pod_templates import INGRESS_READY_SCRIPT
from tools.checks import Check


class _OtherSession(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"version": "4", "ray_version": "2.58.0", "ray_commit": "", "session_name": "session_other"})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _other_cluster() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtherSession)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def readiness_check(ctx: Context) -> list[Check]:
    script = ctx.work / "python" / RAY_PODS_PACKAGE / INGRESS_READY_SCRIPT
    state = ctx.work / "readiness-tmp"
    state.mkdir(exist_ok=True)

    def probe(serving: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "TMPDIR": str(state),
            OWN_HEAD_ENV: HEAD_IP,
            SERVING_DASHBOARD_ENV: serving,
            PROXY_HEALTH_ENV: f"{ctx.serve}/-/healthz",
            **{k: v for k, v in ctx.env.items() if k == "RAY_AUTH_TOKEN"},
        }
        return subprocess.run([sys.executable, "-I", str(script)], env=env, capture_output=True, text=True, timeout=60)

    found = []
    with _other_cluster() as other:
        for name, serving, ready in (
            ("this cluster serving: ready", ctx.dashboard, True),
            ("another cluster serving: not ready", other, False),
            ("this cluster serving again: ready", ctx.dashboard, True),
            ("the serving head gone: the last verdict kept, ready", _closed_port(), True),
        ):
            result = probe(serving)
            detail = f"exit {result.returncode}: {(result.stdout + result.stderr).strip()[-300:]}"
            found.append(Check(f"ingress readiness: {name}", (result.returncode == 0) is ready, detail))
    found.append(
        Check("ingress readiness: token auth on", "RAY_AUTH_TOKEN" in ctx.env, "the probe sent KubeRay's token")
    )
    return found
