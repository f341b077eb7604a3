"""The names every panel and alarm uses, where each comes from, and verify's live check of the pipeline.

- promql_queries(): every PromQL query of the Grafana dashboard and the alerting rules,
  each parsed by promql-parser (a real PromQL parser); query_names(): its metric and label names.
- ray_pod_names(): the metric names that must appear in a scrape of the Ray pods (all but
  the cited ones in observability/names.yaml); missing_from_scrape(): those a scrape lacks.
- panel_checks(): on a live stack, every panel's query returns data from the workspace
  (SigV4-signed queries to its Prometheus API); a panel without data fails, by name.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

from serve_config.observability_payloads import (
    NAMES_FILE,
    alarm_queries,
    dashboard,
    insights_queries,
    render_rules,
)
from settings import Settings
from tools.checks import Check

# Labels a scrape of any target has; never a reason to fail.
_BUILTIN_LABELS = frozenset({"__name__", "le", "quantile"})


@dataclass(frozen=True)
class Names:
    metrics: frozenset[str]
    labels: frozenset[str]


def _walk(node: Any, metrics: set[str], labels: set[str]) -> None:
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            metrics.add(node.name)
        for matcher in node.matchers.matchers:
            labels.add(matcher.name)
        return
    if isinstance(node, promql_parser.MatrixSelector):
        _walk(node.vector_selector, metrics, labels)
    elif isinstance(node, promql_parser.AggregateExpr):
        if node.modifier is not None:
            labels.update(node.modifier.labels)
        _walk(node.expr, metrics, labels)
        if node.param is not None:
            _walk(node.param, metrics, labels)
    elif isinstance(node, promql_parser.BinaryExpr):
        matching = getattr(node.modifier, "matching", None) if node.modifier is not None else None
        if matching is not None:
            labels.update(matching.labels)
        _walk(node.lhs, metrics, labels)
        _walk(node.rhs, metrics, labels)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            _walk(arg, metrics, labels)
    elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
        _walk(node.expr, metrics, labels)


def query_names(query: str) -> Names:
    """Metric and label names of one PromQL query; a query the parser refuses raises ValueError."""
    try:
        tree = promql_parser.parse(query)
    except Exception as err:  # the parser raises its own exception types
        raise ValueError(f"not PromQL: {query!r}: {err}") from err
    metrics: set[str] = set()
    labels: set[str] = set()
    _walk(tree, metrics, labels)
    return Names(frozenset(metrics), frozenset(labels - _BUILTIN_LABELS))


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query) for every target of the Grafana dashboard."""
    return [
        (f"{panel['title']} [{target['refId']}]", target["expr"])
        for panel in dashboard()["panels"]
        for target in panel["targets"]
    ]


def rule_queries(s: Settings) -> list[tuple[str, str]]:
    """(alert name, query) for every rule of the rendered rules."""
    groups = yaml.safe_load(render_rules(s))["groups"]
    return [(f"alarm {rule['alert']}", rule["expr"]) for group in groups for rule in group["rules"]]


def promql_queries(s: Settings) -> list[tuple[str, str]]:
    return dashboard_queries() + rule_queries(s)


def cited() -> dict[str, dict[str, str]]:
    loaded: dict[str, dict[str, str]] = yaml.safe_load(NAMES_FILE.read_text())
    return loaded


def used_names(s: Settings) -> Names:
    metrics: set[str] = set()
    labels: set[str] = set()
    for _, query in promql_queries(s):
        names = query_names(query)
        metrics |= names.metrics
        labels |= names.labels
    return Names(frozenset(metrics), frozenset(labels))


def ray_pod_names(s: Settings) -> Names:
    """What a scrape of the Ray pods must show: every used name that names.yaml does not cite."""
    sources = cited()
    used = used_names(s)
    return Names(
        used.metrics - set(sources.get("after_failure", {})),
        used.labels - set(sources.get("scrape_labels", {})),
    )


def cloudwatch_metric_names(cluster_name: str, namespace: str) -> set[str]:
    """The Container Insights names the CloudWatch dashboard and alarms use."""
    queries = {**insights_queries(cluster_name, namespace), **alarm_queries(cluster_name, namespace)}
    return {metric for metric, _ in queries.values()}


def scrape_names(texts: Iterable[str]) -> Names:
    """Every series name (histograms as _bucket/_sum/_count) and label name in Prometheus text exposition."""
    metrics: set[str] = set()
    labels: set[str] = set()
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                metrics.add(sample.name)
                labels.update(sample.labels)
    return Names(frozenset(metrics), frozenset(labels))


def missing_from_scrape(s: Settings, texts: Iterable[str]) -> list[str]:
    """The metric and label names a panel or alarm uses that neither the scrape shows nor names.yaml cites."""
    return missing_from_names(s, scrape_names(texts))


def missing_from_names(s: Settings, seen: Names) -> list[str]:
    """The metric and label names a panel or alarm uses that are not among these seen, nor cited in names.yaml."""
    need = ray_pod_names(s)
    return sorted(need.metrics - seen.metrics) + sorted(f"label {name}" for name in need.labels - seen.labels)


# --- verify on a live stack ---------------------------------------------------------
# An instant query over the workspace's Prometheus API; returns the result vector.
Query = Callable[[str], list[Any]]
# PromQL's own fallback in a panel ("or vector(0)") returns data without any scrape: not evidence.
_FALLBACK = re.compile(r"\s+or\s+vector\(0\)\s*$")


