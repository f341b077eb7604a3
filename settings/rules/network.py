"""The account, the region, the VPC and the cluster's control plane."""

from __future__ import annotations

import importlib.util
import re

from settings import catalog
from settings.model import ENDPOINT_ACCESS_MODES, Settings
from settings.rules.base import ipv4_network, require

_AWS_ACCOUNT = re.compile(r"^\d{12}$")
_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8}([0-9a-f]{9})?$")
_IAM_PRINCIPAL = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")
# What `aws sts get-caller-identity` prints for a role's session: the role's name without its path.
_ASSUMED_ROLE_SESSION = re.compile(r"^arn:aws[a-z-]*:sts::\d{12}:assumed-role/[^/]+/.+$")
_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9\-_]{0,99}$")


def check_network(s: Settings) -> None:
    """Region and account, the VPC, the cluster's name, version, endpoint and admins."""
    regions = sorted(catalog.REGION_AZS)
    require(s.region is None or s.region in catalog.REGION_AZS, "region", s.region, f"one of {regions}")
    require(s.account is None or bool(_AWS_ACCOUNT.match(s.account)), "account", s.account, "12 digits")

    require(s.vpc_id is None or bool(_VPC_ID.match(s.vpc_id)), "vpc_id", s.vpc_id, "vpc- and 8 or 17 hex digits")
    require(
        s.vpc_id is None or (s.account is not None and s.effective_region is not None),
        "vpc_id",
        s.vpc_id,
        "looking up an existing VPC needs 'account' and 'region' set too",
    )
    network = ipv4_network(s.vpc_cidr)
    require(
        network is not None and 16 <= network.prefixlen <= 20,
        "vpc_cidr",
        s.vpc_cidr,
        "an IPv4 network from /16 to /20, e.g. 10.0.0.0/16",
    )
    require(2 <= s.max_azs <= 3, "max_azs", s.max_azs, "2 or 3 (EKS needs two AZs)")

    require(bool(_CLUSTER_NAME.match(s.cluster_name)), "cluster_name", s.cluster_name, "1-100 letters, digits, - or _")
    versions = list(catalog.KUBERNETES_VERSIONS)
    require(
        s.kubernetes_version in catalog.KUBERNETES_VERSIONS,
        "kubernetes_version",
        s.kubernetes_version,
        f"a version EKS still creates clusters on: {versions}",
    )
    layer_module = catalog.KUBERNETES_VERSIONS[s.kubernetes_version]
    require(
        importlib.util.find_spec(layer_module) is not None,
        "kubernetes_version",
        s.kubernetes_version,
        f"its kubectl layer is not installed: pip install {catalog.layer_package(s.kubernetes_version)}",
    )
    require(
        s.endpoint_access in ENDPOINT_ACCESS_MODES,
        "endpoint_access",
        s.endpoint_access,
        f"one of {list(ENDPOINT_ACCESS_MODES)}",
    )
    for cidr in s.public_access_cidrs:
        require(
            ipv4_network(cidr) is not None,
            "public_access_cidrs",
            cidr,
            "IPv4 networks, e.g. 203.0.113.0/24 (your office or VPN egress)",
        )
    require(
        not (s.public_access_cidrs and s.endpoint_access == "private"),
        "public_access_cidrs",
        list(s.public_access_cidrs),
        "empty when endpoint_access is 'private' (there is no public endpoint to restrict)",
    )
    for arn in s.cluster_admin_arns:
        # Converted offline it would lose the role's path (SSO roles have one), and EKS would refuse the entry.
        require(
            not _ASSUMED_ROLE_SESSION.match(arn),
            "cluster_admin_arns",
            arn,
            "an IAM role ARN, not the assumed-role session ARN `aws sts get-caller-identity` prints: leave it out "
            "and run `make preflight`, whose cluster admin line looks the role up in IAM and prints the "
            "-c cluster_admin_arns=... to use",
        )
        require(
            bool(_IAM_PRINCIPAL.match(arn)),
            "cluster_admin_arns",
            arn,
            "IAM role or user ARNs, arn:aws:iam::<account>:role/<name>",
        )
