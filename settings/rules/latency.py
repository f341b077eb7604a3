"""A side's latency target, the alternative to its ongoing-requests target: where it may be set, and how low.

A target a replica cannot meet on an idle side would scale the side to its maximum and hold it there, paying
for every GPU while missing the target still: refused, with the floor `make plan` prints
(settings/sizing/latency.py).
"""

from __future__ import annotations

import math

from settings.model import Settings
from settings.rules.base import require
from settings.rules.bounds import span, within
from settings.sizing import decode_itl_floor_ms, prefill_floor_prompt_tokens, prefill_ttft_floor_ms

# Each side's two settings, and what its target bounds.
LATENCY_KEYS: dict[str, tuple[str, str]] = {
    "prefill": ("prefill_ttft_target_ms", "prefill_ttft_target_percentile"),
    "decode": ("decode_itl_target_ms", "decode_itl_target_percentile"),
}


def _floor(s: Settings, side: str) -> tuple[int, str]:
    """The lowest target one replica of the side can give, in whole milliseconds, and what it is."""
    if side == "prefill":
        return math.ceil(prefill_ttft_floor_ms(s)), (
            f"one prefill replica's time for a {prefill_floor_prompt_tokens(s)}-token prompt, the shortest prefill "
            "is sent (typical_request_tokens, or past local_prefill_max_tokens)"
        )
    return math.ceil(decode_itl_floor_ms(s)), "one decode step at decode's max_ongoing_requests"


def check_latency_targets(s: Settings) -> None:
    """Each side's percentile in its range; a target only on a ranged side of the split, alone, above the floor."""
    for side, (key, percentile_key) in LATENCY_KEYS.items():
        percentile = getattr(s, percentile_key)
        require(
            within(percentile_key, percentile),
            percentile_key,
            percentile,
            f"{span(percentile_key)} (the share of {side}'s requests {key} bounds)",
        )
        target = s.side_latency_target(side)
        if target is None:
            continue
        ms = target[0]
        require(
            s.serving_mode != "aggregated",
            key,
            ms,
            "unset with serving_mode aggregated (its one deployment both prefills and decodes: there is no "
            f"{side} side to scale on its own; use {side}_target_ongoing_requests)",
        )
        require(
            s.autoscales(side),
            key,
            ms,
            f"unset while {side}_max_replicas is unset or equal to {side}_replicas: a fixed size scales toward nothing",
        )
        ongoing_key = f"{side}_target_ongoing_requests"
        require(
            s.side_target_ongoing_requests(side) is None,
            key,
            ms,
            f"unset while {ongoing_key} is set: a side scales on one target, its ongoing requests or its latency; "
            "unset one of them",
        )
        floor, what = _floor(s, side)
        require(
            ms >= floor,
            key,
            ms,
            f"at least {floor} ms on {s.gpu_instance_type}, {what} (make plan): a lower target would scale {side} "
            "to its maximum and keep it there, missing the target still",
        )
        longest = s.request_timeout_seconds * 1000
        require(
            ms <= longest,
            key,
            ms,
            f"at most {longest} ms, request_timeout_seconds (a request is ended before a longer target is missed)",
        )
