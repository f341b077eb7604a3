"""Bad settings end synth with one line naming the key; good ones load typed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import app
from settings import Settings, SettingsError, settings_from, settings_from_cli
from settings.sizing import gpu_memory_plan
from tests.conftest import PROJECT_CONTEXT, ROOT

# (overrides, the key the error must name, a fragment of what is allowed)
BAD_SETTINGS: list[tuple[dict[str, Any], str, str]] = [
    ({"gpu_instnce_type": "g6.8xlarge"}, "gpu_instnce_type", "did you mean 'gpu_instance_type'?"),
    ({"zzz": "1"}, "zzz", "settings are ["),
    # Multi-GPU types at tensor parallel size 1: a pod per GPU, but one EFA device for
    # four GPUs on the G types and four for eight on p4d; on p5 one replica leaves 7 GPUs idle.
    ({"gpu_instance_type": "g6.12xlarge"}, "prefill_tensor_parallel_size", "1 EFA device(s) for 4 GPUs"),
    ({"gpu_instance_type": "g6e.12xlarge"}, "prefill_tensor_parallel_size", "use one of [4]"),
    ({"gpu_instance_type": "g5.12xlarge"}, "prefill_tensor_parallel_size", "use one of [4]"),
    ({"gpu_instance_type": "p4d.24xlarge"}, "prefill_tensor_parallel_size", "use one of [2, 4, 8]"),
    ({"gpu_instance_type": "p5.48xlarge"}, "prefill_replicas", "leave 7 of p5.48xlarge's 8 GPUs idle"),
    ({"model_source": "gs://bucket/qwen"}, "model_source", "or s3://bucket/prefix"),
    ({"model_source": "s3://Bad_Bucket/qwen"}, "model_source", "or s3://bucket/prefix"),
    ({"model_source": "s3://bucket-only"}, "model_source", "or s3://bucket/prefix"),
    ({"max_model_len": 40961}, "max_model_len", "256 to 40960 tokens, the context length of Qwen/Qwen3-8B"),
    (
        {"model_id": "Qwen/Qwen2.5-7B-Instruct", "max_model_len": 32769},
        "max_model_len",
        "256 to 32768 tokens",
    ),
    ({"max_model_len": 255}, "max_model_len", "256 to"),
    ({"system_nodes_min": 0}, "system_nodes_min", "at least 1"),
    ({"system_volume_gib": 99}, "system_volume_gib", "100 to 16384"),
    ({"public_access_cidrs": "office"}, "public_access_cidrs", "IPv4 networks"),
    (
        {"public_access_cidrs": "203.0.113.0/24", "endpoint_access": "private"},
        "public_access_cidrs",
        "empty when endpoint_access is 'private'",
    ),
    ({"gpu_instance_type": "g6.2xlarge"}, "gpu_instance_type", "with a GPU and EFA"),
    ({"gpu_instance_type": "m7i.xlarge"}, "gpu_instance_type", "with a GPU and EFA"),
    ({"gpu_instance_type": "g9.huge"}, "gpu_instance_type", "with a GPU and EFA"),
    ({"system_instance_type": "t9.nano"}, "system_instance_type", "without a GPU"),
    ({"system_instance_type": "g6.8xlarge"}, "system_instance_type", "without a GPU"),
    ({"gpu_availability_zone": "us-east-1z"}, "gpu_availability_zone", "an AZ of region 'us-east-1'"),
    ({"region": "us-west-2", "gpu_availability_zone": "us-east-1a"}, "gpu_availability_zone", "us-west-2"),
    ({"region": "mars-north-1"}, "region", "one of"),
    ({"system_nodes_min": 3, "system_nodes_desired": 2}, "system_nodes_desired", "system_nodes_min <="),
    ({"system_nodes_desired": 4, "system_nodes_max": 3}, "system_nodes_desired", "<= system_nodes_max"),
    ({"kubernetes_version": "1.30"}, "kubernetes_version", "a version EKS still creates clusters on"),
    ({"kubernetes_version": "1.31"}, "kubernetes_version", "a version EKS still creates clusters on"),
    # A release of another Kubernetes minor: EKS creates no node group on it.
    ({"gpu_ami_release_version": "1.35.6-20260714"}, "gpu_ami_release_version", "1.36.<patch>-<YYYYMMDD>"),
    ({"gpu_ami_release_version": "1.36.2"}, "gpu_ami_release_version", "for Kubernetes 1.36"),
    ({"gpu_ami_release_version": "ami-0123456789abcdef0"}, "gpu_ami_release_version", "e.g. 1.36.2-20260714"),
    ({"endpoint_access": "public"}, "endpoint_access", "public_and_private"),
    ({"max_azs": 1}, "max_azs", "EKS needs two AZs"),
    ({"vpc_cidr": "10.0.0.0/8"}, "vpc_cidr", "/16 to /20"),
    ({"vpc_cidr": "banana"}, "vpc_cidr", "/16 to /20"),
    ({"vpc_id": "vpc-0123456789abcdef0"}, "vpc_id", "needs 'account' and 'region'"),
    ({"vpc_id": "subnet-1"}, "vpc_id", "vpc- and 8 or 17 hex digits"),
    ({"account": "12345"}, "account", "12 digits"),
    ({"cluster_admin_arns": "alice"}, "cluster_admin_arns", "IAM role or user ARNs"),
    ({"cluster_admin_arns": "[not json"}, "cluster_admin_arns", "a JSON list or comma-separated text"),
    ({"gpu_volume_gib": 20}, "gpu_volume_gib", "30 to 16384 on g6.8xlarge"),
    ({"gpu_volume_gib": "big"}, "gpu_volume_gib", "a whole number"),
    ({"gpu_placement_group": "maybe"}, "gpu_placement_group", "true or false"),
    ({"gpu_capacity_reservation_id": "cr-123"}, "gpu_capacity_reservation_id", "cr- and 17 hex digits"),
    ({"gpu_capacity_reservation_id": "cr-0123456789abcdef0"}, "gpu_capacity_reservation_id", "gpu_placement_group"),
    ({"model_id": "Qwen/Qwen3-14B"}, "model_id", "must fit"),
    ({"max_model_len": 40960, "model_id": "Qwen/Qwen3-8B"}, "model_id", "must fit"),
    ({"model_id": "nobody/unknown-model"}, "model_id", "one of"),
    ({"model_id": "meta-llama/Llama-3.1-8B-Instruct"}, "model_id", "hf_token_secret_name"),
    ({"gpu_memory_utilization": 0.99}, "gpu_memory_utilization", "0.5 to 0.95"),
    ({"prefill_replicas": 0}, "prefill_replicas", "1 to 16"),
    ({"decode_replicas": 17}, "decode_replicas", "1 to 16"),
    ({"ray_image": "not an image"}, "ray_image", "registry/repository:tag"),
    ({"serving_namespace": "LLM"}, "serving_namespace", "a DNS label"),
    # Built at run time so no token-shaped literal is tracked.
    ({"hf_token_secret_name": "hf_" + "abcdefghij" * 4}, "hf_token_secret_name", "not the token"),
    (
        {"hf_token_kms_key_arn": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"},
        "hf_token_kms_key_arn",
        "only with hf_token_secret_name",
    ),
    (
        {"hf_token_secret_name": "prod/hf-token", "hf_token_kms_key_arn": "alias/hf"},
        "hf_token_kms_key_arn",
        "a KMS key ARN",
    ),
]


BAD_IDS = [f"{key}-{i}" for i, (_, key, _) in enumerate(BAD_SETTINGS)]


@pytest.mark.parametrize(("overrides", "key", "allowed"), BAD_SETTINGS, ids=BAD_IDS)
def test_bad_setting_names_key_and_allowed(overrides: dict[str, Any], key: str, allowed: str) -> None:
    with pytest.raises(SettingsError) as raised:
        settings_from({**PROJECT_CONTEXT, **overrides})
    message = str(raised.value)
    assert raised.value.key == key
    assert f"setting '{key}'" in message
    assert allowed in message
    assert "\n" not in message


def test_defaults_are_valid_and_typed() -> None:
    settings = settings_from(PROJECT_CONTEXT)
    assert settings == Settings()
    assert settings.gpu_nodes == 2
    assert settings.kubernetes_version == "1.36"
    assert settings.gpu_ami_release == "1.36.2-20260714"


def test_the_gpu_ami_release_follows_kubernetes_version_unless_set() -> None:
    assert settings_from({**PROJECT_CONTEXT, "kubernetes_version": "1.34"}).gpu_ami_release == "1.34.9-20260714"
    chosen = settings_from({**PROJECT_CONTEXT, "gpu_ami_release_version": "1.36.2-20260801"})
    assert chosen.gpu_ami_release == "1.36.2-20260801"


def test_context_strings_are_coerced() -> None:
    settings = settings_from(
        {
            "prefill_replicas": "2",
            "gpu_placement_group": "false",
            "gpu_memory_utilization": "0.85",
            "cluster_admin_arns": "arn:aws:iam::123456789012:role/a, arn:aws:iam::123456789012:user/b",
        }
    )
    assert settings.prefill_replicas == 2
    assert settings.gpu_nodes == 3
    assert settings.gpu_placement_group is False
    assert settings.gpu_memory_utilization == 0.85
    assert settings.cluster_admin_arns == ("arn:aws:iam::123456789012:role/a", "arn:aws:iam::123456789012:user/b")


def test_settings_file_and_command_line_precedence(tmp_path: Path) -> None:
    file = tmp_path / "settings.yaml"
    file.write_text("prefill_replicas: 2\ndecode_replicas: 1\nmax_model_len: 4096\n")
    settings = settings_from({"settings_file": str(file), "max_model_len": "2048"})
    assert (settings.prefill_replicas, settings.max_model_len) == (2, 2048)


def test_settings_file_with_unknown_key_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "settings.yaml"
    file.write_text("prefill_replicas: 2\nprefil_replicas: 3\n")
    with pytest.raises(SettingsError, match=r"setting 'prefil_replicas'.*not a setting"):
        settings_from({"settings_file": str(file)})


def test_missing_settings_file_is_one_line() -> None:
    with pytest.raises(SettingsError, match="setting 'settings_file'"):
        settings_from({"settings_file": "/nonexistent/settings.yaml"})


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.model_id = "other"  # type: ignore[misc]


def test_default_model_fits_one_l4_with_room_for_kv() -> None:
    plan = gpu_memory_plan(Settings())
    # 8.19e9 params * 2 bytes = 15.26 GiB; KV 144 KiB/token * 8192 = 1.125 GiB; 22.5 GiB * 0.90 = 20.25 GiB,
    # less prefill's 8192-token step (0.69 GiB activations, 0.52 CUDA graphs, 0.4 non-torch): tests/test_sizing.py.
    assert round(plan.weights, 2) == 15.26
    assert plan.one_sequence_kv == 1.125
    assert plan.budget == pytest.approx(20.25)
    assert plan.kv_cache - plan.one_sequence_kv > 2.0


def _run_app(context: dict[str, Any], outdir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps({**PROJECT_CONTEXT, **context}), "CDK_OUTDIR": str(outdir)}
    return subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    ("context", "key"),
    [({"gpu_instance_type": "c7i.large"}, "gpu_instance_type"), ({"kubernetes_version": "1.30"}, "kubernetes_version")],
)
def test_app_prints_one_line_and_no_traceback(context: dict[str, Any], key: str, tmp_path: Path) -> None:
    """As `cdk synth -c key=value` runs it: the CLI hands context to app.py through CDK_CONTEXT_JSON."""
    result = _run_app(context, tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: setting '{key}'")
    assert "Traceback" not in result.stderr


def test_a_cdk_refusal_while_building_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """jsii surfaces CDK errors as RuntimeError with a JavaScript stack; main() prints their first line."""

    def refuse() -> None:
        raise RuntimeError("AmiTypeDoesNotMatchInstanceArchitecture: the AMI does not match\n    at Kernel._ensureSync")

    monkeypatch.setattr(app, "build_app", refuse)
    assert app.main() == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: the stack could not be built: AmiTypeDoesNotMatchInstanceArchitecture: the AMI does not match"
    ]


def test_max_model_len_up_to_the_models_context_length_is_accepted() -> None:
    """The boundary: exactly the model's max_position_embeddings (Qwen3-4B: 40960) loads."""
    settings = settings_from({**PROJECT_CONTEXT, "model_id": "Qwen/Qwen3-4B", "max_model_len": "40960"})
    assert settings.max_model_len == settings.model.max_context_tokens == 40960


