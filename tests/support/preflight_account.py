"""A fake AWS account that passes every preflight check, and the helpers the preflight tests change it with."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from settings import settings_from_cli
from tests.conftest import ROOT
from tests.support.aws_fakes import Answer, FakeAws, client_error
from tools.preflight.base import Result
from tools.preflight.checks import run

ACCOUNT = "123456789012"


ROLE = f"arn:aws:iam::{ACCOUNT}:role/platform/Deployer"


CALLER = f"arn:aws:sts::{ACCOUNT}:assumed-role/Deployer/alice"


ZONES = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f"]


ZONE_IDS = dict(zip(ZONES, ["use1-az4", "use1-az6", "use1-az1", "use1-az2", "use1-az3", "use1-az5"], strict=True))


OFFERED = {"g6.8xlarge": ["us-east-1b", "us-east-1c"], "m7i.xlarge": ZONES}


CMK = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"


RESERVATION = "cr-0123456789abcdef0"


GOOD = [f"cluster_admin_arns={ROLE}", "gpu_availability_zone=us-east-1b"]


def instance_type(name: str, vcpus: int, efa: bool, store_gb: int = 0) -> dict[str, Any]:
    network: dict[str, Any] = {"EfaSupported": efa, "MaximumNetworkCards": 1}
    if efa:
        network["EfaInfo"] = {"MaximumEfaInterfaces": 1}
    found: dict[str, Any] = {"InstanceType": name, "VCpuInfo": {"DefaultVCpus": vcpus}, "NetworkInfo": network}
    found["InstanceStorageSupported"] = store_gb > 0
    if store_gb:
        found["InstanceStorageInfo"] = {"TotalSizeInGB": store_gb}
    return found


TYPES = {
    "g6.8xlarge": instance_type("g6.8xlarge", 32, True, 900),
    "m7i.xlarge": instance_type("m7i.xlarge", 4, False),
}


QUOTAS = {
    "L-DB2E81BA": 256.0,
    "L-1216C47A": 640.0,
    "L-0263D0A3": 5.0,
    "L-F678F1CE": 5.0,
    "L-A4707A72": 5.0,
    "L-FE5A380F": 5.0,
}


def quotas(**codes: float) -> Answer:
    """GetServiceQuota with QUOTAS, or these values by quota code."""
    values = {**QUOTAS, **{k.replace("_", "-"): v for k, v in codes.items()}}

    def answer(params: dict[str, Any], _: str) -> dict[str, Any]:
        code = params["QuotaCode"]
        return {"Quota": {"ServiceCode": params["ServiceCode"], "QuotaCode": code, "Value": values[code]}}

    return answer


def offerings(**offered: list[str]) -> Answer:
    """DescribeInstanceTypeOfferings with OFFERED, or these AZs by instance type (dots as underscores)."""
    where = {**OFFERED, **{k.replace("_", "."): v for k, v in offered.items()}}

    def answer(params: dict[str, Any], _: str) -> dict[str, Any]:
        return {
            "InstanceTypeOfferings": [
                {"InstanceType": t, "LocationType": "availability-zone", "Location": z}
                for t in params["Filters"][0]["Values"]
                for z in where.get(t, [])
            ]
        }

    return answer


def role(params: dict[str, Any], _: str) -> dict[str, Any]:
    name = params["RoleName"]
    if name != "Deployer":
        return client_error("NoSuchEntity", f"The role with name {name} cannot be found.", 404)
    return {
        "Role": {
            "Path": "/platform/",
            "RoleName": name,
            "RoleId": "AROAEXAMPLEID1234567",
            "Arn": ROLE,
            "CreateDate": datetime(2026, 1, 1, tzinfo=UTC),
        }
    }


def zones(ids: dict[str, str] = ZONE_IDS) -> dict[str, Any]:
    """DescribeAvailabilityZones: these AZ names, with these zone IDs."""
    return {
        "AvailabilityZones": [
            {
                "ZoneName": z,
                "ZoneId": i,
                "State": "available",
                "ZoneType": "availability-zone",
                "RegionName": "us-east-1",
            }
            for z, i in ids.items()
        ]
    }


def default_subnets(azs: list[str] | None = None) -> Answer:
    """DescribeSubnets: the default VPC has a default subnet in these AZs (every AZ, as AWS creates it)."""

    def answer(params: dict[str, Any], _: str) -> dict[str, Any]:
        filters = {f["Name"]: f["Values"] for f in params.get("Filters", [])}
        if filters.get("default-for-az") != ["true"]:
            return {"Subnets": []}
        return {
            "Subnets": [
                {"SubnetId": f"subnet-0d{n:015x}", "AvailabilityZone": z, "DefaultForAz": True}
                for n, z in enumerate(ZONES if azs is None else azs)
            ]
        }

    return answer


def running(*types: tuple[str, int]) -> Answer:
    """DescribeInstances: these (type, vCPUs) are running."""
    instances = [
        {"InstanceId": f"i-{n:017x}", "InstanceType": t, "CpuOptions": {"CoreCount": v // 2, "ThreadsPerCore": 2}}
        for n, (t, v) in enumerate(types)
    ]
    return (
        {"Reservations": [{"ReservationId": "r-0123456789abcdef0", "Instances": instances}]}
        if instances
        else {"Reservations": []}
    )


AMI_IMAGE = "ami-0123456789abcdef0"


def ssm_parameters(published: tuple[str, ...] = ("us-east-1",), bootstrap: str = "33") -> Answer:
    """GetParameter: CDK's bootstrap version, and the public parameter of every EKS optimized AMI release in these
    regions (any release: tests/test_preflight_gpu_ami.py names the one it publishes)."""

    def answer(params: dict[str, Any], region: str) -> dict[str, Any]:
        name = params["Name"]
        if name.startswith("/aws/service/eks/optimized-ami/"):
            if region not in published:
                return client_error("ParameterNotFound", "", 400)
            return {"Parameter": {"Name": name, "Value": AMI_IMAGE}}
        return {"Parameter": {"Name": name, "Value": bootstrap}}

    return answer


def account(**changes: Answer) -> dict[tuple[str, str], Answer]:
    """An account where every check passes; `changes` maps 'service:Operation' to another answer."""
    answers: dict[tuple[str, str], Answer] = {
        ("sts", "GetCallerIdentity"): {"Account": ACCOUNT, "Arn": CALLER, "UserId": "AROAEXAMPLEID1234567:alice"},
        ("ssm", "GetParameter"): ssm_parameters(),
        ("cloudformation", "DescribeStacks"): client_error(
            "ValidationError", "Stack with id PdInference does not exist"
        ),
        ("eks", "DescribeClusterVersions"): lambda p, _: {
            "clusterVersions": [
                {"clusterVersion": v, "versionStatus": "STANDARD_SUPPORT"} for v in p["clusterVersions"]
            ]
        },
        ("ec2", "DescribeInstanceTypes"): lambda p, _: {"InstanceTypes": [TYPES[t] for t in p["InstanceTypes"]]},
        ("ec2", "DescribeInstanceTypeOfferings"): offerings(),
        ("ec2", "DescribeAvailabilityZones"): zones(),
        ("ec2", "DescribeSubnets"): default_subnets(),
        ("ec2", "DescribeInstances"): running(("g5.xlarge", 4), ("m7i.2xlarge", 8), ("inf2.xlarge", 4)),
        ("service-quotas", "GetServiceQuota"): quotas(),
        ("ec2", "DescribeVpcs"): {"Vpcs": [{"VpcId": "vpc-0aaaaaaaaaaaaaaa1"}]},
        ("ec2", "DescribeInternetGateways"): {"InternetGateways": [{"InternetGatewayId": "igw-0aaaaaaaaaaaaaaa1"}]},
        ("ec2", "DescribeAddresses"): {"Addresses": [{"PublicIp": "198.51.100.7"}]},
        ("ec2", "DescribeNatGateways"): {"NatGateways": []},
        ("iam", "GetRole"): role,
    }
    for key, value in changes.items():
        service, operation = key.split(":")
        answers[(service, operation)] = value
    return answers


def check(results: list[Result], name: str) -> Result:
    found = [r for r in results if r.check == name]
    assert len(found) == 1, f"{name}: {[r.check for r in results]}"
    return found[0]


def preflight(answers: dict[tuple[str, str], Answer], *pairs: str, region: str | None = "us-east-1") -> list[Result]:
    settings = settings_from_cli(list(pairs))
    return run(settings, FakeAws(answers, region_name=region))[1]


def status_of(name: str, answers: dict[tuple[str, str], Answer], *pairs: str) -> tuple[str, Result]:
    found = check(preflight(answers, *pairs), name)
    return found.status, found


def deployed_stack(az: str) -> dict[str, Any]:
    return {
        "StackName": "PdInference",
        "CreationTime": datetime(2026, 11, 1, tzinfo=UTC),
        "StackStatus": "UPDATE_COMPLETE",
        "Outputs": [{"OutputKey": "GpuNodeAvailabilityZone", "OutputValue": az}],
    }


GVT = "G and VT vCPUs"


STANDARD = "standard vCPUs"


def reservation(**changes: Any) -> dict[str, Any]:
    r = {
        "CapacityReservationId": RESERVATION,
        "InstanceType": "g6.8xlarge",
        "AvailabilityZone": "us-east-1c",
        "Tenancy": "default",
        "State": "active",
        "TotalInstanceCount": 2,
        "AvailableInstanceCount": 2,
        "InstanceMatchCriteria": "targeted",
        "EndDateType": "unlimited",
    }
    return {"CapacityReservations": [{**r, **changes}]}


RESERVED = [f"cluster_admin_arns={ROLE}", f"gpu_capacity_reservation_id={RESERVATION}", "gpu_placement_group=false"]


def secret(**changes: Any) -> dict[str, Any]:
    return {
        "ARN": f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:prod/hf-token-AbCdEf",
        "Name": "prod/hf-token",
        "VersionIdsToStages": {"a1b2c3d4-5678-90ab-cdef-EXAMPLE11111": ["AWSCURRENT"]},
        **changes,
    }


def key(manager: str) -> dict[str, Any]:
    return {"KeyMetadata": {"KeyId": CMK.rsplit("/", 1)[1], "Arn": CMK, "KeyManager": manager}}


def project(tmp_path: Path, context: dict[str, Any] | None = None) -> Path:
    """A deployment folder with the product's cdk.json and, if given, a cdk.context.json."""
    (tmp_path / "cdk.json").write_text((ROOT / "cdk.json").read_text())
    if context is not None:
        (tmp_path / "cdk.context.json").write_text(json.dumps(context))
    return tmp_path
