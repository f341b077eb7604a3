"""preflight against an account described in AWS's own response shapes, offline.

The "account" below passes every check; each test changes one thing about it
and reads the line that check prints. Every check is seen to pass, warn and fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from settings import catalog, settings_from_cli
from tests.conftest import ROOT, synth
from tests.support.aws_fakes import Answer, FakeAws, client_error
from tests.support.preflight_account import (
    ACCOUNT,
    CMK,
    GOOD,
    GVT,
    RESERVED,
    ROLE,
    STANDARD,
    TYPES,
    account,
    check,
    deployed_stack,
    instance_type,
    key,
    offerings,
    preflight,
    project,
    quotas,
    reservation,
    role,
    running,
    secret,
    status_of,
)
from tools.preflight.__main__ import main, markdown, table
from tools.preflight.account import cli_bootstrap_version
from tools.preflight.base import Account, Result
from tools.preflight.checks import run
from tools.preflight.context_file import write_context
from tools.preflight.zones import RECORD_KEY

# Each account maps AZ names to physical zones (zone IDs) its own way.
# us-east-1a, the AZ an unchosen stack lands in, does not offer the GPU type.


def test_every_check_passes_on_a_ready_account() -> None:
    results = preflight(account(), *GOOD, "region=us-east-1")
    assert [r for r in results if r.status != "PASS"] == []
    assert [r.check for r in results] == [
        "credentials",
        "region",
        "CDK bootstrap",
        "Kubernetes version",
        "GPU AMI release",
        "EFA",
        "GPU availability zone",
        "G and VT vCPUs",
        "standard vCPUs",
        "VPCs",
        "internet gateways",
        "Elastic IPs",
        "NAT gateways per AZ",
        "cluster admin",
    ]


# --- credentials and region ------------------------------------------------------------
def test_credentials_for_another_account_fail() -> None:
    status, line = status_of("credentials", account(), *GOOD, "account=210987654321")
    assert status == "FAIL" and "210987654321" in line.detail and "-c account=123456789012" in line.fix


def test_a_region_from_the_profile_warns_until_recorded() -> None:
    status, line = status_of("region", account(), f"cluster_admin_arns={ROLE}")
    assert status == "WARN" and "--write-context" in line.fix
    # A GPU AZ names its region too.
    assert check(preflight(account(), *GOOD), "region").status == "PASS"


# --- CDK bootstrap ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (client_error("ParameterNotFound", "", 400), "FAIL"),
        ({"Parameter": {"Value": "5"}}, "FAIL"),
        ({"Parameter": {"Value": "21"}}, "WARN"),
        ({"Parameter": {"Value": "33"}}, "PASS"),
    ],
)
def test_bootstrap_version(answer: Answer, expected: str) -> None:
    status, line = status_of("CDK bootstrap", account(**{"ssm:GetParameter": answer}), *GOOD)
    assert status == expected
    if expected != "PASS":
        assert line.fix == f"make bootstrap SETTINGS=<your settings file> (cdk bootstrap aws://{ACCOUNT}/us-east-1)"


def test_the_pinned_cli_bootstrap_version_is_read_from_its_template() -> None:
    version = cli_bootstrap_version()
    assert version is not None and version >= 8


# --- Kubernetes version ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"clusterVersions": [{"clusterVersion": "1.36", "versionStatus": "STANDARD_SUPPORT"}]}, "PASS"),
        (
            {
                "clusterVersions": [
                    {
                        "clusterVersion": "1.36",
                        "versionStatus": "EXTENDED_SUPPORT",
                        "endOfExtendedSupportDate": datetime(2028, 2, 1, tzinfo=UTC),
                    }
                ]
            },
            "WARN",
        ),
        ({"clusterVersions": []}, "FAIL"),
    ],
)
def test_kubernetes_version(answer: Answer, expected: str) -> None:
    status, line = status_of("Kubernetes version", account(**{"eks:DescribeClusterVersions": answer}), *GOOD)
    assert status == expected
    if expected != "PASS":
        assert line.fix == "-c kubernetes_version=1.36"


# --- EFA -------------------------------------------------------------------------------
def test_a_type_without_efa_fails() -> None:
    types = {**TYPES, "g6.8xlarge": instance_type("g6.8xlarge", 32, False, 900)}
    answer = account(
        **{"ec2:DescribeInstanceTypes": lambda p, _: {"InstanceTypes": [types[t] for t in p["InstanceTypes"]]}}
    )
    status, line = status_of("EFA", answer, *GOOD)
    assert status == "FAIL" and "does not support EFA" in line.detail


def test_a_catalog_that_disagrees_with_ec2_warns() -> None:
    types = {**TYPES, "g6.8xlarge": instance_type("g6.8xlarge", 48, True, 600)}
    answer = account(
        **{"ec2:DescribeInstanceTypes": lambda p, _: {"InstanceTypes": [types[t] for t in p["InstanceTypes"]]}}
    )
    status, line = status_of("EFA", answer, *GOOD)
    assert status == "WARN" and "EC2 says 1, 48, 600" in line.detail


# --- GPU availability zone ------------------------------------------------------------------
def test_a_chosen_az_without_the_gpu_type_fails_naming_one_that_has_it() -> None:
    status, line = status_of(
        "GPU availability zone", account(), f"cluster_admin_arns={ROLE}", "gpu_availability_zone=us-east-1d"
    )
    assert status == "FAIL" and line.fix == "-c gpu_availability_zone=us-east-1b"
    assert "['us-east-1b', 'us-east-1c']" in line.detail


def test_with_no_az_chosen_the_default_az_without_the_type_fails_and_one_is_picked() -> None:
    settings = settings_from_cli([f"cluster_admin_arns={ROLE}"])
    found, results = run(settings, FakeAws(account()))
    line = check(results, "GPU availability zone")
    assert line.status == "FAIL" and "would use us-east-1a" in line.detail
    assert found.chosen_az == "us-east-1b" and "--write-context" in line.fix


def test_with_no_az_chosen_and_a_default_that_works_it_warns() -> None:
    answers = account(**{"ec2:DescribeInstanceTypeOfferings": offerings(g6_8xlarge=["us-east-1a", "us-east-1c"])})
    status, line = status_of("GPU availability zone", answers, f"cluster_admin_arns={ROLE}")
    assert status == "WARN" and "picked us-east-1a" in line.detail


def test_a_deployed_stack_keeps_its_az() -> None:
    deployed = {"Stacks": [deployed_stack("us-east-1c")]}
    settings = settings_from_cli([f"cluster_admin_arns={ROLE}"])
    found, _ = run(settings, FakeAws(account(**{"cloudformation:DescribeStacks": deployed})))
    assert found.chosen_az == "us-east-1c"


def test_an_az_whose_vpc_partner_lacks_the_system_type_fails() -> None:
    # us-east-1b's partner AZ in the new VPC is us-east-1a (settings/catalog.py REGION_AZS order).
    answers = account(**{"ec2:DescribeInstanceTypeOfferings": offerings(m7i_xlarge=["us-east-1b", "us-east-1c"])})
    status, line = status_of("GPU availability zone", answers, *GOOD)
    assert status == "FAIL" and "['us-east-1b', 'us-east-1a']" in line.detail


# --- vCPU quotas --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "expected"),
    # 4 vCPUs of g5 run already; two g6.8xlarge need 64, an update 64 more.
    [(256.0, "PASS"), (100.0, "WARN"), (64.0, "FAIL")],
)
def test_gpu_vcpu_quota(limit: float, expected: str) -> None:
    status, line = status_of(GVT, account(**{"service-quotas:GetServiceQuota": quotas(L_DB2E81BA=limit)}), *GOOD)
    assert status == expected, line
    assert "4 in use" in line.detail and "need 64" in line.detail and "an update 64 more" in line.detail
    if expected != "PASS":
        assert "--quota-code L-DB2E81BA --desired-value 132" in line.fix


def test_standard_vcpu_quota_counts_standard_families_only() -> None:
    status, line = status_of(STANDARD, account(**{"service-quotas:GetServiceQuota": quotas(L_1216C47A=20)}), *GOOD)
    # m7i.2xlarge counts (8), inf2 and g5 do not; 2 system nodes need 8, an update up to 2 per AZ more.
    assert status == "WARN" and "8 in use" in line.detail and "need 8" in line.detail
    assert status_of(STANDARD, account(**{"service-quotas:GetServiceQuota": quotas(L_1216C47A=12)}), *GOOD)[0] == "FAIL"


def test_a_quota_never_adjusted_falls_back_to_the_default() -> None:
    defaults: Answer = quotas(L_DB2E81BA=64)
    answers = account(
        **{
            "service-quotas:GetServiceQuota": client_error("NoSuchResourceException", "", 400),
            "service-quotas:GetAWSDefaultServiceQuota": defaults,
        }
    )
    status, line = status_of(GVT, answers, *GOOD)
    assert status == "FAIL" and "(L-DB2E81BA): 64 vCPUs, 4 in use" in line.detail


def test_a_deployed_stack_needs_quota_only_for_the_update() -> None:
    answers = account(
        **{
            "cloudformation:DescribeStacks": {"Stacks": [deployed_stack("us-east-1b")]},
            "ec2:DescribeInstances": running(("g6.8xlarge", 32), ("g6.8xlarge", 32)),
        }
    )
    answers[("service-quotas", "GetServiceQuota")] = quotas(L_DB2E81BA=128)
    results = preflight(answers, *GOOD)
    line = check(results, GVT)
    assert line.status == "PASS" and "64 in use" in line.detail and "need 0 more" in line.detail
    assert not [r for r in results if r.check == "VPCs"]


# --- new VPC room -------------------------------------------------------------------------------------
def test_a_region_at_its_vpc_limit_fails() -> None:
    vpcs = {"Vpcs": [{"VpcId": f"vpc-0aaaaaaaaaaaaaa{n:02x}"} for n in range(5)]}
    status, line = status_of("VPCs", account(**{"ec2:DescribeVpcs": vpcs}), *GOOD)
    assert status == "FAIL" and "--quota-code L-F678F1CE --desired-value 6" in line.fix


def test_elastic_ips_for_the_nat_gateways() -> None:
    addresses = {"Addresses": [{"PublicIp": f"198.51.100.{n}"} for n in range(4)]}
    status, line = status_of("Elastic IPs", account(**{"ec2:DescribeAddresses": addresses}), *GOOD)
    assert status == "FAIL" and "needs 2" in line.detail


@pytest.mark.parametrize(("full_az", "expected"), [("us-east-1b", "FAIL"), ("us-east-1d", "WARN")])
def test_nat_gateways_per_az(full_az: str, expected: str) -> None:
    nats = {
        "NatGateways": [
            {"NatGatewayId": f"nat-0aaaaaaaaaaaaaa{n:02x}", "SubnetId": "subnet-0aaaaaaaaaaaaaaa1"} for n in range(5)
        ]
    }
    subnets = {"Subnets": [{"SubnetId": "subnet-0aaaaaaaaaaaaaaa1", "AvailabilityZone": full_az}]}
    answers = account(**{"ec2:DescribeNatGateways": nats, "ec2:DescribeSubnets": subnets})
    assert status_of("NAT gateways per AZ", answers, *GOOD)[0] == expected


# --- capacity reservation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "expected", "said"),
    [
        ({}, "PASS", "active, 2 x g6.8xlarge in us-east-1c"),
        ({"EndDateType": "limited", "EndDate": datetime.now(UTC) + timedelta(days=2)}, "WARN", "it ends"),
        ({"InstanceType": "g6e.8xlarge", "State": "expired"}, "FAIL", "state expired; type g6e.8xlarge"),
        ({"AvailableInstanceCount": 1}, "FAIL", "1 available of the 2"),
    ],
)
def test_capacity_reservation(changes: dict[str, Any], expected: str, said: str) -> None:
    answers = account(**{"ec2:DescribeCapacityReservations": reservation(**changes)})
    settings = settings_from_cli(RESERVED)
    found, results = run(settings, FakeAws(answers))
    line = check(results, "capacity reservation")
    assert line.status == expected and said in line.detail
    # With no AZ chosen, the reservation's AZ is picked.
    assert found.chosen_az == "us-east-1c"


def test_a_reservation_in_another_az_than_the_chosen_one_fails() -> None:
    answers = account(**{"ec2:DescribeCapacityReservations": reservation()})
    status, line = status_of("capacity reservation", answers, *RESERVED, "gpu_availability_zone=us-east-1b")
    assert status == "FAIL" and "AZ us-east-1c, not gpu_availability_zone us-east-1b" in line.detail


def test_a_missing_reservation_fails() -> None:
    answers = account(**{"ec2:DescribeCapacityReservations": client_error("InvalidCapacityReservationId.NotFound")})
    assert status_of("capacity reservation", answers, *RESERVED)[0] == "FAIL"


# --- existing VPC --------------------------------------------------------------------------------------
VPC = "vpc-0123456789abcdef0"
EXISTING = [f"cluster_admin_arns={ROLE}", f"vpc_id={VPC}", f"account={ACCOUNT}", "region=us-east-1"]


def subnet(n: int, az: str, tagged: bool = True) -> dict[str, Any]:
    tags = [{"Key": "kubernetes.io/role/internal-elb", "Value": "1"}] if tagged else []
    return {"SubnetId": f"subnet-0{n:016x}", "AvailabilityZone": az, "VpcId": VPC, "Tags": tags}


def vpc_answers(subnets: list[dict[str, Any]], public_subnet: dict[str, Any]) -> dict[tuple[str, str], Answer]:
    tables = {
        "RouteTables": [
            {
                "RouteTableId": "rtb-0000000000000000a",
                "Associations": [{"Main": True}],
                "Routes": [{"DestinationCidrBlock": "0.0.0.0/0", "NatGatewayId": "nat-0000000000000000a"}],
            },
            {
                "RouteTableId": "rtb-0000000000000000b",
                "Associations": [{"Main": False, "SubnetId": public_subnet["SubnetId"]}],
                "Routes": [{"DestinationCidrBlock": "0.0.0.0/0", "GatewayId": "igw-0000000000000000a"}],
            },
        ]
    }
    return account(
        **{
            "ec2:DescribeSubnets": {"Subnets": [*subnets, public_subnet]},
            "ec2:DescribeRouteTables": tables,
            "ec2:DescribeVpcs": {"Vpcs": [{"VpcId": VPC}]},
        }
    )


@pytest.mark.parametrize(
    ("subnets", "extra", "expected"),
    [
        ([subnet(1, "us-east-1b"), subnet(2, "us-east-1c")], [], "PASS"),
        ([subnet(1, "us-east-1b"), subnet(2, "us-east-1c", tagged=False)], [], "WARN"),
        (
            [subnet(1, "us-east-1b"), subnet(2, "us-east-1c", tagged=False)],
            ["internal_endpoint_cidrs=10.0.0.0/8"],
            "FAIL",
        ),
        ([subnet(1, "us-east-1b"), subnet(2, "us-east-1b")], [], "FAIL"),
    ],
)
def test_existing_vpc(subnets: list[dict[str, Any]], extra: list[str], expected: str) -> None:
    answers = vpc_answers(subnets, subnet(9, "us-east-1a", tagged=False))
    settings = settings_from_cli([*EXISTING, *extra])
    found, results = run(settings, FakeAws(answers))
    assert check(results, "existing VPC").status == expected
    # The public subnet (an IGW route) is never counted as private.
    assert "us-east-1a" not in found.private_subnet_azs
    if expected == "PASS":
        assert found.chosen_az == "us-east-1b"
        # A VPC lookup assumes the lookup role, which needs bootstrap version 8.
        assert check(results, "CDK bootstrap").status == "PASS"
        assert not [r for r in results if r.check == "VPCs"]


def test_an_existing_vpc_needs_bootstrap_version_8() -> None:
    answers = vpc_answers([subnet(1, "us-east-1b"), subnet(2, "us-east-1c")], subnet(9, "us-east-1a"))
    answers[("ssm", "GetParameter")] = {"Parameter": {"Value": "7"}}
    assert status_of("CDK bootstrap", answers, *EXISTING)[1].detail == "version 7; this stack needs 8 or later"


def test_a_missing_vpc_fails() -> None:
    answers = account(**{"ec2:DescribeVpcs": client_error("InvalidVpcID.NotFound")})
    assert status_of("existing VPC", answers, *EXISTING)[0] == "FAIL"


# --- the model token and its key ---------------------------------------------------------------------
TOKEN = [*GOOD, "hf_token_secret_name=prod/hf-token"]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (secret(), "PASS"),
        (client_error("ResourceNotFoundException"), "FAIL"),
        (secret(DeletedDate=datetime(2026, 12, 1, tzinfo=UTC)), "FAIL"),
        (secret(VersionIdsToStages={}), "FAIL"),
        (client_error("AccessDeniedException"), "WARN"),
    ],
)
def test_token_secret(answer: Answer, expected: str) -> None:
    status, line = status_of("token secret", account(**{"secretsmanager:DescribeSecret": answer}), *TOKEN)
    assert status == expected
    if expected == "WARN":
        assert line.detail == "not checked: DescribeSecret was denied"


@pytest.mark.parametrize(
    ("manager", "setting", "expected"),
    [
        ("AWS", [], "PASS"),
        ("CUSTOMER", [], "WARN"),
        ("CUSTOMER", [f"hf_token_kms_key_arn={CMK}"], "PASS"),
        ("CUSTOMER", [f"hf_token_kms_key_arn={CMK[:-2]}ff"], "FAIL"),
    ],
)
def test_token_secret_key(manager: str, setting: list[str], expected: str) -> None:
    answers = account(**{"secretsmanager:DescribeSecret": secret(KmsKeyId=CMK), "kms:DescribeKey": key(manager)})
    status, line = status_of("token secret key", answers, *TOKEN, *setting)
    assert status == expected
    if expected != "PASS":
        assert line.fix.startswith(f"-c hf_token_kms_key_arn={CMK}")


# --- cluster admin ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("admins", "expected", "said"),
    [
        (ROLE, "PASS", "gets cluster admin"),
        (f"arn:aws:iam::{ACCOUNT}:role/Other", "FAIL", "does not exist"),
        (f"arn:aws:iam::{ACCOUNT}:role/Deployer", "FAIL", "with its path"),
        ("", "WARN", "is not in cluster_admin_arns"),
    ],
)
def test_cluster_admin(admins: str, expected: str, said: str) -> None:
    status, line = status_of(
        "cluster admin", account(), f"cluster_admin_arns={admins}", "gpu_availability_zone=us-east-1b"
    )
    assert status == expected and said in line.detail
    if expected != "PASS":
        assert line.fix == f"-c cluster_admin_arns={ROLE}" or "<your role" in line.fix


def test_cluster_admin_names_every_bad_arn() -> None:
    missing, pathless = f"arn:aws:iam::{ACCOUNT}:role/Other", f"arn:aws:iam::{ACCOUNT}:role/Deployer"
    status, line = status_of(
        "cluster admin", account(), f"cluster_admin_arns={missing},{pathless}", "gpu_availability_zone=us-east-1b"
    )
    assert status == "FAIL" and f"{missing}, which does not exist" in line.detail, line
    assert f"names {pathless}; the role's ARN is {ROLE}" in line.detail
    assert line.fix == f"-c cluster_admin_arns=<your role's ARN, path included>,{ROLE}"


def deployed_with_admins(*admins: str) -> dict[str, Answer]:
    """A deployed stack whose template is the one `cdk synth` makes with these cluster admins."""
    body = json.dumps(synth(cluster_admin_arns=",".join(admins), gpu_availability_zone="us-east-1b"))
    return {
        "cloudformation:DescribeStacks": {"Stacks": [deployed_stack("us-east-1b")]},
        "cloudformation:GetTemplate": lambda params, _: (
            {"TemplateBody": body} if params == {"StackName": "PdInference", "TemplateStage": "Original"} else {}
        ),
    }


OTHER_ADMIN = f"arn:aws:iam::{ACCOUNT}:role/Other"


@pytest.mark.parametrize(
    ("deployed", "admins", "expected"),
    [
        ((ROLE,), "", "FAIL"),  # the trap: the caller's entry dropped from the settings
        ((ROLE, OTHER_ADMIN), f"{ROLE}", "PASS"),  # someone else's entry dropped: the caller keeps theirs
        ((OTHER_ADMIN,), "", "WARN"),  # never had one: nothing to lose, the old warning
    ],
    ids=["drops-mine", "drops-another", "never-had-one"],
)
def test_a_deploy_that_drops_the_callers_own_access_entry_is_stopped(
    deployed: tuple[str, ...], admins: str, expected: str
) -> None:
    answers = account(**deployed_with_admins(*deployed), **{"iam:GetRole": role_or_other})
    status, line = status_of(
        "cluster admin", answers, f"cluster_admin_arns={admins}", "gpu_availability_zone=us-east-1b"
    )
    assert status == expected, line
    if expected == "FAIL":
        assert f"removes the access entry of {ROLE}" in line.detail and "\n" not in line.detail
        assert line.fix.startswith(f"-c cluster_admin_arns={ROLE}")


def role_or_other(params: dict[str, Any], region: str) -> dict[str, Any]:
    """GetRole: the caller's role, and OTHER_ADMIN as a role without a path."""
    if params["RoleName"] == "Other":
        return {
            "Role": {
                "Path": "/",
                "RoleName": "Other",
                "RoleId": "AROAEXAMPLEID7654321",
                "Arn": OTHER_ADMIN,
                "CreateDate": datetime(2026, 1, 1, tzinfo=UTC),
            }
        }
    return role(params, region)


