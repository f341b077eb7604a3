"""Settings whose meaning depends on sizing or normalisation: what validation accepts, and what the stack then makes."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from app import build_app
from settings import Settings, SettingsError, catalog, settings_from, sizing
from settings.project import STACK_NAME
from tests.conftest import PROJECT_CONTEXT, pod_identity_policy, rayservice_from, require_serve_deps, synth
from tools.template_text import render

pytestmark = pytest.mark.private_internals

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


# --- GPU memory: prefill's step must leave KV for one max_model_len sequence ----------------------------
def _load(**values: str) -> Any:
    return settings_from({**PROJECT_CONTEXT, **values})


def test_the_smallest_gpu_memory_utilization_leaves_prefill_kv_for_one_sequence() -> None:
    """Worked by hand for the defaults: Qwen3-8B on one L4 (22.5 GiB), max_model_len 8192, prefill step 8192.

    vLLM 0.26 (gpu_worker.determine_available_memory) gives the KV cache total x utilization minus the
    weights, the non-torch memory, profile_run's torch peak and the CUDA-graph estimate, and refuses to
    start when that is under one max_model_len sequence (kv_cache_utils.check_enough_kv_cache_memory).
    Weights: 8.19e9 x 2 B = 15.2549 GiB. KV: 147,456 B x 8192 = 1.125 GiB.
    Torch peak of an 8192-token step: 8192 x (2 x 4096 + 3 x 12288) x 2 B = 0.6875 GiB (the MLP's
    gate_up and activation outputs beside the residual stream); the sampler's 256 rows x 151,936 x 10 B
    + the 8192 x 4096 x 2 B hidden states = 0.4248 GiB is smaller. CUDA graphs 0.52 GiB, non-torch 0.4 GiB.
    Sum 17.9874 GiB / 22.5 GiB = 0.79944: 0.800 is the smallest accepted at three decimals.
    """
    assert _load(gpu_memory_utilization="0.8").gpu_memory_utilization == 0.8
    with pytest.raises(SettingsError) as raised:
        _load(gpu_memory_utilization="0.797")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("setting 'gpu_memory_utilization' = 0.797 is not valid: at least 0.800 ")
    assert "8192-token step" in message and "max_model_len=8192" in message


def test_the_fit_follows_the_step_size() -> None:
    """Aggregated engines keep vLLM's 2048-token step: a smaller torch peak, so a lower utilization fits.

    At 2048 tokens the sampler dominates: 2048 x 4096 x 2 B + 256 x 151,936 x 10 B = 0.3779 GiB;
    15.2549 + 1.125 + 0.3779 + 0.52 + 0.4 = 17.6778 GiB / 22.5 = 0.78568.
    """
    aggregated = Settings(serving_mode="aggregated")
    assert sizing.min_gpu_memory_utilization(aggregated) == pytest.approx(0.78568, abs=5e-4)
    assert sizing.min_gpu_memory_utilization(Settings()) == pytest.approx(0.79944, abs=5e-4)
    assert _load(serving_mode="aggregated", gpu_memory_utilization="0.79").gpu_memory_utilization == 0.79
    with pytest.raises(SettingsError, match=r"^setting 'gpu_memory_utilization' = 0\.79 is not valid"):
        _load(gpu_memory_utilization="0.79")


def test_a_model_that_fits_at_no_utilization_names_the_model() -> None:
    with pytest.raises(SettingsError, match=r"^setting 'model_id' = 'Qwen/Qwen3-14B' is not valid: weights 27\.6 GiB"):
        _load(model_id="Qwen/Qwen3-14B")


@pytest.mark.serve
def test_vllms_own_check_agrees_at_the_boundary() -> None:
    """vLLM's check_enough_kv_cache_memory, on the KV cache spec of Qwen3-8B's 36 layers, with what our plan leaves.

    At the smallest accepted utilization vLLM starts; at the first one refused it raises.
    """
    require_serve_deps()
    import torch
    from vllm.v1.core.kv_cache_utils import _check_enough_kv_cache_memory
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    model = catalog.MODELS["Qwen/Qwen3-8B"]
    spec = FullAttentionSpec(block_size=16, num_kv_heads=model.kv_heads, head_size=model.head_dim, dtype=torch.bfloat16)
    # The two fields FullAttentionSpec.max_memory_usage_bytes reads.
    config = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=8192),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )

    def vllm_starts(utilization: float) -> bool:
        plan = sizing.gpu_memory_plan(Settings(), "prefill", utilization=utilization)
        try:
            _check_enough_kv_cache_memory(
                int(plan.kv_cache * 2**30),
                lambda: model.layers * spec.max_memory_usage_bytes(config),
                8192,
                lambda _: 0,
            )
        except ValueError:
            return False
        return True

    assert vllm_starts(0.800) and _load(gpu_memory_utilization="0.8")
    assert not vllm_starts(0.797)
    with pytest.raises(SettingsError):
        _load(gpu_memory_utilization="0.797")


def test_tensor_parallelism_splits_the_weights_the_kv_heads_and_the_mlp() -> None:
    """Qwen3-14B (40 layers, 8 KV heads, hidden 5120, MLP 17408) over 4 L4s of a g6.12xlarge, 8192-token prefill step.

    Per GPU: weights 14.8e9 x 2 B / 4 = 6.8917 GiB; KV for one 8192-token sequence: 2 of the 8 KV heads,
    2 x 40 x 2 x 128 x 2 B x 8192 = 0.3125 GiB; forward 8192 x (2 x 5120 + 3 x 17408 / 4) x 2 B = 0.35547 GiB,
    under the sampler's 8192 x 5120 x 2 B + 256 x 151,936 x 10 B = 0.44037 GiB (the logits are gathered whole).
    With CUDA graphs 0.52 and non-torch 0.4: 8.5646 GiB of 22.5, a utilization of at least 0.38065.
    """
    s = Settings(model_id="Qwen/Qwen3-14B", gpu_instance_type="g6.12xlarge")
    plan = sizing.gpu_memory_plan(s, "prefill", tensor_parallel_size=4)
    assert plan.weights == pytest.approx(6.8917, abs=1e-4)
    assert plan.one_sequence_kv == pytest.approx(0.3125)
    assert plan.activations == pytest.approx(0.44037, abs=1e-5)
    assert sizing.min_gpu_memory_utilization(s, {"prefill": 4, "decode": 4}) == pytest.approx(0.38065, abs=1e-4)
    # More GPUs than KV heads: vLLM replicates a head rather than split it (Qwen2.5-7B has 4).
    qwen25 = Settings(model_id="Qwen/Qwen2.5-7B-Instruct")
    one_head = sizing.gpu_memory_plan(qwen25, tensor_parallel_size=8).one_sequence_kv
    assert one_head == pytest.approx(sizing.gpu_memory_plan(qwen25, tensor_parallel_size=4).one_sequence_kv)
