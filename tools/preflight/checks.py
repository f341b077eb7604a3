"""The account checks: read-only AWS calls, one Result per line of the table.

Every check reads the same Settings `cdk synth` reads. A check that cannot run
because the caller may not make a call warns (naming the IAM action) instead of
failing: the deploy may still work, but nobody checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, Protocol

from botocore.exceptions import ClientError

from settings import Settings, catalog

Status = Literal["PASS", "WARN", "FAIL"]
STACK_NAME = "PdInference"
# The CLI's own bootstrap template: `cdk bootstrap` with the pinned CLI installs this version.
CLI_BOOTSTRAP_TEMPLATE = (
    Path(__file__).resolve().parents[2] / "node_modules/aws-cdk/lib/api/bootstrap/bootstrap-template.yaml"
)
_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess"}
_README_ADMIN_WARNING = (
    "the cluster is created by CloudFormation's role: without an access entry for you, "
    "kubectl and make verify are refused"
)


@dataclass(frozen=True)
class Result:
    """One line of the table; a FAIL carries the one command or setting that fixes it."""

    status: Status
    check: str
    detail: str
    fix: str = ""


class Session(Protocol):
    """What preflight needs of a boto3 Session."""

    region_name: str | None

    def client(self, service_name: str, region_name: str | None = None) -> Any: ...


class CannotCheckError(Exception):
    """Nothing can be checked (no credentials, no region): one line, then exit."""


@dataclass
class Account:
    """What the checks learn as they go, for the checks after them."""

    settings: Settings
    session: Session
    region: str = ""
    region_from_settings: bool = True
    account_id: str = ""
    caller_arn: str = ""
    deployed_az: str | None = None
    deployed: bool = False
    gpu_vcpus: int = 0
    system_vcpus: int = 0
    reservation_az: str | None = None
    private_subnet_azs: list[str] = field(default_factory=list)
    chosen_az: str | None = None

    def client(self, service: str) -> Any:
        return self.session.client(service, region_name=self.region)


def error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def guarded(name: str, check: Callable[[Account], list[Result]]) -> Callable[[Account], list[Result]]:
    """Run a check; an IAM denial becomes a WARN naming the action, another AWS error a FAIL."""

    def run(account: Account) -> list[Result]:
        try:
            return check(account)
        except ClientError as err:
            operation = err.operation_name
            if error_code(err) in _DENIED:
                denied = f"not checked: {operation} was denied"
                return [Result("WARN", name, denied, "attach tools/preflight/iam-policy.json")]
            message = str(err.response.get("Error", {}).get("Message", err)).splitlines()[0]
            return [Result("FAIL", name, f"{operation}: {error_code(err)}: {message}")]

    return run


def pages(client: Any, operation: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
    for page in client.get_paginator(operation).paginate(**params):
        yield from page.get(key, [])


# --- credentials and region ------------------------------------------------------
def identity(account: Account) -> list[Result]:
    """Who is calling, in which account and region. Raises CannotCheckError without credentials."""
    from botocore.exceptions import NoCredentialsError, NoRegionError, PartialCredentialsError

    settings = account.settings
    account.region = settings.effective_region or account.session.region_name or ""
    account.region_from_settings = settings.effective_region is not None
    if not account.region:
        raise CannotCheckError(
            "no AWS region: set AWS_REGION (the CDK CLI reads it too) or a profile's region, or -c region=<region>"
        )
    try:
        caller = account.client("sts").get_caller_identity()
    except (NoCredentialsError, PartialCredentialsError):
        raise CannotCheckError(
            "no AWS credentials found: set AWS_PROFILE or run `aws configure` / `aws sso login`"
        ) from None
    except NoRegionError:
        raise CannotCheckError("no AWS region: set AWS_REGION or -c region=<region>") from None
    except ClientError as err:
        raise CannotCheckError(f"the AWS credentials were refused: {error_code(err)}") from None
    account.account_id, account.caller_arn = caller["Account"], caller["Arn"]
    results = []
    if settings.account and settings.account != account.account_id:
        results.append(
            Result(
                "FAIL",
                "credentials",
                f"{account.caller_arn} is in account {account.account_id}, the settings name {settings.account}",
                f"use credentials for {settings.account}, or -c account={account.account_id}",
            )
        )
    else:
        results.append(Result("PASS", "credentials", f"{account.caller_arn} (account {account.account_id})"))
    if account.region_from_settings:
        results.append(Result("PASS", "region", f"{account.region} (from the settings)"))
    else:
        results.append(
            Result(
                "WARN",
                "region",
                f"{account.region} comes from your AWS profile, not the settings: another shell may deploy elsewhere",
                "python -m tools.preflight --write-context (records it in cdk.context.json)",
            )
        )
    return results


def cli_bootstrap_version(template: Path = CLI_BOOTSTRAP_TEMPLATE) -> int | None:
    """The bootstrap version the pinned CLI's `cdk bootstrap` installs (its template's CdkBootstrapVersion)."""
    if not template.exists():
        return None
    text = template.read_text(encoding="utf-8")
    block = text[text.index("  CdkBootstrapVersion:") :]
    found = re.search(r"Value: '(\d+)'", block)
    return int(found.group(1)) if found else None


def bootstrap(account: Account) -> list[Result]:
    """The version the template's CheckBootstrapVersion rule reads from SSM."""
    fix = f"npx cdk bootstrap aws://{account.account_id}/{account.region}"
    parameter = f"/cdk-bootstrap/{catalog.CDK_BOOTSTRAP_QUALIFIER}/version"
    try:
        value = account.client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"]
    except ClientError as err:
        if error_code(err) == "ParameterNotFound":
            return [Result("FAIL", "CDK bootstrap", f"{account.region} is not bootstrapped ({parameter} missing)", fix)]
        raise
    version = int(value)
    needed = catalog.CDK_BOOTSTRAP_MIN_VERSION
    if account.settings.vpc_id is not None:
        needed = catalog.CDK_BOOTSTRAP_LOOKUP_MIN_VERSION
    if version < needed:
        return [Result("FAIL", "CDK bootstrap", f"version {version}; this stack needs {needed} or later", fix)]
    current = cli_bootstrap_version()
    if current is not None and version < current:
        return [
            Result(
                "WARN",
                "CDK bootstrap",
                f"version {version} works, but the pinned CLI installs {current}; its fixes are not in this account",
                fix,
            )
        ]
    return [Result("PASS", "CDK bootstrap", f"version {version} (needs {needed})")]


