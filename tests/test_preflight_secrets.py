"""preflight on the API keys' secret: it exists with a current value, its value is a JSON object of
key id to key as the ingress reads it, and a customer-managed KMS key is named in
endpoint_api_keys_kms_key_arn. Each FAIL carries the command or setting that fixes it, and no line
carries a key.

The account is tests/test_preflight.py's, answered in AWS's own response shapes (botocore validates
every request and answer).
"""

from __future__ import annotations

import ast
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from settings import settings_from_cli
from tests.conftest import ROOT
from tests.support.aws_fakes import Answer, FakeAws, client_error
from tests.support.preflight_account import ACCOUNT, CMK, GOOD, account, check, key, preflight
from tools.preflight.base import Result
from tools.preflight.checks import run
from tools.preflight.secrets import API_KEY_MIN_LENGTH, KEYS_SHAPE

NAME = "prod/llm-keys"
KEYS = [*GOOD, f"endpoint_api_keys_secret_name={NAME}"]
SECRET = "API keys secret"
KEY = "API keys secret key"
VALUE = "API keys secret value"
# Made up here, in the shape the README's command makes.
GOOD_KEY = "sk-" + "Qx7" * 14
PUT = (
    f"aws secretsmanager put-secret-value --secret-id {NAME} --secret-string file://keys.json --region us-east-1, "
    f"keys.json holding {KEYS_SHAPE}"
)


def described(**changes: Any) -> dict[str, Any]:
    return {
        "ARN": f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:{NAME}-AbCdEf",
        "Name": NAME,
        "VersionIdsToStages": {"a1b2c3d4-5678-90ab-cdef-EXAMPLE22222": ["AWSCURRENT"]},
        **changes,
    }


def value(text: str) -> dict[str, Any]:
    return {"ARN": described()["ARN"], "Name": NAME, "SecretString": text}


def keys_account(text: str = json.dumps({"team-a": GOOD_KEY}), /, **changes: Answer) -> dict[tuple[str, str], Answer]:
    return account(
        **{"secretsmanager:DescribeSecret": described(), "secretsmanager:GetSecretValue": value(text), **changes}
    )


def lines(results: list[Result]) -> str:
    return "\n".join(f"{r.status} {r.check} {r.detail} {r.fix}" for r in results)


def test_a_good_keys_secret_passes_every_line() -> None:
    results = preflight(keys_account(), *KEYS)
    assert [(r.check, r.status) for r in results if r.check.startswith(SECRET)] == [
        (SECRET, "PASS"),
        (KEY, "PASS"),
        (VALUE, "PASS"),
    ]
    assert "1 key(s) of 16+ characters" in check(results, VALUE).detail


def test_without_the_setting_the_keys_secret_is_not_looked_at() -> None:
    fake = FakeAws(keys_account())
    run(settings_from_cli(GOOD), fake)
    assert not [c for c in fake.calls if c[0] == "secretsmanager"]


def test_a_missing_keys_secret_fails_naming_the_command_and_the_shape() -> None:
    answers = keys_account(**{"secretsmanager:DescribeSecret": client_error("ResourceNotFoundException", "", 400)})
    line = check(preflight(answers, *KEYS), SECRET)
    assert line.status == "FAIL" and line.detail == f"no secret {NAME!r} in us-east-1"
    assert line.fix == (
        f"aws secretsmanager create-secret --name {NAME} --secret-string file://keys.json --region us-east-1, "
        f"keys.json holding {KEYS_SHAPE}"
    )


