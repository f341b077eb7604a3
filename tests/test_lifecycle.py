"""Destroy order, upgrades on fixed capacity, and CRD upgrades, proved on the template."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdk_constructs import addons
from settings.catalog import KUBECTL_IMAGE, KUBERAY_OPERATOR, kuberay_crd_urls
from tests.conftest import helm_releases, manifest_resource, manifests, resources, synth
from tests.support.template_graph import depends_on

EVERYTHING = {
    "hf_token_secret_name": "prod/hf-token",
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "internal_endpoint_cidrs": "10.0.0.0/8",
}


@pytest.fixture(scope="module")
def full() -> dict[str, Any]:
    """Every optional part turned on, so every ordering can be checked."""
    return synth(**EVERYTHING)


def _nodegroups(template: dict[str, Any]) -> list[str]:
    return list(resources(template, "AWS::EKS::Nodegroup"))


def test_rayservice_deleted_before_every_helm_release(full: dict[str, Any]) -> None:
    rayservice = manifest_resource(full, "RayService")
    releases = helm_releases(full)
    assert len(releases) == 5
    for release, logical_id in releases.items():
        if release != "aws-load-balancer-controller":
            assert depends_on(full, rayservice, logical_id), release


def test_helm_releases_deleted_before_node_groups(full: dict[str, Any]) -> None:
    for release, logical_id in helm_releases(full).items():
        for nodegroup in _nodegroups(full):
            assert depends_on(full, logical_id, nodegroup), (release, nodegroup)


def test_node_groups_deleted_before_cluster_and_addons(full: dict[str, Any]) -> None:
    cluster = next(iter(resources(full, "AWS::EKS::Cluster")))
    for nodegroup in _nodegroups(full):
        assert depends_on(full, nodegroup, cluster)
        for addon, props in resources(full, "AWS::EKS::Addon").items():
            if props["Properties"]["AddonName"] == "amazon-cloudwatch-observability":
                # The other way round: its DaemonSets need nodes, and go before them on destroy.
                assert depends_on(full, addon, nodegroup)
                continue
            assert depends_on(full, nodegroup, addon)


def test_load_balanced_service_deleted_before_its_controller_subnets_and_groups(full: dict[str, Any]) -> None:
    service = manifest_resource(full, "Service", "pd-llm-internal")
    assert depends_on(full, service, helm_releases(full)["aws-load-balancer-controller"])
    for subnet in resources(full, "AWS::EC2::Subnet"):
        props = full["Resources"][subnet]["Properties"]
        if not props["MapPublicIpOnLaunch"]:
            assert depends_on(full, service, subnet), subnet
    for group in resources(full, "AWS::EC2::SecurityGroup"):
        if group.startswith(("ObservabilityScraperSecurityGroup", "GcsStoreSecurityGroup")):
            continue  # the managed collector's ENIs, the GCS store's: no load balancer rule refers to them
        assert depends_on(full, service, group), group


def test_every_kubernetes_object_goes_before_the_cluster_and_nodes(full: dict[str, Any]) -> None:
    """Nothing Kubernetes made may outlive the nodes or the network it runs on."""
    for logical_id in resources(full, "Custom::AWSCDK-EKS-KubernetesResource"):
        for nodegroup in _nodegroups(full):
            assert depends_on(full, logical_id, nodegroup), logical_id


def test_upgrades_fit_two_fixed_gpus(rayservice: dict[str, Any], template: dict[str, Any]) -> None:
    # No second Ray cluster on a change: serve config updates in place.
    assert rayservice["spec"]["upgradeStrategy"] == {"type": "None"}
    gpu_group = next(
        g["Properties"]
        for g in resources(template, "AWS::EKS::Nodegroup").values()
        if g["Properties"]["Labels"]["role"] == "gpu-worker"
    )
    assert gpu_group["UpdateConfig"] == {"MaxUnavailable": 1}


def test_kuberay_crds_upgraded_by_a_versioned_job(template: dict[str, Any]) -> None:
    docs = {d["kind"]: d for d in manifests(template) if d["metadata"].get("name", "").startswith("kuberay-crd")}
    job = docs["Job"]
    assert job["metadata"]["name"].startswith(f"kuberay-crds-{KUBERAY_OPERATOR.version.replace('.', '-')}-")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == KUBECTL_IMAGE
    assert container["args"][:2] == ["apply", "--server-side"]
    urls = [arg for arg in container["args"] if arg.startswith("https://")]
    assert urls == kuberay_crd_urls(KUBERAY_OPERATOR.version)
    assert all(f"/v{KUBERAY_OPERATOR.version}/" in url for url in urls)
    rules = docs["ClusterRole"]["rules"]
    assert all(rule["resources"] == ["customresourcedefinitions"] for rule in rules)
    assert {"get", "patch", "update"} == set(rules[0]["verbs"])
    assert all(name.endswith(".ray.io") for name in rules[0]["resourceNames"])
    # After the operator chart, before the RayService.
    job_id = manifest_resource(template, "Job", name_prefix="kuberay-crds-")
    assert depends_on(template, job_id, helm_releases(template)["kuberay-operator"])
    assert depends_on(template, manifest_resource(template, "RayService"), job_id)


def test_chart_version_bump_makes_a_new_job(monkeypatch: pytest.MonkeyPatch) -> None:
    bumped = KUBERAY_OPERATOR.__class__(**{**KUBERAY_OPERATOR.__dict__, "version": "1.8.0"})
    monkeypatch.setattr(addons, "KUBERAY_OPERATOR", bumped)
    (job,) = [doc for doc in addons.kuberay_crd_upgrade({}) if doc["kind"] == "Job"]
    assert job["metadata"]["name"].startswith("kuberay-crds-1-8-0-")
    assert all("/v1.8.0/" in arg for arg in job["spec"]["template"]["spec"]["containers"][0]["args"] if "://" in arg)


def test_log_groups_and_key_are_removed_on_destroy(template: dict[str, Any]) -> None:
    groups = resources(template, "AWS::Logs::LogGroup")
    # VPC flow logs, EKS control plane, the kubectl provider's two Lambdas, the observability add-on's four
    assert len(groups) == 8
    assert all(g["DeletionPolicy"] == "Delete" and g["Properties"]["RetentionInDays"] == 30 for g in groups.values())
    (control_plane,) = [
        k for k, g in groups.items() if g["Properties"].get("LogGroupName") == "/aws/eks/pd-inference/cluster"
    ]
    cluster = next(iter(resources(template, "AWS::EKS::Cluster")))
    assert depends_on(template, cluster, control_plane)
    keys = resources(template, "AWS::KMS::Key")
    assert len(keys) == 4  # Kubernetes secrets; the log groups; the alarm topic; the GCS store and its token
    for key in keys.values():
        assert key["DeletionPolicy"] == "Delete"
        assert key["Properties"]["PendingWindowInDays"] == 7
        assert key["Properties"]["EnableKeyRotation"] is True
    # Every log group is encrypted with the stack's own logs key (checkov CKV_AWS_158).
    key_ids = {json.dumps(g["Properties"].get("KmsKeyId")) for g in groups.values()}
    (key_ref,) = key_ids
    assert json.loads(key_ref)["Fn::GetAtt"][0] in keys


def test_the_graph_check_can_fail(full: dict[str, Any]) -> None:
    """The reverse relations do not hold, so the checks above are not vacuous."""
    rayservice = manifest_resource(full, "RayService")
    cluster = next(iter(resources(full, "AWS::EKS::Cluster")))
    assert not depends_on(full, helm_releases(full)["kuberay-operator"], rayservice)
    for nodegroup in _nodegroups(full):
        assert not depends_on(full, cluster, nodegroup)