def warnings(settings: Settings) -> list[str]:
    """The synth warnings but the surge one (test_a_side_without_room_for_a_surge_warns_with_its_downtime)."""
    return [line for line in app.warnings(settings) if "surge replica" not in line]


def test_a_side_without_room_for_a_surge_warns_with_its_downtime() -> None:
    """The defaults (one replica a side, no range): one line naming both sides and the minutes; a range on
    prefill leaves decode named; ranges on both: no line."""
    (line,) = [w for w in app.warnings(Settings()) if "surge replica" in w]
    assert "prefill and decode" in line and "about 1.1-3.1 min" in line and "\n" not in line
    one = Settings(prefill_max_replicas=2, prefill_target_ongoing_requests=2.0)
    (line,) = [w for w in app.warnings(one) if "surge replica" in w]
    assert "on decode (no range)" in line and "decode_max_replicas above" in line
    both = Settings(
        prefill_max_replicas=2, prefill_target_ongoing_requests=2.0, decode_max_replicas=2,
        decode_target_ongoing_requests=8.0,
    )  # fmt: skip
    assert not [w for w in app.warnings(both) if "surge replica" in w]


def test_a_surge_where_no_side_has_room_is_refused_in_one_line() -> None:
    with pytest.raises(SettingsError) as raised:
        settings_from({**PROJECT_CONTEXT, "replica_surge": "true"})
    assert str(raised.value).startswith("setting 'replica_surge' = True is not valid: true only where")
    assert "prefill_max_replicas or decode_max_replicas" in str(raised.value) and "\n" not in str(raised.value)
    ranged = {"prefill_max_replicas": "2", "prefill_target_ongoing_requests": "2", "replica_surge": "true"}
    assert settings_from({**PROJECT_CONTEXT, **ranged}).replica_surge