# --- denied calls, the IAM policy, the command line ---------------------------------------------------------
def test_a_denied_call_warns_and_the_rest_still_run() -> None:
    results = preflight(account(**{"ec2:DescribeInstances": client_error("UnauthorizedOperation", "", 403)}), *GOOD)
    line = check(results, "vCPU quotas")
    assert line.status == "WARN" and "DescribeInstances was denied" in line.detail
    assert check(results, "cluster admin").status == "PASS"


SUBNET = "subnet-0aaaaaaaaaaaaaaa1"


def test_a_regional_nat_gateway_has_no_subnet_and_the_zonal_ones_still_count() -> None:
    # botocore 1.44.8: NatGateway.SubnetId is optional; AvailabilityMode is zonal or regional.
    regional = {
        "NatGatewayId": "nat-0bbbbbbbbbbbbbb01",
        "VpcId": "vpc-0aaaaaaaaaaaaaaa1",
        "State": "available",
        "AvailabilityMode": "regional",
        "NatGatewayAddresses": [{"AllocationId": "eipalloc-0bbbbbbbbbbbbbb01", "AvailabilityZone": "us-east-1b"}],
    }
    zonal = [
        {
            "NatGatewayId": f"nat-0aaaaaaaaaaaaaa{n:02x}",
            "SubnetId": "subnet-0aaaaaaaaaaaaaaa1",
            "AvailabilityMode": "zonal",
        }
        for n in range(5)
    ]
    subnets = {"Subnets": [{"SubnetId": SUBNET, "AvailabilityZone": "us-east-1b"}]}
    answers = account(**{"ec2:DescribeSubnets": subnets})
    answers[("ec2", "DescribeNatGateways")] = {"NatGateways": [regional]}
    line = check(preflight(answers, *GOOD), "NAT gateways per AZ")
    assert line.status == "PASS" and "1 regional" in line.detail, line
    answers[("ec2", "DescribeNatGateways")] = {"NatGateways": [regional, *zonal]}
    line = check(preflight(answers, *GOOD), "NAT gateways per AZ")
    assert line.status == "FAIL" and "['us-east-1b']" in line.detail, line


