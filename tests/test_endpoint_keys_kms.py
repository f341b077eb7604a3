"""The API keys' secret under a customer-managed KMS key: External Secrets may decrypt it, through
Secrets Manager only, when endpoint_api_keys_kms_key_arn names the key; the setting is refused alone
or as anything but a key ARN.

Without the grant External Secrets cannot read the secret, the Kubernetes Secret is never made, and
every Ray pod, which mounts it, waits in ContainerCreating.
"""

from __future__ import annotations

from typing import Any

import pytest

from settings import SettingsError, settings_from
from tests.conftest import PROJECT_CONTEXT, pod_identity_policy, resources, synth
from tools.template_text import render

# The keys alone in the External Secrets role (the GCS store key's grant: tests/test_gcs_store.py).
KEYS = {"endpoint_api_keys_secret_name": "prod/llm-keys", "gcs_fault_tolerance": "false"}
KEYS_KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
TOKEN_KEY = "arn:aws:kms:us-east-1:123456789012:key/0000abcd-12ab-34cd-56ef-1234567890ab"
VIA_SECRETS_MANAGER = "secretsmanager.${AWS::Region}.amazonaws.com"


def _decrypts(template: dict[str, Any]) -> list[dict[str, Any]]:
    statements = pod_identity_policy(template, "external-secrets")["PolicyDocument"]["Statement"]
    return [s for s in statements if s["Action"] == "kms:Decrypt"]


def test_the_keys_secrets_key_is_decryptable_by_external_secrets_through_secrets_manager_only() -> None:
    template = synth(**KEYS, endpoint_api_keys_kms_key_arn=KEYS_KEY)
    (decrypt,) = _decrypts(template)
    assert decrypt["Resource"] == KEYS_KEY
    assert render(decrypt["Condition"]["StringEquals"]["kms:ViaService"]) == VIA_SECRETS_MANAGER
    # No other role in the stack may decrypt with it.
    grants = [
        s
        for p in resources(template, "AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if s.get("Resource") == KEYS_KEY
    ]
    assert grants == [decrypt]


def test_each_secret_gets_the_grant_for_its_own_key() -> None:
    template = synth(
        **KEYS,
        endpoint_api_keys_kms_key_arn=KEYS_KEY,
        hf_token_secret_name="prod/hf-token",
        model_id="meta-llama/Llama-3.1-8B-Instruct",
        hf_token_kms_key_arn=TOKEN_KEY,
    )
    # CDK merges statements that differ only in their resources.
    (decrypt,) = _decrypts(template)
    assert sorted(decrypt["Resource"]) == sorted([KEYS_KEY, TOKEN_KEY])
    assert render(decrypt["Condition"]["StringEquals"]["kms:ViaService"]) == VIA_SECRETS_MANAGER


def test_without_the_setting_no_key_is_granted() -> None:
    assert _decrypts(synth(**KEYS)) == []


@pytest.mark.parametrize(
    ("overrides", "allowed"),
    [
        ({"endpoint_api_keys_kms_key_arn": KEYS_KEY}, "set only with endpoint_api_keys_secret_name"),
        ({**KEYS, "endpoint_api_keys_kms_key_arn": "alias/llm-keys"}, "a KMS key ARN"),
        ({**KEYS, "endpoint_api_keys_kms_key_arn": KEYS_KEY.replace(":key/", ":alias/")}, "a KMS key ARN"),
    ],
)
def test_a_bad_key_setting_ends_synth_in_one_line(overrides: dict[str, Any], allowed: str) -> None:
    with pytest.raises(SettingsError) as raised:
        settings_from({**PROJECT_CONTEXT, **overrides})
    assert raised.value.key == "endpoint_api_keys_kms_key_arn"
    assert allowed in str(raised.value) and "\n" not in str(raised.value)