def deployed_stack(account: Account) -> list[Result]:
    """Whether this stack is already deployed here, and in which GPU AZ: no line of its own."""
    try:
        stacks = account.client("cloudformation").describe_stacks(StackName=STACK_NAME)["Stacks"]
    except ClientError as err:
        if error_code(err) == "ValidationError":
            return []
        raise
    account.deployed = True
    outputs = {o["OutputKey"]: o.get("OutputValue") for o in stacks[0].get("Outputs", [])}
    account.deployed_az = outputs.get("GpuNodeAvailabilityZone")
    return []


# --- EKS and instance types ----------------------------------------------------------
def kubernetes_version(account: Account) -> list[Result]:
    wanted = account.settings.kubernetes_version
    versions = account.client("eks").describe_cluster_versions(clusterVersions=[wanted])["clusterVersions"]
    found = [v for v in versions if v.get("clusterVersion") == wanted]
    status = found[0].get("versionStatus") if found else None
    offered = sorted(catalog.KUBERNETES_VERSIONS)
    if status == "STANDARD_SUPPORT":
        return [Result("PASS", "Kubernetes version", f"{wanted}: standard support in {account.region}")]
    if status == "EXTENDED_SUPPORT":
        end = found[0].get("endOfExtendedSupportDate")
        return [
            Result(
                "WARN",
                "Kubernetes version",
                f"{wanted} is in extended support (a higher hourly control-plane price) until {end:%Y-%m-%d}"
                if end
                else f"{wanted} is in extended support (a higher hourly control-plane price)",
                f"-c kubernetes_version={offered[-1]}",
            )
        ]
    return [
        Result(
            "FAIL",
            "Kubernetes version",
            f"EKS does not create {wanted} clusters in {account.region}",
            f"-c kubernetes_version={offered[-1]}",
        )
    ]