def test_an_unexpected_error_is_that_checks_own_fail_line(capsys: pytest.CaptureFixture[str]) -> None:
    # VCpuInfo is optional in DescribeInstanceTypes' answer: a KeyError in the EFA check.
    bare = {k: v for k, v in TYPES["g6.8xlarge"].items() if k != "VCpuInfo"}
    types = {**TYPES, "g6.8xlarge": bare}
    answers = account(
        **{"ec2:DescribeInstanceTypes": lambda p, _: {"InstanceTypes": [types[t] for t in p["InstanceTypes"]]}}
    )
    results = preflight(answers, *GOOD)
    line = check(results, "EFA")
    assert line.status == "FAIL" and "KeyError" in line.detail and line.fix, line
    assert check(results, "cluster admin").status == "PASS"
    assert main([f"-c{p}" for p in GOOD], session=FakeAws(answers)) == 1
    out = capsys.readouterr().out
    assert "FAIL  EFA" in out and "PASS  cluster admin" in out and "preflight: " in out


def test_a_network_error_is_that_checks_own_fail_line() -> None:
    def unreachable(_: dict[str, Any], __: str) -> dict[str, Any]:
        raise EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com/")

    results = preflight(account(**{"ec2:DescribeInstances": unreachable}), *GOOD)
    line = check(results, "vCPU quotas")
    assert line.status == "FAIL" and "EndpointConnectionError" in line.detail and "network" in line.fix, line
    assert check(results, "cluster admin").status == "PASS"


