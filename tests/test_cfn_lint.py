"""cfn-lint on the synthesized template: zero errors, zero warnings but W3005."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from tests.conftest import PROJECT_CONTEXT, ROOT, only, synth
from tests.support.autoscaling import AUTOSCALING
from tests.support.cfn_lint import lint_errors

# W3005 (redundant DependsOn): CDK adds explicit DependsOn next to the implicit
# Ref/GetAtt ones; harmless, and not ours to remove.


def test_cfn_lint_clean_on_defaults() -> None:
    assert lint_errors(synth()) == []


def test_cfn_lint_clean_with_pinned_az_reservation_and_private_endpoint() -> None:
    template = synth(
        gpu_availability_zone="us-east-1c",
        gpu_placement_group="false",
        gpu_capacity_reservation_id="cr-0123456789abcdef0",
        endpoint_access="private",
    )
    # W3010 (hard-coded AZ) is the point of gpu_availability_zone: g6 is not in every AZ.
    assert lint_errors(template, also_ignored=("W3010",)) == []


def test_cfn_lint_catches_a_broken_template() -> None:
    """The check can fail: an invalid instance type in a launch template is reported."""
    broken = json.loads(json.dumps(synth()))
    for resource in broken["Resources"].values():
        if resource["Type"] == "AWS::EC2::LaunchTemplate":
            resource["Properties"]["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] = "sometimes"
    assert any(line.startswith("E") for line in lint_errors(broken))


def test_cfn_lint_clean_with_every_optional_part() -> None:
    template = synth(
        hf_token_secret_name="prod/hf-token",
        model_id="meta-llama/Llama-3.1-8B-Instruct",
        internal_endpoint_cidrs="10.0.0.0/8",
        prefill_replicas="2",
        endpoint_api_keys_secret_name="prod/llm-keys",
        endpoint_tls_certificate_arn="arn:aws:acm:us-east-1:123456789012:certificate/"
        + "11111111-2222-3333-4444-555555555555",
    )
    assert lint_errors(template) == []


def test_cfn_lint_clean_with_cluster_autoscaler() -> None:
    """The GPU group with a range (every size, tests/test_gpu_node_scaling.py), Cluster Autoscaler's role,
    association and release."""
    template = synth(**AUTOSCALING)
    scaling = only(template, "AWS::EKS::Nodegroup", AmiType="AL2023_x86_64_NVIDIA")["Properties"]["ScalingConfig"]
    assert scaling["MinSize"] == scaling["DesiredSize"] < scaling["MaxSize"]
    assert lint_errors(template) == []


BROKEN_SYNTH = """
import json, sys
import aws_cdk as cdk
from app import build_app
context = json.loads(sys.argv[1])
app, stack, _ = build_app(context)
if sys.argv[2] == "broken":
    cdk.CfnResource(stack, "Broken", type="AWS::EC2::Subnet", properties={})  # no VpcId, no CIDR
app.synth()
"""


def _synth_in_a_fresh_process(variant: str, **env: str) -> subprocess.CompletedProcess[str]:
    # A fresh process: CDK reads CDK_VALIDATION in its Node kernel, which the suite started with it off.
    context = {**PROJECT_CONTEXT, "internal_endpoint_cidrs": "10.0.0.0/8", "hf_token_secret_name": "prod/hf-token"}
    environ = {k: v for k, v in os.environ.items() if k != "CDK_VALIDATION"} | env
    with tempfile.TemporaryDirectory() as out:
        return subprocess.run(
            [sys.executable, "-c", BROKEN_SYNTH, json.dumps(context), variant],
            cwd=ROOT,
            env={**environ, "CDK_OUTDIR": out},
            capture_output=True,
            text=True,
            check=False,
        )


def test_cdk_builtin_validator_is_on_by_default_and_passes() -> None:
    """app.py runs CDK's own template validator as CDK ships it (the suite turns it off where cfn-lint runs)."""
    passing = _synth_in_a_fresh_process("as-is")
    assert passing.returncode == 0, passing.stderr[-2000:]
    # It is really on: a broken resource fails synth by default, and passes with CDK_VALIDATION=false.
    broken = _synth_in_a_fresh_process("broken")
    assert broken.returncode != 0 and "VpcId" in broken.stderr
    assert _synth_in_a_fresh_process("broken", CDK_VALIDATION="false").returncode == 0