def efa(account: Account) -> list[Result]:
    settings = account.settings
    gpu_type, system_type = settings.gpu_instance_type, settings.system_instance_type
    described = {
        t["InstanceType"]: t
        for t in account.client("ec2").describe_instance_types(InstanceTypes=sorted({gpu_type, system_type}))[
            "InstanceTypes"
        ]
    }
    gpu, system = described.get(gpu_type), described.get(system_type)
    if gpu is None or system is None:
        missing = gpu_type if gpu is None else system_type
        return [Result("FAIL", "EFA", f"{missing} is not an instance type in {account.region}")]
    account.gpu_vcpus = gpu["VCpuInfo"]["DefaultVCpus"]
    account.system_vcpus = system["VCpuInfo"]["DefaultVCpus"]
    network = gpu.get("NetworkInfo", {})
    interfaces = network.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0)
    cards = network.get("MaximumNetworkCards", 1)
    if not network.get("EfaSupported"):
        efa_types = sorted(k for k, v in catalog.INSTANCE_TYPES.items() if v.gpus == 1 and v.efa_interfaces)
        return [Result("FAIL", "EFA", f"{gpu_type} does not support EFA", f"-c gpu_instance_type= one of {efa_types}")]
    spec = catalog.INSTANCE_TYPES[gpu_type]
    detail = f"{gpu_type}: EFA supported, {interfaces} EFA interface(s), {cards} network card(s); the stack attaches 1"
    # The instance store decides the NVMe RAID0 and the model cache (settings/catalog.py instance_store_gb).
    store = gpu.get("InstanceStorageInfo", {}).get("TotalSizeInGB", 0) if gpu.get("InstanceStorageSupported") else 0
    ours = (spec.efa_interfaces, spec.vcpus, spec.instance_store_gb)
    theirs = (interfaces, account.gpu_vcpus, store)
    if ours != theirs:
        return [
            Result(
                "WARN",
                "EFA",
                f"{detail}; settings/catalog.py says {ours[0]} interface(s), {ours[1]} vCPUs, {ours[2]} GB "
                f"instance store; EC2 says {theirs[0]}, {theirs[1]}, {theirs[2]}",
                "correct INSTANCE_TYPES in settings/catalog.py",
            )
        ]
    return [Result("PASS", "EFA", detail)]


def capacity_reservation(account: Account) -> list[Result]:
    settings = account.settings
    reservation_id = settings.gpu_capacity_reservation_id
    if reservation_id is None:
        return []
    try:
        found = account.client("ec2").describe_capacity_reservations(CapacityReservationIds=[reservation_id])
    except ClientError as err:
        if error_code(err).startswith("InvalidCapacityReservationId"):
            return [Result("FAIL", "capacity reservation", f"{reservation_id} does not exist in {account.region}")]
        raise
    r = found["CapacityReservations"][0]
    account.reservation_az = r["AvailabilityZone"]
    wanted_az = settings.gpu_availability_zone or r["AvailabilityZone"]
    problems = []
    if r["State"] != "active":
        problems.append(f"state {r['State']}")
    if r["InstanceType"] != settings.gpu_instance_type:
        problems.append(f"type {r['InstanceType']}, not {settings.gpu_instance_type}")
    if r["AvailabilityZone"] != wanted_az:
        problems.append(f"AZ {r['AvailabilityZone']}, not gpu_availability_zone {wanted_az}")
    if r.get("Tenancy", "default") != "default":
        problems.append(f"tenancy {r['Tenancy']} (the node group launches default tenancy)")
    if r["AvailableInstanceCount"] < settings.gpu_nodes:
        problems.append(f"{r['AvailableInstanceCount']} available of the {settings.gpu_nodes} the GPU nodes need")
    if problems:
        return [
            Result(
                "FAIL",
                "capacity reservation",
                f"{reservation_id}: " + "; ".join(problems),
                "fix the reservation, or -c gpu_capacity_reservation_id=none",
            )
        ]
    detail = f"{reservation_id}: active, {r['AvailableInstanceCount']} x {r['InstanceType']} in {r['AvailabilityZone']}"
    end = r.get("EndDate")
    if end is not None and end - datetime.now(UTC) < timedelta(days=7):
        return [Result("WARN", "capacity reservation", f"{detail}; it ends {end:%Y-%m-%d %H:%M} UTC")]
    return [Result("PASS", "capacity reservation", detail)]


# --- network ------------------------------------------------------------------------
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


def _offerings(account: Account, instance_types: list[str]) -> dict[str, set[str]]:
    """Instance type -> the AZs of the region that offer it."""
    found: dict[str, set[str]] = {t: set() for t in instance_types}
    for offer in pages(
        account.client("ec2"),
        "describe_instance_type_offerings",
        "InstanceTypeOfferings",
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": instance_types}],
    ):
        found[offer["InstanceType"]].add(offer["Location"])
    return found


