"""What a side with a latency target reports to Serve's autoscaler, and the counting behind it.

A side with a latency target scales on Serve's custom metrics (Ray 2.58 serve/_private/replica.py): Serve calls a
replica's `record_autoscaling_stats` every min(look_back_period_s x 0.2, metrics_interval_s) seconds (6 s at Serve's
defaults), waits at most 10 s for it, and takes a dict of ints or floats, checked on the first call only (anything
else turns the metrics off for good). The controller keeps each key's values per replica and hands the policy
(ray_pods/latency_autoscaling.py) their time-weighted mean over look_back_period_s
(serve/_private/autoscaling_state.py, _get_aggregated_custom_metrics). So a replica reports counts, never a
percentile: the requests that finished in its last WINDOW_S seconds and how many of them were over the target. The
policy sums both over the replicas: a mean of percentiles is not a percentile, a ratio of sums is the fraction over.

The names live here, in a module of the standard library alone: the policy imports them in Serve's controller,
which has no engine. The servers that measure are in ray_pods/latency_servers.py.

The targets are a side's `user_config` (TARGET_MS_KEY, TARGET_PERCENTILE_KEY), which Serve hands the running
replicas' `reconfigure`: not in Serve's code version, so a new target restarts no engine. The policy and its kwargs
are fixed (serve_config/deployments.py). A replica with no target reports an empty dict, and Serve then adds no
metric (replica.py, `if custom_metrics`).
"""

import collections
from typing import Any

# A side's user_config keys (serve_config/deployments.py writes them; a test keeps the two equal).
TARGET_MS_KEY = "latency_target_ms"
TARGET_PERCENTILE_KEY = "latency_target_percentile"
# What a replica reports (record_autoscaling_stats), as floats. Decode leaves KV_CACHE_USAGE out where vLLM keeps
# no stats (disable_log_stats): unknown, not 0.
REQUESTS = "latency_requests"
OVER_TARGET = "latency_over_target"
ALLOWED_OVER_FRACTION = "latency_allowed_over_fraction"
LOCAL_PREFILLS = "local_prefills"
KV_CACHE_USAGE = "kv_cache_usage"
# Seconds of finished requests a report counts. At least Serve's interval between two reports (6 s at its defaults,
# at most metrics_interval_s, 10 s by default), so that every finished request is in some report; no longer, so
# that a breach that has ended leaves the reports soon (the controller then averages them over look_back_period_s,
# 30 s by default, and waits out upscale_delay_s or downscale_delay_s).
WINDOW_S = 10.0
# Requests timed against a target, by side and whether over it; Ray's exporter names it
# ray_latency_target_requests_total. A panel divides the over-target rate by the whole rate, each summed over the
# replicas (never a mean of each replica's fraction).
REQUESTS_METRIC = "latency_target_requests"


class SlidingCount:
    """Events in the last `window_s` seconds: their times in order, the expired ones dropped as it is used, so a
    request costs an append and, later, a pop."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        self._times: collections.deque[float] = collections.deque()

    def add(self, now: float) -> None:
        self._times.append(now)
        self._drop_before(now)

    def count(self, now: float) -> int:
        self._drop_before(now)
        return len(self._times)

    def _drop_before(self, now: float) -> None:
        edge = now - self._window_s
        while self._times and self._times[0] <= edge:
            self._times.popleft()


def target_of(user_config: dict[str, Any] | None) -> tuple[float, float] | None:
    """(target in ms, the fraction of requests allowed over it) from a side's user_config; None: no target."""
    config = user_config or {}
    if config.get(TARGET_MS_KEY) is None:
        return None
    target_ms = float(config[TARGET_MS_KEY])
    percentile = float(config.get(TARGET_PERCENTILE_KEY, 0))
    if target_ms <= 0 or not 0 < percentile < 100:
        raise ValueError(
            f"user_config {TARGET_MS_KEY}={config[TARGET_MS_KEY]!r}, {TARGET_PERCENTILE_KEY}="
            f"{config.get(TARGET_PERCENTILE_KEY)!r}: a target above 0 ms and a percentile between 0 and 100"
        )
    return target_ms, 1 - percentile / 100
