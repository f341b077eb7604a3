"""GCS fault tolerance: the ElastiCache store, its token by reference, the RayService as KubeRay 1.7 reads it.

The store's run-time behaviour (a killed head coming back with its workers' actors) is
tests/test_gcs_ft.py, on Ray itself against a TLS Redis with a password.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

import serve_config
from cdk_constructs.gcs_store import AUTH_TOKEN_LENGTH, GCS_STORE_PORT, replication_group_id
from serve_config import pod_templates
from serve_config.head_image import HEAD_IMAGE
from settings import SettingsError, settings_from
from settings.estimates import hourly_cost
from tests.conftest import (
    manifest_resource,
    manifests,
    only,
    pod_identity_policy,
    rayservice_from,
    require_serve_deps,
    resources,
    synth,
    synth_leaks,
)
from tests.support import kuberay_paths, placement
from tests.support.reachability import selector_matches
from tests.support.security_groups import Interface, arrives, nodegroup_groups
from tests.support.template_graph import depends_on
from tools.template_text import render

# Ray's address parser is private (ray._private.services).
pytestmark = pytest.mark.private_internals
OFF = {"gcs_fault_tolerance": "false"}


def _store(template: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = only(template, "AWS::ElastiCache::ReplicationGroup")["Properties"]
    return props


def _logical_id(template: dict[str, Any], type_: str) -> str:
    (found,) = resources(template, type_)
    return found


# --- The store -------------------------------------------------------------------------------------------------


def test_the_store_is_multi_az_encrypted_both_ways_with_the_stacks_key(template: dict[str, Any]) -> None:
    store = _store(template)
    assert (store["Engine"], store["EngineVersion"]) == ("valkey", "7.2")
    assert store["NumCacheClusters"] == 2 and store["MultiAZEnabled"] and store["AutomaticFailoverEnabled"]
    assert store["TransitEncryptionEnabled"] and store["TransitEncryptionMode"] == "required"
    assert store["AtRestEncryptionEnabled"] and store["KmsKeyId"] == {
        "Fn::GetAtt": [_key_of(template, "Encrypts the Ray GCS store"), "Arn"]
    }
    assert store["Port"] == GCS_STORE_PORT != 6379  # Ray's own GCS port: the workers' policy tells them apart
    assert store["SnapshotRetentionLimit"] == 0
    assert store["ReplicationGroupId"] == replication_group_id("pd-inference") == "pd-inference-gcs"
    # Two AZs to fail over between: the subnet group is the private subnets, one per AZ.
    (subnet_group,) = resources(template, "AWS::ElastiCache::SubnetGroup").values()
    subnets = [template["Resources"][ref["Ref"]] for ref in subnet_group["Properties"]["SubnetIds"]]
    assert len({s["Properties"]["AvailabilityZone"]["Fn::Select"][0] for s in subnets}) >= 2
    assert all(not s["Properties"]["MapPublicIpOnLaunch"] for s in subnets)


def _key_of(template: dict[str, Any], description: str) -> str:
    (found,) = [
        k
        for k, r in resources(template, "AWS::KMS::Key").items()
        if r["Properties"]["Description"].startswith(description)
    ]
    return found


def test_only_the_clusters_nodes_reach_the_store_and_only_on_its_port(template: dict[str, Any]) -> None:
    cluster = _logical_id(template, "AWS::EKS::Cluster")
    cluster_group = render({"Fn::GetAtt": [cluster, "ClusterSecurityGroupId"]})
    store_group = render({"Fn::GetAtt": [_store(template)["SecurityGroupIds"][0]["Fn::GetAtt"][0], "GroupId"]})
    store = Interface("store", "10.0.128.10", (store_group,))
    nodes = nodegroup_groups(template, cluster_group)
    assert len(nodes) == 2
    for name, groups in nodes.items():
        node = Interface(name, "10.0.128.20", groups)
        assert arrives(template, node, store, GCS_STORE_PORT), name
        assert not arrives(template, node, store, 6379), name
    # Anything else in the VPC, the managed Prometheus collector included.
    scraper = render({"Fn::GetAtt": [next(iter(_groups(template, "ObservabilityScraper"))), "GroupId"]})
    for other in (Interface("collector", "10.0.128.30", (scraper,)), Interface("vpc host", "10.0.128.40", ())):
        assert not arrives(template, other, store, GCS_STORE_PORT), other.name


def _groups(template: dict[str, Any], prefix: str) -> list[str]:
    return [k for k in resources(template, "AWS::EC2::SecurityGroup") if k.startswith(prefix)]


def test_no_primary_pages_the_alarm_topic(template: dict[str, Any]) -> None:
    (alarm,) = [a for k, a in resources(template, "AWS::CloudWatch::Alarm").items() if k.startswith("GcsStore")]
    props = alarm["Properties"]
    members = sorted(m["MetricStat"]["Metric"]["Dimensions"][0]["Value"] for m in props["Metrics"] if "MetricStat" in m)
    # ElastiCache names a replication group's nodes <id>-001, -002 (cluster mode disabled).
    assert members == ["pd-inference-gcs-001", "pd-inference-gcs-002"]
    assert {m["MetricStat"]["Metric"]["MetricName"] for m in props["Metrics"] if "MetricStat" in m} == {"IsMaster"}
    assert props["ComparisonOperator"] == "LessThanThreshold" and props["Threshold"] == 1
    # Its behaviour, run as CloudWatch evaluates it, is tests/test_gcs_store_alarm.py.
    assert props["TreatMissingData"] == "missing"
    topic = _logical_id(template, "AWS::SNS::Topic")
    assert props["AlarmActions"] == props["InsufficientDataActions"] == [{"Ref": topic}]


# --- The token: generated, by reference, never a value ---------------------------------------------------------


def test_the_token_is_generated_into_secrets_manager_and_referenced_never_written(template: dict[str, Any]) -> None:
    (secret_id,) = [k for k in resources(template, "AWS::SecretsManager::Secret") if k.startswith("GcsStore")]
    secret = template["Resources"][secret_id]["Properties"]
    assert "SecretString" not in secret
    generated = secret["GenerateSecretString"]
    # ElastiCache takes 16-128 characters; KubeRay puts it unquoted on `ray start`'s bash command line.
    assert 16 <= generated["PasswordLength"] == AUTH_TOKEN_LENGTH <= 128
    assert generated["ExcludePunctuation"] is True and generated.get("IncludeSpace") is False
    assert secret["KmsKeyId"] == {"Fn::GetAtt": [_key_of(template, "Encrypts the Ray GCS store"), "Arn"]}
    # A CloudFormation dynamic reference: resolved by CloudFormation at deploy, in no file.
    assert render(_store(template)["AuthToken"]) == "{{resolve:secretsmanager:${" + secret_id + "}:SecretString:::}}"
    # The RayService names a Kubernetes Secret only.
    options = rayservice_from(template)["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert options["redisPassword"] == {
        "valueFrom": {"secretKeyRef": {"name": serve_config.GCS_STORE_SECRET, "key": serve_config.GCS_STORE_SECRET_KEY}}
    }


def test_no_password_in_the_template_or_cdk_out(tmp_path: Path) -> None:
    # The names a Redis client or a developer's shell would hold a password under.
    password = "gcsstoreSENTINEL7f3a9c2e"
    env = {name: password for name in ("REDIS_PASSWORD", "RAY_REDIS_PASSWORD", "GCS_STORE_AUTH_TOKEN")}
    assert synth_leaks(password, tmp_path, {}, env) == []


def test_external_secrets_syncs_exactly_that_secret_decrypting_through_secrets_manager(
    template: dict[str, Any],
) -> None:
    (secret_id,) = [k for k in resources(template, "AWS::SecretsManager::Secret") if k.startswith("GcsStore")]
    (external,) = [
        m
        for m in manifests(template)
        if m["kind"] == "ExternalSecret" and m["metadata"]["name"] == serve_config.GCS_STORE_SECRET
    ]
    assert external["spec"]["target"]["name"] == serve_config.GCS_STORE_SECRET
    assert external["spec"]["data"] == [
        {"secretKey": serve_config.GCS_STORE_SECRET_KEY, "remoteRef": {"key": render({"Ref": secret_id})}}
    ]
    statements = pod_identity_policy(template, "external-secrets")["PolicyDocument"]["Statement"]
    (read,) = [s for s in statements if "secretsmanager:GetSecretValue" in s["Action"]]
    assert read["Resource"] == {"Ref": secret_id}
    (decrypt,) = [s for s in statements if s["Action"] == "kms:Decrypt"]
    assert decrypt["Resource"] == {"Fn::GetAtt": [_key_of(template, "Encrypts the Ray GCS store"), "Arn"]}
    assert (
        render(decrypt["Condition"]["StringEquals"]["kms:ViaService"]) == "secretsmanager.${AWS::Region}.amazonaws.com"
    )


# --- The RayService, as KubeRay 1.7 and Ray read it -------------------------------------------------------------


@pytest.mark.serve
def test_kuberay_accepts_the_options_and_ray_and_the_cleanup_job_parse_the_address(template: dict[str, Any]) -> None:
    rayservice = rayservice_from(template)
    cluster = rayservice["spec"]["rayClusterConfig"]
    assert kuberay_paths.gcs_fault_tolerance_problems(cluster, rayservice["metadata"].get("annotations", {})) == []
    address = render(cluster["gcsFaultToleranceOptions"]["redisAddress"])
    store = _logical_id(template, "AWS::ElastiCache::ReplicationGroup")
    assert address == f"rediss://${{{store}.PrimaryEndPoint.Address}}:{GCS_STORE_PORT}"
    concrete = address.replace(
        f"${{{store}.PrimaryEndPoint.Address}}", "master.pd-inference-gcs.abc123.use1.cache.amazonaws.com"
    )
    # KubeRay's redis cleanup Job (raycluster_controller.go buildRedisCleanupJob, v1.7.0).
    parsed = urlparse(concrete)
    assert (parsed.scheme == "rediss", parsed.port) == (True, GCS_STORE_PORT)
    # Ray's own parser for RAY_REDIS_ADDRESS (ray/_private/services.py get_address, 2.58).
    require_serve_deps()
    from ray._private.services import get_address  # ray: only with the serving stack installed

    assert get_address(concrete) == (parsed.hostname, str(GCS_STORE_PORT), True)


def test_the_kuberay_checks_refuse_what_v1_7_refuses() -> None:
    """The model of KubeRay's validation can fail: each of its refusals, on a copy of the synthesized cluster."""
    rayservice = rayservice_from(synth())
    base = rayservice["spec"]["rayClusterConfig"]
    head = ["headGroupSpec", "template", "spec", "containers", 0]

    def changed(path: list[Any], key: str, value: Any) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(base))
        node: Any = copy
        for part in path:
            node = node[part]
        node[key] = value
        return copy

    refused = [
        (changed(["headGroupSpec", "rayStartParams"], "redis-password", "x"), {}),
        (changed(head, "env", [{"name": "REDIS_PASSWORD", "value": "x"}]), {}),
        (changed(head, "env", [{"name": "RAY_REDIS_ADDRESS", "value": "redis://x:1"}]), {}),
        (base, {"ray.io/ft-enabled": "true"}),
        (base, {"ray.io/external-storage-namespace": "x"}),
        (changed(["gcsFaultToleranceOptions"], "storage", {"size": "1Gi"}), {}),
    ]
    for cluster, on_the_cluster in refused:
        assert kuberay_paths.gcs_fault_tolerance_problems(cluster, on_the_cluster), on_the_cluster


