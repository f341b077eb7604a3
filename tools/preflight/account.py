"""Account checks: credentials and region, CDK bootstrap, the deployed stack, EKS version, cluster admin."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from settings import catalog
from settings.project import STACK_NAME
from tools.preflight.base import Account, CannotCheckError, Result, error_code, first_line

# The CLI's own bootstrap template: `cdk bootstrap` with the pinned CLI installs this version.
CLI_BOOTSTRAP_TEMPLATE = (
    Path(__file__).resolve().parents[2] / "node_modules/aws-cdk/lib/api/bootstrap/bootstrap-template.yaml"
)
_README_ADMIN_WARNING = (
    "the cluster is created by CloudFormation's role: without an access entry for you, "
    "kubectl and make verify are refused"
)


# --- credentials and region ------------------------------------------------------
def identity(account: Account) -> list[Result]:
    """Who is calling, in which account and region. Raises CannotCheckError without credentials."""
    from botocore.exceptions import NoCredentialsError, NoRegionError, PartialCredentialsError

    settings = account.settings
    account.region = settings.effective_region or account.session.region_name or ""
    account.region_from_settings = settings.effective_region is not None
    if not account.region:
        raise CannotCheckError(
            "no AWS region: set AWS_REGION (the CDK CLI reads it too) or a profile's region, or -c region=<region>"
        )
    try:
        caller = account.client("sts").get_caller_identity()
    except (NoCredentialsError, PartialCredentialsError):
        raise CannotCheckError(
            "no AWS credentials found: set AWS_PROFILE or run `aws configure` / `aws sso login`"
        ) from None
    except NoRegionError:
        raise CannotCheckError("no AWS region: set AWS_REGION or -c region=<region>") from None
    except ClientError as err:
        raise CannotCheckError(f"the AWS credentials were refused: {error_code(err)}") from None
    except BotoCoreError as err:
        raise CannotCheckError(f"could not reach AWS: {type(err).__name__}: {first_line(err)}") from None
    account.account_id, account.caller_arn = caller["Account"], caller["Arn"]
    results = []
    if settings.account and settings.account != account.account_id:
        results.append(
            Result(
                "FAIL",
                "credentials",
                f"{account.caller_arn} is in account {account.account_id}, the settings name {settings.account}",
                f"use credentials for {settings.account}, or -c account={account.account_id}",
            )
        )
    else:
        results.append(Result("PASS", "credentials", f"{account.caller_arn} (account {account.account_id})"))
    if account.region_from_settings:
        results.append(Result("PASS", "region", f"{account.region} (from the settings)"))
    else:
        results.append(
            Result(
                "WARN",
                "region",
                f"{account.region} comes from your AWS profile, not the settings: another shell may deploy elsewhere",
                "python -m tools.preflight --write-context (records it in cdk.context.json)",
            )
        )
    return results


def cli_bootstrap_version(template: Path = CLI_BOOTSTRAP_TEMPLATE) -> int | None:
    """The bootstrap version the pinned CLI's `cdk bootstrap` installs (its template's CdkBootstrapVersion)."""
    if not template.exists():
        return None
    text = template.read_text(encoding="utf-8")
    block = text[text.index("  CdkBootstrapVersion:") :]
    found = re.search(r"Value: '(\d+)'", block)
    return int(found.group(1)) if found else None


def bootstrap(account: Account) -> list[Result]:
    """The version the template's CheckBootstrapVersion rule reads from SSM."""
    # make bootstrap runs the pinned CLI in the settings' account and region (tools/preflight/target.py).
    fix = f"make bootstrap SETTINGS=<your settings file> (cdk bootstrap aws://{account.account_id}/{account.region})"
    parameter = f"/cdk-bootstrap/{catalog.CDK_BOOTSTRAP_QUALIFIER}/version"
    try:
        value = account.client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"]
    except ClientError as err:
        if error_code(err) == "ParameterNotFound":
            return [Result("FAIL", "CDK bootstrap", f"{account.region} is not bootstrapped ({parameter} missing)", fix)]
        raise
    version = int(value)
    needed = catalog.CDK_BOOTSTRAP_MIN_VERSION
    if account.settings.vpc_id is not None:
        needed = catalog.CDK_BOOTSTRAP_LOOKUP_MIN_VERSION
    if version < needed:
        return [Result("FAIL", "CDK bootstrap", f"version {version}; this stack needs {needed} or later", fix)]
    current = cli_bootstrap_version()
    if current is not None and version < current:
        return [
            Result(
                "WARN",
                "CDK bootstrap",
                f"version {version} works, but the pinned CLI installs {current}; its fixes are not in this account",
                fix,
            )
        ]
    return [Result("PASS", "CDK bootstrap", f"version {version} (needs {needed})")]


