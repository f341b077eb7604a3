"""The reviewable observability payloads in observability/, rendered with the settings.

observability/scrape.yaml (the managed collector's Prometheus config), rules.yaml (the
alerting rules), dashboard.json (the Grafana dashboard) and names.yaml (where every name
that a panel or alarm uses comes from) are data; this module only fills in their
${...} placeholders. The Container Insights queries live here, as CloudWatch Metrics
Insights SQL, because their values (cluster name) are settings too.
"""

from __future__ import annotations

import json
import string
from typing import Any

import yaml

from settings import Settings
from settings.project import ROOT

PAYLOADS = ROOT / "observability"
DASHBOARD_FILE = PAYLOADS / "dashboard.json"
RULES_FILE = PAYLOADS / "rules.yaml"
SCRAPE_FILE = PAYLOADS / "scrape.yaml"
NAMES_FILE = PAYLOADS / "names.yaml"

# The CloudWatch agent's namespace and the dimension set it gives every node metric
# (aws/amazon-cloudwatch-agent translator/translate/otel/exporter/awsemf/kubernetes.go).
CONTAINER_INSIGHTS = "ContainerInsights"
NODE_SCHEMA = f"SCHEMA({CONTAINER_INSIGHTS}, ClusterName, InstanceId, NodeName)"
# pod_network_rx_bytes has a (ClusterName, Namespace) set; pod_status_pending only per pod.
NAMESPACE_SCHEMA = f"SCHEMA({CONTAINER_INSIGHTS}, ClusterName, Namespace)"
POD_SCHEMA = f"SCHEMA({CONTAINER_INSIGHTS}, ClusterName, Namespace, PodName)"


def render_rules(s: Settings) -> str:
    """rules.yaml with the alarm thresholds and replica minimums of these settings, and only the
    rules of its serving mode."""
    text = string.Template(RULES_FILE.read_text()).substitute(
        TTFT_P99_TARGET_SECONDS=f"{s.alarm_ttft_p99_seconds:g}",
        KV_THROUGHPUT_FLOOR_BYTES_PER_SECOND=f"{s.alarm_kv_throughput_floor_gb_per_s * 1e9:.0f}",
        KV_CACHE_USAGE_ALARM_RATIO=f"{s.alarm_kv_cache_usage_ratio:g}",
        PREFILL_REPLICAS=str(s.prefill_replicas),
        DECODE_REPLICAS=str(s.decode_replicas),
        ALL_REPLICAS=str(s.prefill_replicas + s.decode_replicas),
        NAMESPACE=s.serving_namespace,
    )
    rules = yaml.safe_load(text)
    for group in rules["groups"]:
        group["rules"] = [
            r for r in group["rules"] if r.get("labels", {}).get("serving_mode", s.serving_mode) == s.serving_mode
        ]
    dumped: str = yaml.safe_dump(rules, sort_keys=False, width=1000)
    return dumped


def render_scrape(s: Settings, cluster_arn: str) -> str:
    """scrape.yaml for this cluster: its serving namespace and the scrape interval."""
    return string.Template(SCRAPE_FILE.read_text()).substitute(
        SCRAPE_INTERVAL=f"{s.observability_scrape_interval_seconds}s",
        CLUSTER_ARN=cluster_arn,
        NAMESPACE=s.serving_namespace,
    )


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return loaded


def insights_queries(cluster_name: str, namespace: str) -> dict[str, tuple[str, str]]:
    """The Container Insights panels and alarms: title -> (metric name, Metrics Insights query).

    One series per node (GROUP BY NodeName) for the panels; the alarms use their own
    queries (alarm_queries) that return one series."""
    where = f"WHERE ClusterName = '{cluster_name}'"

    def per_node(stat: str, metric: str) -> tuple[str, str]:
        return metric, f"SELECT {stat}({metric}) FROM {NODE_SCHEMA} {where} GROUP BY NodeName"  # noqa: S608 - Metrics Insights over validated settings

    return {
        "GPU utilisation per node (%)": per_node("AVG", "node_gpu_utilization"),
        "GPU memory used per node (bytes)": per_node("MAX", "node_gpu_memory_used"),
        "EFA bytes received per node": per_node("SUM", "node_efa_rx_bytes"),
        "EFA bytes sent per node": per_node("SUM", "node_efa_tx_bytes"),
        "EFA RDMA read bytes per node": per_node("SUM", "node_efa_rdma_read_bytes"),
        "Nodes ready": per_node("MIN", "node_status_condition_ready"),
        "Pending pods (serving namespace)": (
            "pod_status_pending",
            # One datapoint a minute per pod, 1 while pending: the sum is the pending count.
            f"SELECT SUM(pod_status_pending) FROM {POD_SCHEMA} {where} AND Namespace = '{namespace}'",  # noqa: S608 - Metrics Insights over validated settings
        ),
    }


def alarm_queries(cluster_name: str, namespace: str) -> dict[str, tuple[str, str]]:
    """The CloudWatch alarms' queries: one series each (no GROUP BY)."""
    where = f"WHERE ClusterName = '{cluster_name}'"
    return {
        "node-not-ready": (
            "node_status_condition_ready",
            f"SELECT MIN(node_status_condition_ready) FROM {NODE_SCHEMA} {where}",  # noqa: S608 - Metrics Insights over validated settings
        ),
        "efa-bytes": ("node_efa_rx_bytes", f"SELECT SUM(node_efa_rx_bytes) FROM {NODE_SCHEMA} {where}"),  # noqa: S608 - Metrics Insights over validated settings
        "serving-pod-network": (
            "pod_network_rx_bytes",
            f"SELECT SUM(pod_network_rx_bytes) FROM {NAMESPACE_SCHEMA} {where} AND Namespace = '{namespace}'",  # noqa: S608 - Metrics Insights over validated settings
        ),
    }