def test_no_way_to_reach_sts_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def unreachable(_: dict[str, Any], __: str) -> dict[str, Any]:
        raise EndpointConnectionError(endpoint_url="https://sts.us-east-1.amazonaws.com/")

    assert main([f"-c{p}" for p in GOOD], session=FakeAws(account(**{"sts:GetCallerIdentity": unreachable}))) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: could not reach AWS") and "sts.us-east-1" in err[0]


def test_the_iam_policy_allows_exactly_the_calls_preflight_makes() -> None:
    policy = json.loads((ROOT / "tools/preflight/iam-policy.json").read_text())
    allowed = {a for s in policy["Statement"] for a in s["Action"]}
    called: set[str] = set()
    for answers, pairs in (
        (
            account(
                **{
                    "service-quotas:GetServiceQuota": client_error("NoSuchResourceException"),
                    "service-quotas:GetAWSDefaultServiceQuota": quotas(),
                    "ec2:DescribeNatGateways": {"NatGateways": [{"SubnetId": "subnet-0aaaaaaaaaaaaaaa1"}]},
                    "ec2:DescribeSubnets": {
                        "Subnets": [{"SubnetId": "subnet-0aaaaaaaaaaaaaaa1", "AvailabilityZone": "us-east-1a"}]
                    },
                }
            ),
            GOOD,
        ),
        (account(**{"secretsmanager:DescribeSecret": secret(KmsKeyId=CMK), "kms:DescribeKey": key("CUSTOMER")}), TOKEN),
        (
            account(
                **{
                    "secretsmanager:DescribeSecret": secret(Name="prod/llm-keys"),
                    "secretsmanager:GetSecretValue": {"Name": "prod/llm-keys", "SecretString": "{}"},
                }
            ),
            [*GOOD, "endpoint_api_keys_secret_name=prod/llm-keys"],
        ),
        (account(**{"ec2:DescribeCapacityReservations": reservation()}), RESERVED),
        (vpc_answers([subnet(1, "us-east-1b"), subnet(2, "us-east-1c")], subnet(9, "us-east-1a")), EXISTING),
        (account(**deployed_with_admins(ROLE)), ["gpu_availability_zone=us-east-1b"]),
        (
            account(
                **{
                    "ecr:DescribePullThroughCacheRules": client_error("PullThroughCacheRuleNotFoundException"),
                    "ecr:DescribeRepositories": client_error("RepositoryNotFoundException"),
                }
            ),
            [*GOOD, "image_pull_through_cache_prefix=pd-inference-public"],
        ),
    ):
        fake = FakeAws(answers)
        run(settings_from_cli(list(pairs)), fake)
        called |= fake.actions()
    assert called == allowed
    assert all(a.split(":")[1].startswith(("Describe", "Get")) for a in allowed)