def gpu_zone(account: Account) -> list[Result]:
    """The GPU AZ offers the GPU type and the VPC's AZs offer the system type; with none chosen, pick one."""
    settings = account.settings
    gpu_type, system_type = settings.gpu_instance_type, settings.system_instance_type
    offers = _offerings(account, sorted({gpu_type, system_type}))
    zones = [
        z["ZoneName"]
        for z in account.client("ec2").describe_availability_zones(
            Filters=[{"Name": "state", "Values": ["available"]}]
        )["AvailabilityZones"]
        if z.get("ZoneType", "availability-zone") == "availability-zone"
    ]

    def vpc_azs(gpu_az: str) -> list[str]:
        if settings.vpc_id is not None:
            return account.private_subnet_azs
        return replace(settings, gpu_availability_zone=gpu_az).new_vpc_availability_zones or []

    def works(gpu_az: str) -> bool:
        if gpu_az not in offers[gpu_type]:
            return False
        if settings.vpc_id is not None:
            return gpu_az in account.private_subnet_azs
        azs = vpc_azs(gpu_az)
        return all(z in zones and z in offers[system_type] for z in azs)

    good = [z for z in zones if works(z)]
    both = sorted(offers[gpu_type] & offers[system_type])
    name = "GPU availability zone"
    if settings.gpu_availability_zone is not None:
        az = settings.gpu_availability_zone
        if az not in offers[gpu_type]:
            return [
                Result(
                    "FAIL",
                    name,
                    f"{az} does not offer {gpu_type}; AZs that offer it with {system_type}: {both}",
                    f"-c gpu_availability_zone={good[0]}" if good else "-c gpu_instance_type=<another type>",
                )
            ]
        if not works(az):
            return [
                Result(
                    "FAIL",
                    name,
                    f"{az} offers {gpu_type}, but the VPC's AZs {vpc_azs(az)} do not all offer {system_type}"
                    + (" or hold private subnets" if settings.vpc_id else ""),
                    f"-c gpu_availability_zone={good[0]}" if good else "-c system_instance_type=<another type>",
                )
            ]
        account.chosen_az = az
        return [Result("PASS", name, f"{az} offers {gpu_type}; the VPC's AZs {vpc_azs(az)} offer {system_type}")]
    # None chosen: keep what is deployed, else a reservation's AZ, else the first that works.
    preferred = [z for z in (account.deployed_az, account.reservation_az) if z]
    pick = next((z for z in [*preferred, *good] if works(z)), None)
    if pick is None:
        return [
            Result(
                "FAIL",
                name,
                f"no AZ of {account.region} offers {gpu_type} with {system_type} in the VPC's other AZs",
                "choose another region (-c region=...) or -c gpu_instance_type=<another type>",
            )
        ]
    account.chosen_az = pick
    if settings.vpc_id is not None:
        default = account.private_subnet_azs[0] if account.private_subnet_azs else "?"
    else:
        default = zones[0] if zones else "?"
    if account.deployed_az:
        default = account.deployed_az
    record = "python -m tools.preflight --write-context"
    if default not in offers[gpu_type]:
        return [
            Result(
                "FAIL",
                name,
                f"none chosen: the stack would use {default}, which does not offer {gpu_type}; "
                f"{pick} does (AZs offering both types: {both})",
                record,
            )
        ]
    return [
        Result(
            "WARN",
            name,
            f"none chosen: the stack would use {default}; picked {pick} (AZs offering both types: {both})",
            f"{record} (records {pick} in cdk.context.json)",
        )
    ]


# --- quotas ---------------------------------------------------------------------
def quota_value(account: Account, quota: catalog.Quota) -> float:
    client = account.client("service-quotas")
    try:
        return float(client.get_service_quota(ServiceCode=quota.service, QuotaCode=quota.code)["Quota"]["Value"])
    except ClientError as err:
        # A quota never adjusted in this account may have no applied value.
        if error_code(err) != "NoSuchResourceException":
            raise
    default = client.get_aws_default_service_quota(ServiceCode=quota.service, QuotaCode=quota.code)
    return float(default["Quota"]["Value"])


def _family(instance_type: str) -> str:
    found = re.match(r"[a-z]+", instance_type)
    return found.group(0) if found else ""


def is_gvt(instance_type: str) -> bool:
    """Counted by "Running On-Demand G and VT instances" (g4dn, g6, gr6, vt1, ...)."""
    return _family(instance_type).startswith(("g", "vt"))