def test_the_address_the_stack_fills_in_is_not_in_the_cluster_hash() -> None:
    # The label on the synthesized pods is the hash KubeRay's recreate Job compares: the stack's address
    # token must not move it, and the hash recomputed from the template must equal it.
    rayservice = rayservice_from(synth())
    assert rayservice["metadata"]["labels"][serve_config.CLUSTER_CONFIG_LABEL] == pod_templates.cluster_config_hash(
        rayservice
    )


def test_the_rayservice_waits_for_the_store_and_its_token(template: dict[str, Any]) -> None:
    rayservice = manifest_resource(template, "RayService")
    assert depends_on(template, rayservice, _logical_id(template, "AWS::ElastiCache::ReplicationGroup"))
    assert depends_on(
        template, rayservice, manifest_resource(template, "ExternalSecret", serve_config.GCS_STORE_SECRET)
    )


# --- Who may reach it from the pods ----------------------------------------------------------------------------


def _egress_allows(policies: list[dict[str, Any]], labels: Mapping[str, str], protocol: str, port: int) -> bool:
    """NetworkPolicy egress (networking.k8s.io/v1): a pod no Egress policy selects sends anywhere; a selected pod
    sends where some selecting policy's egress rule has a matching port (no `to`: any destination)."""
    selecting = [
        p
        for p in policies
        if "Egress" in p["spec"].get("policyTypes", []) and selector_matches(p["spec"]["podSelector"], labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("egress") or []:
            assert "to" not in rule, "this model reads rules to any destination only"
            for entry in rule.get("ports") or [{}]:
                if entry.get("protocol", "TCP") != protocol:
                    continue
                start = entry.get("port")
                if start is None or start <= port <= entry.get("endPort", start):
                    return True
    return False


def test_no_worker_pod_reaches_the_store_and_every_other_port_stays_open(template: dict[str, Any]) -> None:
    policies = [m for m in manifests(template) if m["kind"] == "NetworkPolicy"]
    pods = placement.ray_workloads(rayservice_from(template))
    workers = [p for p in pods if p.labels["ray.io/node-type"] == "worker"]
    (head,) = [p for p in pods if p.labels["ray.io/node-type"] == "head"]
    assert {p.labels["ray.io/group"] for p in workers} == {"prefill", "decode", "ingress"}
    # KubeRay's cleanup Job is built from the head pod (its labels, node-type redis-cleanup).
    cleanup = {**head.labels, "ray.io/node-type": "redis-cleanup"}
    for labels in (head.labels, cleanup):
        assert _egress_allows(policies, labels, "TCP", GCS_STORE_PORT)
    for worker in workers:
        assert not _egress_allows(policies, worker.labels, "TCP", GCS_STORE_PORT), worker.name
        # Ray's GCS, HTTPS (Hugging Face, S3), DNS, NIXL's side channel, the last port.
        for protocol, port in (("TCP", 6379), ("TCP", 443), ("UDP", 53), ("TCP", 53), ("TCP", 20000), ("TCP", 65535)):
            assert _egress_allows(policies, worker.labels, protocol, port), (worker.name, protocol, port)


# --- Off, and bad values ---------------------------------------------------------------------------------------


def test_off_leaves_no_store_no_token_and_no_options() -> None:
    template = synth(**OFF)
    for type_ in ("AWS::ElastiCache::ReplicationGroup", "AWS::ElastiCache::SubnetGroup", "AWS::SecretsManager::Secret"):
        assert not resources(template, type_), type_
    assert "gcsFaultToleranceOptions" not in rayservice_from(template)["spec"]["rayClusterConfig"]
    kinds = [m["kind"] for m in manifests(template)]
    assert "ExternalSecret" not in kinds
    assert not [m for m in manifests(template) if m["kind"] == "NetworkPolicy" and "Egress" in m["spec"]["policyTypes"]]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"gcs_store_node_type": "cache.t2.micro"}, "gcs_store_node_type"),
        ({"cluster_name": "pd_inference"}, "cluster_name"),
        ({"cluster_name": "a" * 37}, "cluster_name"),
        ({"cluster_name": "pd--inference"}, "cluster_name"),
        ({"cluster_name": "1pd"}, "cluster_name"),
    ],
)
def test_bad_values_are_refused_in_one_line_naming_the_setting(overrides: dict[str, str], key: str) -> None:
    with pytest.raises(SettingsError) as refused:
        settings_from(overrides)
    assert str(refused.value).startswith(f"setting '{key}'") and "\n" not in str(refused.value)


