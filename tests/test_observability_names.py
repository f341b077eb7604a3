"""The names test: every name a panel or alarm uses comes from what really runs, and every query parses.

Names come from a real scrape of the rehearsal's pd case (both nodes' metrics endpoints,
recorded in tests/data/ by rehearsal/metric_names.py), or are cited in observability/names.yaml:
from vLLM's source for the counters that exist only after a failure, from the scrape config for
the labels the collector adds, from the CloudWatch agent's translator for Container Insights.
"""

from __future__ import annotations

import re
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

from rehearsal import metric_names
from rehearsal.network import DECODE_METRICS, PREFILL_METRICS
from serve_config import observability_payloads
from serve_config.observability_payloads import SCRAPE_FILE, alarm_queries, insights_queries
from settings.model import Settings
from settings.rules import validate
from tests.support.metric_names import recorded
from tools import verify_observability
from tools.checks import Check
from tools.verify_observability import (
    cited,
    cloudwatch_metric_names,
    dashboard_queries,
    missing_from_scrape,
    panel_checks,
    promql_queries,
    query_names,
    scrape_names,
)

# Recorded from the pd case on 2026-12-04 (rehearsal/metric_names.py wrote them; gzip only):
# node A runs the Ray head and prefill, node B decode.
# The installed packages the names are cited from (vLLM 0.26.0, Ray 2.58.0).
SITE = Path(sysconfig.get_paths()["purelib"])
SETTINGS = validate(Settings())


def test_every_query_parses_with_a_real_promql_parser() -> None:
    queries = promql_queries(SETTINGS)
    assert len(queries) >= 19
    for where, query in queries:
        names = query_names(query)
        assert names.metrics, where


def test_the_parser_refuses_what_is_not_promql() -> None:
    with pytest.raises(ValueError, match="not PromQL"):
        query_names("sum(rate(ray_vllm_x[5m])")


def test_the_recorded_scrape_is_a_real_two_node_scrape() -> None:
    prefill, decode = (scrape_names([text]) for text in recorded())
    # Ray's own node metrics on both; the engines' histograms after verify's request.
    for names in (prefill, decode):
        assert any(m.startswith("ray_node_") for m in names.metrics)
    assert "ray_vllm_nixl_xfer_time_seconds_bucket" in decode.metrics | prefill.metrics


def test_every_name_a_panel_or_alarm_uses_is_in_the_scrape_or_cited() -> None:
    assert missing_from_scrape(SETTINGS, recorded()) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("ray_vllm_kv_cache_usage_perc", "vllm:kv_cache_usage_perc"),  # vLLM's own name, before Ray's export
        ("ray_vllm_time_to_first_token_seconds_bucket", "ray_vllm_time_to_first_token_seconds"),
        ("by (deployment)", "by (deployment_name)"),
    ],
)
def test_changing_one_name_in_one_panel_fails(monkeypatch: pytest.MonkeyPatch, old: str, new: str) -> None:
    board = observability_payloads.dashboard()
    panel = next(p for p in board["panels"] if any(old in t["expr"] for t in p["targets"]))
    target = next(t for t in panel["targets"] if old in t["expr"])
    target["expr"] = target["expr"].replace(old, new, 1)
    monkeypatch.setattr(verify_observability, "dashboard", lambda: board)
    missing = missing_from_scrape(SETTINGS, recorded())
    assert missing, f"{panel['title']}: {new} should be reported"