@pytest.mark.parametrize(
    ("changes", "said", "fix"),
    [
        ({"DeletedDate": datetime(2026, 12, 1, tzinfo=UTC)}, "scheduled for deletion", "restore-secret"),
        ({"VersionIdsToStages": {}}, "has no current value", PUT),
    ],
)
def test_a_keys_secret_without_a_current_value_fails(changes: dict[str, Any], said: str, fix: str) -> None:
    results = preflight(keys_account(**{"secretsmanager:DescribeSecret": described(**changes)}), *KEYS)
    line = check(results, SECRET)
    assert line.status == "FAIL" and said in line.detail and fix in line.fix, line
    assert not [r for r in results if r.check in (KEY, VALUE)]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (json.dumps([GOOD_KEY]), "is an array, not a JSON object of key id to key"),
        (json.dumps(GOOD_KEY), "is a string, not a JSON object of key id to key"),
        ("sk-" + "Qx7" * 14, "is not JSON (Expecting value at line 1 column 1)"),
        (json.dumps({"team-a": {"key": GOOD_KEY}, "team-b": GOOD_KEY}), "the keys of ids ['team-a'] are not strings"),
        (json.dumps({"team-a": 12345678901234567890}), "the keys of ids ['team-a'] are not strings"),
        (json.dumps({}), "holds an empty JSON object: the ingress replica would not start"),
        (json.dumps({"team-a": "short"}), "holds no key of 16+ characters: the ingress replica would not start"),
    ],
    ids=["array", "string", "not-json", "object-value", "number-value", "empty", "all-short"],
)
def test_a_value_the_ingress_cannot_use_fails_naming_the_shape(text: str, said: str) -> None:
    line = check(preflight(keys_account(text), *KEYS), VALUE)
    assert line.status == "FAIL" and said in line.detail, line
    assert line.fix == PUT


def test_a_short_key_beside_a_good_one_warns() -> None:
    line = check(preflight(keys_account(json.dumps({"team-a": GOOD_KEY, "team-b": "short"})), *KEYS), VALUE)
    assert line.status == "WARN" and "1 key(s)" in line.detail and "['team-b']" in line.detail, line


def test_a_binary_secret_fails() -> None:
    answers = keys_account(**{"secretsmanager:GetSecretValue": {"Name": NAME, "SecretBinary": b"{}"}})
    assert check(preflight(answers, *KEYS), VALUE).status == "FAIL"


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"team-a": GOOD_KEY, "team-b": "tooshort-secret"}),
        json.dumps([GOOD_KEY]),
        GOOD_KEY,
        json.dumps({"team-a": [GOOD_KEY]}),
        '{"team-a": "' + GOOD_KEY + '",}',
    ],
    ids=["short-key", "array", "bare-key", "array-value", "trailing-comma"],
)
def test_no_line_carries_a_key(text: str) -> None:
    out = lines(preflight(keys_account(text), *KEYS))
    assert GOOD_KEY not in out and "tooshort-secret" not in out and "Qx7Qx7" not in out


def test_reading_the_value_denied_warns_naming_the_policy() -> None:
    answers = keys_account(**{"secretsmanager:GetSecretValue": client_error("AccessDeniedException", "", 400)})
    line = check(preflight(answers, *KEYS), VALUE)
    assert line.status == "WARN" and "GetSecretValue was denied" in line.detail and "iam-policy.json" in line.fix


# --- the keys' KMS key ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("manager", "setting", "expected"),
    [
        ("AWS", [], "PASS"),
        # Serving would stall in ContainerCreating: a FAIL, not a WARN.
        ("CUSTOMER", [], "FAIL"),
        ("CUSTOMER", [f"endpoint_api_keys_kms_key_arn={CMK}"], "PASS"),
        ("CUSTOMER", [f"endpoint_api_keys_kms_key_arn={CMK[:-2]}ff"], "FAIL"),
    ],
)
def test_a_customer_managed_key_must_be_named(manager: str, setting: list[str], expected: str) -> None:
    answers = keys_account(
        **{"secretsmanager:DescribeSecret": described(KmsKeyId=CMK), "kms:DescribeKey": key(manager)}
    )
    line = check(preflight(answers, *KEYS, *setting), KEY)
    assert line.status == expected, line
    if expected != "PASS":
        assert line.fix.startswith(f"-c endpoint_api_keys_kms_key_arn={CMK}")
    if not setting and expected == "FAIL":
        assert "ContainerCreating" in line.detail


def test_a_key_named_for_a_secret_under_the_aws_managed_key_warns() -> None:
    line = check(preflight(keys_account(), *KEYS, f"endpoint_api_keys_kms_key_arn={CMK}"), KEY)
    assert line.status == "WARN" and "the grant is unused" in line.detail
    assert line.fix == "-c endpoint_api_keys_kms_key_arn=none"


def test_the_minimum_key_length_is_the_ingresses() -> None:
    """ray_pods/api_keys.py runs in the Ray pods and imports ray: read its constant without importing it."""
    tree = ast.parse((ROOT / "ray_pods/api_keys.py").read_text(encoding="utf-8"))
    (found,) = [
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["MIN_KEY_LENGTH"]
    ]
    assert ast.literal_eval(found) == API_KEY_MIN_LENGTH
