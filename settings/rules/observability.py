"""Observability: the alarm address and the alarm thresholds."""

from __future__ import annotations

import re

from settings.model import Settings
from settings.rules.base import require
from settings.rules.bounds import span, within

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def check_observability(s: Settings) -> None:
    """The collector's interval and the alarm thresholds."""
    require(
        within("observability_scrape_interval_seconds", s.observability_scrape_interval_seconds),
        "observability_scrape_interval_seconds",
        s.observability_scrape_interval_seconds,
        f"{span('observability_scrape_interval_seconds')} seconds (a managed collector scrapes at most every 30 s)",
    )
    if s.alarm_email is not None:
        require(bool(_EMAIL.match(s.alarm_email)), "alarm_email", s.alarm_email, "one e-mail address, name@domain")
    require(0 < s.alarm_ttft_p99_seconds <= 600, "alarm_ttft_p99_seconds", s.alarm_ttft_p99_seconds, "0 to 600 seconds")
    require(
        0 < s.alarm_kv_throughput_floor_gb_per_s <= 100,
        "alarm_kv_throughput_floor_gb_per_s",
        s.alarm_kv_throughput_floor_gb_per_s,
        "above 0 and at most 100 GB/s",
    )
    require(
        0 < s.alarm_kv_cache_usage_ratio <= 1,
        "alarm_kv_cache_usage_ratio",
        s.alarm_kv_cache_usage_ratio,
        "above 0 and at most 1 (vLLM's kv_cache_usage_perc is a ratio)",
    )
    require(
        0 < s.alarm_efa_flat_bytes_per_second < s.alarm_pod_network_kv_bytes_per_second,
        "alarm_efa_flat_bytes_per_second",
        s.alarm_efa_flat_bytes_per_second,
        "above 0 and below alarm_pod_network_kv_bytes_per_second (EFA flat while KV-sized traffic is on pod network)",
    )
