"""The managed collector's network path, followed through the synthesized security groups.

The collector discovers its targets through the EKS API from its own ENIs, then scrapes each Ray
pod's metrics port (AMP user guide, "Using an AWS managed collector": the cluster's endpoint must
include private access; the scraper's subnets and security groups must reach the API server). So
its ENIs need 443 to the API endpoint's ENIs and 8080 to every node a Ray pod runs on. The private
endpoint's ENIs carry the cluster security group and the groups of ResourcesVpcConfig (EKS user
guide, "View Amazon EKS security group requirements for clusters").
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from serve_config import METRICS_PORT
from settings.model import ENDPOINT_ACCESS_MODES
from tests.conftest import rayservice_from, resources, synth
from tests.support import reachability, security_groups
from tests.support.cluster import workloads
from tests.support.reachability_cluster import policies_of, private_subnets
from tests.support.security_groups import Interface, connects
from tests.support.template_graph import depends_on
from tools.template_text import render

API_PORT = 443


def _cluster(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ((cluster_id, cluster),) = resources(template, "AWS::EKS::Cluster").items()
    return cluster_id, cluster["Properties"]


def _scraper_group(template: dict[str, Any]) -> str:
    (scraper,) = resources(template, "AWS::APS::Scraper").values()
    (group,) = scraper["Properties"]["Source"]["EksConfiguration"]["SecurityGroupIds"]
    return render(group)


def _address(template: dict[str, Any], subnet_index: int, offset: int) -> str:
    return str(ipaddress.ip_network(private_subnets(template)[subnet_index])[offset])


def collector(template: dict[str, Any]) -> Interface:
    # Its ENIs sit in the private subnets (tests/test_observability.py checks which).
    return Interface("managed collector ENI", _address(template, 0, 250), (_scraper_group(template),))


def api_endpoint(template: dict[str, Any]) -> Interface:
    cluster_id, props = _cluster(template)
    groups = (
        render({"Fn::GetAtt": [cluster_id, "ClusterSecurityGroupId"]}),
        *security_groups.groups_named(props["ResourcesVpcConfig"].get("SecurityGroupIds", [])),
    )
    return Interface("EKS API private endpoint ENI", _address(template, 1, 200), groups)


def ray_nodes(template: dict[str, Any]) -> dict[str, Interface]:
    """The node ENI each Ray group's pods use: the node groups whose labels hold the group's nodeSelector."""
    cluster_id, _ = _cluster(template)
    cluster_group = render({"Fn::GetAtt": [cluster_id, "ClusterSecurityGroupId"]})
    node_groups = security_groups.nodegroup_groups(template, cluster_group)
    config = rayservice_from(template)["spec"]["rayClusterConfig"]
    ray_groups = {"headgroup": config["headGroupSpec"], **{g["groupName"]: g for g in config["workerGroupSpecs"]}}
    found = {}
    for index, (name, group) in enumerate(ray_groups.items()):
        selector = group["template"]["spec"].get("nodeSelector", {})
        hosts = [
            logical_id
            for logical_id, ng in resources(template, "AWS::EKS::Nodegroup").items()
            if all(ng["Properties"].get("Labels", {}).get(k) == v for k, v in selector.items())
        ]
        assert hosts, f"no node group runs Ray group {name}"
        for host in hosts:
            found[f"{name} on {host}"] = Interface(f"{name} pod", _address(template, 0, 10 + index), node_groups[host])
    return found


@pytest.mark.parametrize("endpoint_access", ENDPOINT_ACCESS_MODES)
def test_the_collector_reaches_the_api_endpoint_on_443_and_every_ray_pod_on_8080(endpoint_access: str) -> None:
    template = synth(endpoint_access=endpoint_access)
    # The collector reaches the API through its private endpoint only (AMP's requirement).
    assert _cluster(template)[1]["ResourcesVpcConfig"]["EndpointPrivateAccess"] is True
    source = collector(template)
    assert connects(template, source, api_endpoint(template), API_PORT), "collector -> EKS API endpoint:443 refused"
    nodes = ray_nodes(template)
    assert {name.split(" on ")[0] for name in nodes} == {"headgroup", "prefill", "decode", "ingress"}
    refused = [name for name, node in nodes.items() if not connects(template, source, node, METRICS_PORT)]
    assert refused == []
    # And the NetworkPolicies admit it to those pods (tests/test_reachability.py's model).
    policies = policies_of(template)
    peer = reachability.Peer(source.name, source.ip)
    for pod in rayservice_pods(template):
        assert reachability.admits(policies, peer, pod, METRICS_PORT), pod.name


def rayservice_pods(template: dict[str, Any]) -> list[reachability.Peer]:
    peers = reachability.pod_peers(workloads(template, "1.36"), private_subnets(template)[0])
    ray = [p for p in peers if p.labels.get("ray.io/is-ray-node") == "yes"]
    assert ray
    return ray


def test_the_collector_is_admitted_to_443_and_8080_only_and_made_after_its_rules() -> None:
    template = synth()
    group = _scraper_group(template)
    admitted = sorted(
        {(r.protocol, r.from_port, r.to_port) for r in security_groups.ingress_rules_from(template, group)}
    )
    assert admitted == [("tcp", API_PORT, API_PORT), ("tcp", METRICS_PORT, METRICS_PORT)]
    # Nothing admits the collector elsewhere on the API's or the nodes' groups.
    source = collector(template)
    for port in (22, 6379, 8265, 10250):
        assert not connects(template, source, api_endpoint(template), port), port
        assert not any(connects(template, source, n, port) for n in ray_nodes(template).values()), port
    (scraper_id,) = resources(template, "AWS::APS::Scraper")
    for logical_id, rule in resources(template, "AWS::EC2::SecurityGroupIngress").items():
        if render(rule["Properties"].get("SourceSecurityGroupId", "")) == group:
            assert depends_on(template, scraper_id, logical_id), logical_id


def test_the_model_follows_ec2s_rules() -> None:
    """The model itself: both ends must agree; a group peer needs the group on the other ENI."""
    template: dict[str, Any] = {
        "Resources": {
            "A": {"Type": "AWS::EC2::SecurityGroup", "Properties": {"SecurityGroupEgress": [
                {"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "CidrIp": "10.0.0.0/16"}]}},
            "B": {"Type": "AWS::EC2::SecurityGroup", "Properties": {}},
            "BFromA": {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {
                "GroupId": {"Fn::GetAtt": ["B", "GroupId"]}, "IpProtocol": "tcp", "FromPort": 443, "ToPort": 8080,
                "SourceSecurityGroupId": {"Fn::GetAtt": ["A", "GroupId"]}}},
        }
    }  # fmt: skip
    a = Interface("a", "10.0.0.5", (security_groups.group_id("A"),))
    b = Interface("b", "10.0.1.5", (security_groups.group_id("B"),))
    outside = Interface("b elsewhere", "10.9.1.5", b.groups)
    assert connects(template, a, b, 443)
    assert not connects(template, a, b, 8080)  # A's own egress stops it
    assert not connects(template, a, outside, 443)
    assert connects(template, b, b, 0) is False  # B admits only A
    assert not connects(template, Interface("c", "10.0.0.6", ()), b, 443)