def sigv4_query(query_url: str, region: str) -> Query:
    """Instant queries to an Amazon Managed Prometheus workspace, signed with the caller's credentials."""
    import boto3
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.utils import percent_encode_sequence

    credentials = boto3.Session().get_credentials()

    def query(promql: str) -> list[Any]:
        # SigV4 signs the URL's query as written (botocore/auth.py, canonical_query_string), and the
        # service canonicalises what it receives with a space as %20. urllib's urlencode writes '+',
        # so the signatures would differ; percent_encode_sequence is the encoding botocore gives its
        # own requests' queries (botocore/awsrequest.py, prepare_request_dict). The URL signed is the
        # URL sent.
        url = f"{query_url.rstrip('/')}/api/v1/query?{percent_encode_sequence({'query': promql})}"
        request = AWSRequest(method="GET", url=url)
        SigV4Auth(credentials, "aps", region).add_auth(request)
        prepared = urllib.request.Request(request.url, headers=dict(request.headers))  # noqa: S310 - the workspace
        with urllib.request.urlopen(prepared, timeout=30) as response:  # noqa: S310
            body = json.loads(response.read().decode())
        result: list[Any] = body["data"]["result"]
        return result

    return query


def panel_checks(
    queries: list[tuple[str, str]],
    query: Query,
    *,
    attempts: int = 6,
    wait_seconds: float = 30.0,
    sleep: Callable[[float], None] | None = None,
    promql: bool = True,
) -> list[Check]:
    """Each panel's query must return data within `attempts` scrape intervals; one Check per panel.

    promql: the queries are PromQL (else CloudWatch Metrics Insights, asked as they are).
    sleep: None is time.sleep, looked up when called (as verify's own waits do)."""

    exempt: set[str] = set()
    if promql:
        after_failure = set(cited().get("after_failure", {}))
        # A panel on a counter that exists only after a failure has no data on a healthy stack.
        exempt = {title for title, expr in queries if query_names(expr).metrics <= after_failure}
    pending = {title: _FALLBACK.sub("", expr) for title, expr in queries if title not in exempt}
    errors: dict[str, str] = {}
    for attempt in range(attempts):
        for title, expr in list(pending.items()):
            try:
                if query(expr):
                    del pending[title]
                    errors.pop(title, None)
            except Exception as err:  # one panel's error is its own FAIL row
                errors[title] = f"{type(err).__name__}: {err}"
        if not pending or attempt == attempts - 1:
            break
        (sleep or time.sleep)(wait_seconds)
    return [
        Check(
            f"panel has data: {title}",
            title not in pending,
            "exists only after a failure (observability/names.yaml)"
            if title in exempt
            else errors.get(title, "no series" if title in pending else "data"),
        )
        for title, _ in queries
    ]


def workspace_query(s: Settings) -> Query:
    """Instant queries to this stack's workspace, found by its alias (cdk_constructs/observability.py)."""
    import boto3

    session = boto3.Session(region_name=s.effective_region) if s.effective_region else boto3.Session()
    alias = f"{s.cluster_name}-metrics"
    found = session.client("amp").list_workspaces(alias=alias)["workspaces"]
    active = [w for w in found if w.get("alias") == alias and w["status"]["statusCode"] == "ACTIVE"]
    if len(active) != 1:
        raise LookupError(f"{len(active)} active managed Prometheus workspaces with alias {alias}")
    endpoint = session.client("amp").describe_workspace(workspaceId=active[0]["workspaceId"])["workspace"][
        "prometheusEndpoint"
    ]
    return sigv4_query(endpoint, session.region_name)


def insights_query(s: Settings) -> Query:
    """Metrics Insights queries to CloudWatch over the last 10 minutes, one datapoint a minute."""
    import datetime

    import boto3

    session = boto3.Session(region_name=s.effective_region) if s.effective_region else boto3.Session()
    client = session.client("cloudwatch")

    def query(sql: str) -> list[Any]:
        end = datetime.datetime.now(datetime.UTC)
        answer = client.get_metric_data(
            MetricDataQueries=[{"Id": "q", "Expression": sql, "Period": 60}],
            StartTime=end - datetime.timedelta(minutes=10),
            EndTime=end,
        )
        return [r for r in answer["MetricDataResults"] if r.get("Values")]

    return query


def live_checks(
    s: Settings,
    query: Query | None = None,
    insights: Query | None = None,
    *,
    sleep: Callable[[float], None] | None = None,
) -> list[Check]:
    """verify's pipeline check, after its own request: every panel of both dashboards has data.

    The Grafana panels from the stack's Prometheus workspace, the CloudWatch dashboard's from
    Container Insights (the agent reports once a minute). Aggregated mode has no NIXL: its KV
    panels are not asked for."""

    if not s.observability:
        return []
    found: list[Check] = []
    try:
        ask = query if query is not None else workspace_query(s)
    except Exception as err:  # no credentials, no workspace: one FAIL row, not a crash
        found.append(Check("observability: the stack's Prometheus workspace", False, f"{type(err).__name__}: {err}"))
    else:
        panels = dashboard_queries()
        if s.serving_mode == "aggregated":
            panels = [
                (t, q) for t, q in panels if not any(m.startswith("ray_vllm_nixl_") for m in query_names(q).metrics)
            ]
        found += panel_checks(panels, ask, wait_seconds=float(s.observability_scrape_interval_seconds), sleep=sleep)
    try:
        cloudwatch = insights if insights is not None else insights_query(s)
    except Exception as err:
        found.append(Check("observability: CloudWatch", False, f"{type(err).__name__}: {err}"))
        return found
    panels = [(title, sql) for title, (_, sql) in insights_queries(s.cluster_name, s.serving_namespace).items()]
    # Pending pods are none on a healthy stack: no data there is the good answer, not a gap.
    panels = [(title, sql) for title, sql in panels if "pod_status_pending" not in sql]
    found += panel_checks(panels, cloudwatch, wait_seconds=60.0, sleep=sleep, promql=False)
    return found