def test_the_table_and_markdown_carry_each_fix() -> None:
    results = [
        Result("PASS", "credentials", "arn (account 1)"),
        Result("WARN", "region", "from the profile", "python -m tools.preflight --write-context"),
        Result("FAIL", "EFA", "no EFA", "-c gpu_instance_type=g6.8xlarge"),
    ]
    lines = table(results).splitlines()
    assert (
        len(lines) == 3
        and lines[2].startswith("FAIL  EFA")
        and lines[2].endswith("-> fix: -c gpu_instance_type=g6.8xlarge")
    )
    assert "| FAIL | EFA | no EFA | -c gpu_instance_type=g6.8xlarge |" in markdown(results)


def test_exit_code_is_non_zero_on_a_fail(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*[f"-c{p}" for p in GOOD], "-cregion=us-east-1"], session=FakeAws(account())) == 0
    # No SSM parameter at all: CDK's bootstrap version and the GPU AMI release both fail.
    failing = account(**{"ssm:GetParameter": client_error("ParameterNotFound")})
    assert main([f"-c{p}" for p in GOOD], session=FakeAws(failing)) == 1
    assert " passed, 0 warned, 2 failed" in capsys.readouterr().out


def test_without_credentials_it_fails_in_one_line(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AWS_") and k not in {"CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION"}
    }
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_REGION="us-east-1",
    )
    done = subprocess.run(
        [sys.executable, "-m", "tools.preflight"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: no AWS credentials found: set AWS_PROFILE or run `aws configure` / `aws sso login`"
    ]


def test_a_bad_setting_fails_before_any_call(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeAws({})
    with pytest.raises(SystemExit) as stopped:
        main(["-c", "gpu_instance_type=g6.2xlarge"], session=fake)
    assert stopped.value.code == 2
    assert fake.calls == [] and capsys.readouterr().err.startswith("error: setting 'gpu_instance_type'")


# --- --write-context: cdk.context.json ----------------------------------------------------------------------


def test_write_context_records_the_picked_az_and_region_for_synth(tmp_path: Path) -> None:
    root = project(tmp_path, {"availability-zones:account=123456789012:region=us-east-1": ["us-east-1a"]})
    args = ["--root", str(root), "--write-context", f"-ccluster_admin_arns={ROLE}"]
    assert main(args, session=FakeAws(account())) == 1  # the unchosen default AZ lacks the GPU type
    written = json.loads((root / "cdk.context.json").read_text())
    assert written == {
        "availability-zones:account=123456789012:region=us-east-1": ["us-east-1a"],
        "region": "us-east-1",
        "gpu_availability_zone": "us-east-1b",
        # The physical zone and the account it was checked in: an AZ name means another zone elsewhere.
        "preflight:gpu-availability-zone": {
            "account": ACCOUNT,
            "region": "us-east-1",
            "zone": "us-east-1b",
            "zoneId": "use1-az6",
        },
    }
    recorded = settings_from_cli([], root=root)
    assert (recorded.region, recorded.gpu_availability_zone) == ("us-east-1", "us-east-1b")
    # -c on the command line still wins, and cdk.json's context over cdk.context.json, as in the CDK CLI.
    assert settings_from_cli(["gpu_availability_zone=us-east-1c"], root=root).gpu_availability_zone == "us-east-1c"
    # Now recorded, the same account passes.
    assert main(["--root", str(root), f"-ccluster_admin_arns={ROLE}"], session=FakeAws(account())) == 0


def test_write_context_refuses_to_move_a_deployed_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path)
    answers = account(**{"cloudformation:DescribeStacks": {"Stacks": [deployed_stack("us-east-1c")]}})
    args = [
        "--root",
        str(root),
        "--write-context",
        f"-ccluster_admin_arns={ROLE}",
        "-cgpu_availability_zone=us-east-1b",
    ]
    assert main(args, session=FakeAws(answers)) == 1
    assert not (root / "cdk.context.json").exists()
    err = capsys.readouterr().err
    assert "deployed with its GPU nodes in us-east-1c" in err and "--replace-deployed-cluster" in err
    assert main([*args, "--replace-deployed-cluster"], session=FakeAws(answers)) == 0
    assert json.loads((root / "cdk.context.json").read_text())["gpu_availability_zone"] == "us-east-1b"


def test_write_context_refuses_to_move_a_deployed_stack_to_another_region(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path, {"region": "us-west-2", "gpu_availability_zone": "us-west-2b"})

    def stacks(_: dict[str, Any], region: str) -> dict[str, Any]:
        if region == "us-west-2":
            return {"Stacks": [deployed_stack("us-west-2b")]}
        return client_error("ValidationError", "Stack with id PdInference does not exist")

    answers = account(**{"cloudformation:DescribeStacks": stacks})
    args = [
        "--root",
        str(root),
        "--write-context",
        f"-ccluster_admin_arns={ROLE}",
        "-cregion=us-east-1",
        "-cgpu_availability_zone=us-east-1b",
    ]
    fake = FakeAws(answers)
    assert main(args, session=fake) == 1
    assert "deployed in us-west-2" in capsys.readouterr().err
    assert ("cloudformation", "DescribeStacks", "us-west-2", {"StackName": "PdInference"}) in fake.calls
    assert json.loads((root / "cdk.context.json").read_text())["region"] == "us-west-2"


def test_write_context_that_cannot_read_the_recorded_region_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path, {"region": "us-west-2", "gpu_availability_zone": "us-west-2b"})

    def stacks(_: dict[str, Any], region: str) -> dict[str, Any]:
        if region == "us-west-2":
            raise EndpointConnectionError(endpoint_url="https://cloudformation.us-west-2.amazonaws.com/")
        return client_error("ValidationError", "Stack with id PdInference does not exist")

    args = ["--root", str(root), "--write-context", f"-ccluster_admin_arns={ROLE}", "-cregion=us-east-1"]
    args.append("-cgpu_availability_zone=us-east-1b")
    assert main(args, session=FakeAws(account(**{"cloudformation:DescribeStacks": stacks}))) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: not written: EndpointConnectionError"), err
    assert json.loads((root / "cdk.context.json").read_text())["region"] == "us-west-2"


