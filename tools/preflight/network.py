"""Network checks: an existing VPC's private subnets, or room in the region for a new VPC."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from settings import catalog
from tools.preflight.base import Account, Result, Status, error_code, pages, quota_value


def _egress_route_tables(tables: list[dict[str, Any]]) -> tuple[set[str], set[str], str | None]:
    """(route tables with a default route through NAT or a gateway other than an IGW, IGW tables, the main table)."""
    private, public, main = set(), set(), None
    for table in tables:
        if any(a.get("Main") for a in table.get("Associations", [])):
            main = table["RouteTableId"]
        for route in table.get("Routes", []):
            if route.get("DestinationCidrBlock") != "0.0.0.0/0":
                continue
            if route.get("GatewayId", "").startswith("igw-"):
                public.add(table["RouteTableId"])
            elif route.get("NatGatewayId") or route.get("TransitGatewayId") or route.get("NetworkInterfaceId"):
                private.add(table["RouteTableId"])
    return private, public, main


def existing_vpc(account: Account) -> list[Result]:
    settings = account.settings
    vpc_id = settings.vpc_id
    if vpc_id is None:
        return []
    ec2 = account.client("ec2")
    try:
        ec2.describe_vpcs(VpcIds=[vpc_id])
    except ClientError as err:
        if error_code(err) == "InvalidVpcID.NotFound":
            missing = f"{vpc_id} does not exist in {account.region}"
            return [Result("FAIL", "existing VPC", missing, "-c vpc_id=<a VPC id>")]
        raise
    where = [{"Name": "vpc-id", "Values": [vpc_id]}]
    subnets = list(pages(ec2, "describe_subnets", "Subnets", Filters=where))
    tables = list(pages(ec2, "describe_route_tables", "RouteTables", Filters=where))
    private_tables, _, main = _egress_route_tables(tables)
    table_of = {a["SubnetId"]: t["RouteTableId"] for t in tables for a in t.get("Associations", []) if "SubnetId" in a}
    private = [s for s in subnets if table_of.get(s["SubnetId"], main) in private_tables]
    azs = sorted({s["AvailabilityZone"] for s in private})
    account.private_subnet_azs = azs
    if len(azs) < 2:
        return [
            Result(
                "FAIL",
                "existing VPC",
                f"{vpc_id}: private subnets with NAT egress in {len(azs)} AZ(s) {azs}; EKS needs two or more",
                "add private subnets with a NAT route in a second AZ, or leave vpc_id unset for a new VPC",
            )
        ]
    tag = "kubernetes.io/role/internal-elb"
    untagged = sorted(s["SubnetId"] for s in private if {"Key": tag, "Value": "1"} not in s.get("Tags", []))
    if untagged:
        needed = bool(settings.internal_endpoint_cidrs)
        return [
            Result(
                "FAIL" if needed else "WARN",
                "existing VPC",
                f"{vpc_id}: private subnets without {tag}=1: {untagged}"
                + ("; the internal NLB finds its subnets by that tag" if needed else ""),
                f"aws ec2 create-tags --resources {' '.join(untagged)} --tags Key={tag},Value=1",
            )
        ]
    return [Result("PASS", "existing VPC", f"{vpc_id}: private subnets with NAT egress in {azs}, tagged")]


def vpc_room(account: Account) -> list[Result]:
    """A new VPC takes one VPC, one internet gateway, and a NAT gateway with an Elastic IP per AZ."""
    settings = account.settings
    if settings.vpc_id is not None or account.deployed:
        return []
    ec2 = account.client("ec2")
    nats = settings.max_azs
    results = []
    for quota, used, need in (
        (catalog.VPCS, len(list(pages(ec2, "describe_vpcs", "Vpcs"))), 1),
        (catalog.INTERNET_GATEWAYS, len(list(pages(ec2, "describe_internet_gateways", "InternetGateways"))), 1),
        (catalog.ELASTIC_IPS, len(ec2.describe_addresses()["Addresses"]), nats),
    ):
        limit = int(quota_value(account, quota))
        fix = (
            f"aws service-quotas request-service-quota-increase --service-code {quota.service} "
            f"--quota-code {quota.code} --desired-value {used + need}"
        )
        status: Status = "PASS" if used + need <= limit else "FAIL"
        detail = f"{quota.name} ({quota.code}): {used} of {limit} in use; the new VPC needs {need}"
        results.append(Result(status, quota.label, detail, fix if status == "FAIL" else ""))
    live = [{"Name": "state", "Values": ["pending", "available"]}]
    gateways = list(pages(ec2, "describe_nat_gateways", "NatGateways", Filters=live))
    # A regional NAT gateway (AvailabilityMode regional) has no subnet and spans the VPC's AZs.
    # Whether it counts against the per-AZ quota is not in the quota table: it is not counted, but said.
    busy = [n["SubnetId"] for n in gateways if n.get("SubnetId")]
    regional = len(gateways) - len(busy)
    also = f"; {regional} regional NAT gateway(s) not counted per AZ" if regional else ""
    per_az: dict[str, int] = {}
    if busy:
        for subnet in pages(ec2, "describe_subnets", "Subnets", SubnetIds=sorted(set(busy))):
            az = subnet["AvailabilityZone"]
            per_az[az] = per_az.get(az, 0) + busy.count(subnet["SubnetId"])
    limit = int(quota_value(account, catalog.NAT_GATEWAYS_PER_AZ))
    full = sorted(az for az, n in per_az.items() if n + 1 > limit)
    quota = catalog.NAT_GATEWAYS_PER_AZ
    if full:
        results.append(
            Result(
                "FAIL" if account.chosen_az in full or settings.gpu_availability_zone in full else "WARN",
                quota.label,
                f"{limit} per AZ already used in {full}; the new VPC adds one NAT gateway in each of its AZs{also}",
                f"aws service-quotas request-service-quota-increase --service-code vpc --quota-code {quota.code} "
                f"--desired-value {limit + 1}",
            )
        )
    else:
        results.append(
            Result(
                "PASS", quota.label, f"{quota.name} ({quota.code}): room for one more in every AZ (limit {limit}){also}"
            )
        )
    return results
