"""Settings whose meaning depends on sizing or normalisation: what validation accepts, and what the stack then makes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from settings import SettingsError, catalog, settings_from
from tests.conftest import PROJECT_CONTEXT, pod_identity_policy, rayservice_from, synth
from tools.review import render

# --- model_source as the S3 console copies it (with a trailing slash) --------------------------------
CONSOLE_S3_URI = "s3://acme-models/approved/qwen3-8b/"
NORMALISED_S3_URI = "s3://acme-models/approved/qwen3-8b"


def test_an_s3_source_with_a_trailing_slash_is_accepted_and_normalised() -> None:
    settings = settings_from({**PROJECT_CONTEXT, "model_source": CONSOLE_S3_URI})
    assert settings.model_source == NORMALISED_S3_URI


def test_the_policy_and_the_serve_config_see_the_normalised_s3_source() -> None:
    template = synth(model_source=CONSOLE_S3_URI)
    statements: list[dict[str, Any]] = pod_identity_policy(template, "ray-model-reader")["PolicyDocument"]["Statement"]
    by_action = {s["Action"]: s for s in statements}
    assert render(by_action["s3:GetObject"]["Resource"]) == "arn:${AWS::Partition}:s3:::acme-models/approved/qwen3-8b/*"
    assert by_action["s3:ListBucket"]["Condition"] == {
        "StringLike": {"s3:prefix": ["approved/qwen3-8b/", "approved/qwen3-8b/*"]}
    }
    doc = yaml.safe_load(rayservice_from(template)["spec"]["serveConfigV2"])
    for key in ("prefill_config", "decode_config"):
        assert doc["applications"][0]["args"][key]["model_loading_config"]["model_source"] == NORMALISED_S3_URI


# --- The GPU node's root volume follows the instance store ----------------------------------------------
def _gpu_root_volume_gib(template: dict[str, Any]) -> int:
    (group,) = [
        r["Properties"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::EKS::Nodegroup" and r["Properties"]["Labels"].get("role") == "gpu-worker"
    ]
    data = template["Resources"][group["LaunchTemplate"]["Id"]["Ref"]]["Properties"]["LaunchTemplateData"]
    (disk,) = data["BlockDeviceMappings"]
    assert disk["DeviceName"] == "/dev/xvda" and disk["Ebs"]["VolumeType"] == "gp3" and disk["Ebs"]["Encrypted"]
    return int(disk["Ebs"]["VolumeSize"])


def _synth_uncached(**overrides: Any) -> dict[str, Any]:
    # Not conftest.synth: its cache would hand a monkeypatched catalog's template to later tests.
    from app import STACK_NAME, build_app

    app, _, _ = build_app({**PROJECT_CONTEXT, **overrides})
    template: dict[str, Any] = app.synth().get_stack_by_name(STACK_NAME).template
    return template


def test_with_instance_store_the_root_volume_holds_only_what_nodeadm_leaves_there(template: dict[str, Any]) -> None:
    """g6.8xlarge: kubelet, containerd and the model cache sit on the NVMe RAID0, so the root is the AMI and logs."""
    assert catalog.INSTANCE_TYPES["g6.8xlarge"].instance_store_gb > 0
    assert _gpu_root_volume_gib(template) == 50
    # An explicit size still wins.
    assert _gpu_root_volume_gib(synth(gpu_volume_gib="300")) == 300


def test_without_instance_store_the_root_keeps_the_image_and_the_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    no_nvme = dataclasses.replace(catalog.INSTANCE_TYPES["g6.8xlarge"], instance_store_gb=0)
    monkeypatch.setattr(catalog, "INSTANCE_TYPES", {**catalog.INSTANCE_TYPES, "g6.8xlarge": no_nvme})
    assert _gpu_root_volume_gib(_synth_uncached()) == 300


@pytest.mark.parametrize(
    ("type_store_gb", "volume", "allowed"),
    [
        (900, 29, "30 to 16384 on g6.8xlarge"),
        (0, 99, "100 to 16384 on g6.8xlarge"),
    ],
)
def test_a_root_volume_too_small_for_the_type_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, type_store_gb: int, volume: int, allowed: str
) -> None:
    spec = dataclasses.replace(catalog.INSTANCE_TYPES["g6.8xlarge"], instance_store_gb=type_store_gb)
    monkeypatch.setattr(catalog, "INSTANCE_TYPES", {**catalog.INSTANCE_TYPES, "g6.8xlarge": spec})
    with pytest.raises(SettingsError) as raised:
        settings_from({**PROJECT_CONTEXT, "gpu_volume_gib": str(volume)})
    message = str(raised.value)
    assert "\n" not in message and message.startswith("setting 'gpu_volume_gib'") and allowed in message
    # One GiB more is accepted.
    assert settings_from({**PROJECT_CONTEXT, "gpu_volume_gib": str(volume + 1)}).gpu_volume_gib == volume + 1
