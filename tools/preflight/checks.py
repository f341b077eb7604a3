"""The account checks in the order they run: one Result per line of the table.

Every check reads the same Settings `cdk synth` reads. Each lives with its kind:
account.py (credentials, bootstrap, the deployed stack, versions, admin), secrets.py
(the token's and the API keys' secrets and their KMS keys), registry.py (the image
cache's prefix and repository), capacity.py (instance
types and EFA, reservation, vCPU quotas), zones.py (the GPU AZ's offering, the AZ
the stack would use, the recorded zone ID) and network.py (existing VPC, room for
a new one); base.py holds what they share. A check learns
into the Account what later checks read, so the order matters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from settings import Settings
from tools.preflight.account import (
    bootstrap,
    cluster_admin,
    deployed_stack,
    identity,
    kubernetes_version,
)
from tools.preflight.arns import setting_arns
from tools.preflight.base import Account, Result, Session, guarded
from tools.preflight.capacity import capacity_reservation, efa, vcpu_quotas
from tools.preflight.gpu_ami import gpu_ami_release
from tools.preflight.network import existing_vpc, vpc_room
from tools.preflight.registry import image_cache
from tools.preflight.secrets import endpoint_keys_secret, token_secret
from tools.preflight.zones import gpu_zone, recorded_zone

CHECKS: tuple[tuple[str, Callable[[Account], list[Result]]], ...] = (
    ("CDK bootstrap", bootstrap),
    ("deployed stack", deployed_stack),
    ("Kubernetes version", kubernetes_version),
    ("GPU AMI release", gpu_ami_release),
    ("EFA", efa),
    ("capacity reservation", capacity_reservation),
    ("existing VPC", existing_vpc),
    ("GPU availability zone", gpu_zone),
    ("recorded GPU AZ", recorded_zone),
    ("vCPU quotas", vcpu_quotas),
    ("new VPC", vpc_room),
    ("token secret", token_secret),
    ("API keys secret", endpoint_keys_secret),
    ("image cache", image_cache),
    ("cluster admin", cluster_admin),
    ("setting ARNs", setting_arns),
)


def run(settings: Settings, session: Session, context: Mapping[str, Any] | None = None) -> tuple[Account, list[Result]]:
    """Every check in order; `context` is the CDK context the settings came from.

    Raises CannotCheckError when nothing can be checked.
    """
    account = Account(settings=settings, session=session, context=dict(context or {}))
    results = identity(account)
    for name, check in CHECKS:
        results.extend(guarded(name, check)(account))
    return account, results
