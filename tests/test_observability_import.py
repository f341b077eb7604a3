"""The one-command dashboard import, against a local HTTP server speaking Grafana's API."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from tests.conftest import ROOT
from tools import import_dashboard

PROMETHEUS = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1234/"


class Grafana(http.server.BaseHTTPRequestHandler):
    calls: ClassVar[list[tuple[str, str, Any, str]]] = []
    datasources: ClassVar[dict[str, str]] = {}

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.calls.append(("GET", self.path, None, self.headers["Authorization"]))
        name = self.path.rsplit("/", 1)[-1]
        if self.path.startswith("/api/datasources/name/") and name in self.datasources:
            self._reply(200, {"uid": self.datasources[name]})
        else:
            self._reply(404, {"message": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(("POST", self.path, body, self.headers["Authorization"]))
        if self.path == "/api/datasources":
            self.datasources[body["name"]] = "ds-uid-1"
            self._reply(200, {"datasource": {"uid": "ds-uid-1"}})
        else:
            self._reply(200, {"url": "/d/pd-inference-kv"})

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def grafana() -> Iterator[str]:
    Grafana.calls, Grafana.datasources = [], {}
    server = http.server.HTTPServer(("127.0.0.1", 0), Grafana)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_one_command_creates_the_sigv4_data_source_once_and_imports_the_dashboard(
    grafana: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_token")
    assert import_dashboard.main(["--grafana-url", grafana, "--prometheus-url", PROMETHEUS]) == 0
    posts = [(path, body) for method, path, body, _ in Grafana.calls if method == "POST"]
    (source,) = [body for path, body in posts if path == "/api/datasources"]
    assert source["url"] == PROMETHEUS.rstrip("/")
    assert source["jsonData"]["sigV4Auth"] is True and source["jsonData"]["sigV4Region"] == "us-east-1"
    (imported,) = [body for path, body in posts if path == "/api/dashboards/db"]
    variable = next(v for v in imported["dashboard"]["templating"]["list"] if v["name"] == "datasource")
    assert variable["current"]["value"] == "ds-uid-1"
    shipped = json.loads((ROOT / "observability" / "dashboard.json").read_text())
    assert imported["overwrite"] is True and imported["dashboard"]["panels"] == shipped["panels"]
    assert {auth for *_, auth in Grafana.calls} == {"Bearer glsa_token"}
    # Again: the data source exists, so only the dashboard is posted.
    Grafana.calls = []
    assert import_dashboard.main(["--grafana-url", grafana, "--prometheus-url", PROMETHEUS]) == 0
    assert [path for method, path, *_ in Grafana.calls if method == "POST"] == ["/api/dashboards/db"]


def test_without_a_token_it_says_so_and_sends_nothing(grafana: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    assert import_dashboard.main(["--grafana-url", grafana]) == 2
    assert Grafana.calls == []


def test_the_region_comes_from_the_workspace_endpoint() -> None:
    assert import_dashboard.region_of(PROMETHEUS) == "us-east-1"
    assert import_dashboard.region_of("https://prometheus.example.com/") is None