def is_standard(instance_type: str) -> bool:
    """Counted by "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"."""
    family = _family(instance_type)
    return family[:1] in set("acdhimrtz") and not family.startswith(("inf", "dl", "mac", "hpc", "trn"))


def running_vcpus(account: Account) -> tuple[int, int]:
    """(G and VT vCPUs, standard vCPUs) of the region's pending and running On-Demand instances."""
    gvt = standard = 0
    for reservation in pages(
        account.client("ec2"),
        "describe_instances",
        "Reservations",
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}],
    ):
        for instance in reservation["Instances"]:
            if instance.get("InstanceLifecycle") == "spot":
                continue
            cpu = instance.get("CpuOptions", {})
            vcpus = cpu.get("CoreCount", 0) * cpu.get("ThreadsPerCore", 1)
            if is_gvt(instance["InstanceType"]):
                gvt += vcpus
            elif is_standard(instance["InstanceType"]):
                standard += vcpus
    return gvt, standard


def _quota_line(
    account: Account, quota: catalog.Quota, used: int, nodes: int, surge: int, vcpus: int, what: str
) -> Result:
    limit = int(quota_value(account, quota))
    free = limit - used
    create = 0 if account.deployed else nodes * vcpus
    update = surge * vcpus
    detail = (
        f"{quota.name} ({quota.code}): {limit} vCPUs, {used} in use; {what} need {create}"
        + (" more (already deployed)" if account.deployed else "")
        + f", and an update {update} more"
    )
    ask = (
        f"aws service-quotas request-service-quota-increase --service-code {quota.service} "
        f"--quota-code {quota.code} --desired-value {used + create + update} --region {account.region}"
    )
    if create > free:
        return Result("FAIL", quota.label, detail, ask)
    if create + update > free:
        return Result("WARN", quota.label, detail + " (a node group update would stall)", ask)
    return Result("PASS", quota.label, detail)


def vcpu_quotas(account: Account) -> list[Result]:
    settings = account.settings
    if not account.gpu_vcpus:
        return []  # the EFA check could not describe the types; it has said so
    gvt, standard = running_vcpus(account)
    surge = catalog.NODE_UPDATE_SURGE_PER_AZ
    system_azs = settings.max_azs if settings.vpc_id is None else max(2, len(account.private_subnet_azs))
    return [
        _quota_line(account, catalog.GVT_VCPUS, gvt, settings.gpu_nodes, surge, account.gpu_vcpus, "the GPU nodes"),
        _quota_line(
            account,
            catalog.STANDARD_VCPUS,
            standard,
            settings.system_nodes_desired,
            surge * system_azs,
            account.system_vcpus,
            "the system nodes",
        ),
    ]


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
    busy = [n["SubnetId"] for n in pages(ec2, "describe_nat_gateways", "NatGateways", Filters=live)]
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
                f"{limit} per AZ already used in {full}; the new VPC adds one NAT gateway in each of its AZs",
                f"aws service-quotas request-service-quota-increase --service-code vpc --quota-code {quota.code} "
                f"--desired-value {limit + 1}",
            )
        )
    else:
        results.append(
            Result("PASS", quota.label, f"{quota.name} ({quota.code}): room for one more in every AZ (limit {limit})")
        )
    return results


# --- the model token ---------------------------------------------------------------
def token_secret(account: Account) -> list[Result]:
    settings = account.settings
    name = settings.hf_token_secret_name
    if name is None:
        return []
    try:
        secret = account.client("secretsmanager").describe_secret(SecretId=name)
    except ClientError as err:
        if error_code(err) == "ResourceNotFoundException":
            return [
                Result(
                    "FAIL",
                    "token secret",
                    f"no secret {name!r} in {account.region}",
                    f"aws secretsmanager create-secret --name {name} --secret-string file://token.txt "
                    f"--region {account.region}",
                )
            ]
        raise
    if secret.get("DeletedDate"):
        restore = f"aws secretsmanager restore-secret --secret-id {name}"
        return [Result("FAIL", "token secret", f"{name!r} is scheduled for deletion", restore)]
    if not any("AWSCURRENT" in stages for stages in secret.get("VersionIdsToStages", {}).values()):
        return [
            Result(
                "FAIL",
                "token secret",
                f"{name!r} has no current value",
                f"aws secretsmanager put-secret-value --secret-id {name} --secret-string file://token.txt",
            )
        ]
    results = [Result("PASS", "token secret", f"{name!r} exists with a current value")]
    key = secret.get("KmsKeyId")
    if not key:
        results.append(Result("PASS", "token secret key", "Secrets Manager's AWS managed key: no grant needed"))
        return results
    results.extend(guarded("token secret key", lambda a: _token_key(a, key))(account))
    return results


