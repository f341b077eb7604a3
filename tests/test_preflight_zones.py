"""preflight and AZ names: which AZ the stack would use, and whether the recorded one is still the same zone.

An AZ name maps to a different physical zone (zone ID) in each account. The account is
tests/test_preflight.py's: us-east-1b is use1-az6 there, and only us-east-1b and us-east-1c
offer the GPU type.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from settings import settings_from_cli
from tests.support.aws_fakes import Answer, FakeAws
from tests.support.preflight_account import (
    ACCOUNT,
    GOOD,
    ROLE,
    ZONE_IDS,
    account,
    check,
    default_subnets,
    offerings,
    project,
    zones,
)
from tools.preflight.__main__ import main
from tools.preflight.base import Result
from tools.preflight.checks import run
from tools.preflight.zones import RECORD_KEY

OTHER = "210987654321"
RECORDED = "recorded GPU AZ"


def record(**changes: str) -> dict[str, Any]:
    """What --write-context records for us-east-1b in ACCOUNT."""
    return {
        RECORD_KEY: {"account": ACCOUNT, "region": "us-east-1", "zone": "us-east-1b", "zoneId": "use1-az6", **changes}
    }


def caller(account_id: str) -> dict[str, Any]:
    arn = f"arn:aws:sts::{account_id}:assumed-role/Deployer/alice"
    return {"Account": account_id, "Arn": arn, "UserId": "AROAEXAMPLEID1234567:alice"}


def preflight(answers: dict[tuple[str, str], Answer], context: dict[str, Any], *pairs: str) -> list[Result]:
    return run(settings_from_cli(list(pairs)), FakeAws(answers), context)[1]


# --- the recorded zone ---------------------------------------------------------------------------
def test_a_recorded_zone_in_its_own_account_passes() -> None:
    line = check(preflight(account(), record(), *GOOD), RECORDED)
    assert line.status == "PASS" and "use1-az6" in line.detail


def test_a_recorded_zone_used_from_another_account_fails() -> None:
    # In the other account, us-east-1b is another zone; the recorded use1-az6 is called us-east-1d there.
    ids = dict(ZONE_IDS, **{"us-east-1b": "use1-az2", "us-east-1d": "use1-az6"})
    answers = account(**{"sts:GetCallerIdentity": caller(OTHER), "ec2:DescribeAvailabilityZones": zones(ids)})
    line = check(preflight(answers, record(), *GOOD), RECORDED)
    assert line.status == "FAIL", line
    assert f"recorded for account {ACCOUNT}" in line.detail and f"account {OTHER}" in line.detail
    assert "us-east-1b is use1-az2 here" in line.detail
    assert f"use credentials for account {ACCOUNT}" in line.fix
    assert "-c gpu_availability_zone=us-east-1d" in line.fix and "--write-context" in line.fix


def test_a_recorded_zone_id_that_the_name_no_longer_means_fails() -> None:
    # The same account, but the file says us-east-1b is use1-az1 (it was written elsewhere and copied).
    line = check(preflight(account(), record(zoneId="use1-az1"), *GOOD), RECORDED)
    assert line.status == "FAIL" and "us-east-1b is use1-az6 here" in line.detail, line
    assert "-c gpu_availability_zone=us-east-1c" in line.fix


def test_only_another_account_fails_even_where_the_names_match() -> None:
    answers = account(**{"sts:GetCallerIdentity": caller(OTHER)})
    line = check(preflight(answers, record(), *GOOD), RECORDED)
    assert line.status == "FAIL" and f"recorded for account {ACCOUNT}" in line.detail, line


def test_a_record_that_is_not_what_write_context_writes_fails() -> None:
    line = check(preflight(account(), {RECORD_KEY: {"zone": "us-east-1b"}}, *GOOD), RECORDED)
    assert line.status == "FAIL" and "--write-context" in line.fix


def test_nothing_recorded_is_no_line() -> None:
    assert not [r for r in preflight(account(), {}, *GOOD) if r.check == RECORDED]


def test_the_command_reads_the_record_from_cdk_context_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path, {"region": "us-east-1", "gpu_availability_zone": "us-east-1b", **record()})
    answers = account(**{"sts:GetCallerIdentity": caller(OTHER)})
    assert main(["--root", str(root), f"-ccluster_admin_arns={ROLE}"], session=FakeAws(answers)) == 1
    assert "FAIL  recorded GPU AZ" in capsys.readouterr().out
    # The loader never takes the record for a setting: cdk synth reads the same file.
    assert settings_from_cli([], root=root).gpu_availability_zone == "us-east-1b"


def test_write_context_then_another_account_fails(tmp_path: Path) -> None:
    root = project(tmp_path)
    args = ["--root", str(root), f"-ccluster_admin_arns={ROLE}"]
    assert main([*args, "--write-context", "-cgpu_availability_zone=us-east-1b"], session=FakeAws(account())) == 0
    assert json.loads((root / "cdk.context.json").read_text())[RECORD_KEY]["account"] == ACCOUNT
    assert main(args, session=FakeAws(account())) == 0
    assert main(args, session=FakeAws(account(**{"sts:GetCallerIdentity": caller(OTHER)}))) == 1


# --- the AZ an unchosen stack would use -------------------------------------------------------------
GPU_AZ = "GPU availability zone"


def test_an_environment_agnostic_stack_uses_the_first_az_with_a_default_subnet() -> None:
    # Fn::GetAZs lists the AZs with a default subnet, alphabetically: us-east-1a's was deleted.
    answers = account(**{"ec2:DescribeSubnets": default_subnets(["us-east-1c", "us-east-1b", "us-east-1e"])})
    line = check(preflight(answers, {}, f"cluster_admin_arns={ROLE}"), GPU_AZ)
    assert line.status == "WARN" and "would use us-east-1b (Fn::GetAZs" in line.detail, line


def test_with_no_default_subnet_fn_getazs_lists_every_az() -> None:
    answers = account(**{"ec2:DescribeSubnets": default_subnets([])})
    line = check(preflight(answers, {}, f"cluster_admin_arns={ROLE}"), GPU_AZ)
    assert line.status == "FAIL" and "would use us-east-1a (Fn::GetAZs" in line.detail, line


def test_a_stack_with_an_account_and_region_uses_the_cli_lookup() -> None:
    pinned = [f"cluster_admin_arns={ROLE}", f"account={ACCOUNT}", "region=us-east-1"]
    key = f"availability-zones:account={ACCOUNT}:region=us-east-1"
    line = check(preflight(account(), {key: ["us-east-1c", "us-east-1a"]}, *pinned), GPU_AZ)
    assert line.status == "WARN" and f"would use us-east-1c (cdk.context.json's {key})" in line.detail, line
    # Not yet looked up: the CLI takes EC2's order, which need not be alphabetical.
    listed = dict(sorted(ZONE_IDS.items(), reverse=True))
    answers = account(
        **{
            "ec2:DescribeAvailabilityZones": zones(listed),
            "ec2:DescribeInstanceTypeOfferings": offerings(g6_8xlarge=["us-east-1f", "us-east-1b"]),
        }
    )
    line = check(preflight(answers, {}, *pinned), GPU_AZ)
    assert line.status == "WARN" and "would use us-east-1f (the CDK CLI's AZ lookup" in line.detail, line
