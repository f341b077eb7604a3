"""Secrets checks: the model token's secret, the API keys' secret, and the KMS key of each.

External Secrets reads each secret with its Pod Identity role, which may decrypt only with the
keys the settings name. A secret it cannot read fails quietly: without the token the model
download is refused; without the keys no Kubernetes Secret is made, and every Ray pod, which
mounts it, waits in ContainerCreating.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from tools.preflight.base import Account, Result, Status, error_code, guarded

# The ingress ignores a key shorter than this, and its replica does not start without one
# (ray_pods/api_keys.py MIN_KEY_LENGTH, which runs in the Ray pods and imports nothing of the
# product's; a test keeps the two equal).
API_KEY_MIN_LENGTH = 16
KEYS_SHAPE = f'{{"<key id>": "<key of {API_KEY_MIN_LENGTH}+ characters>", ...}}'
KEYS_VALUE = f", keys.json holding {KEYS_SHAPE}"


@dataclass(frozen=True)
class _Secret:
    """What the checks of one secret say about it."""

    check: str
    name: str
    # The setting that names the secret's customer-managed KMS key, and its value.
    key_setting: str
    key_configured: str | None
    # A customer-managed key the setting does not name: the token's is a WARN (a model without a
    # gate needs no token), the keys' a FAIL (the Ray pods cannot start).
    unnamed_key: Status
    without_grant: str
    value_file: str
    # What the value must be, said after the command that writes it.
    value_shape: str = ""


def _described(account: Account, secret: _Secret) -> tuple[list[Result], dict[str, Any] | None]:
    """DescribeSecret: the secret exists, is not scheduled for deletion, and has a current value."""
    name, region = secret.name, account.region
    put = f"aws secretsmanager put-secret-value --secret-id {name} --secret-string {secret.value_file}"
    put += f" --region {region}{secret.value_shape}"
    try:
        found: dict[str, Any] = account.client("secretsmanager").describe_secret(SecretId=name)
    except ClientError as err:
        if error_code(err) == "ResourceNotFoundException":
            create = f"aws secretsmanager create-secret --name {name} --secret-string {secret.value_file}"
            create += f" --region {region}{secret.value_shape}"
            return [Result("FAIL", secret.check, f"no secret {name!r} in {region}", create)], None
        raise
    if found.get("DeletedDate"):
        restore = f"aws secretsmanager restore-secret --secret-id {name}"
        return [Result("FAIL", secret.check, f"{name!r} is scheduled for deletion", restore)], None
    if not any("AWSCURRENT" in stages for stages in found.get("VersionIdsToStages", {}).values()):
        return [Result("FAIL", secret.check, f"{name!r} has no current value", put)], None
    return [Result("PASS", secret.check, f"{name!r} exists with a current value")], found


def _kms_key(account: Account, secret: _Secret, key: str | None) -> list[Result]:
    """The secret's KMS key against the setting that grants External Secrets kms:Decrypt on it."""
    check, setting, configured = f"{secret.check} key", secret.key_setting, secret.key_configured
    if not key:
        if configured is not None:
            return [
                Result(
                    "WARN",
                    check,
                    f"{setting} is {configured}, but the secret uses Secrets Manager's AWS managed key: "
                    "the grant is unused",
                    f"-c {setting}=none",
                )
            ]
        return [Result("PASS", check, "Secrets Manager's AWS managed key: no grant needed")]
    metadata = account.client("kms").describe_key(KeyId=key)["KeyMetadata"]
    arn = metadata["Arn"]
    if metadata.get("KeyManager") == "AWS":
        return [Result("PASS", check, f"{arn} is AWS managed: no grant needed")]
    if configured == arn:
        return [Result("PASS", check, f"{arn}: the External Secrets role may decrypt with it")]
    if configured is None:
        return [
            Result(
                secret.unnamed_key,
                check,
                f"the secret is encrypted with the customer-managed key {arn}; without kms:Decrypt "
                f"the External Secrets role cannot read it and {secret.without_grant}",
                f"-c {setting}={arn} (the key policy must also let this account's IAM policies grant it)",
            )
        ]
    detail = f"{setting} is {configured}, but the secret is encrypted with {arn}"
    return [Result("FAIL", check, detail, f"-c {setting}={arn}")]


