"""Settings given where they have no effect: refused, so that a value the user chose is never dropped unseen.

A setting with a default counts only when the user gave it (the settings file, -c, cdk.json or
cdk.context.json); validate() hands the keys over. Settings built in code count every value other than the
default as given.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, fields

from settings.model import Settings
from settings.rules.base import require

# The managed Prometheus workspace's rules and the CloudWatch alarms exist only with observability.
_OBSERVABILITY_ONLY = (
    "observability_scrape_interval_seconds",
    "alarm_email",
    "alarm_ttft_p99_seconds",
    "alarm_kv_throughput_floor_gb_per_s",
    "alarm_kv_cache_usage_ratio",
    "alarm_efa_flat_bytes_per_second",
    "alarm_pod_network_kv_bytes_per_second",
)


@dataclass(frozen=True)
class _Needs:
    """A setting that acts only while `applies` holds; `allowed` says when, and what else to change."""

    setting: str
    applies: Callable[[Settings], bool]
    allowed: str


NEEDS: tuple[_Needs, ...] = (
    *(
        _Needs(name, lambda s: s.observability, "set only with observability=true (without it there are no alarms)")
        for name in _OBSERVABILITY_ONLY
    ),
    # The KvThroughputBelowFloor rule is labelled serving_mode: disaggregated; aggregated mode moves no KV.
    _Needs(
        "alarm_kv_throughput_floor_gb_per_s",
        lambda s: s.serving_mode != "aggregated",
        "set only with serving_mode disaggregated (aggregated mode transfers no KV, and has no such alarm)",
    ),
    _Needs(
        "gcs_store_node_type",
        lambda s: s.gcs_fault_tolerance,
        "set only with gcs_fault_tolerance=true (without it there is no GCS store)",
    ),
    # An existing VPC is looked up as it is: the new VPC's range and AZ count are never read.
    _Needs("vpc_cidr", lambda s: s.vpc_id is None, "set only without vpc_id (it is the range of a new VPC)"),
    _Needs("max_azs", lambda s: s.vpc_id is None, "set only without vpc_id (it is the AZ count of a new VPC)"),
    _Needs(
        "capacity_block_end_warning_hours",
        lambda s: s.gpu_capacity_block,
        "set only with gpu_capacity_block=true (preflight's warning before a Capacity Block ends)",
    ),
    _Needs(
        "endpoint_api_keys_refresh_seconds",
        lambda s: s.endpoint_api_keys_secret_name is not None,
        "set only with endpoint_api_keys_secret_name (how often External Secrets re-reads the keys)",
    ),
    _Needs(
        "ray_worker_idle_timeout_seconds",
        lambda s: s.any_autoscaling,
        "set only where some side has a range, prefill_max_replicas or decode_max_replicas above its minimum "
        "(Ray's autoscaler, which removes idle worker pods, runs only then)",
    ),
    # A percentile is the share of requests a latency target bounds: without the target it bounds nothing.
    _Needs(
        "prefill_ttft_target_percentile",
        lambda s: s.prefill_ttft_target_ms is not None,
        "set only with prefill_ttft_target_ms (the percentile of prefill's time to first token it bounds)",
    ),
    _Needs(
        "decode_itl_target_percentile",
        lambda s: s.decode_itl_target_ms is not None,
        "set only with decode_itl_target_ms (the percentile of decode's inter-token latency it bounds)",
    ),
    # serve_config/deployments.py gives the router to the prefill and decode deployments only.
    _Needs(
        "prefix_cache_routing",
        lambda s: s.serving_mode != "aggregated",
        "set only with serving_mode disaggregated (aggregated mode's one deployment has no prefix router)",
    ),
)


def given_in_code(s: Settings) -> frozenset[str]:
    """The settings a Settings built in code gave: every field whose value is not its default."""
    return frozenset(f.name for f in fields(s) if getattr(s, f.name) != f.default)


def check_effect(s: Settings, given: Collection[str]) -> None:
    """Every setting the user gave acts in the configuration chosen; an empty value (none) is never refused."""
    for need in NEEDS:
        value = getattr(s, need.setting)
        if need.setting in given and value is not None and value != () and not need.applies(s):
            require(False, need.setting, value, need.allowed)
