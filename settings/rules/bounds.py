"""The fixed numeric range of each setting that has one: what validate() enforces and what the
settings reference (settings/descriptions.py) prints, from this one table.

Ranges that depend on other settings (max_model_len on the model, gpu_volume_gib on the instance
type) are computed where they are checked.
"""

from __future__ import annotations

RANGES: dict[str, tuple[int, int]] = {
    "system_volume_gib": (100, 16384),
    # A Capacity Block lasts at most 182 days.
    "capacity_block_end_warning_hours": (0, 24 * 182),
    "prefill_replicas": (1, 16),
    "decode_replicas": (1, 16),
    "prefill_max_replicas": (1, 16),
    "decode_max_replicas": (1, 16),
    # A latency target's percentile: under the median it scales on the fast half of the requests; above 99,
    # on the one or two slowest of a replica's look-back window, which is noise.
    "prefill_ttft_target_percentile": (50, 99),
    "decode_itl_target_percentile": (50, 99),
    "gpu_warm_nodes": (0, 16),
    "backpressure_retry_after_seconds": (1, 3600),
    "request_timeout_seconds": (30, 86400),
    "ray_worker_idle_timeout_seconds": (10, 86400),
    "endpoint_api_keys_refresh_seconds": (15, 86400),
    "endpoint_rate_limit_rpm": (0, 1_000_000),
    # A managed collector scrapes at most every 30 s.
    "observability_scrape_interval_seconds": (30, 300),
}


def within(name: str, value: float) -> bool:
    """Whether the value lies in the setting's range, both ends included."""
    low, high = RANGES[name]
    return low <= value <= high


def span(name: str) -> str:
    """The range as the errors and the reference word it: '15 to 86400'."""
    low, high = RANGES[name]
    return f"{low} to {high}"
