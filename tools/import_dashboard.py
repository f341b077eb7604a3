"""Import the KV-path and latency dashboard (observability/dashboard.json) into a Grafana, in one command.

    python -m tools.import_dashboard --grafana-url https://g-xxxx.grafana-workspace.<region>.amazonaws.com \\
        --prometheus-url <stack output PrometheusQueryUrl> [--region us-east-1]

GRAFANA_TOKEN (a service account token with the Editor role) authenticates. With
--prometheus-url, the data source for the workspace (SigV4, the Grafana's own AWS
credentials) is created once under DATASOURCE_NAME and the dashboard's `datasource`
variable points at it; without it, pick the data source in the dashboard.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.request
from typing import Any

from serve_config.observability_payloads import dashboard

DATASOURCE_NAME = "pd-inference-prometheus"


def _call(base: str, token: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310 - the Grafana the user names
        f"{base.rstrip('/')}{path}",
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        text = response.read().decode()
    return json.loads(text) if text.strip() else None


def region_of(prometheus_url: str) -> str | None:
    """The region in a workspace endpoint, aps-workspaces.<region>.amazonaws.com."""
    found = re.search(r"aps-workspaces\.([a-z0-9-]+)\.amazonaws\.com", prometheus_url)
    return found.group(1) if found else None


def datasource_body(prometheus_url: str, region: str) -> dict[str, Any]:
    """A Prometheus data source signing with SigV4 (service aps) with the Grafana's own AWS credentials."""
    return {
        "name": DATASOURCE_NAME,
        "type": "prometheus",
        "access": "proxy",
        "url": prometheus_url.rstrip("/"),
        "jsonData": {"sigV4Auth": True, "sigV4AuthType": "default", "sigV4Region": region, "httpMethod": "POST"},
    }


def ensure_datasource(base: str, token: str, prometheus_url: str, region: str) -> str:
    """The uid of the workspace's data source, created if absent."""
    try:
        found = _call(base, token, "GET", f"/api/datasources/name/{DATASOURCE_NAME}")
        return str(found["uid"])
    except urllib.error.HTTPError as err:
        if err.code != 404:
            raise
    created = _call(base, token, "POST", "/api/datasources", datasource_body(prometheus_url, region))
    return str(created["datasource"]["uid"])


def import_body(datasource_uid: str | None) -> dict[str, Any]:
    board = dashboard()
    if datasource_uid is not None:
        for variable in board["templating"]["list"]:
            if variable["name"] == "datasource":
                variable["current"] = {"text": DATASOURCE_NAME, "value": datasource_uid}
    return {"dashboard": board, "overwrite": True, "message": "tools.import_dashboard"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grafana-url", required=True)
    parser.add_argument("--prometheus-url", help="the stack output PrometheusQueryUrl")
    parser.add_argument("--region", help="the workspace's region (default: read from --prometheus-url)")
    args = parser.parse_args(argv)
    token = os.environ.get("GRAFANA_TOKEN")
    if not token:
        print("GRAFANA_TOKEN is not set: a Grafana service account token with the Editor role", file=sys.stderr)
        return 2
    uid = None
    if args.prometheus_url:
        region = args.region or region_of(args.prometheus_url)
        if region is None:
            print("--region is needed: no region in --prometheus-url", file=sys.stderr)
            return 2
        uid = ensure_datasource(args.grafana_url, token, args.prometheus_url, region)
    result = _call(args.grafana_url, token, "POST", "/api/dashboards/db", import_body(uid))
    print(f"imported: {args.grafana_url.rstrip('/')}{result.get('url', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