def test_a_failure_only_counter_is_what_vllm_defines_as_ray_exports_it() -> None:
    """The cited name, derived from vLLM 0.26's source by Ray 2.58's rules (':' -> '_', prefix ray_, +_total)."""
    stats = (SITE / "vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py").read_text()
    counters = re.findall(r"self\._counter_cls\(\s*name=\"(vllm:[a-z_]+)\"", stats)
    assert "vllm:nixl_num_failed_transfers" in counters
    wrappers = (SITE / "vllm/v1/metrics/ray_wrappers.py").read_text()
    assert 're.sub(r"[^a-zA-Z0-9_]", "_", name)' in wrappers
    recorder = (SITE / "ray/_private/telemetry/open_telemetry_metric_recorder.py").read_text()
    assert 'NAMESPACE = "ray"' in recorder
    # Ray's exporter adds _total to a counter (ray/_private/metrics_agent.py), as the scrape shows for
    # vLLM's counter vllm:prompt_tokens, which exists in a healthy run: with _total, and only so.
    seen = scrape_names(recorded()).metrics
    assert "ray_vllm_prompt_tokens_total" in seen and "ray_vllm_prompt_tokens" not in seen
    for name in cited()["after_failure"]:
        base = name.removeprefix("ray_").removesuffix("_total")
        assert f"vllm:{base.removeprefix('vllm_')}" in counters, name
    # And it is absent from a healthy scrape: it really exists only after a failure.
    assert not set(cited()["after_failure"]) & scrape_names(recorded()).metrics


def test_the_labels_the_collector_adds_are_its_relabel_targets() -> None:
    text = SCRAPE_FILE.read_text()
    targets = set(re.findall(r"target_label: ([a-z_]+)", text))
    assert set(cited()["scrape_labels"]) <= targets
    # Every label a query groups or selects by is in the scrape or added by the collector.
    used = set().union(*(query_names(q).labels for _, q in promql_queries(SETTINGS)))
    assert used <= scrape_names(recorded()).labels | set(cited()["scrape_labels"])


# The CloudWatch agent's dimension sets for each name (translator kubernetes.go, as names.yaml cites them).
_DIMENSIONS = re.compile(r"dimensions \(([A-Za-z, ]+)\)")
_INSIGHTS = re.compile(
    r"^SELECT (AVG|MAX|MIN|SUM|COUNT)\(([a-z_]+)\) FROM SCHEMA\(ContainerInsights, ([A-Za-z, ]+)\) "
    r"WHERE ClusterName = '[A-Za-z0-9_-]+'( AND Namespace = '[a-z0-9-]+')?( GROUP BY NodeName)?$"
)


def _agent_dimensions() -> dict[str, set[str]]:
    found = {}
    for name, text in cited()["cloudwatch_agent"].items():
        match = _DIMENSIONS.search(text)
        assert match, name
        found[name] = {d.strip() for d in match.group(1).split(",")}
    return found


def test_every_container_insights_query_names_a_cited_metric_under_its_dimension_set() -> None:
    dimensions = _agent_dimensions()
    queries = {**insights_queries("pd-inference", "llm"), **alarm_queries("pd-inference", "llm")}
    assert cloudwatch_metric_names("pd-inference", "llm") <= set(dimensions)
    for title, (metric, query) in queries.items():
        match = _INSIGHTS.match(query)
        assert match, (title, query)
        assert match.group(2) == metric, title
        schema = {d.strip() for d in match.group(3).split(",")}
        assert schema == dimensions[metric], (title, schema, dimensions[metric])


def test_a_container_insights_query_under_another_schema_fails() -> None:
    dimensions = _agent_dimensions()
    # pod_status_pending has no (ClusterName, Namespace) set: a query on it would return nothing.
    assert {"ClusterName", "Namespace"} != dimensions["pod_status_pending"]


def test_the_dashboard_covers_what_the_issue_lists() -> None:
    titles = " | ".join(title for title, _ in dashboard_queries())
    for words in (
        "TTFT",
        "Inter-token",
        "running and waiting",
        "KV transfer time",
        "KV bytes",
        "KV throughput",
        "failed transfers",
        "KV-cache use",
        "Healthy and desired replicas",
    ):
        assert words in titles, words
    insights = " | ".join(insights_queries("c", "n"))
    for words in ("GPU utilisation", "GPU memory", "EFA bytes", "Pending pods", "Nodes ready"):
        assert words in insights, words


def test_the_rules_file_is_prometheus_rules_with_an_expression_each() -> None:
    groups = yaml.safe_load(observability_payloads.render_rules(SETTINGS))["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"]}
    assert alerts == {
        "NixlFailedTransfers",
        "TtftP99AboveTarget",
        "KvThroughputBelowFloor",
        "PrefillReplicasBelowMinimum",
        "DecodeReplicasBelowMinimum",
        "KvCachePinned",
    }


