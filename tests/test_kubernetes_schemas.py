"""Every built-in Kubernetes object the stack applies, against Kubernetes' own schema for the cluster's version."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from settings import Settings
from tests.conftest import manifests, synth

CUSTOM_KINDS = {"RayService", "SecretStore", "ExternalSecret"}  # checked elsewhere, or no schema offline
EVERYTHING = {
    "hf_token_secret_name": "prod/hf-token",
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "internal_endpoint_cidrs": "10.0.0.0/8",
    "model_source": "s3://acme-models/approved/llama-3.1-8b",
    "endpoint_api_keys_secret_name": "prod/llm-keys",
    "endpoint_tls_certificate_arn": "arn:aws:acm:us-east-1:123456789012:certificate/"
    + "11111111-2222-3333-4444-555555555555",
}


@pytest.fixture(scope="module")
def builtin_objects() -> list[dict[str, Any]]:
    objects = [m for m in manifests(synth(**EVERYTHING)) if m["kind"] not in CUSTOM_KINDS]
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job", "Service", "NetworkPolicy"} <= {
        o["kind"] for o in objects
    }
    assert "ray-pods-code" in {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    assert "ray-model-reader" in {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    return objects


def test_builtin_objects_are_valid_for_the_cluster_version(builtin_objects: list[dict[str, Any]]) -> None:
    version = Settings().kubernetes_version
    for obj in builtin_objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_rejects_a_misspelled_field(builtin_objects: list[dict[str, Any]]) -> None:
    job = next(copy.deepcopy(o) for o in builtin_objects if o["kind"] == "Job")
    job["spec"]["template"]["spec"]["restartPolcy"] = job["spec"]["template"]["spec"].pop("restartPolicy")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, Settings().kubernetes_version, strict=True)
