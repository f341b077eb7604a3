"""preflight against the GPU group's maximum: quotas and the reservation must hold the
nodes Cluster Autoscaler may add, not only the ones the deploy starts with.

The account is tests/test_preflight.py's (4 vCPUs of g5 run; g6.8xlarge has 32 vCPUs), answered in
AWS's own response shapes. With decode scaling 1 -> 3 the GPU group runs 2 nodes at its minimum and
4 at its maximum (settings/sizing/root_volume.py gpu_node_bounds).
"""

from __future__ import annotations

import pytest

from settings import settings_from_cli, sizing
from tests.support.aws_fakes import FakeAws
from tests.support.preflight_account import (
    GOOD,
    GVT,
    RESERVED,
    account,
    check,
    deployed_stack,
    preflight,
    quotas,
    reservation,
    running,
)
from tools.preflight.checks import run

RANGE = ["decode_max_replicas=3", "decode_target_ongoing_requests=8"]


def test_the_range_is_two_to_four_gpu_nodes() -> None:
    assert sizing.gpu_node_bounds(settings_from_cli(RANGE)) == (2, 4)


@pytest.mark.parametrize(
    ("limit", "expected", "said"),
    [
        # used 4 + the minimum 64 + growing to the maximum 64 + an update 64 = 196
        (196, "PASS", ""),
        (195, "WARN", "a node group update would stall"),
        (132, "WARN", "a node group update would stall"),  # room for the maximum, exactly
        (131, "FAIL", "scale-up would stop at 3"),  # one vCPU short of the fourth node
        (100, "FAIL", "scale-up would stop at 3"),
        (99, "FAIL", "scale-up would stop at 2"),
        (67, "FAIL", "need 64"),  # not even the minimum: the deploy fails
    ],
)
def test_the_gpu_vcpu_quota_is_checked_against_the_maximum(limit: int, expected: str, said: str) -> None:
    answers = account(**{"service-quotas:GetServiceQuota": quotas(L_DB2E81BA=limit)})
    line = check(preflight(answers, *GOOD, *RANGE), GVT)
    assert line.status == expected, line
    maximum = "64 more to grow to their maximum of 4 (which also holds a blue/green upgrade's second cluster)"
    assert f"need 64, {maximum}, and an update 64 more" in line.detail
    assert said in line.detail
    if expected != "PASS":
        assert "--quota-code L-DB2E81BA --desired-value 196" in line.fix


def test_the_same_quota_passes_a_fixed_group_it_fails_with_a_maximum() -> None:
    """132 vCPUs hold 2 fixed nodes and their update; the maximum of 4 does not fit."""
    answers = account(**{"service-quotas:GetServiceQuota": quotas(L_DB2E81BA=131)})
    assert check(preflight(answers, *GOOD), GVT).status == "WARN"
    assert check(preflight(answers, *GOOD, *RANGE), GVT).status == "FAIL"


@pytest.mark.parametrize(("limit", "expected"), [(192, "PASS"), (128, "WARN"), (127, "FAIL")])
def test_a_deployed_stack_needs_the_growth_and_an_update(limit: int, expected: str) -> None:
    """Deployed at its minimum (two g6.8xlarge run, 64 in use): 64 more to grow, 64 for an update."""
    answers = account(
        **{
            "cloudformation:DescribeStacks": {"Stacks": [deployed_stack("us-east-1b")]},
            "ec2:DescribeInstances": running(("g6.8xlarge", 32), ("g6.8xlarge", 32)),
            "service-quotas:GetServiceQuota": quotas(L_DB2E81BA=limit),
        }
    )
    line = check(preflight(answers, *GOOD, *RANGE), GVT)
    assert line.status == expected, line
    assert "64 in use" in line.detail and "need 0 more (already deployed), 64 more to grow" in line.detail
    if expected == "FAIL":
        assert "scale-up would stop at 3" in line.detail and "--desired-value 192" in line.fix


@pytest.mark.parametrize(
    ("available", "expected", "said"),
    [
        (4, "PASS", "active, 4 x g6.8xlarge"),
        (3, "FAIL", "3 available of the 4 GPU nodes at their maximum (minimum 2)"),
        (2, "FAIL", "2 available of the 4 GPU nodes at their maximum (minimum 2)"),
    ],
)
def test_the_reservation_must_hold_the_maximum(available: int, expected: str, said: str) -> None:
    answers = account(
        **{"ec2:DescribeCapacityReservations": reservation(AvailableInstanceCount=available, TotalInstanceCount=4)}
    )
    line = check(run(settings_from_cli([*RESERVED, *RANGE]), FakeAws(answers))[1], "capacity reservation")
    assert line.status == expected and said in line.detail, line


def test_a_deployed_stacks_reservation_must_hold_the_maximum_in_all() -> None:
    answers = account(
        **{
            "cloudformation:DescribeStacks": {"Stacks": [deployed_stack("us-east-1c")]},
            "ec2:DescribeCapacityReservations": reservation(AvailableInstanceCount=1, TotalInstanceCount=3),
        }
    )
    line = check(run(settings_from_cli([*RESERVED, *RANGE]), FakeAws(answers))[1], "capacity reservation")
    assert line.status == "FAIL" and "3 in all, fewer than the 4 GPU nodes at their maximum" in line.detail, line