def test_aggregated_mode_alarms_on_its_one_engine_deployment_and_asks_nothing_of_nixl() -> None:
    aggregated = validate(Settings(serving_mode="aggregated"))
    groups = yaml.safe_load(observability_payloads.render_rules(aggregated))["groups"]
    rules = {r["alert"]: r["expr"] for g in groups for r in g["rules"]}
    assert set(rules) == {"TtftP99AboveTarget", "KvCachePinned", "EngineReplicasBelowMinimum"}
    assert 'deployment=~"LLMServer:.*"}) < 2 or absent' in rules["EngineReplicasBelowMinimum"]
    assert not any("nixl" in expr for expr in rules.values())
    for expr in rules.values():
        query_names(expr)


# --- verify's live check, against a fake workspace --------------------------------------------
def _fake(empty: set[str]) -> Any:
    def query(promql: str) -> list[Any]:
        return [] if any(name in promql for name in empty) else [{"value": [0, "1"]}]

    return query


def _checks(empty: set[str], **kw: Any) -> dict[str, Check]:
    checks = panel_checks(dashboard_queries(), _fake(empty), sleep=lambda _s: None, **kw)
    return {c.name: c for c in checks}


def test_every_panel_with_data_passes() -> None:
    checks = _checks(set())
    assert len(checks) == len(dashboard_queries()) and all(c.ok for c in checks.values())


def test_a_panel_without_data_fails_by_name() -> None:
    checks = _checks({"ray_vllm_kv_cache_usage_perc"})
    failed = [name for name, c in checks.items() if not c.ok]
    assert failed == ["panel has data: KV-cache use per side [A]"]


def test_the_failure_only_panel_is_not_asked_for_and_its_fallback_is_not_evidence() -> None:
    asked: list[str] = []

    def query(promql: str) -> list[Any]:
        asked.append(promql)
        return [{"value": [0, "1"]}]

    checks = {c.name: c for c in panel_checks(dashboard_queries(), query, sleep=lambda _s: None)}
    assert not any("num_failed_transfers" in q for q in asked)
    assert not any("vector(0)" in q for q in asked)
    assert checks["panel has data: NIXL failed transfers [A]"].ok


def test_it_waits_a_few_scrape_intervals_for_data() -> None:
    calls = {"n": 0}
    slept: list[float] = []

    def late(promql: str) -> list[Any]:
        calls["n"] += 1
        return [{"value": [0, "1"]}] if calls["n"] > 40 else []

    checks = panel_checks(dashboard_queries(), late, sleep=slept.append, wait_seconds=30.0)
    assert all(c.ok for c in checks) and slept and set(slept) == {30.0}


def test_live_checks_without_a_workspace_is_one_fail_row(monkeypatch: pytest.MonkeyPatch) -> None:
    def nowhere(_s: Settings) -> Any:
        raise LookupError("0 active managed Prometheus workspaces with alias pd-inference-metrics")

    monkeypatch.setattr(verify_observability, "workspace_query", nowhere)
    checks = verify_observability.live_checks(SETTINGS, insights=_fake(set()), sleep=lambda _s: None)
    (check,) = [c for c in checks if not c.ok]
    assert "alias pd-inference-metrics" in check.detail
    assert verify_observability.live_checks(validate(Settings(observability=False))) == []


def test_a_cloudwatch_panel_without_data_fails_by_name_and_pending_pods_are_not_asked() -> None:
    asked: list[str] = []

    def insights(sql: str) -> list[Any]:
        asked.append(sql)
        return [] if "node_efa_rdma_read_bytes" in sql else [{"Values": [1.0]}]

    checks = verify_observability.live_checks(SETTINGS, _fake(set()), insights, sleep=lambda _s: None)
    failed = [c.name for c in checks if not c.ok]
    assert failed == ["panel has data: EFA RDMA read bytes per node"]
    assert not any("pod_status_pending" in sql for sql in asked)
    assert len(checks) == len(dashboard_queries()) + len(insights_queries("c", "n")) - 1