def test_the_product_repository_ships_no_cdk_context_json() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "cdk.context.json"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert tracked.stdout == ""


def test_the_cdk_cli_reads_the_recorded_az_and_needs_the_bootstrap_preflight_checks(tmp_path: Path) -> None:
    """The pinned CLI itself merges cdk.context.json under cdk.json and -c: the template has the recorded AZ.

    The file is the one --write-context writes, zone record included: the CLI and the app accept it offline.
    Its cloud assembly also states the bootstrap versions preflight asks for.
    """
    context = json.loads((ROOT / "cdk.json").read_text())
    context["app"] = f"{sys.executable} {ROOT / 'app.py'}"
    (tmp_path / "cdk.json").write_text(json.dumps(context))
    checked = Account(
        settings=settings_from_cli([]),
        session=FakeAws({}),
        region="us-west-2",
        account_id=ACCOUNT,
        chosen_az="us-west-2c",
        zone_ids={"us-west-2c": "usw2-az3"},
    )
    write_context(checked, tmp_path / "cdk.context.json")
    assert json.loads((tmp_path / "cdk.context.json").read_text())[RECORD_KEY]["zoneId"] == "usw2-az3"
    env = {**os.environ, "PATH": f"{ROOT / '.venv/bin'}:{os.environ['PATH']}", "CDK_VALIDATION": "false"}
    cdk = ROOT / "node_modules/.bin/cdk"
    done = subprocess.run(
        [str(cdk), "synth", "--quiet", "--output", str(tmp_path / "out"), "-c", "max_azs=3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    template = json.loads((tmp_path / "out/PdInference.template.json").read_text())
    assert template["Outputs"]["GpuNodeAvailabilityZone"]["Value"] == "us-west-2c"
    subnets = {
        r["Properties"]["AvailabilityZone"] for r in template["Resources"].values() if r["Type"] == "AWS::EC2::Subnet"
    }
    assert subnets == {"us-west-2c", "us-west-2a", "us-west-2b"}
    parameter = template["Parameters"]["BootstrapVersion"]["Default"]
    assert parameter == f"/cdk-bootstrap/{catalog.CDK_BOOTSTRAP_QUALIFIER}/version"
    manifest = (tmp_path / "out/manifest.json").read_text()
    required = {int(v) for v in re.findall(r'"requiresBootstrapStackVersion": (\d+)', manifest)}
    assert required == {catalog.CDK_BOOTSTRAP_MIN_VERSION, catalog.CDK_BOOTSTRAP_LOOKUP_MIN_VERSION}
