"""Each fixed range is one fact: validate() refuses just outside it, accepts its ends, and the settings
reference prints the same range (settings/rules/bounds.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from settings.descriptions import SETTING_DOCS
from settings.model import Settings, SettingsError
from settings.rules import validate
from settings.rules.bounds import RANGES, span

# What a setting's upper end needs from the others to be valid on its own.
NEEDS: dict[str, dict[str, Any]] = {
    "endpoint_rate_limit_rpm": {"endpoint_api_keys_secret_name": "pd-inference/api-keys"},
    # Settings that act only in some configurations (settings/rules/effect.py), given in one where they act.
    "endpoint_api_keys_refresh_seconds": {"endpoint_api_keys_secret_name": "pd-inference/api-keys"},
    "capacity_block_end_warning_hours": {
        "gpu_capacity_block": True,
        "gpu_capacity_reservation_id": "cr-0123456789abcdef0",
        "gpu_placement_group": False,
    },
    "ray_worker_idle_timeout_seconds": {"prefill_max_replicas": 2, "prefill_target_ongoing_requests": 1.0},
    # A percentile acts only with its side's latency target, on a side with a range.
    "prefill_ttft_target_percentile": {"prefill_max_replicas": 2, "prefill_ttft_target_ms": 60_000},
    "decode_itl_target_percentile": {"decode_max_replicas": 2, "decode_itl_target_ms": 1_000},
    "prefill_replicas": {"prefill_max_replicas": 16},
    "decode_replicas": {"decode_max_replicas": 16},
    # Warm nodes lie within the GPU group's range: both sides at 16 leave room for 30.
    "gpu_warm_nodes": {
        "prefill_max_replicas": 16,
        "decode_max_replicas": 16,
        "prefill_target_ongoing_requests": 1.0,
        "decode_target_ongoing_requests": 1.0,
    },
}
# A side's replica counts are valid at their ends only with a target that depends on both of them.
REPLICA_COUNTS = {"prefill_replicas", "decode_replicas", "prefill_max_replicas", "decode_max_replicas"}


def _with(name: str, value: int) -> Settings:
    changes: dict[str, Any] = {**NEEDS.get(name, {}), name: value}
    return replace(Settings(), **changes)


@pytest.mark.parametrize("name", sorted(RANGES))
def test_just_outside_the_range_is_refused_naming_it(name: str) -> None:
    low, high = RANGES[name]
    for value in (low - 1, high + 1):
        with pytest.raises(SettingsError) as refused:
            validate(_with(name, value))
        assert refused.value.key == name
        assert span(name) in str(refused.value)


@pytest.mark.parametrize("name", sorted(RANGES))
def test_the_reference_prints_the_range_the_rules_enforce(name: str) -> None:
    assert SETTING_DOCS[name].allowed.startswith(span(name))


@pytest.mark.parametrize("name", sorted(set(RANGES) - REPLICA_COUNTS))
def test_both_ends_are_accepted(name: str) -> None:
    for value in RANGES[name]:
        validate(_with(name, value))