def test_a_public_endpoint_open_to_the_world_warns_in_one_line() -> None:
    # ray_cluster_upgrade=recreate: the defaults' other warning, the upgrade's downtime, said once and asked for here.
    (line,) = warnings(Settings(ray_cluster_upgrade="recreate"))
    assert "0.0.0.0/0" in line and "public_access_cidrs" in line and "\n" not in line
    assert warnings(Settings(public_access_cidrs=("203.0.113.0/24",), ray_cluster_upgrade="recreate")) == []
    assert warnings(Settings(endpoint_access="private", ray_cluster_upgrade="recreate")) == []


def test_a_ray_cluster_change_with_downtime_warns_in_one_line_unless_recreate_was_asked_for() -> None:
    """auto where the GPU group's maximum cannot hold a second cluster: the recreate Job, said once."""
    (line,) = warnings(Settings(endpoint_access="private"))
    assert "cannot hold a second Ray cluster" in line and "a maximum of 4 or more" in line and "\n" not in line
    assert warnings(Settings(endpoint_access="private", ray_cluster_upgrade="recreate")) == []
    # 2 nodes at the minimum, 4 at the maximum: blue/green; 3 at the maximum: not.
    room = Settings(endpoint_access="private", decode_max_replicas=3, decode_target_ongoing_requests=8.0)
    assert warnings(room) == []
    tight = Settings(endpoint_access="private", decode_max_replicas=2, decode_target_ongoing_requests=8.0)
    assert warnings(tight) != []


def test_cdk_json_wins_over_cdk_context_json_and_the_command_line_over_both(tmp_path: Path) -> None:
    """The pinned CLI's order (aws-cdk lib/cli/user-configuration.js): -c, then cdk.json, then cdk.context.json."""
    cdk_json = json.loads((ROOT / "cdk.json").read_text())
    cdk_json["context"]["max_azs"] = 3
    (tmp_path / "cdk.json").write_text(json.dumps(cdk_json))
    (tmp_path / "cdk.context.json").write_text(json.dumps({"max_azs": 2, "gpu_availability_zone": "us-east-1d"}))
    loaded = settings_from_cli([], root=tmp_path)
    assert (loaded.max_azs, loaded.gpu_availability_zone) == (3, "us-east-1d")
    assert settings_from_cli(["gpu_availability_zone=us-east-1a"], root=tmp_path).gpu_availability_zone == "us-east-1a"


def test_a_broken_cdk_context_json_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "cdk.json").write_text((ROOT / "cdk.json").read_text())
    (tmp_path / "cdk.context.json").write_text("{not json")
    with pytest.raises(SettingsError, match=r"setting 'cdk.context.json' = .* is not valid: a JSON object"):
        settings_from_cli([], root=tmp_path)
