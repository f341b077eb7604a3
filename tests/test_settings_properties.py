"""Property-based: no combination of settings gets past validation and then fails later."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app import build_app
from settings import SETTING_NAMES, Settings, SettingsError, settings_from
from settings.catalog import INSTANCE_TYPES, MODELS, REGION_AZS
from tests.conftest import PROJECT_CONTEXT

# Plausible values per key, good and bad mixed, so that generated combinations
# often pass validation and reach the stack.
CANDIDATES: dict[str, list[Any]] = {
    "region": [None, "us-east-1", "us-west-2", "eu-west-1", "xx-nowhere-1", ""],
    "account": [None, "123456789012", "12345", "abc"],
    "vpc_id": [None, "vpc-0123456789abcdef0", "vpc-12"],
    "vpc_cidr": ["10.0.0.0/16", "10.1.0.0/18", "172.16.0.0/20", "10.0.0.0/8", "300.0.0.0/16", "x"],
    "max_azs": [2, 3, 1, 4, "two"],
    "cluster_name": ["pd-inference", "a", "bad name", "-x", "pd_inference", "a" * 37, "a--b"],
    "kubernetes_version": ["1.36", "1.35", "1.32", "1.31", "1.30", "2.0"],
    "endpoint_access": ["public_and_private", "private", "public"],
    "public_access_cidrs": ["", "203.0.113.0/24", "0.0.0.0/0", "nope"],
    "pd_prefill_header_keys": ["", "ops", "ops,verify", "[broken"],
    "cluster_admin_arns": ["", "arn:aws:iam::123456789012:role/admin", "nope", "[broken", '["arn:aws:iam::1:role/x"]'],
    "system_instance_type": ["m7i.xlarge", "g6.8xlarge", "t2.micro"],
    "system_nodes_min": [0, 1, 2, 5, -1],
    "system_nodes_desired": [0, 1, 2, 3, 9],
    "system_nodes_max": [1, 2, 3, 10, 0],
    "system_volume_gib": [100, 200, 50, 10, "lots"],
    "gpu_instance_type": [*INSTANCE_TYPES, "g6.2xlarge", "nope"],
    "gpu_availability_zone": [None, "us-east-1a", "us-east-1c", "us-west-2b", "eu-west-1z", "mars"],
    "gpu_volume_gib": [100, 300, 99, 20000],
    "gpu_placement_group": [True, False, "true", "false", "perhaps"],
    "gpu_capacity_reservation_id": [None, "cr-0123456789abcdef0", "cr-1"],
    "gpu_capacity_block": [False, True, "maybe"],
    "capacity_block_end_warning_hours": [24, 0, 5000],
    "pod_imds_access": [True, False, "yes", "2"],
    "gpu_ami_release_version": [None, "1.36.2-20260714", "1.35.6-20260714", "1.36.2", "ami-0123456789abcdef0"],
    "model_id": [*MODELS, "unknown/model"],
    "model_source": [None, "s3://bucket/models/qwen", "gs://bucket/m", "Qwen/Qwen3-8B", "not a source"],
    "max_model_len": [256, 2048, 8192, 32768, 131072, 100, "long"],
    "gpu_memory_utilization": [0.5, 0.8, 0.9, 0.95, 0.99, "high"],
    "prefill_replicas": [1, 2, 4, 0, 17],
    "decode_replicas": [1, 2, 0, 20],
    "prefill_max_replicas": [None, 1, 2, 4, 0, 17],
    "decode_max_replicas": [None, 1, 3, 0, 20],
    "prefill_target_ongoing_requests": [None, 2, 0.5, 0, 1e9],
    "decode_target_ongoing_requests": [None, 8, 1.5, -1, 1e9],
    "prefill_ttft_target_ms": [None, 2000, 100, 0],
    "prefill_ttft_target_percentile": [90, 50, 99, 100],
    "decode_itl_target_ms": [None, 200, 10, -1],
    "decode_itl_target_percentile": [90, 49, 95],
    "typical_request_tokens": [2048, 64, 8192, 10, 1_000_000],
    "backpressure_retry_after_seconds": [10, 1, 0, 5000],
    "request_timeout_seconds": [600, 30, 10, 100_000],
    "ray_worker_idle_timeout_seconds": [60, 10, 5, 100_000],
    "ray_cluster_upgrade": ["auto", "recreate", "blue-green", "NewCluster"],
    "replica_surge": [False, True, "on"],
    "gcs_fault_tolerance": [True, False, "off"],
    "gcs_store_node_type": ["cache.t4g.micro", "cache.r7g.large", "cache.t2.micro", "t4g.micro"],
    "prefill_tensor_parallel_size": [1, 2, 4, 8, 3],
    "decode_tensor_parallel_size": [1, 2, 4, 8, 0],
    "serving_mode": ["disaggregated", "aggregated", "split"],
    "local_prefill_max_tokens": [0, 4096, 8192, 8193, -1, "many"],
    "prefix_cache_routing": [True, False, "on"],
    "ray_image": ["public.ecr.aws/deep-learning-containers/ray:serve-llm-cuda-v1.0.0", "rayproject/ray:2.58.0", "bad"],
    "serving_namespace": ["llm", "LLM", "a" * 70],
    "ray_token_auth": [True, False, "off", "sometimes"],
    "service_name": ["pd-llm", "x" * 50, "Bad_Name"],
    "hf_token_secret_name": [None, "prod/hf-token", "hf_" + "a" * 34],
    "hf_token_kms_key_arn": [
        None,
        "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "alias/aws/secretsmanager",
    ],
    "internal_endpoint_cidrs": ["", "10.0.0.0/8", "0.0.0.0/0", "10.0.0.0/8,192.168.0.0/16", "nonsense"],
    "endpoint_api_keys_secret_name": [None, "prod/llm-keys", "bad name!"],
    "endpoint_api_keys_kms_key_arn": [
        None,
        "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "alias/llm-keys",
    ],
    "endpoint_api_keys_refresh_seconds": [60, 14, 3600],
    "endpoint_rate_limit_rpm": [0, 120, -1],
    "endpoint_tls_certificate_arn": [
        None,
        "arn:aws:acm:us-east-1:123456789012:certificate/11111111-2222-3333-4444-555555555555",
        "arn:aws:acm::1:cert",
    ],
    "gpu_warm_nodes": [0, 1, -1],
    "image_pull_through_cache_prefix": [None, "pd-inference-public", "Bad_Prefix"],
    "observability": [True, False],
    "observability_scrape_interval_seconds": [30, 15, 120],
    "alarm_email": [None, "oncall@example.com", "not an address"],
    "alarm_ttft_p99_seconds": [10.0, 0.5, 0],
    "alarm_kv_throughput_floor_gb_per_s": [1.0, 0.25, -1],
    "alarm_kv_cache_usage_ratio": [0.98, 0.9, 1.5],
    "alarm_efa_flat_bytes_per_second": [10_000, 0, 20_000_000],
    "alarm_pod_network_kv_bytes_per_second": [10_000_000, 5_000],
}
assert set(CANDIDATES) == set(SETTING_NAMES), "every setting needs candidates"

overrides = st.dictionaries(
    st.sampled_from(sorted(CANDIDATES)),
    st.none(),
    max_size=6,
).flatmap(lambda keys: st.fixed_dictionaries({k: st.sampled_from(CANDIDATES[k]) for k in keys}))


def _context(values: dict[str, Any]) -> dict[str, Any]:
    # The CLI hands every -c value over as text.
    return {**PROJECT_CONTEXT, **{k: "" if v is None else str(v) for k, v in values.items()}}


def _load(values: dict[str, Any]) -> Settings | SettingsError:
    try:
        return settings_from(_context(values))
    except SettingsError as err:
        return err


@settings(max_examples=300, deadline=None)
@given(overrides)
def test_settings_either_load_or_fail_in_one_line_naming_a_key(values: dict[str, Any]) -> None:
    loaded = _load(values)
    if isinstance(loaded, SettingsError):
        message = str(loaded)
        assert "\n" not in message
        assert loaded.key in SETTING_NAMES
        assert message.startswith(f"setting '{loaded.key}'")
        return
    assert loaded.gpu_instance.gpus >= 1
    assert loaded.gpu_instance.efa_interfaces >= 1
    if loaded.gpu_availability_zone is not None:
        assert loaded.gpu_availability_zone in REGION_AZS[loaded.effective_region or ""]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overrides)
def test_settings_that_validate_always_synthesize(values: dict[str, Any]) -> None:
    """No jsii, CDK or cdk-nag error waits behind a setting that passed validation."""

    context = _context(values)
    try:
        loaded = settings_from(context)
    except SettingsError as err:
        event(f"refused: {err.key}")
        return
    if loaded.vpc_id is not None:
        event("skipped: VPC lookup")
        return  # a lookup needs AWS credentials or a cdk.context.json entry
    event("synthesized")
    app, _, _ = build_app(context)
    app.synth()


@given(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=30).filter(lambda k: k not in SETTING_NAMES)
)
def test_settings_file_with_unknown_key_is_refused(tmp_path_factory: pytest.TempPathFactory, key: str) -> None:
    path: Path = tmp_path_factory.mktemp("settings") / "settings.yaml"
    path.write_text(yaml.safe_dump({"prefill_replicas": 1, key: 1}))
    with pytest.raises(SettingsError) as raised:
        settings_from({"settings_file": str(path)})
    assert raised.value.key == key
