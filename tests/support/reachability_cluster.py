"""The synthesized cluster as the reachability proof sees it: policies, pods and the pairs that must connect."""

from __future__ import annotations

import functools
import ipaddress
import json
from typing import Any

from serve_config import DASHBOARD_PORT, METRICS_PORT, SERVE_PORT
from tests.conftest import manifests, resources, synth
from tests.support import reachability
from tests.support.cluster import workloads
from tests.support.reachability import Peer, admits

RAY_PORTS = (6379, DASHBOARD_PORT, 10001, SERVE_PORT, METRICS_PORT, 20000, 22000, 45678)


def policies_of(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in manifests(template) if m["kind"] == "NetworkPolicy"]


def private_subnets(template: dict[str, Any]) -> list[str]:
    return sorted(
        r["Properties"]["CidrBlock"]
        for r in resources(template, "AWS::EC2::Subnet").values()
        if not r["Properties"].get("MapPublicIpOnLaunch")
    )


@functools.cache
def _cluster(overrides_json: str) -> tuple[list[dict[str, Any]], list[Peer], list[str]]:
    overrides = json.loads(overrides_json)
    template = synth(**overrides)
    subnets = private_subnets(template)
    peers = reachability.pod_peers(workloads(template, "1.36"), subnets[0])
    return policies_of(template), peers, subnets


def cluster(**overrides: Any) -> tuple[list[dict[str, Any]], list[Peer], list[str]]:
    return _cluster(json.dumps(overrides, sort_keys=True))


def ray_pods(peers: list[Peer]) -> list[Peer]:
    return [p for p in peers if p.labels.get("ray.io/is-ray-node") == "yes"]


def address_in(cidr: str, offset: int) -> str:
    return str(ipaddress.ip_network(cidr)[offset])


def required_pairs(
    peers: list[Peer], subnets: list[str], nlb_targets: list[Peer] | None = None
) -> list[tuple[Peer, Peer, int]]:
    """Every (source, destination, port) the service needs; nlb_targets: the pods the NLB sends clients to."""
    ray = ray_pods(peers)
    head = next(p for p in ray if p.labels["ray.io/node-type"] == "head")
    (operator,) = [p for p in peers if p.name == "Deployment/kuberay-operator"]
    pairs = [(a, b, port) for a in ray for b in ray for port in RAY_PORTS]
    pairs += [(operator, head, DASHBOARD_PORT), (operator, head, SERVE_PORT)]
    # The control plane's ENIs sit in the cluster's (private) subnets.
    api_server = Peer("EKS control plane ENI", address_in(subnets[1], 200))
    pairs += [(api_server, pod, METRICS_PORT) for pod in ray]
    if nlb_targets:
        load_balancer = Peer("internal NLB", address_in(subnets[1], 77))
        pairs += [(load_balancer, pod, SERVE_PORT) for pod in nlb_targets]
    return pairs


def refused(policies: list[dict[str, Any]], pairs: list[tuple[Peer, Peer, int]]) -> list[str]:
    return [f"{s.name} -> {d.name}:{port}" for s, d, port in pairs if not admits(policies, s, d, port)]
