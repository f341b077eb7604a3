"""Zone checks: the GPU AZ offers the types, is the AZ the stack would use, and is the physical zone recorded."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from settings import CONTEXT_FILE
from tools.preflight.base import Account, Result, pages

# Where --write-context records the account and zone ID of the GPU AZ. A key with ':' is
# a lookup result to settings/loading.py (never a setting), and plain context to the CDK CLI.
RECORD_KEY = "preflight:gpu-availability-zone"
_RECORD_FIELDS = ("account", "region", "zone", "zoneId")


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


def _available_zones(account: Account) -> list[dict[str, Any]]:
    """The region's available zones in EC2's order; learns each name's zone ID for this account."""
    described: list[dict[str, Any]] = account.client("ec2").describe_availability_zones(
        Filters=[{"Name": "state", "Values": ["available"]}]
    )["AvailabilityZones"]
    account.zone_ids = {z["ZoneName"]: z["ZoneId"] for z in described if z.get("ZoneName") and z.get("ZoneId")}
    return described


def gpu_zone(account: Account) -> list[Result]:
    """The GPU AZ offers the GPU type and the VPC's AZs offer the system type; with none chosen, pick one."""
    settings = account.settings
    gpu_type, system_type = settings.gpu_instance_type, settings.system_instance_type
    offers = _offerings(account, sorted({gpu_type, system_type}))
    described = _available_zones(account)
    listed = [z["ZoneName"] for z in described if z.get("ZoneName")]
    zones = [z["ZoneName"] for z in described if z.get("ZoneType", "availability-zone") == "availability-zone"]

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
    if account.deployed_az:
        default, how = account.deployed_az, "where it is deployed"
    elif settings.vpc_id is not None:
        default = account.private_subnet_azs[0] if account.private_subnet_azs else "?"
        how = "the VPC's first private subnet"
    else:
        azs, how = stack_default_azs(account, listed, zones)
        default = azs[0] if azs else "?"
    record = "python -m tools.preflight --write-context"
    if default not in offers[gpu_type]:
        return [
            Result(
                "FAIL",
                name,
                f"none chosen: the stack would use {default} ({how}), which does not offer {gpu_type}; "
                f"{pick} does (AZs offering both types: {both})",
                record,
            )
        ]
    return [
        Result(
            "WARN",
            name,
            f"none chosen: the stack would use {default} ({how}); picked {pick} (AZs offering both types: {both})",
            f"{record} (records {pick} in {CONTEXT_FILE})",
        )
    ]


def stack_default_azs(account: Account, listed: list[str], zones: list[str]) -> tuple[list[str], str]:
    """A new VPC's AZs when no GPU AZ is named, as the stack resolves them, and how; its GPU subnet takes the first.

    `listed`: the region's available zones in DescribeAvailabilityZones' order; `zones`: those that are AZs.
    """
    settings = account.settings
    region = settings.effective_region
    if settings.account and region:
        # A stack with an account and a region takes the CLI's AZ lookup: cdk.context.json's answer, else
        # DescribeAvailabilityZones' available zones in the order EC2 lists them (aws-cdk AZContextProviderPlugin).
        key = f"availability-zones:account={settings.account}:region={region}"
        cached = account.context.get(key)
        if isinstance(cached, list):
            return [str(z) for z in cached], f"{CONTEXT_FILE}'s {key}"
        return listed, "the CDK CLI's AZ lookup, in EC2's order"
    # An environment-agnostic stack gets Fn::Select over Fn::GetAZs: the AZs with a default subnet, in
    # alphabetical order, or every AZ when none has one (CloudFormation's Fn::GetAZs reference).
    default_subnet = [{"Name": "default-for-az", "Values": ["true"]}]
    with_default = {
        s["AvailabilityZone"]
        for s in pages(account.client("ec2"), "describe_subnets", "Subnets", Filters=default_subnet)
    }
    if with_default & set(zones):
        return sorted(with_default & set(zones)), "Fn::GetAZs: the first AZ, alphabetically, with a default subnet"
    return sorted(zones), "Fn::GetAZs: the first AZ alphabetically; no AZ has a default subnet"


def recorded_zone(account: Account) -> list[Result]:
    """The AZ --write-context recorded is still that physical zone: the same account, the same zone ID.

    An AZ name maps to a different zone in each account: a file copied to another account, or used
    with other credentials, would put the GPU nodes away from the capacity and reservation checked.
    """
    record: Any = account.context.get(RECORD_KEY)
    if record is None:
        return []
    name = "recorded GPU AZ"
    rewrite = "python -m tools.preflight --write-context"
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in _RECORD_FIELDS):
        return [Result("FAIL", name, f"{CONTEXT_FILE}'s {RECORD_KEY!r} is not what --write-context writes", rewrite)]
    zone, zone_id, owner = record["zone"], record["zoneId"], record["account"]
    if record["region"] != account.region:
        return [
            Result(
                "WARN",
                name,
                f"{CONTEXT_FILE} records {zone} ({zone_id}) in {record['region']}; this run is in {account.region}",
                rewrite,
            )
        ]
    if not account.zone_ids:
        _available_zones(account)
    here = account.zone_ids.get(zone)
    same = next((n for n, i in sorted(account.zone_ids.items()) if i == zone_id), None)
    problems = []
    if owner != account.account_id:
        problems.append(f"recorded for account {owner}, but these credentials are account {account.account_id}")
    if here != zone_id:
        where = f"{same} here" if same else "in no AZ of this account"
        problems.append(f"{zone} is {here or 'not an AZ'} here; the zone recorded, {zone_id}, is {where}")
    if problems:
        fixes = []
        if owner != account.account_id:
            fixes.append(f"use credentials for account {owner}")
        if same and same != zone:
            fixes.append(f"-c gpu_availability_zone={same} (the recorded zone)")
        fixes.append(f"{rewrite} (records a zone for account {account.account_id})")
        return [Result("FAIL", name, f"{zone} ({zone_id}): " + "; ".join(problems), ", or ".join(fixes))]
    if account.settings.gpu_availability_zone != zone:
        chosen = account.settings.gpu_availability_zone or "none"
        return [
            Result("WARN", name, f"{CONTEXT_FILE} records {zone} ({zone_id}); the settings choose {chosen}", rewrite)
        ]
    return [Result("PASS", name, f"{zone} is {zone_id} in account {owner}, as recorded")]