def test_aggregated_mode_does_not_ask_for_the_kv_panels() -> None:
    aggregated = validate(Settings(serving_mode="aggregated"))
    checks = verify_observability.live_checks(aggregated, _fake(set()), _fake(set()), sleep=lambda _s: None)
    assert not any("KV transfer" in c.name or "NIXL" in c.name for c in checks)
    assert any("TTFT" in c.name for c in checks)


# --- the rehearsal phase (rehearsal/metric_names.py), on recorded scrapes -------------------------
def _phase(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, texts: list[str]) -> list[Check]:
    by_url = {PREFILL_METRICS: texts[0], DECODE_METRICS: texts[1]}
    monkeypatch.setattr(metric_names, "metrics_text", lambda url: by_url[url])
    # The phase's own request goes to the rehearsal's endpoint; here the scrape is the recorded one.
    sent: list[str] = []
    monkeypatch.setattr(metric_names, "chat_check", lambda base, model, api_key: sent.append(model))
    monkeypatch.setattr(metric_names, "SCRAPE_WAIT_S", 0.0)
    ctx = type("Ctx", (), {"results": tmp_path, "metrics": {}, "serve": "", "model_id": "m", "api_key": None})()
    checks: list[Check] = metric_names.names_check(ctx)
    assert sent == ["m"]
    return checks


def test_the_rehearsal_phase_passes_on_the_recorded_scrape_and_writes_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (check,) = _phase(monkeypatch, tmp_path, recorded())
    assert check.ok, check.detail
    assert (tmp_path / "metrics_decode_node.prom").read_text() == recorded()[1]


def test_the_rehearsal_phase_fails_on_a_scrape_without_a_panels_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    prefill, decode = recorded()
    strip = "\n".join(line for line in decode.splitlines() if "ray_vllm_nixl_xfer_time_seconds" not in line)
    prefill = "\n".join(line for line in prefill.splitlines() if "ray_vllm_nixl_xfer_time_seconds" not in line)
    (check,) = _phase(monkeypatch, tmp_path, [prefill + "\n", strip + "\n"])
    assert not check.ok and "ray_vllm_nixl_xfer_time_seconds_bucket" in check.detail


def test_the_rehearsal_phase_counts_a_name_seen_in_any_scrape_of_its_wait(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ray keeps a gauge in its scrape for two export intervals after its last report: a gauge in the first scrape
    and gone from the next, and another only in the next, are both there, as a collector would have stored them."""
    prefill, decode = recorded()
    gauges = ("ray_vllm_kv_cache_usage_perc", "ray_serve_deployment_replica_healthy")
    assert all(g in prefill + decode for g in gauges)

    def without(text: str, name: str) -> str:
        return "".join(line for line in text.splitlines(keepends=True) if name not in line)

    # The first scrape lacks one gauge, every later one the other.
    scrapes = [
        {PREFILL_METRICS: without(prefill, gauges[0]), DECODE_METRICS: without(decode, gauges[0])},
        {PREFILL_METRICS: without(prefill, gauges[1]), DECODE_METRICS: without(decode, gauges[1])},
    ]
    taken: list[dict[str, str]] = []

    def metrics_text(url: str) -> str:
        if url == PREFILL_METRICS:
            taken.append(scrapes[min(len(taken), len(scrapes) - 1)])
        return taken[-1][url]

    monkeypatch.setattr(metric_names, "metrics_text", metrics_text)
    monkeypatch.setattr(metric_names, "chat_check", lambda base, model, api_key: None)
    monkeypatch.setattr(metric_names, "SCRAPE_WAIT_S", 5.0)
    monkeypatch.setattr(metric_names, "SCRAPE_INTERVAL_S", 0.01)
    ctx = type("Ctx", (), {"results": tmp_path, "metrics": {}, "serve": "", "model_id": "m", "api_key": None})()
    (check,) = metric_names.names_check(ctx)
    assert check.ok, check.detail
    written = (tmp_path / "metrics_decode_node.prom").read_text()
    assert written.startswith("# scrape 1 of 2") and "# scrape 2 of 2" in written
