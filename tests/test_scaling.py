"""Scaling (issue 19 items 1-4, 6): replica bounds and targets, queue bounds, the drain, the in-tree autoscaler.

Each check runs on the real artifact: the settings validation, the serve config as
synthesized, Ray Serve's own schema and Ray's own autoscaler parser.
"""

from __future__ import annotations

from typing import Any

import pytest

from settings import Settings, SettingsError, sizing, validate
from tests.conftest import PROJECT_CONTEXT

RANGE: dict[str, Any] = {"decode_max_replicas": 3, "decode_target_ongoing_requests": 8}
P5: dict[str, Any] = {
    "gpu_instance_type": "p5.48xlarge",
    "model_id": "meta-llama/Llama-3.3-70B-Instruct",
    "hf_token_secret_name": "prod/hf-token",
    "prefill_tensor_parallel_size": 8,
    "decode_tensor_parallel_size": 4,
    "decode_replicas": 2,
}


def _refusal(**overrides: Any) -> SettingsError:
    with pytest.raises(SettingsError) as err:
        validate(Settings(**overrides))
    return err.value


# --- Settings: one line naming the setting ------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        ({"decode_replicas": 2, "decode_max_replicas": 1}, "decode_max_replicas", "at least decode_replicas = 2"),
        ({"prefill_max_replicas": 0}, "prefill_max_replicas", "1 to 16"),
        ({"decode_max_replicas": 17}, "decode_max_replicas", "1 to 16"),
        ({"decode_target_ongoing_requests": 4}, "decode_target_ongoing_requests", "a fixed size scales toward nothing"),
        (
            {"prefill_max_replicas": 1, "prefill_target_ongoing_requests": 2},
            "prefill_target_ongoing_requests",
            "a fixed size",
        ),
        ({"decode_max_replicas": 3}, "decode_target_ongoing_requests", "set when decode_max_replicas > decode_"),
        ({"prefill_replicas": 0, "prefill_max_replicas": 2}, "prefill_replicas", "1 to 16"),
        ({**RANGE, "decode_target_ongoing_requests": 0}, "decode_target_ongoing_requests", "above 0 and at most 13"),
        ({**RANGE, "decode_target_ongoing_requests": 1e9}, "decode_target_ongoing_requests", "at most 13"),
        ({"typical_request_tokens": 16384}, "typical_request_tokens", "64 to max_model_len = 8192"),
        ({"backpressure_retry_after_seconds": 0}, "backpressure_retry_after_seconds", "1 to 3600"),
        ({"request_timeout_seconds": 5}, "request_timeout_seconds", "30 to 86400"),
        ({"ray_worker_idle_timeout_seconds": 1}, "ray_worker_idle_timeout_seconds", "10 to 86400"),
        # Two decode pods a p5 node at TP 4: a third replica needs a second node and leaves half of it idle.
        (
            {**P5, "decode_max_replicas": 3, "decode_target_ongoing_requests": 4},
            "decode_max_replicas",
            "leave 4 of a node's 8 GPUs idle at the maximum; fits: decode_max_replicas=4",
        ),
    ],
)
def test_bad_bounds_end_synth_in_one_line_naming_the_setting(overrides: dict[str, Any], key: str, allowed: str) -> None:
    err = _refusal(**overrides)
    assert err.key == key
    assert allowed in str(err)
    assert "\n" not in str(err)


def test_the_settings_come_from_the_command_line_too() -> None:
    from settings import settings_from

    s = settings_from({**PROJECT_CONTEXT, "decode_max_replicas": "3", "decode_target_ongoing_requests": "8"})
    assert (s.side_max_replicas("decode"), s.decode_target_ongoing_requests, s.autoscales("decode")) == (3, 8.0, True)
    assert not s.autoscales("prefill") and s.any_autoscaling


def test_a_max_equal_to_the_min_is_a_fixed_size() -> None:
    s = validate(Settings(decode_replicas=2, decode_max_replicas=2))
    assert not s.any_autoscaling and s.gpu_nodes_max == s.gpu_nodes == 3


def test_gpu_nodes_at_the_maximum() -> None:
    s = validate(Settings(**RANGE, prefill_max_replicas=2, prefill_target_ongoing_requests=2))
    assert (s.gpu_nodes, s.gpu_nodes_max) == (2, 5)


# --- Sizing: the bounds follow the engine -------------------------------------------------------
def test_the_admission_bound_is_what_the_kv_cache_holds_at_the_typical_length() -> None:
    s = validate(Settings())
    for side in ("prefill", "decode"):
        fits = sizing.kv_cache_tokens(s, side) // s.typical_request_tokens
        assert sizing.max_ongoing_requests(s, side) == fits
        assert sizing.max_queued_requests(s, side) == fits
    assert (sizing.max_ongoing_requests(s, "prefill"), sizing.max_ongoing_requests(s, "decode")) == (12, 13)
    # A shorter typical request: more at once, never past vLLM's max_num_seqs.
    short = validate(Settings(typical_request_tokens=64))
    assert sizing.max_ongoing_requests(short, "decode") == sizing.vllm_default_max_num_seqs(short) == 256


def test_the_ingress_passes_on_everything_decode_can_hold() -> None:
    s = validate(Settings(**RANGE))
    assert sizing.ingress_max_ongoing_requests(s) == 13 * 3 + 13


def test_the_drain_covers_the_longest_generation_and_prefills_kv_lease() -> None:
    s = validate(Settings())
    wait, timeout = sizing.graceful_shutdown(s, "decode")
    assert timeout > s.request_timeout_seconds
    wait, timeout = sizing.graceful_shutdown(s, "prefill")
    longest = sizing.prefill_seconds(s, s.max_model_len, mfu=sizing.PREFILL_MFU_RANGE[0])
    assert wait >= sizing.PREFILL_KV_LEASE_S + longest and timeout >= 2 * wait
