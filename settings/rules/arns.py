"""ARNs in the stack's own region and account, where the settings name them (region, account, or a GPU AZ).

Where they do not, the stack deploys wherever the CLI points, and preflight compares the ARNs with the
region and account it finds (tools/preflight/arns.py). What each ARN allows:
- ACM certificates are regional, and a load balancer uses only its own account's (ACM has no cross-account
  certificate use): the region and the account must match.
- KMS keys are regional, and Secrets Manager encrypts a secret with a key of its own region; another
  account's key is allowed (CreateSecret KmsKeyId: "To use a KMS key in a different account, use the key
  ARN"): only the region must match.
- IAM is global, and an EKS access entry of type STANDARD may name another account's principal (EKS user
  guide, "Create access entries"): cluster_admin_arns is not checked here.
"""

from __future__ import annotations

from dataclasses import dataclass

from settings.model import Settings
from settings.rules.base import require


@dataclass(frozen=True)
class RegionalArn:
    setting: str
    service: str
    same_account: bool


REGIONAL_ARNS: tuple[RegionalArn, ...] = (
    RegionalArn("endpoint_tls_certificate_arn", "ACM certificate", same_account=True),
    RegionalArn("hf_token_kms_key_arn", "KMS key", same_account=False),
    RegionalArn("endpoint_api_keys_kms_key_arn", "KMS key", same_account=False),
)


def arn_region_account(arn: str) -> tuple[str, str]:
    """(region, account) of an ARN, arn:<partition>:<service>:<region>:<account>:<resource>."""
    parts = arn.split(":", 5)
    return (parts[3], parts[4]) if len(parts) == 6 else ("", "")


def arn_mismatch(entry: RegionalArn, arn: str, region: str | None, account: str | None) -> str | None:
    """What is wrong with the ARN for a stack in this region and account (None: unknown), or None."""
    arn_region, arn_account = arn_region_account(arn)
    if region and arn_region != region:
        return f"a {entry.service} in the stack's region {region}, not {arn_region} ({entry.service}s are regional)"
    if entry.same_account and account and arn_account != account:
        return f"a {entry.service} of the stack's account {account}, not {arn_account} (none is used across accounts)"
    return None


def check_arn_placement(s: Settings) -> None:
    """Each regional ARN setting in the stack's region, and the certificate in its account, where they are known."""
    for entry in REGIONAL_ARNS:
        arn = getattr(s, entry.setting)
        if arn is None:
            continue
        wrong = arn_mismatch(entry, arn, s.effective_region, s.account)
        require(wrong is None, entry.setting, arn, wrong or "")
