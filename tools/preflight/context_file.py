"""Record the checked GPU AZ and region in cdk.context.json, where `cdk synth` reads them offline.

Beside them, under a lookup-style key the settings never read, the account and the zone ID
that AZ name meant there: preflight checks them on every later run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from settings.project import STACK_NAME
from tools.preflight.account import describe_stack, is_deployed, stack_outputs
from tools.preflight.base import Account
from tools.preflight.zones import RECORD_KEY

REPLACE_FLAG = "--replace-deployed-cluster"


class RefusedError(Exception):
    """Writing would move a deployed stack: one line saying what it would replace."""


def _deployed_az(account: Account, region: str) -> str | bool | None:
    """The GPU AZ of this stack deployed in `region`; False when it is not deployed there."""
    stack = describe_stack(account.session.client("cloudformation", region_name=region))
    if stack is None or not is_deployed(str(stack["StackStatus"])):
        return False
    return stack_outputs(stack).get("GpuNodeAvailabilityZone")


def write_context(account: Account, path: Path, *, replace_deployed: bool = False) -> dict[str, Any]:
    """Merge region, gpu_availability_zone and the zone record into the context file; returns what was written.

    Raises RefusedError when the stack is deployed elsewhere, unless replace_deployed.
    """
    if account.chosen_az is None:
        raise RefusedError("no GPU availability zone passed the checks: nothing to record")
    existing: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    recorded_region = existing.get("region")
    if not replace_deployed:
        if account.deployed and account.deployed_az and account.deployed_az != account.chosen_az:
            raise RefusedError(
                f"{STACK_NAME} is deployed with its GPU nodes in {account.deployed_az}: recording "
                f"{account.chosen_az} would replace its subnets, node groups and cluster on the next deploy; "
                f"pass {REPLACE_FLAG} to record it anyway"
            )
        moved = recorded_region and recorded_region != account.region
        if moved and _deployed_az(account, str(recorded_region)) is not False:
            raise RefusedError(
                f"{STACK_NAME} is deployed in {recorded_region}: recording {account.region} makes the next deploy "
                f"create a second cluster there and leaves the one in {recorded_region} running; "
                f"pass {REPLACE_FLAG} to record it anyway"
            )
    written: dict[str, Any] = {"region": account.region, "gpu_availability_zone": account.chosen_az}
    zone_id = account.zone_ids.get(account.chosen_az)
    if zone_id:
        # The zone the checks saw, for this account: an AZ name means another zone in another account.
        record = {"account": account.account_id, "region": account.region, "zone": account.chosen_az, "zoneId": zone_id}
        written[RECORD_KEY] = record
    path.write_text(json.dumps({**existing, **written}, indent=2) + "\n", encoding="utf-8")
    return written
