"""The reachability proof: the synthesized NetworkPolicies, applied to every pod the cluster will run.

Every pair that must talk is admitted; no pod outside the Ray cluster reaches
the dashboard (8265, the job API) or GCS (6379); removing any allow rule breaks
a pair that must talk. Pods and their labels come from the rendered charts, the
stack's manifests and the Ray pods as KubeRay labels them (tests/cluster.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from serve_config import DASHBOARD_PORT, METRICS_PORT, SERVE_PORT
from settings.catalog import KUBERAY_OPERATOR
from tests.conftest import manifest_resource, manifests, resources, synth
from tests.support import reachability
from tests.support.reachability import Peer, admits
from tests.support.reachability_cluster import (
    RAY_PORTS,
    address_in,
    cluster,
    ray_pods,
    refused,
    required_pairs,
)

NLB = {"internal_endpoint_cidrs": "10.0.0.0/8"}
# Ports Ray and NIXL use between their pods: GCS, dashboard, client, serve,
# metrics, NIXL's side channels (20000, 22000) and one Ray picks at random.
CONTROL_PLANE_PORTS = (DASHBOARD_PORT, 6379)


def load_balancer_selector(template: dict[str, Any]) -> dict[str, str] | None:
    """The selector of the NLB's Service (the pods it sends clients to); None without one."""
    found = [m for m in manifests(template) if m["kind"] == "Service" and m["spec"]["type"] == "LoadBalancer"]
    return dict(found[0]["spec"]["selector"]) if found else None


def load_balancer_targets(peers: list[Peer], overrides: dict[str, Any]) -> list[Peer]:
    """The pods the NLB sends clients to: those its Service's selector matches."""
    selector = load_balancer_selector(synth(**overrides))
    if selector is None:
        return []
    return [p for p in peers if all(p.labels.get(k) == v for k, v in selector.items())]


@pytest.mark.parametrize("overrides", [{}, NLB], ids=["defaults", "internal NLB"])
def test_every_pair_that_must_talk_is_admitted(overrides: dict[str, Any]) -> None:
    policies, peers, subnets = cluster(**overrides)
    targets = load_balancer_targets(peers, overrides)
    # The NLB sends clients to the ingress pod alone (tests/test_client_endpoint.py), never to a GPU worker.
    assert [p.labels["ray.io/group"] for p in targets] == (["ingress"] if overrides else [])
    assert refused(policies, required_pairs(peers, subnets, targets)) == []


# A namespace no policy names, holding a copy of every pod (tests/reachability.py strangers).
STRANGERS = "strangers"


def outsiders(peers: list[Peer], subnets: list[str]) -> list[Peer]:
    """Every pod outside the Ray cluster, and a copy of every pod (Ray's too) in a namespace of its own."""
    ray = ray_pods(peers)
    return [p for p in peers if p not in ray] + reachability.strangers(peers, STRANGERS, subnets[0])


@pytest.mark.parametrize("overrides", [{}, NLB], ids=["defaults", "internal NLB"])
def test_no_pod_outside_the_ray_cluster_reaches_the_dashboard_or_gcs(overrides: dict[str, Any]) -> None:
    policies, peers, subnets = cluster(**overrides)
    ray = ray_pods(peers)
    others = outsiders(peers, subnets)
    assert {p.labels.get("ray.io/node-type") for p in others if p.namespace == STRANGERS} >= {"head", "worker"}
    # The charts' controllers, our Jobs (one in the serving namespace itself), CoreDNS;
    # of all of them, only the operator, and only to the head's dashboard.
    assert {"Deployment/kuberay-operator", "Deployment/coredns"} <= {p.name for p in others}
    assert any(p.namespace == "llm" for p in others)
    outsider = Peer("a client outside the VPC", "198.51.100.10")
    admitted = [
        f"{src.name} -> {dst.name}:{port}"
        for src in [*others, outsider]
        for dst in ray
        for port in CONTROL_PLANE_PORTS
        if admits(policies, src, dst, port)
    ]
    assert admitted == ["Deployment/kuberay-operator -> pd-llm/head:8265"]


def test_without_a_load_balancer_no_pod_outside_ray_reaches_the_endpoint() -> None:
    policies, peers, subnets = cluster()
    ray = ray_pods(peers)
    # Only the operator's health check; kubectl port-forward enters the pod's own network namespace.
    admitted = {s.name for s in outsiders(peers, subnets) for d in ray if admits(policies, s, d, SERVE_PORT)}
    assert admitted == {"Deployment/kuberay-operator"}


def test_the_operator_is_selected_by_its_rendered_labels() -> None:
    """The policy names the operator by the labels its chart really puts on the pod."""
    _, peers, _ = cluster()
    (operator,) = [p for p in peers if p.name == "Deployment/kuberay-operator"]
    assert operator.namespace == KUBERAY_OPERATOR.namespace
    assert operator.labels["app.kubernetes.io/name"] == KUBERAY_OPERATOR.chart
    assert operator.labels["app.kubernetes.io/instance"] == KUBERAY_OPERATOR.release


