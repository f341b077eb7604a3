"""preflight reads the vCPU quota that counts the configured GPU type: P instances (p4d, p5) count
against "Running On-Demand P instances", G instances against "G and VT".

The account is tests/test_preflight.py's, answered in AWS's own response shapes, with p5.48xlarge
described as EC2 describes it (192 vCPUs, 32 network cards with one EFA each, 8 x 3840 GB NVMe).
"""

from __future__ import annotations

from typing import Any

import pytest

from settings import catalog
from tests.support.aws_fakes import Answer
from tests.support.preflight_account import (
    GOOD,
    GVT,
    STANDARD,
    TYPES,
    account,
    check,
    offerings,
    preflight,
    quotas,
    running,
)

P5 = [*GOOD, "gpu_instance_type=p5.48xlarge", "prefill_tensor_parallel_size=8", "decode_tensor_parallel_size=8"]
P_VCPUS = "P vCPUs"
P5_TYPE: dict[str, Any] = {
    "InstanceType": "p5.48xlarge",
    "VCpuInfo": {"DefaultVCpus": 192},
    "NetworkInfo": {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 32}, "MaximumNetworkCards": 32},
    "InstanceStorageSupported": True,
    "InstanceStorageInfo": {"TotalSizeInGB": 30720},
}


def p5_account(**changes: Answer) -> dict[tuple[str, str], Answer]:
    types = {**TYPES, "p5.48xlarge": P5_TYPE}
    return account(
        **{
            "ec2:DescribeInstanceTypes": lambda p, _: {"InstanceTypes": [types[t] for t in p["InstanceTypes"]]},
            "ec2:DescribeInstanceTypeOfferings": offerings(p5_48xlarge=["us-east-1b"]),
            **changes,
        }
    )


def test_p5_nodes_are_checked_against_the_p_quota_not_g_and_vt() -> None:
    """A large G and VT quota and a P quota of 0: the deploy would stall, so preflight fails, naming the P quota."""
    answers = p5_account(**{"service-quotas:GetServiceQuota": quotas(L_DB2E81BA=10_000, L_417A185B=0)})
    results = preflight(answers, *P5)
    line = check(results, P_VCPUS)
    assert line.status == "FAIL", line
    # Two p5.48xlarge (192 vCPUs each) at the deploy, two more for a node group update.
    assert line.detail.startswith(
        "Running On-Demand P instances (L-417A185B): 0 vCPUs, 0 in use; the GPU nodes need 384"
    ), line
    assert line.fix == (
        "aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-417A185B "
        "--desired-value 768 --region us-east-1"
    )
    assert not [r for r in results if r.check == GVT or "L-DB2E81BA" in r.detail + r.fix]


def test_the_gpu_quota_line_says_the_maximum_holds_a_blue_green_upgrades_second_cluster() -> None:
    """Decode may grow to 3: 2 GPU nodes at the minimum, 4 at the maximum, room for a second Ray cluster."""
    room = ["decode_max_replicas=3", "decode_target_ongoing_requests=8"]
    line = check(preflight(account(), *GOOD, *room), GVT)
    assert "to grow to their maximum of 4 (which also holds a blue/green upgrade's second cluster)" in line.detail
    line = check(preflight(account(), *GOOD, *room, "ray_cluster_upgrade=recreate"), GVT)
    assert "blue/green" not in line.detail and "to grow to their maximum of 4," in line.detail


def test_running_p_instances_count_against_the_p_quota_only() -> None:
    answers = p5_account(
        **{
            "service-quotas:GetServiceQuota": quotas(L_417A185B=768 + 96, L_1216C47A=20),
            "ec2:DescribeInstances": running(("p4d.24xlarge", 96), ("g5.xlarge", 4), ("m7i.2xlarge", 8)),
        }
    )
    results = preflight(answers, *P5)
    line = check(results, P_VCPUS)
    assert line.status == "PASS" and "96 in use" in line.detail, line
    assert "8 in use" in check(results, STANDARD).detail


@pytest.mark.parametrize(
    ("instance_type", "code"),
    [
        ("p5.48xlarge", "L-417A185B"),
        ("p4d.24xlarge", "L-417A185B"),
        ("p3dn.24xlarge", "L-417A185B"),
        ("g6.8xlarge", "L-DB2E81BA"),
        ("g6e.12xlarge", "L-DB2E81BA"),
        ("g5.12xlarge", "L-DB2E81BA"),
        ("g4dn.xlarge", "L-DB2E81BA"),
        ("gr6.4xlarge", "L-DB2E81BA"),
        ("vt1.3xlarge", "L-DB2E81BA"),
        ("m7i.xlarge", "L-1216C47A"),
        ("c7g.large", "L-1216C47A"),
        ("im4gn.large", "L-1216C47A"),
        ("d3.xlarge", "L-1216C47A"),
        ("h1.2xlarge", "L-1216C47A"),
    ],
)
def test_each_family_has_its_quota(instance_type: str, code: str) -> None:
    quota = catalog.vcpu_quota(instance_type)
    assert quota is not None and quota.code == code


@pytest.mark.parametrize(
    "instance_type", ["inf2.xlarge", "trn1.2xlarge", "dl1.24xlarge", "hpc7g.4xlarge", "x2idn.16xlarge", "mac1.metal"]
)
def test_families_with_quotas_of_their_own_are_counted_by_none_of_these(instance_type: str) -> None:
    assert catalog.vcpu_quota(instance_type) is None


def test_every_instance_type_in_the_catalog_has_a_vcpu_quota() -> None:
    """A GPU type added to INSTANCE_TYPES without a quota would not be checked at all."""
    assert [t for t in catalog.INSTANCE_TYPES if catalog.vcpu_quota(t) is None] == []