def _token_key(account: Account, key: str) -> list[Result]:
    metadata = account.client("kms").describe_key(KeyId=key)["KeyMetadata"]
    if metadata.get("KeyManager") == "AWS":
        return [Result("PASS", "token secret key", f"{metadata['Arn']} is AWS managed: no grant needed")]
    configured = account.settings.hf_token_kms_key_arn
    if configured == metadata["Arn"]:
        return [Result("PASS", "token secret key", f"{metadata['Arn']}: the External Secrets role may decrypt with it")]
    if configured is None:
        return [
            Result(
                "WARN",
                "token secret key",
                f"the secret is encrypted with the customer-managed key {metadata['Arn']}; without kms:Decrypt "
                "the External Secrets role cannot read it and the model token never reaches the pods",
                f"-c hf_token_kms_key_arn={metadata['Arn']} "
                "(the key policy must also let this account's IAM policies grant it)",
            )
        ]
    return [
        Result(
            "FAIL",
            "token secret key",
            f"hf_token_kms_key_arn is {configured}, but the secret is encrypted with {metadata['Arn']}",
            f"-c hf_token_kms_key_arn={metadata['Arn']}",
        )
    ]


# --- cluster access ----------------------------------------------------------------
_ASSUMED = re.compile(r"^arn:(aws[a-z-]*):sts::(\d{12}):assumed-role/([^/]+)/")


def _role_name(arn: str) -> str | None:
    """The role name of an IAM role ARN, without its path."""
    found = re.match(r"^arn:aws[a-z-]*:iam::\d{12}:role/(?:.*/)?([^/]+)$", arn)
    return found.group(1) if found else None


def cluster_admin(account: Account) -> list[Result]:
    settings = account.settings
    iam = account.client("iam")
    results = []
    for arn in settings.cluster_admin_arns:
        name = _role_name(arn)
        if name is None or f":{account.account_id}:" not in arn:
            continue
        try:
            actual = iam.get_role(RoleName=name)["Role"]["Arn"]
        except ClientError as err:
            if error_code(err) != "NoSuchEntity":
                raise
            return [
                Result(
                    "FAIL",
                    "cluster admin",
                    f"cluster_admin_arns names {arn}, which does not exist: EKS refuses its access entry",
                    "-c cluster_admin_arns=<your role's ARN, path included>",
                )
            ]
        if actual != arn:
            return [
                Result(
                    "FAIL",
                    "cluster admin",
                    f"cluster_admin_arns names {arn}; the role's ARN is {actual} (with its path)",
                    f"-c cluster_admin_arns={actual}",
                )
            ]
    caller = account.caller_arn
    assumed = _ASSUMED.match(caller)
    if assumed:
        caller = iam.get_role(RoleName=assumed.group(3))["Role"]["Arn"]
    if caller in settings.cluster_admin_arns:
        results.append(Result("PASS", "cluster admin", f"{caller} gets cluster admin"))
    else:
        results.append(
            Result(
                "WARN",
                "cluster admin",
                f"{caller} is not in cluster_admin_arns: {_README_ADMIN_WARNING}",
                f"-c cluster_admin_arns={caller}",
            )
        )
    return results


CHECKS: tuple[tuple[str, Callable[[Account], list[Result]]], ...] = (
    ("CDK bootstrap", bootstrap),
    ("deployed stack", deployed_stack),
    ("Kubernetes version", kubernetes_version),
    ("EFA", efa),
    ("capacity reservation", capacity_reservation),
    ("existing VPC", existing_vpc),
    ("GPU availability zone", gpu_zone),
    ("vCPU quotas", vcpu_quotas),
    ("new VPC", vpc_room),
    ("token secret", token_secret),
    ("cluster admin", cluster_admin),
)


def run(settings: Settings, session: Session) -> tuple[Account, list[Result]]:
    """Every check in order. Raises CannotCheckError when nothing can be checked."""
    account = Account(settings=settings, session=session)
    results = identity(account)
    for name, check in CHECKS:
        results.extend(guarded(name, check)(account))
    return account, results
