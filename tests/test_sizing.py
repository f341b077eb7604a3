"""Settings whose meaning depends on sizing or normalisation: what validation accepts, and what the stack then makes."""

from __future__ import annotations

from typing import Any

import yaml

from settings import settings_from
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
