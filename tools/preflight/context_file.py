"""Record the checked GPU AZ and region in cdk.context.json, where `cdk synth` reads them offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tools.preflight.account import describe_stack, is_deployed, stack_outputs
from tools.preflight.base import STACK_NAME, Account

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
    """Merge region and gpu_availability_zone into the context file; returns what was written.

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
    written = {"region": account.region, "gpu_availability_zone": account.chosen_az}
    path.write_text(json.dumps({**existing, **written}, indent=2) + "\n", encoding="utf-8")
    return written