def _secret_checks(account: Account, secret: _Secret) -> tuple[list[Result], bool]:
    """The secret's own line and its key's; True when it exists with a current value."""
    results, found = _described(account, secret)
    if found is None:
        return results, False
    key = found.get("KmsKeyId")
    results.extend(guarded(f"{secret.check} key", lambda a: _kms_key(a, secret, key))(account))
    return results, True


# --- the model token ---------------------------------------------------------------
def token_secret(account: Account) -> list[Result]:
    settings = account.settings
    if settings.hf_token_secret_name is None:
        return []
    secret = _Secret(
        check="token secret",
        name=settings.hf_token_secret_name,
        key_setting="hf_token_kms_key_arn",
        key_configured=settings.hf_token_kms_key_arn,
        unnamed_key="WARN",
        without_grant="the model token never reaches the pods",
        value_file="file://token.txt",
    )
    return _secret_checks(account, secret)[0]


# --- the endpoint's API keys ------------------------------------------------------------
KEYS_CHECK = "API keys secret"


def endpoint_keys_secret(account: Account) -> list[Result]:
    settings = account.settings
    name = settings.endpoint_api_keys_secret_name
    if name is None:
        return []
    secret = _Secret(
        check=KEYS_CHECK,
        name=name,
        key_setting="endpoint_api_keys_kms_key_arn",
        key_configured=settings.endpoint_api_keys_kms_key_arn,
        unnamed_key="FAIL",
        without_grant="every Ray pod, which mounts the keys, waits in ContainerCreating",
        value_file="file://keys.json",
        value_shape=KEYS_VALUE,
    )
    results, current = _secret_checks(account, secret)
    if current:
        results.extend(guarded(f"{KEYS_CHECK} value", lambda a: _keys_value(a, name))(account))
    return results


def _keys_value(account: Account, name: str) -> list[Result]:
    """The keys' structure, as the ingress reads it: a JSON object of key id to a key of 16+ characters.

    Only the value shows whether the ingress will find a key, so preflight reads it (GetSecretValue,
    the caller's own account, read-only). The keys stay in this function: no line prints or keeps a
    key, only counts and key ids (the ingress logs those too).
    """
    check = f"{KEYS_CHECK} value"
    fix = f"aws secretsmanager put-secret-value --secret-id {name} --secret-string file://keys.json"
    fix += f" --region {account.region}{KEYS_VALUE}"
    text = account.client("secretsmanager").get_secret_value(SecretId=name).get("SecretString")
    if text is None:
        return [Result("FAIL", check, f"{name!r} holds a binary value, not the JSON text the ingress reads", fix)]
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as err:
        # err.msg and the position name no character of the value.
        return [Result("FAIL", check, f"{name!r} is not JSON ({err.msg} at line {err.lineno} column {err.colno})", fix)]
    if not isinstance(loaded, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(loaded), "a number")
        return [Result("FAIL", check, f"{name!r} is {kind}, not a JSON object of key id to key", fix)]
    not_strings = sorted(k for k, v in loaded.items() if not isinstance(v, str))
    if not_strings:
        return [Result("FAIL", check, f"{name!r}: the keys of ids {not_strings} are not strings", fix)]
    short = sorted(k for k, v in loaded.items() if len(v) < API_KEY_MIN_LENGTH)
    usable = len(loaded) - len(short)
    if not usable:
        said = "an empty JSON object" if not loaded else f"no key of {API_KEY_MIN_LENGTH}+ characters"
        return [Result("FAIL", check, f"{name!r} holds {said}: the ingress replica would not start", fix)]
    detail = f"{name!r}: a JSON object of {usable} key(s) of {API_KEY_MIN_LENGTH}+ characters"
    if short:
        return [Result("WARN", check, f"{detail}; the ingress ignores the shorter keys of ids {short}", fix)]
    return [Result("PASS", check, detail)]