def test_a_cluster_name_the_store_cannot_take_is_fine_without_it() -> None:
    assert settings_from({"cluster_name": "pd_inference", **OFF}).cluster_name == "pd_inference"
    assert settings_from({"cluster_name": "a" * 36}).cluster_name == "a" * 36


def test_the_store_costs_two_nodes_in_the_estimate() -> None:
    (line,) = [line for line in hourly_cost(settings_from({})) if "GCS store" in line.item]
    assert line.count == 2 and line.unit_per_hour == pytest.approx(0.0128)
    assert not [line for line in hourly_cost(settings_from(OFF)) if "GCS store" in line.item]


# --- The head's image on every system node ---------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [{}, {"image_pull_through_cache_prefix": "ecr-public"}], ids=["public", "cache"])
def test_every_system_node_holds_the_heads_image(overrides: dict[str, str]) -> None:
    template = synth(**overrides)
    (daemonset,) = [m for m in manifests(template) if m["kind"] == "DaemonSet" and m["metadata"]["name"] == HEAD_IMAGE]
    head = rayservice_from(template)["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    pod = daemonset["spec"]["template"]["spec"]
    (hold,) = pod["containers"]
    # Rendered: the same text (the cache's ${AWS::...} inside Fn::Sub: tests/test_image_cache.py checks every manifest).
    assert hold["image"] == head["containers"][0]["image"]
    assert pod["nodeSelector"] == head["nodeSelector"]
    # It runs while the node lives, so the kubelet's image garbage collection never takes the image.
    assert hold["command"] == ["sleep", "infinity"]
    assert "tolerations" not in pod  # the GPU nodes' taint keeps it off them, where the workers hold the image


def test_no_held_image_without_the_store() -> None:
    assert HEAD_IMAGE not in {m["metadata"]["name"] for m in manifests(synth(**OFF)) if m["kind"] == "DaemonSet"}
