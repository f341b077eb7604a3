"""Which sources the synthesized NetworkPolicies admit to which pods, by Kubernetes' rules.

The semantics of networking.k8s.io/v1 NetworkPolicy, ingress only:
- a pod is isolated for ingress once any policy in its namespace selects it
  (podSelector) with policyTypes Ingress; a pod no policy selects admits all;
- an isolated pod admits a connection if any selecting policy has an ingress
  rule whose ports include the port (no ports: every port) and whose `from`
  holds a peer that matches the source (no `from`: every source);
- a peer: podSelector alone matches pods of the policy's namespace;
  namespaceSelector alone, every pod of matching namespaces; both, pods matching
  both; ipBlock, any address inside `cidr` and outside `except`.
With the VPC CNI every pod has an address from the VPC's subnets, so an
ipBlock over those subnets admits pods too; the model keeps that (it is what the
AWS network policy agent matches on). Traffic from a node to its own pods
(kubelet, hostNetwork pods) is outside NetworkPolicy: those sources are not modelled.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.support.placement import Workload, expression_matches


@dataclass(frozen=True)
class Peer:
    """One end of a connection: a pod (namespace set) or an address outside the pod network (namespace None)."""

    name: str
    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    # Named container ports, for policies that name a port.
    ports: Mapping[str, int] = field(default_factory=dict)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector: every matchLabels pair and every matchExpression; {} matches all."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(expression_matches(e, labels) for e in selector.get("matchExpressions") or [])


def _namespace_labels(namespace: str) -> dict[str, str]:
    # Kubernetes labels every namespace with its own name.
    return {"kubernetes.io/metadata.name": namespace}


def _peer_matches(peer: Mapping[str, Any], source: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(source.ip)
        inside = address in ipaddress.ip_network(block["cidr"])
        return inside and not any(address in ipaddress.ip_network(c) for c in block.get("except") or [])
    if source.namespace is None:
        return False
    if "namespaceSelector" in peer:
        if not selector_matches(peer["namespaceSelector"], _namespace_labels(source.namespace)):
            return False
    elif source.namespace != policy_namespace:
        return False
    return selector_matches(peer.get("podSelector") or {}, source.labels)


def _port_matches(rule_ports: Iterable[Mapping[str, Any]] | None, dest: Peer, port: int) -> bool:
    if not rule_ports:
        return True
    for entry in rule_ports:
        if entry.get("protocol", "TCP") != "TCP":
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        number = dest.ports.get(wanted) if isinstance(wanted, str) else wanted
        if number is not None and number <= port <= entry.get("endPort", number):
            return True
    return False


def admits(policies: Iterable[Mapping[str, Any]], source: Peer, dest: Peer, port: int) -> bool:
    """Whether a TCP connection from `source` to `dest` on `port` is admitted."""
    assert dest.namespace is not None, "a destination is a pod"
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == dest.namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and selector_matches(p["spec"]["podSelector"], dest.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            from_ok = not peers or any(_peer_matches(p, source, policy["metadata"]["namespace"]) for p in peers)
            if from_ok and _port_matches(rule.get("ports"), dest, port):
                return True
    return False


def pod_peers(workloads: Iterable[Workload], subnet: str) -> list[Peer]:
    """One peer per pod-network workload (hostNetwork pods are the node's), addressed from `subnet`."""
    addresses: Iterator[ipaddress.IPv4Address | ipaddress.IPv6Address] = ipaddress.ip_network(subnet).hosts()
    next(addresses)
    found = []
    for workload in workloads:
        if workload.spec.get("hostNetwork"):
            continue
        named = {
            p["name"]: p["containerPort"]
            for c in workload.spec.get("containers", [])
            for p in c.get("ports") or []
            if "name" in p
        }
        found.append(Peer(workload.name, str(next(addresses)), workload.namespace, workload.labels, named))
    return found


def strangers(peers: Iterable[Peer], namespace: str, subnet: str) -> list[Peer]:
    """A copy of every pod, labels and ports alike, in `namespace`, addressed from the top of `subnet`.

    Whoever may create a pod in some other namespace may give it any labels: a
    policy that admits the operator or the Ray pods by their labels alone, from
    any namespace, admits these copies too. The proof tries them, because it
    otherwise only tries pods that exist.
    """
    network = ipaddress.ip_network(subnet)
    return [
        Peer(f"{namespace}/copy of {peer.name}", str(network[-2 - index]), namespace, peer.labels, peer.ports)
        for index, peer in enumerate(p for p in peers if p.namespace is not None)
    ]
