"""checkov on the optional parts: each variant's template fails only where the defaults' does (aws-cdk's
kubectl-provider Lambdas, tests/test_deploy_day.py), and every finding it skips is one the stack acknowledges,
with its reason, on the construct it names (stacks/nag_acknowledgements.py, CHECKOV_SKIPS).

One checkov run over a folder of the variants' templates: checkov takes about 10 s a template.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stacks.nag_acknowledgements import CHECKOV_SKIPS
from tests.conftest import ROOT, resources, synth

CERT = "arn:aws:acm:us-east-1:123456789012:certificate/11111111-2222-3333-4444-555555555555"
# Each optional part at least once: the NLB with keys and TLS, ranges with a warm node (Cluster Autoscaler),
# the pull-through cache with S3 weights, p5.48xlarge with tensor parallelism, and the smallest stack.
VARIANTS: dict[str, dict[str, Any]] = {
    "nlb-keys-tls": {
        "internal_endpoint_cidrs": "10.0.0.0/8",
        "endpoint_api_keys_secret_name": "prod/llm-keys",
        "endpoint_tls_certificate_arn": CERT,
    },
    "ranges-warm": {"decode_max_replicas": 3, "decode_target_ongoing_requests": 8, "gpu_warm_nodes": 1},
    "cache-s3": {"image_pull_through_cache_prefix": "ecr-public", "model_source": "s3://acme-models/approved/qwen3-8b"},
    "p5-tp": {
        "gpu_instance_type": "p5.48xlarge",
        "model_id": "meta-llama/Llama-3.3-70B-Instruct",
        "prefill_tensor_parallel_size": 8,
        "decode_tensor_parallel_size": 4,
        "decode_replicas": 2,
        "hf_token_secret_name": "prod/hf-token",
    },
    "minimal": {"gcs_fault_tolerance": "false", "observability": "false"},
}
KUBECTL_LAMBDA_CHECKS = {"CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_173"}


def _skips_in(template: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each resource's checkov skips in its template metadata: {logical id: {check: comment}}."""
    return {
        k: {entry["id"]: entry["comment"] for entry in r["Metadata"]["checkov"]["skip"]}
        for k, r in template["Resources"].items()
        if "checkov" in r.get("Metadata", {})
    }


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    checkov = ROOT / ".venv-checkov" / "bin" / "checkov"
    assert checkov.exists(), "checkov is not installed: run `make .venv-checkov/.installed`"
    folder = tmp_path_factory.mktemp("variants")
    templates = {name: synth(**overrides) for name, overrides in VARIANTS.items()}
    for name, template in templates.items():
        (folder / f"{name}.json").write_text(json.dumps(template))
    # Not --quiet: it would leave the skipped checks out of the report.
    command = [str(checkov), "-d", str(folder), "--framework", "cloudformation", "--compact", "--skip-download"]
    result = subprocess.run([*command, "-o", "json"], capture_output=True, text=True, timeout=900, check=False)
    found = json.loads(result.stdout)
    (report,) = found if isinstance(found, list) else [found]
    by_file: dict[str, dict[str, list[dict[str, Any]]]] = {name: {"failed": [], "skipped": []} for name in templates}
    for kind in ("failed", "skipped"):
        for check in report["results"][f"{kind}_checks"]:
            by_file[Path(check["file_path"]).stem][kind].append(check)
    assert report["summary"]["parsing_errors"] == 0, report["summary"]
    return {name: (templates[name], by_file[name]) for name in templates}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_fails_only_on_the_kubectl_provider_lambdas(
    reports: dict[str, tuple[dict[str, Any], dict[str, Any]]], name: str
) -> None:
    template, checks = reports[name]
    failed = {(f["check_id"], f["resource"].split(".", 1)[1]) for f in checks["failed"]}
    lambdas = {k for k in resources(template, "AWS::Lambda::Function") if "KubectlProvider" in k}
    assert {check for check, _ in failed} == KUBECTL_LAMBDA_CHECKS, failed
    assert {resource for _, resource in failed} == lambdas


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_skip_is_an_acknowledgement_with_its_reason(
    reports: dict[str, tuple[dict[str, Any], dict[str, Any]]], name: str
) -> None:
    template, checks = reports[name]
    in_template = _skips_in(template)
    for logical_id, skips in in_template.items():
        # CDK's logical id starts with the construct path, its parts joined (an L2's `Resource` left out).
        (path,) = [p for p in CHECKOV_SKIPS if logical_id.startswith(p.replace("/", ""))]
        assert skips == CHECKOV_SKIPS[path], logical_id
    skipped = {(s["check_id"], s["resource"].split(".", 1)[1]) for s in checks["skipped"]}
    # checkov read every skip, with its reason, and skipped nothing else.
    assert skipped == {(check, logical_id) for logical_id, skips in in_template.items() for check in skips}
    for s in checks["skipped"]:
        assert s["check_result"]["suppress_comment"] == in_template[s["resource"].split(".", 1)[1]][s["check_id"]]


def test_every_acknowledged_construct_appears_in_some_variant(
    reports: dict[str, tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """A skip whose construct no variant makes would be unreviewed: each one is skipped somewhere."""
    skipped_anywhere = {s["check_id"] for _, checks in reports.values() for s in checks["skipped"]}
    assert skipped_anywhere == {check for reasons in CHECKOV_SKIPS.values() for check in reasons}