def is_deployed(status: str) -> bool:
    """Whether a stack in this status holds its resources, so that the next deploy updates them.

    The pinned CLI deletes a stack whose create failed (ROLLBACK_COMPLETE, ROLLBACK_FAILED) and
    creates it again; it creates over REVIEW_IN_PROGRESS and DELETE_IN_PROGRESS (aws-cdk
    lib/index.js, StackStatus.isCreationFailure and deployStack). Only a create that succeeded
    leaves resources an update keeps: CREATE_COMPLETE, then every UPDATE_ and IMPORT_ status.
    """
    return status == "CREATE_COMPLETE" or status.startswith(("UPDATE_", "IMPORT_"))


def describe_stack(client: Any) -> dict[str, Any] | None:
    """This stack as DescribeStacks has it, or None when there is none."""
    try:
        stacks: list[dict[str, Any]] = client.describe_stacks(StackName=STACK_NAME)["Stacks"]
    except ClientError as err:
        if error_code(err) == "ValidationError":
            return None
        raise
    return stacks[0]


def stack_outputs(stack: dict[str, Any]) -> dict[str, str | None]:
    return {o["OutputKey"]: o.get("OutputValue") for o in stack.get("Outputs", [])}


def deployed_stack(account: Account) -> list[Result]:
    """Whether this stack is deployed here, and in which GPU AZ; a line only when it is there but not deployed."""
    stack = describe_stack(account.client("cloudformation"))
    if stack is None:
        return []
    status = str(stack["StackStatus"])
    if is_deployed(status):
        account.deployed = True
        account.deployed_az = stack_outputs(stack).get("GpuNodeAvailabilityZone")
        return []
    region = f"--stack-name {STACK_NAME} --region {account.region}"
    counted = "counted as not deployed: the next deploy creates every resource, and the checks below count them"
    if status == "DELETE_FAILED":
        return [
            Result(
                "FAIL",
                "deployed stack",
                f"{STACK_NAME} is DELETE_FAILED: CloudFormation updates it no more; {counted}",
                f"aws cloudformation describe-stack-events {region}, remove what blocks the delete, then "
                f"aws cloudformation delete-stack {region}",
            )
        ]
    why = "its create failed; the next deploy deletes it first" if status.startswith("ROLLBACK_") else "not deployed"
    return [
        Result(
            "WARN",
            "deployed stack",
            f"{STACK_NAME} is {status} ({why}); {counted}",
            f"aws cloudformation describe-stack-events {region} (why it stopped)",
        )
    ]


# --- EKS and instance types ----------------------------------------------------------
def kubernetes_version(account: Account) -> list[Result]:
    wanted = account.settings.kubernetes_version
    versions = account.client("eks").describe_cluster_versions(clusterVersions=[wanted])["clusterVersions"]
    found = [v for v in versions if v.get("clusterVersion") == wanted]
    status = found[0].get("versionStatus") if found else None
    offered = sorted(catalog.KUBERNETES_VERSIONS)
    if status == "STANDARD_SUPPORT":
        return [Result("PASS", "Kubernetes version", f"{wanted}: standard support in {account.region}")]
    if status == "EXTENDED_SUPPORT":
        end = found[0].get("endOfExtendedSupportDate")
        return [
            Result(
                "WARN",
                "Kubernetes version",
                f"{wanted} is in extended support (a higher hourly control-plane price) until {end:%Y-%m-%d}"
                if end
                else f"{wanted} is in extended support (a higher hourly control-plane price)",
                f"-c kubernetes_version={offered[-1]}",
            )
        ]
    return [
        Result(
            "FAIL",
            "Kubernetes version",
            f"EKS does not create {wanted} clusters in {account.region}",
            f"-c kubernetes_version={offered[-1]}",
        )
    ]


