"""Waiting on a live cluster's counters: poll until done, or until the reading holds still."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

from tools.cluster_access import (
    NixlSnapshot,
)

T = TypeVar("T")


# How long Ray takes to export a counter (metrics_report_interval_ms, 10 s), with margin.
METRICS_WAIT_SECONDS = 30.0


# Ray's metrics_report_interval_ms: a reading unchanged for longer than this includes
# everything that happened before it was first taken.
EXPORT_INTERVAL_SECONDS = 10.0
# The Ray config as an environment variable sets it, for Ray and for these waits alike (the CPU rehearsal shortens it).
EXPORT_INTERVAL_ENV = "RAY_metrics_report_interval_ms"


def export_interval_seconds() -> float:
    """Ray's export interval as this process's environment sets it, else Ray's default; at least 1 s, as Ray
    floors it (ray/_private/telemetry/open_telemetry_metric_recorder.py)."""
    configured = os.environ.get(EXPORT_INTERVAL_ENV)
    return EXPORT_INTERVAL_SECONDS if configured is None else max(float(configured), 1000.0) / 1000.0


def poll(
    read: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout: float = METRICS_WAIT_SECONDS,
    interval: float = 2.0,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """Read until done(reading) or the timeout passes (Ray exports metrics every 10 s); the last reading."""
    pause = sleep or time.sleep
    waited = 0.0
    value = read()
    while not done(value) and waited < timeout:
        pause(interval)
        waited += interval
        value = read()
    return value


def settled(
    read: Callable[[], T],
    *,
    quiet: float | None = None,
    timeout: float = 90.0,
    interval: float = 2.0,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """A baseline: read until the value has held still for longer than Ray's export interval.

    A counter read once right after a deploy may not yet include decode's pre-warm (its
    transfer and prefill's prompt tokens), which Ray exports up to 10 s later; that late
    export would then pass for the growth a check request causes. Gives up after timeout
    (steady traffic) with the last reading. quiet: the export interval and 2 s, unless given.
    """
    if quiet is None:
        quiet = export_interval_seconds() + 2.0
    pause = sleep or time.sleep
    value = read()
    still = waited = 0.0
    while still < quiet and waited < timeout:
        pause(interval)
        waited += interval
        latest = read()
        still = still + interval if latest == value else 0.0
        value = latest
    return value


def poll_until_grown(
    read: Callable[[], NixlSnapshot],
    before: NixlSnapshot,
    *,
    timeout: float = METRICS_WAIT_SECONDS,
    interval: float = 2.0,
    sleep: Callable[[float], None] | None = None,
) -> NixlSnapshot:
    """Read decode's counters until the transfer count grows or the timeout passes; the last reading."""
    return poll(read, lambda after: after.transfers > before.transfers, timeout=timeout, interval=interval, sleep=sleep)


def grew(before: float | None) -> Callable[[float | None], bool]:
    """A done() for poll: the counter exists and is above before."""
    return lambda after: after is not None and after > (before or 0.0)
