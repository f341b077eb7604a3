"""Which network interfaces the synthesized security groups let talk to which, by EC2's rules.

The semantics of VPC security groups (Amazon VPC User Guide, "Security group rules"):
- an ENI carries one or more groups; traffic leaves it if any of its groups has an egress rule
  that matches, and reaches an ENI if any of that ENI's groups has an ingress rule that matches;
- a rule matches on protocol (`-1`: all), port range (all ports for `-1`), and a peer: a CIDR that
  holds the other end's address, or a group the other end's ENI carries;
- a group whose template gives no `SecurityGroupEgress` keeps EC2's default egress rule (all
  traffic anywhere); giving any inline egress rule replaces it. Standalone
  `AWS::EC2::SecurityGroupEgress` resources add to the group and do not remove the default.
Groups are named by the CloudFormation value that yields their id (tools.template_text.render of the
`Fn::GetAtt`), so an imported or EKS-made group (the cluster security group) is one too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tools.template_text import render


@dataclass(frozen=True)
class Interface:
    """An ENI: what it is, its private address, and the groups (rendered ids) it carries."""

    name: str
    ip: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Rule:
    group: str
    direction: str  # "ingress" or "egress"
    protocol: str
    from_port: int
    to_port: int
    peer_group: str | None
    peer_cidr: str | None


def _rule(group: str, direction: str, props: Mapping[str, Any]) -> Rule:
    protocol = str(props["IpProtocol"])
    everything = protocol == "-1"
    peer = props.get("SourceSecurityGroupId") if direction == "ingress" else props.get("DestinationSecurityGroupId")
    return Rule(
        group=group,
        direction=direction,
        protocol=protocol,
        from_port=0 if everything else int(props.get("FromPort", 0)),
        to_port=65535 if everything else int(props.get("ToPort", 65535)),
        peer_group=render(peer) if peer is not None else None,
        peer_cidr=props.get("CidrIp"),
    )


def group_id(logical_id: str) -> str:
    """The rendered id of a group the template makes."""
    return render({"Fn::GetAtt": [logical_id, "GroupId"]})


def rules_of(template: Mapping[str, Any]) -> tuple[list[Rule], set[str]]:
    """Every ingress and egress rule, and the groups that keep EC2's default allow-all egress."""
    rules: list[Rule] = []
    default_egress: set[str] = set()
    for logical_id, resource in template["Resources"].items():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::EC2::SecurityGroup":
            own = group_id(logical_id)
            rules += [_rule(own, "ingress", r) for r in props.get("SecurityGroupIngress", [])]
            if "SecurityGroupEgress" in props:
                rules += [_rule(own, "egress", r) for r in props["SecurityGroupEgress"]]
            else:
                default_egress.add(own)
        elif resource["Type"] == "AWS::EC2::SecurityGroupIngress":
            rules.append(_rule(render(props["GroupId"]), "ingress", props))
        elif resource["Type"] == "AWS::EC2::SecurityGroupEgress":
            rules.append(_rule(render(props["GroupId"]), "egress", props))
    return rules, default_egress


def _matches(rule: Rule, other: Interface, port: int) -> bool:
    if rule.protocol not in ("-1", "tcp", "6") or not rule.from_port <= port <= rule.to_port:
        return False
    if rule.peer_group is not None:
        return rule.peer_group in other.groups
    return rule.peer_cidr is not None and ipaddress.ip_address(other.ip) in ipaddress.ip_network(rule.peer_cidr)


def connects(template: Mapping[str, Any], source: Interface, dest: Interface, port: int) -> bool:
    """Whether a TCP connection from `source` to `dest` on `port` passes both ends' groups."""
    rules, default_egress = rules_of(template)
    leaves = any(g in default_egress for g in source.groups) or any(
        r.direction == "egress" and r.group in source.groups and _matches(r, dest, port) for r in rules
    )
    return leaves and arrives(template, source, dest, port)


def arrives(template: Mapping[str, Any], source: Interface, dest: Interface, port: int) -> bool:
    """Whether `dest`'s groups admit a TCP connection from `source` on `port` (the source's egress aside: an
    EKS-made group, such as the cluster security group, has EKS's allow-all egress outside the template)."""
    rules, _ = rules_of(template)
    return any(r.direction == "ingress" and r.group in dest.groups and _matches(r, source, port) for r in rules)


def ingress_rules_from(template: Mapping[str, Any], group: str) -> list[Rule]:
    """Every ingress rule that names `group` as its peer."""
    return [r for r in rules_of(template)[0] if r.direction == "ingress" and r.peer_group == group]


def nodegroup_groups(template: Mapping[str, Any], cluster_security_group: str) -> dict[str, tuple[str, ...]]:
    """Each managed node group's node ENI groups: its launch template's (SecurityGroupIds, or the primary
    interface's Groups), else the cluster security group EKS applies (EKS User Guide, managed node
    groups with launch templates). With the VPC CNI, pods share their node's ENIs and so its groups."""
    found = {}
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] != "AWS::EKS::Nodegroup":
            continue
        data: Mapping[str, Any] = {}
        launch = resource["Properties"].get("LaunchTemplate")
        if launch is not None:
            data = template["Resources"][launch["Id"]["Ref"]]["Properties"]["LaunchTemplateData"]
        listed: Sequence[Any] = data.get("SecurityGroupIds") or next(
            (n["Groups"] for n in data.get("NetworkInterfaces", []) if n.get("DeviceIndex") == 0), []
        )
        found[logical_id] = tuple(render(g) for g in listed) or (cluster_security_group,)
    return found


def groups_named(values: Iterable[Any]) -> tuple[str, ...]:
    return tuple(render(v) for v in values)
