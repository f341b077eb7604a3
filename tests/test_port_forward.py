"""The tools' port-forward outlives the pod it started on: kubectl exits when its pod goes, and the forward
starts again on the same local port, resolving the Service anew.

A stand-in `kubectl` on PATH does what kubectl port-forward does when its pod is replaced: it forwards
the local port to the Service's backend (a real HTTP server here) for one connection, then exits."""

from __future__ import annotations

import http.server
import json
import os
import stat
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from settings import Settings
from tools import cluster_access

# kubectl -n NS port-forward svc/NAME LOCAL:REMOTE -> serve one connection on LOCAL, relay it to the
# backend, exit. Each start appends a line to the starts file.
FAKE_KUBECTL = """#!{python}
import os, socket, sys, threading
local = int(sys.argv[-1].split(":")[0])
with open(os.environ["FAKE_KUBECTL_STARTS"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
server = socket.create_server(("127.0.0.1", local))
client, _ = server.accept()
backend = socket.create_connection(("127.0.0.1", int(os.environ["FAKE_KUBECTL_BACKEND"])))

def pump(src, dst):
    while data := src.recv(65536):
        dst.sendall(data)
    dst.shutdown(socket.SHUT_WR)

relay = threading.Thread(target=pump, args=(backend, client))
relay.start()
pump(client, backend)
relay.join()
"""


class Backend(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"pod": "ingress"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def fake_kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.parent.mkdir()
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable))
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    starts = tmp_path / "starts"
    monkeypatch.setenv("PATH", f"{kubectl.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_STARTS", str(starts))
    monkeypatch.setenv("FAKE_KUBECTL_BACKEND", str(backend.server_address[1]))
    yield starts
    backend.shutdown()


def _get(url: str) -> dict[str, str]:
    """One request, retried while the forward starts again (as a client's retry would)."""
    for _ in range(50):
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as answer:
                found: dict[str, str] = json.load(answer)
                return found
        except OSError:
            threading.Event().wait(0.2)
    raise AssertionError("the forward did not come back")


def test_requests_after_the_pod_goes_reach_the_new_one(fake_kubectl: Path) -> None:
    with cluster_access.port_forward(Settings(), "pd-llm-ingress", 8000) as url:
        answers = [_get(url) for _ in range(3)]
    assert answers == [{"pod": "ingress"}] * 3
    starts = fake_kubectl.read_text().splitlines()
    # One kubectl per pod it reached (each fake one serves one connection), every one on the Service.
    assert len(starts) >= 3
    assert all(line.startswith("-n llm port-forward svc/pd-llm-ingress ") for line in starts)
    assert len({line.split()[-1] for line in starts}) == 1
