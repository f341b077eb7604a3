"""verify's signed queries to the managed Prometheus workspace, against botocore's own SigV4.

A local HTTP server stands in for the workspace and checks each request's signature the way a
SigV4 service does: it decodes the query it received, canonicalises it again (botocore 1.44.8,
botocore/auth.py SigV4Auth._canonical_query_string_params: each key and value URI-encoded with
only A-Z a-z 0-9 - _ . ~ left as they are, so a space is %20) and signs that with the caller's
secret. Both ways a server may read a '+' in a query (a space, as in a form, or a plus) are tried;
a request is accepted only when both give its signature.
"""

from __future__ import annotations

import datetime
import http.server
import json
import threading
import urllib.error
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import botocore.auth
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from settings import Settings, validate
from tools.verify_observability import dashboard_queries, rule_queries, sigv4_query

KEY_ID, SECRET = "AKIDEXAMPLE", "secret"
REGION = "us-east-1"
CLOCK = datetime.datetime(2026, 12, 2, 12, 0, 0)
# Spaces, braces, quotes, and the characters a form encoding and a URI encoding treat differently.
QUERIES = [
    'rate(x{deployment=~"Decode:.*"}[5m])',
    'sum by (deployment) (rate(ray_serve_num_http_requests_total{route=~"/v1/.+"}[5m])) + 1',
    'histogram_quantile(0.99, sum by (le) (rate(ray_vllm_time_to_first_token_seconds_bucket{model_name!~"a~b"}[5m])))',
    "min(ray_serve_deployment_replica_healthy == 1) or vector(0)",
]


def _signed(url: str, params: list[tuple[str, str]] | None = None) -> AWSRequest:
    """botocore's SigV4 on a GET, at CLOCK, with the fixed credentials."""
    request = AWSRequest(method="GET", url=url, params=params or {})
    SigV4Auth(Credentials(KEY_ID, SECRET), "aps", REGION).add_auth(request)
    return request


def _canonical(request: AWSRequest) -> str:
    canonical: str = SigV4Auth(Credentials(KEY_ID, SECRET), "aps", REGION).canonical_query_string(request)
    return canonical


@dataclass
class Workspace:
    """What the workspace received: each request's path with its query, and its headers."""

    received: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    url: str = ""


def _decodings(query: str) -> list[list[tuple[str, str]]]:
    pairs = [pair.partition("=") for pair in query.split("&") if pair]
    return [
        urllib.parse.parse_qsl(query, keep_blank_values=True),  # '+' is a space
        [(urllib.parse.unquote(k), urllib.parse.unquote(v)) for k, _, v in pairs],  # '+' is a plus
    ]


def _accepts(host: str, path: str, headers: dict[str, str]) -> bool:
    route, _, query = path.partition("?")
    return all(
        _signed(f"http://{host}{route}", pairs).headers["Authorization"] == headers.get("Authorization")
        for pairs in _decodings(query)
    )


@pytest.fixture
def workspace(monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    # The caller's credentials as boto3 finds them first (the environment), and a fixed clock.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *_a, **_k: CLOCK)
    seen = Workspace()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            headers = dict(self.headers.items())
            seen.received.append((self.path, headers))
            ok = _accepts(headers["Host"], self.path, headers)
            body = (
                {"status": "success", "data": {"resultType": "vector", "result": [{"value": [0, "1"]}]}}
                if ok
                else {"message": "The request signature we calculated does not match the signature you provided."}
            )
            data = json.dumps(body).encode()
            self.send_response(200 if ok else 403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    seen.url = f"http://127.0.0.1:{server.server_address[1]}/workspaces/ws-example/"
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("promql", QUERIES)
def test_the_query_sent_and_signed_are_botocores(workspace: Workspace, promql: str) -> None:
    try:
        answer: object = sigv4_query(workspace.url, REGION)(promql)
    except urllib.error.HTTPError as err:
        answer = f"HTTP {err.code}"
    ((path, headers),) = workspace.received
    route, _, sent = path.partition("?")
    assert route == "/workspaces/ws-example/api/v1/query"
    # botocore's canonical query string for the same PromQL given as params...
    reference = _signed(f"{workspace.url}api/v1/query", [("query", promql)])
    assert sent == _canonical(reference)
    # ...is exactly what went over the wire, and the signature sent is botocore's over it.
    assert headers["Authorization"] == reference.headers["Authorization"]
    assert headers["X-Amz-Date"] == CLOCK.strftime("%Y%m%dT%H%M%SZ")
    assert urllib.parse.parse_qsl(sent) == [("query", promql)]
    assert answer == [{"value": [0, "1"]}]


def test_every_dashboard_and_rule_query_is_accepted(workspace: Workspace) -> None:
    query = sigv4_query(workspace.url, REGION)
    queries = dashboard_queries() + rule_queries(validate(Settings()))
    refused = []
    for title, promql in queries:
        try:
            query(promql)
        except urllib.error.HTTPError as err:
            refused.append(f"{title}: HTTP {err.code}")
    assert not refused, refused
    assert len(workspace.received) == len(queries)


def test_a_wrong_secret_is_refused(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in checks signatures: the same request signed with another secret gets 403."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "another")
    with pytest.raises(urllib.error.HTTPError) as err:
        sigv4_query(workspace.url, REGION)(QUERIES[0])
    assert err.value.code == 403
