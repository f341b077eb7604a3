"""cfn-lint on the synthesized template: zero errors, zero warnings but W3005."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cfnlint.api import ManualArgs, lint

from tests.conftest import CDK_JSON_CONTEXT, synth

# W3005 (redundant DependsOn): CDK adds explicit DependsOn next to the implicit
# Ref/GetAtt ones; harmless, and not ours to remove.
IGNORED = ["W3005"]


def _lint(template: dict[str, Any], also_ignored: tuple[str, ...] = ()) -> list[str]:
    config = ManualArgs(regions=["us-east-1"], ignore_checks=[*IGNORED, *also_ignored])
    matches = lint(json.dumps(template), config=config)
    return [f"{m.rule.id} {m.message} ({'/'.join(map(str, m.path))})" for m in matches]


def test_cfn_lint_clean_on_defaults() -> None:
    assert _lint(synth()) == []


def test_cfn_lint_clean_with_pinned_az_reservation_and_private_endpoint() -> None:
    template = synth(
        gpu_availability_zone="us-east-1c",
        gpu_placement_group="false",
        gpu_capacity_reservation_id="cr-0123456789abcdef0",
        endpoint_access="private",
    )
    # W3010 (hard-coded AZ) is the point of gpu_availability_zone: g6 is not in every AZ.
    assert _lint(template, also_ignored=("W3010",)) == []


def test_cfn_lint_catches_a_broken_template() -> None:
    """The check can fail: an invalid instance type in a launch template is reported."""
    broken = json.loads(json.dumps(synth()))
    for resource in broken["Resources"].values():
        if resource["Type"] == "AWS::EC2::LaunchTemplate":
            resource["Properties"]["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] = "sometimes"
    assert any(line.startswith("E") for line in _lint(broken))


def test_cfn_lint_clean_with_every_optional_part() -> None:
    template = synth(
        hf_token_secret_name="prod/hf-token",
        model_id="meta-llama/Llama-3.1-8B-Instruct",
        internal_endpoint_cidrs="10.0.0.0/8",
        prefill_replicas="2",
    )
    assert _lint(template) == []


def test_cdk_builtin_validator_passes_when_turned_back_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """app.py leaves CDK's WebAssembly validator off (cfn-lint above replaces it); users may turn it on."""
    from app import build_app

    monkeypatch.setenv("CDK_VALIDATION", "true")
    context = {**CDK_JSON_CONTEXT, "internal_endpoint_cidrs": "10.0.0.0/8", "hf_token_secret_name": "prod/hf-token"}
    app, _, _ = build_app(context)
    app.synth()  # the validator's errors would fail synth here (as would cdk-nag's)
