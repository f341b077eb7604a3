"""preflight and the state of what is already there: the stack's status, and a capacity reservation it uses.

The account is tests/test_preflight.py's, where every check passes; each test changes one thing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from settings import settings_from_cli
from tests.support.aws_fakes import FakeAws, client_error
from tests.support.preflight_account import (
    GOOD,
    GVT,
    RESERVATION,
    RESERVED,
    ROLE,
    account,
    check,
    deployed_stack,
    preflight,
    project,
    quotas,
    reservation,
)
from tools.preflight.__main__ import main
from tools.preflight.checks import run


def stack(status: str, az: str | None = "us-east-1b") -> dict[str, Any]:
    """DescribeStacks: PdInference in this status; a stack whose create failed has no outputs."""
    found = {**deployed_stack(az or "us-east-1b"), "StackStatus": status}
    if az is None:
        del found["Outputs"]
    return {"Stacks": [found]}


# What the pinned CLI does with each (aws-cdk lib/index.js StackStatus.isCreationFailure and deployStack):
# ROLLBACK_COMPLETE and ROLLBACK_FAILED are deleted and created again; REVIEW_IN_PROGRESS and
# DELETE_IN_PROGRESS get a CREATE change set; DELETE_FAILED cannot be updated and must be deleted first.
NEVER_DEPLOYED = ["ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "REVIEW_IN_PROGRESS", "DELETE_IN_PROGRESS", "DELETE_FAILED"]


@pytest.mark.parametrize("status", NEVER_DEPLOYED)
def test_a_stack_that_is_not_really_deployed_needs_quota_for_everything(status: str) -> None:
    answers = account(
        **{
            "cloudformation:DescribeStacks": stack(status, az=None if status.startswith("ROLLBACK") else "us-east-1b"),
            # 4 vCPUs of g5 run already: 28 free, and the next deploy creates two g6.8xlarge (64).
            "service-quotas:GetServiceQuota": quotas(L_DB2E81BA=32),
        }
    )
    results = preflight(answers, *GOOD)
    line = check(results, GVT)
    assert line.status == "FAIL" and "need 64," in line.detail and "already deployed" not in line.detail, line
    # The new VPC's room is checked again: the next deploy creates the VPC, its EIPs and NAT gateways.
    assert [r.check for r in results if r.check in {"VPCs", "internet gateways", "Elastic IPs", "NAT gateways per AZ"}]
    said = check(results, "deployed stack")
    assert status in said.detail and said.status == ("FAIL" if status == "DELETE_FAILED" else "WARN")
    assert said.fix


@pytest.mark.parametrize(
    "status", ["CREATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE", "UPDATE_COMPLETE", "IMPORT_COMPLETE"]
)
def test_a_stack_whose_create_succeeded_is_deployed(status: str) -> None:
    answers = account(
        **{
            "cloudformation:DescribeStacks": stack(status),
            "service-quotas:GetServiceQuota": quotas(L_DB2E81BA=132),
        }
    )
    results = preflight(answers, *GOOD)
    assert "need 0 more (already deployed)" in check(results, GVT).detail
    assert not [r for r in results if r.check in {"VPCs", "deployed stack"}]


def test_the_az_of_a_failed_create_is_not_kept() -> None:
    # A failed create keeps no outputs in practice; even if it had some, nothing runs in that AZ.
    answers = account(**{"cloudformation:DescribeStacks": stack("ROLLBACK_COMPLETE", az="us-east-1c")})
    found, _ = run(settings_from_cli([f"cluster_admin_arns={ROLE}"]), FakeAws(answers))
    assert (found.deployed, found.deployed_az) == (False, None)


def test_write_context_may_move_a_stack_whose_create_failed(tmp_path: Path) -> None:
    root = project(tmp_path, {"region": "us-west-2", "gpu_availability_zone": "us-west-2b"})

    def stacks(_: dict[str, Any], region: str) -> dict[str, Any]:
        if region == "us-west-2":
            return stack("ROLLBACK_COMPLETE", az=None)
        return client_error("ValidationError", "Stack with id PdInference does not exist")

    args = ["--root", str(root), "--write-context", f"-ccluster_admin_arns={ROLE}", "-cregion=us-east-1"]
    args.append("-cgpu_availability_zone=us-east-1b")
    assert main(args, session=FakeAws(account(**{"cloudformation:DescribeStacks": stacks}))) == 0
    assert json.loads((root / "cdk.context.json").read_text())["region"] == "us-east-1"


# --- a capacity reservation the deployed stack already runs in ------------------------------------
def test_a_deployed_stack_running_in_its_reservation_passes() -> None:
    # Its two GPU nodes use the reservation's two instances: none is available, and none is missing.
    answers = account(
        **{
            "cloudformation:DescribeStacks": stack("UPDATE_COMPLETE", az="us-east-1c"),
            "ec2:DescribeCapacityReservations": reservation(AvailableInstanceCount=0),
        }
    )
    line = check(preflight(answers, *RESERVED), "capacity reservation")
    assert line.status == "PASS", line
    # Not deployed, the same reservation has no room for the nodes the deploy creates.
    line = check(
        preflight(account(**{"ec2:DescribeCapacityReservations": reservation(AvailableInstanceCount=0)}), *RESERVED),
        "capacity reservation",
    )
    assert line.status == "FAIL" and "0 available of the 2" in line.detail


def test_a_deployed_stack_with_a_reservation_too_small_fails() -> None:
    answers = account(
        **{
            "cloudformation:DescribeStacks": stack("UPDATE_COMPLETE", az="us-east-1c"),
            "ec2:DescribeCapacityReservations": reservation(TotalInstanceCount=1, AvailableInstanceCount=0),
        }
    )
    line = check(preflight(answers, *RESERVED), "capacity reservation")
    assert line.status == "FAIL" and "1 in all" in line.detail, line


# --- reservation attributes the launch needs -----------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"InstancePlatform": "Windows"}, "platform Windows"),
        ({"InstancePlatform": "Red Hat Enterprise Linux"}, "platform Red Hat Enterprise Linux"),
        (
            {"PlacementGroupArn": "arn:aws:ec2:us-east-1:123456789012:placement-group/training"},
            "placement-group/training",
        ),
        ({"ReservationType": "capacity-block"}, "Capacity Block"),
    ],
)
def test_a_reservation_the_nodes_cannot_launch_into_fails(changes: dict[str, Any], said: str) -> None:
    answers = account(**{"ec2:DescribeCapacityReservations": reservation(**changes)})
    line = check(preflight(answers, *RESERVED), "capacity reservation")
    assert line.status == "FAIL" and said in line.detail and RESERVATION in line.detail, line


def test_a_linux_reservation_outside_a_placement_group_passes() -> None:
    answers = account(
        **{"ec2:DescribeCapacityReservations": reservation(InstancePlatform="Linux/UNIX", ReservationType="default")}
    )
    assert check(preflight(answers, *RESERVED), "capacity reservation").status == "PASS"
