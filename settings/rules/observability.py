"""Observability: the alarm address and the alarm thresholds."""

from __future__ import annotations

import re

from settings import catalog
from settings.model import Settings
from settings.rules.base import require
from settings.rules.bounds import span, within
from settings.sizing import SIDES, download_gbps, pod_efa_gbps

_BITS_PER_BYTE = 8

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
    check_physical_thresholds(s)
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


def check_physical_thresholds(s: Settings) -> None:
    """Thresholds the chosen hardware can reach: past it, an alarm fires always or never.

    Line rates are in Gbps (settings/catalog.py network_gbps); the thresholds in GB/s or bytes per second.
    """
    gpu, gpus = s.gpu_instance_type, s.gpu_nodes_max
    if s.serving_mode != "aggregated":
        # One transfer moves over one pod's EFA devices on each side: the slower pod's share bounds it
        # (the rule divides bytes by NIXL's transfer time).
        line_gbps = min(pod_efa_gbps(s, side) for side in SIDES)
        floor_gb_per_s = line_gbps / _BITS_PER_BYTE
        require(
            s.alarm_kv_throughput_floor_gb_per_s <= floor_gb_per_s,
            "alarm_kv_throughput_floor_gb_per_s",
            s.alarm_kv_throughput_floor_gb_per_s,
            f"at most {floor_gb_per_s:g} GB/s, the EFA line rate of one {gpu} engine pod ({line_gbps:g} Gbps, "
            "in bits); a floor above it alarms whenever KV moves",
        )
    # The EFA-flat alarm sums every node's EFA receive rate; every GPU node at its line rate is the most it reads.
    efa_bytes = round(gpus * s.gpu_instance.network_gbps * 1e9 / _BITS_PER_BYTE)
    require(
        s.alarm_efa_flat_bytes_per_second < efa_bytes,
        "alarm_efa_flat_bytes_per_second",
        s.alarm_efa_flat_bytes_per_second,
        f"below {efa_bytes} bytes/s, what {gpus} {gpu} node(s) receive over EFA at line rate; above it EFA is "
        "always flat",
    )
    # The serving pods receive over the nodes' ENA: card 0 of each GPU node, and the system nodes.
    system = catalog.INSTANCE_TYPES[s.system_instance_type].network_gbps
    pod_bytes = round((gpus * download_gbps(s) + s.system_nodes_max * system) * 1e9 / _BITS_PER_BYTE)
    require(
        s.alarm_pod_network_kv_bytes_per_second < pod_bytes,
        "alarm_pod_network_kv_bytes_per_second",
        s.alarm_pod_network_kv_bytes_per_second,
        f"below {pod_bytes} bytes/s, what the serving pods' nodes ({gpus} {gpu}, {s.system_nodes_max} "
        f"{s.system_instance_type}) receive on the pod network at line rate; above it the alarm never fires",
    )
