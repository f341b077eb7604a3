"""The synthesized RayService against KubeRay v1.7.0's CRD schema, in strict mode."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.conftest import rayservice_from, shared_file, synth
from tests.support.kuberay_schema import validation_errors

CRD = "kuberay-v1.7.0/ray.io_rayservices.yaml"


def test_synthesized_rayservice_is_valid(rayservice: dict[str, Any]) -> None:
    assert validation_errors(rayservice, shared_file(CRD)) == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"serving_mode": "aggregated"},
        {"ray_token_auth": "false"},
        {"endpoint_api_keys_secret_name": "prod/llm-keys"},
        # The ingress pods' preStop and grace period behind the internal NLB.
        {"internal_endpoint_cidrs": "10.0.0.0/8"},
        # Blue/green: upgradeStrategy NewCluster and rayClusterDeletionDelaySeconds.
        {"decode_max_replicas": "3", "decode_target_ongoing_requests": "8"},
    ],
)
def test_other_modes_are_valid(overrides: dict[str, Any]) -> None:
    assert validation_errors(rayservice_from(synth(**overrides)), shared_file(CRD)) == []


def _broken_replica(doc: dict[str, Any]) -> None:
    group = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    group["replica"] = group.pop("replicas")


def _broken_worker_group_key(doc: dict[str, Any]) -> None:
    cluster = doc["spec"]["rayClusterConfig"]
    cluster["workerGroupSpec"] = cluster.pop("workerGroupSpecs")


def _broken_node_selector(doc: dict[str, Any]) -> None:
    pod = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    pod["nodeSelecter"] = pod.pop("nodeSelector")


def _broken_gpu_type(doc: dict[str, Any]) -> None:
    container = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    container["resources"]["limits"] = "1 GPU"


@pytest.mark.parametrize(
    ("break_it", "where"),
    [
        (_broken_replica, "replica"),
        (_broken_worker_group_key, "workerGroupSpec"),
        (_broken_node_selector, "nodeSelecter"),
        (_broken_gpu_type, "limits"),
    ],
)
def test_broken_variants_are_rejected(rayservice: dict[str, Any], break_it: Any, where: str) -> None:
    broken = copy.deepcopy(rayservice)
    break_it(broken)
    errors = validation_errors(broken, shared_file(CRD))
    assert errors
    assert any(where in e for e in errors), errors