# --- cluster access ----------------------------------------------------------------
_ASSUMED = re.compile(r"^arn:(aws[a-z-]*):sts::(\d{12}):assumed-role/([^/]+)/")


def _role_name(arn: str) -> str | None:
    """The role name of an IAM role ARN, without its path."""
    found = re.match(r"^arn:aws[a-z-]*:iam::\d{12}:role/(?:.*/)?([^/]+)$", arn)
    return found.group(1) if found else None


def deployed_template(account: Account) -> dict[str, Any]:
    """The deployed stack's template, as it was submitted."""
    body: Any = account.client("cloudformation").get_template(StackName=STACK_NAME, TemplateStage="Original")[
        "TemplateBody"
    ]
    template: dict[str, Any] = json.loads(body) if isinstance(body, str) else body
    return template


def deployed_admins(account: Account) -> set[str]:
    """The principals the deployed stack's template gives an EKS access entry."""
    template = deployed_template(account)
    return {
        str(resource["Properties"]["PrincipalArn"])
        for resource in template.get("Resources", {}).values()
        if resource.get("Type") == "AWS::EKS::AccessEntry"
        and isinstance(resource["Properties"].get("PrincipalArn"), str)
    }


def cluster_admin(account: Account) -> list[Result]:
    settings = account.settings
    iam = account.client("iam")
    results = []
    problems, fixed = [], []
    for arn in settings.cluster_admin_arns:
        fixed.append(arn)
        name = _role_name(arn)
        if name is None or f":{account.account_id}:" not in arn:
            continue
        try:
            actual = iam.get_role(RoleName=name)["Role"]["Arn"]
        except ClientError as err:
            if error_code(err) != "NoSuchEntity":
                raise
            problems.append(f"cluster_admin_arns names {arn}, which does not exist: EKS refuses its access entry")
            fixed[-1] = "<your role's ARN, path included>"
            continue
        if actual != arn:
            problems.append(f"cluster_admin_arns names {arn}; the role's ARN is {actual} (with its path)")
            fixed[-1] = actual
    if problems:
        # Every bad ARN at once: EKS refuses the whole deploy for any one of them.
        return [Result("FAIL", "cluster admin", "; ".join(problems), f"-c cluster_admin_arns={','.join(fixed)}")]
    caller = account.caller_arn
    assumed = _ASSUMED.match(caller)
    if assumed:
        caller = iam.get_role(RoleName=assumed.group(3))["Role"]["Arn"]
    if caller in settings.cluster_admin_arns:
        results.append(Result("PASS", "cluster admin", f"{caller} gets cluster admin"))
    elif account.deployed and caller in (granted := deployed_admins(account)):
        # The settings, not the deployed stack, decide the access entries: a deploy from a settings
        # file or a command line that forgot the caller deletes the caller's own entry.
        kept = sorted({*settings.cluster_admin_arns, *granted})
        results.append(
            Result(
                "FAIL",
                "cluster admin",
                f"this deploy removes the access entry of {caller}, who has one in the deployed {STACK_NAME}: "
                "kubectl and make verify would be refused",
                f"-c cluster_admin_arns={','.join(kept)} (or the same SETTINGS file as the last deploy)",
            )
        )
    else:
        results.append(
            Result(
                "WARN",
                "cluster admin",
                f"{caller} is not in cluster_admin_arns: {_README_ADMIN_WARNING}",
                # The admins already named stay: the setting replaces the whole list.
                f"-c cluster_admin_arns={','.join([*settings.cluster_admin_arns, caller])}",
            )
        )
    return results
