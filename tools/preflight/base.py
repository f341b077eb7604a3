"""What every check shares: the Result line, the Account it learns into, and the guard around each check.

A check that cannot run because the caller may not make a call warns (naming the
IAM action) instead of failing: the deploy may still work, but nobody checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from settings import Settings, catalog

Status = Literal["PASS", "WARN", "FAIL"]
_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess"}


@dataclass(frozen=True)
class Result:
    """One line of the table; a FAIL carries the one command or setting that fixes it."""

    status: Status
    check: str
    detail: str
    fix: str = ""


class Session(Protocol):
    """What preflight needs of a boto3 Session."""

    region_name: str | None

    def client(self, service_name: str, region_name: str | None = None) -> Any: ...


class CannotCheckError(Exception):
    """Nothing can be checked (no credentials, no region): one line, then exit."""


@dataclass
class Account:
    """What the checks learn as they go, for the checks after them."""

    settings: Settings
    session: Session
    region: str = ""
    region_from_settings: bool = True
    account_id: str = ""
    caller_arn: str = ""
    deployed_az: str | None = None
    deployed: bool = False
    gpu_vcpus: int = 0
    system_vcpus: int = 0
    reservation_az: str | None = None
    private_subnet_azs: list[str] = field(default_factory=list)
    chosen_az: str | None = None
    # The project's CDK context (cdk.json, cdk.context.json, -c): lookups and what --write-context recorded.
    context: Mapping[str, Any] = field(default_factory=dict)
    zone_ids: dict[str, str] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        return self.session.client(service, region_name=self.region)


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0]


def error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def guarded(name: str, check: Callable[[Account], list[Result]]) -> Callable[[Account], list[Result]]:
    """Run a check; an IAM denial becomes a WARN naming the action; any other error that check's FAIL."""

    def run(account: Account) -> list[Result]:
        try:
            return check(account)
        except ClientError as err:
            operation = err.operation_name
            if error_code(err) in _DENIED:
                denied = f"not checked: {operation} was denied"
                return [Result("WARN", name, denied, "attach tools/preflight/iam-policy.json")]
            message = str(err.response.get("Error", {}).get("Message", err)).splitlines()[0]
            return [Result("FAIL", name, f"{operation}: {error_code(err)}: {message}")]
        except BotoCoreError as err:
            unreachable = f"not checked: {type(err).__name__}: {first_line(err)}"
            return [Result("FAIL", name, unreachable, "check the network, proxy and region, then run preflight again")]
        except Exception as err:
            # One check's surprise (an answer without a field it expected) must not hide the others.
            surprise = f"not checked: preflight stopped on {type(err).__name__}: {first_line(err)}"
            return [Result("FAIL", name, surprise, "a preflight defect: report this line")]

    return run


def pages(client: Any, operation: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
    for page in client.get_paginator(operation).paginate(**params):
        yield from page.get(key, [])


def quota_value(account: Account, quota: catalog.Quota) -> float:
    client = account.client("service-quotas")
    try:
        return float(client.get_service_quota(ServiceCode=quota.service, QuotaCode=quota.code)["Quota"]["Value"])
    except ClientError as err:
        # A quota never adjusted in this account may have no applied value.
        if error_code(err) != "NoSuchResourceException":
            raise
    default = client.get_aws_default_service_quota(ServiceCode=quota.service, QuotaCode=quota.code)
    return float(default["Quota"]["Value"])