def test_default_deny_selects_every_pod_of_the_namespace() -> None:
    policies, _, _ = cluster()
    (deny,) = [p for p in policies if p["metadata"]["name"] == "default-deny-ingress"]
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": []}


@pytest.mark.parametrize(
    "removed",
    ["ray-cluster-internal", "kuberay-operator-to-head", "metrics-from-control-plane", "serve-from-load-balancer"],
)
def test_removing_any_allow_rule_breaks_a_needed_path(removed: str) -> None:
    policies, peers, subnets = cluster(**NLB)
    assert removed in {p["metadata"]["name"] for p in policies}
    remaining = [p for p in policies if p["metadata"]["name"] != removed]
    assert refused(remaining, required_pairs(peers, subnets, load_balancer_targets(peers, NLB))) != []


def test_the_vpc_cni_enforces_network_policies(template: dict[str, Any]) -> None:
    (cni,) = [r for r in resources(template, "AWS::EKS::Addon").values() if r["Properties"]["AddonName"] == "vpc-cni"]
    assert json.loads(cni["Properties"]["ConfigurationValues"]) == {"enableNetworkPolicy": "true"}


def test_policies_exist_before_the_ray_pods(template: dict[str, Any]) -> None:
    rayservice = template["Resources"][manifest_resource(template, "RayService")]
    for logical_id, r in resources(template, "Custom::AWSCDK-EKS-KubernetesResource").items():
        if "NetworkPolicy" in json.dumps(r["Properties"]["Manifest"]):
            assert logical_id in rayservice["DependsOn"]


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
    ],
)
def test_selector_semantics(selector: dict[str, Any], labels: dict[str, str], matches: bool) -> None:
    assert reachability.selector_matches(selector, labels) is matches


def test_peer_and_port_semantics() -> None:
    pod = Peer("p", "10.0.64.5", "llm", {"app": "x"}, {"web": 8000})
    other_ns = Peer("q", "10.0.64.6", "other", {"app": "x"})
    outside = Peer("ext", "192.0.2.1")
    policy = {
        "metadata": {"name": "t", "namespace": "llm"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "x"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "x"}}}], "ports": [{"port": "web"}]},
                {"from": [{"ipBlock": {"cidr": "192.0.2.0/24", "except": ["192.0.2.1/32"]}}]},
                {
                    "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}}],
                    "ports": [{"port": 9000, "endPort": 9010}],
                },
            ],
        },
    }
    assert admits([policy], pod, pod, 8000) and not admits([policy], pod, pod, 8001)
    assert not admits([policy], other_ns, pod, 8000) and admits([policy], other_ns, pod, 9005)
    assert not admits([policy], outside, pod, 8000)
    assert admits([], outside, pod, 1)


# --- what reaches the Ray pods' metrics port (8080) ------------------------------------
def test_the_collector_reaches_every_ray_pods_metrics_port() -> None:
    policies, peers, subnets = cluster()
    # The managed collector's ENIs sit in the private subnets (cdk_constructs/observability.py).
    collector = Peer("managed Prometheus collector ENI", address_in(subnets[0], 250))
    assert refused(policies, [(collector, pod, METRICS_PORT) for pod in ray_pods(peers)]) == []


def test_the_network_policy_cannot_tell_the_collector_from_any_pod_on_8080() -> None:
    """What a NetworkPolicy can and cannot limit here: it admits 8080 by address, and with the VPC CNI every
    pod's address is in the private subnets, so every pod of the cluster (the add-on's too, and a stranger's
    copy of a Ray pod) reaches 8080; it still keeps them off every other Ray port. The security-group rule
    from the collector's group is what admits the collector, and it admits it to 8080 only."""
    policies, peers, subnets = cluster()
    ray = ray_pods(peers)
    others = outsiders(peers, subnets)
    assert {p.namespace for p in others} >= {"amazon-cloudwatch", STRANGERS}
    on_metrics = {s.name for s in others for d in ray if admits(policies, s, d, METRICS_PORT)}
    assert on_metrics == {p.name for p in others}
    elsewhere = {
        f"{s.name} -> {d.name}:{port}"
        for s in others
        for d in ray
        for port in RAY_PORTS
        if port not in (METRICS_PORT, DASHBOARD_PORT, SERVE_PORT) and admits(policies, s, d, port)
    }
    assert elsewhere == set()
    template = synth()
    cluster_group = {"Fn::GetAtt": [next(iter(resources(template, "AWS::EKS::Cluster"))), "ClusterSecurityGroupId"]}
    to_metrics = [
        r["Properties"]
        for r in resources(template, "AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"]["GroupId"] == cluster_group
        and r["Properties"].get("FromPort", 0) <= METRICS_PORT <= r["Properties"].get("ToPort", 65535)
    ]
    (rule,) = to_metrics
    assert rule["SourceSecurityGroupId"]["Fn::GetAtt"][0].startswith("ObservabilityScraperSecurityGroup")
    assert (rule["FromPort"], rule["ToPort"]) == (METRICS_PORT, METRICS_PORT)
