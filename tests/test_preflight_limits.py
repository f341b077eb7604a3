"""Every quota comparison at its boundary: exactly full passes, one short fails.

A limit far from the threshold cannot tell `>` from `>=`; these can. The account is
tests/test_preflight.py's: 4 vCPUs of g5 and 8 of m7i run, 1 VPC, 1 internet gateway and
1 Elastic IP exist, and the default settings create 2 GPU nodes (64 vCPUs) in a new
2-AZ VPC (1 VPC, 1 internet gateway, 2 NAT gateways with an Elastic IP each).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.preflight_account import GOOD, GVT, STANDARD, account, check, preflight, quotas


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        # used 4 + create 64 + update 64 = 132
        (132, "PASS"),  # room for the create and an update, exactly
        (131, "WARN"),  # one short for the update
        (68, "WARN"),  # room for the create, exactly
        (67, "FAIL"),  # one short for the create
    ],
)
def test_gpu_vcpu_quota_at_its_boundaries(limit: int, expected: str) -> None:
    line = check(preflight(account(**{"service-quotas:GetServiceQuota": quotas(L_DB2E81BA=limit)}), *GOOD), GVT)
    assert line.status == expected, line


@pytest.mark.parametrize(
    ("limit", "expected"),
    # used 8 + create 2 x 4 + update 2 per AZ x 2 AZs x 4 = 32
    [(32, "PASS"), (31, "WARN"), (16, "WARN"), (15, "FAIL")],
)
def test_standard_vcpu_quota_at_its_boundaries(limit: int, expected: str) -> None:
    line = check(preflight(account(**{"service-quotas:GetServiceQuota": quotas(L_1216C47A=limit)}), *GOOD), STANDARD)
    assert line.status == expected, line


@pytest.mark.parametrize(
    ("label", "code", "full"),
    [
        ("VPCs", "L_F678F1CE", 2),  # 1 in use, the new VPC needs 1
        ("internet gateways", "L_A4707A72", 2),  # 1 in use, 1 more
        ("Elastic IPs", "L_0263D0A3", 3),  # 1 in use, 1 per NAT gateway: 2 more
    ],
)
def test_new_vpc_room_at_its_boundary(label: str, code: str, full: int) -> None:
    exactly = check(preflight(account(**{"service-quotas:GetServiceQuota": quotas(**{code: full})}), *GOOD), label)
    assert exactly.status == "PASS", exactly
    short = check(preflight(account(**{"service-quotas:GetServiceQuota": quotas(**{code: full - 1})}), *GOOD), label)
    assert short.status == "FAIL", short


@pytest.mark.parametrize(("in_use", "expected"), [(4, "PASS"), (5, "FAIL")])
def test_nat_gateways_per_az_at_its_boundary(in_use: int, expected: str) -> None:
    # The limit is 5 per AZ; the new VPC adds one in the GPU AZ.
    nats: dict[str, Any] = {
        "NatGateways": [
            {"NatGatewayId": f"nat-0aaaaaaaaaaaaaa{n:02x}", "SubnetId": "subnet-0aaaaaaaaaaaaaaa1"}
            for n in range(in_use)
        ]
    }
    subnets = {"Subnets": [{"SubnetId": "subnet-0aaaaaaaaaaaaaaa1", "AvailabilityZone": "us-east-1b"}]}
    answers = account(**{"ec2:DescribeNatGateways": nats, "ec2:DescribeSubnets": subnets})
    assert check(preflight(answers, *GOOD), "NAT gateways per AZ").status == expected
