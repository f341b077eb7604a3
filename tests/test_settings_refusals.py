"""Settings a user writes that would deploy and then quietly not do what they say: each ends in one line.

Every case is a settings file, read as `make synth SETTINGS=...` reads it (settings/loading.py, then
validate()); one runs app.py itself as the CDK CLI does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from settings import Settings, SettingsError, catalog, settings_from
from tests.conftest import PROJECT_CONTEXT, ROOT
from tests.support.aws_fakes import FakeAws
from tests.support.preflight_account import ACCOUNT, GOOD, ROLE, account, check, preflight, secret, status_of
from tools.preflight.checks import run

CERT = "arn:aws:acm:{region}:{account}:certificate/12345678-1234-1234-1234-123456789012"
KEY = "arn:aws:kms:{region}:{account}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
NLB = "internal_endpoint_cidrs: 10.0.0.0/8\n"
KEYS = "endpoint_api_keys_secret_name: prod/llm-keys\n"
TOKEN = "hf_token_secret_name: prod/hf-token\n"


def load(tmp_path: Path, text: str, name: str = "settings.yaml") -> Settings:
    file = tmp_path / name
    file.write_text(text, encoding="utf-8")
    return settings_from({**PROJECT_CONTEXT, "settings_file": str(file)})


def refused(tmp_path: Path, text: str, name: str = "settings.yaml") -> SettingsError:
    with pytest.raises(SettingsError) as raised:
        load(tmp_path, text, name)
    assert "\n" not in str(raised.value)
    return raised.value


# --- the settings file itself ---------------------------------------------------------------------------
def readme_settings_file() -> str:
    """The README's example settings file, as its quick start writes it."""
    block = (ROOT / "README.md").read_text(encoding="utf-8").split("<!-- offline: settings-file -->", 1)[1]
    return block.split("<<'END'\n", 1)[1].split("\nEND\n", 1)[0] + "\n"


def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path: Path) -> None:
    # What docs/security.md's recipe used to make of the README's file: printf appended a second model_id.
    text = readme_settings_file() + f"{TOKEN}model_id: meta-llama/Llama-3.1-8B-Instruct\n"
    first = 1 + next(i for i, line in enumerate(text.splitlines()) if line.startswith("model_id:"))
    err = refused(tmp_path, text)
    assert err.key == "model_id"
    assert f"at lines {first} and {len(text.splitlines())}" in str(err), err


def test_a_key_given_twice_in_a_json_file_is_refused(tmp_path: Path) -> None:
    err = refused(
        tmp_path, '{\n  "max_model_len": 4096,\n  "region": "us-east-1",\n  "max_model_len": 2048\n}\n', "s.json"
    )
    assert err.key == "max_model_len" and "at lines 2 and 4" in str(err), err


def test_the_security_recipe_cannot_give_a_key_twice(tmp_path: Path) -> None:
    """docs/security.md's lines that edit the settings file, run on the README's file: it still loads."""
    page = (ROOT / "docs/security.md").read_text(encoding="utf-8")
    block = page.split("## The model token", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    edits = [line for line in block.splitlines() if "my-settings" in line and not line.startswith("make ")]
    assert edits, block
    (tmp_path / "my-settings.yaml").write_text(readme_settings_file(), encoding="utf-8")
    for _ in range(2):  # run twice: a recipe repeated must not duplicate either
        subprocess.run(["bash", "-ec", "\n".join(edits)], cwd=tmp_path, check=True, timeout=30)
    data = yaml.safe_load((tmp_path / "my-settings.yaml").read_text(encoding="utf-8"))
    assert data["model_id"] == "meta-llama/Llama-3.1-8B-Instruct" and data["hf_token_secret_name"] == "prod/hf-token"
    loaded = load(tmp_path, (tmp_path / "my-settings.yaml").read_text(encoding="utf-8"))
    assert loaded.model_id == "meta-llama/Llama-3.1-8B-Instruct"


def test_a_yaml_error_keeps_its_line_and_column(tmp_path: Path) -> None:
    err = refused(tmp_path, "region: us-east-1\nmax_azs: [2\nmodel_id: Qwen/Qwen3-8B\n")
    assert err.key == "settings_file"
    assert re.search(r"line 3, column \d+: expected ',' or ']'", str(err)), err
    err = refused(tmp_path, "region: us-east-1\n  max_azs: 2\n")
    assert "line 2, column 10: mapping values are not allowed here" in str(err), err


# --- cluster admin: the ARN get-caller-identity prints ---------------------------------------------------
def test_an_assumed_role_session_arn_is_refused_pointing_to_preflight(tmp_path: Path) -> None:
    session = f"arn:aws:sts::{ACCOUNT}:assumed-role/AWSReservedSSO_Admin_0123456789abcdef/alice@example.com"
    err = refused(tmp_path, f"cluster_admin_arns: {session}\n")
    assert err.key == "cluster_admin_arns"
    assert "assumed-role session ARN" in str(err) and "make preflight" in str(err), err


def test_preflight_prints_the_role_arn_with_its_path_and_keeps_the_other_admins() -> None:
    """The caller is an assumed-role session (tests/support/preflight_account.py); IAM gives its role's path."""
    other = f"arn:aws:iam::{ACCOUNT}:role/Other"
    answers = account(
        **{
            "iam:GetRole": lambda p, _: {
                "Role": {
                    "Path": "/platform/" if p["RoleName"] == "Deployer" else "/",
                    "RoleName": p["RoleName"],
                    "RoleId": "AROAEXAMPLEID1234567",
                    "Arn": ROLE if p["RoleName"] == "Deployer" else other,
                    "CreateDate": "2026-01-01T00:00:00Z",
                }
            }
        }
    )
    status, line = status_of(
        "cluster admin", answers, f"cluster_admin_arns={other}", "gpu_availability_zone=us-east-1b"
    )
    assert status == "WARN" and line.fix == f"-c cluster_admin_arns={other},{ROLE}", line
    # The line it prints is a setting synth accepts.
    assert settings_from({**PROJECT_CONTEXT, "cluster_admin_arns": line.fix.split("=", 1)[1]}).cluster_admin_arns == (
        other,
        ROLE,
    )


# --- ARNs of another region or account --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "key", "said"),
    [
        (
            f"region: us-east-1\n{NLB}endpoint_tls_certificate_arn: "
            f"{CERT.format(region='eu-west-1', account=ACCOUNT)}\n",
            "endpoint_tls_certificate_arn",
            "in the stack's region us-east-1, not eu-west-1",
        ),
        # The region a GPU AZ implies counts too.
        (
            f"gpu_availability_zone: us-west-2b\n{NLB}endpoint_tls_certificate_arn: "
            f"{CERT.format(region='us-east-1', account=ACCOUNT)}\n",
            "endpoint_tls_certificate_arn",
            "region us-west-2",
        ),
        (
            f"region: us-east-1\naccount: '{ACCOUNT}'\n{NLB}endpoint_tls_certificate_arn: "
            f"{CERT.format(region='us-east-1', account='210987654321')}\n",
            "endpoint_tls_certificate_arn",
            f"of the stack's account {ACCOUNT}, not 210987654321",
        ),
        (
            f"region: us-east-1\n{KEYS}endpoint_api_keys_kms_key_arn: "
            f"{KEY.format(region='us-west-2', account=ACCOUNT)}\n",
            "endpoint_api_keys_kms_key_arn",
            "a KMS key in the stack's region us-east-1, not us-west-2",
        ),
        (
            f"region: us-east-1\n{TOKEN}hf_token_kms_key_arn: {KEY.format(region='eu-west-1', account=ACCOUNT)}\n",
            "hf_token_kms_key_arn",
            "a KMS key in the stack's region us-east-1, not eu-west-1",
        ),
    ],
    ids=["cert-region", "cert-az-region", "cert-account", "keys-kms-region", "token-kms-region"],
)
def test_an_arn_of_another_region_or_account_is_refused(tmp_path: Path, text: str, key: str, said: str) -> None:
    err = refused(tmp_path, text)
    assert err.key == key and said in str(err), err


def test_arns_of_the_stacks_region_and_a_key_of_another_account_are_accepted(tmp_path: Path) -> None:
    # Secrets Manager encrypts with another account's key when its policy allows; ACM and ELB have no such use.
    text = (
        f"region: us-east-1\naccount: '{ACCOUNT}'\n{NLB}{KEYS}{TOKEN}"
        f"endpoint_tls_certificate_arn: {CERT.format(region='us-east-1', account=ACCOUNT)}\n"
        f"endpoint_api_keys_kms_key_arn: {KEY.format(region='us-east-1', account='210987654321')}\n"
        f"hf_token_kms_key_arn: {KEY.format(region='us-east-1', account=ACCOUNT)}\n"
    )
    assert load(tmp_path, text).endpoint_tls_certificate_arn is not None


def test_without_a_region_in_the_settings_preflight_compares_the_arns_with_where_it_deploys() -> None:
    cert = CERT.format(region="eu-west-1", account=ACCOUNT)
    key = KEY.format(region="us-east-1", account=ACCOUNT)
    pairs = [f"cluster_admin_arns={ROLE}", "internal_endpoint_cidrs=10.0.0.0/8", f"endpoint_tls_certificate_arn={cert}"]
    settings = settings_from({**PROJECT_CONTEXT, **dict(p.split("=", 1) for p in pairs)})  # synth accepts it
    line = check(run(settings, FakeAws(account(), region_name="us-east-1"))[1], "setting ARNs")
    assert line.status == "FAIL" and "endpoint_tls_certificate_arn" in line.detail and "eu-west-1" in line.detail
    assert "-c region=eu-west-1" in line.fix
    other_account = CERT.format(region="us-east-1", account="210987654321")
    line = check(preflight(account(), *pairs[:2], f"endpoint_tls_certificate_arn={other_account}"), "setting ARNs")
    assert line.status == "FAIL" and f"account {ACCOUNT}, not 210987654321" in line.detail, line
    fine = [f"cluster_admin_arns={ROLE}", "hf_token_secret_name=prod/hf-token", f"hf_token_kms_key_arn={key}"]
    settings = settings_from({**PROJECT_CONTEXT, **dict(p.split("=", 1) for p in fine)})
    answers = account(**{"secretsmanager:DescribeSecret": secret()})
    results = run(settings, FakeAws(answers, region_name="us-east-1"))[1]
    assert [r.status for r in results if r.check == "setting ARNs"] == ["PASS"]
    assert not [r for r in preflight(account(), *GOOD) if r.check == "setting ARNs"]


# --- settings with no effect in the configuration chosen --------------------------------------------------
NO_EFFECT: list[tuple[str, str, str]] = [
    ("observability: false\nalarm_email: oncall@example.com\n", "alarm_email", "only with observability=true"),
    ("observability: false\nalarm_ttft_p99_seconds: 5\n", "alarm_ttft_p99_seconds", "only with observability=true"),
    ("observability: false\nalarm_kv_cache_usage_ratio: 0.9\n", "alarm_kv_cache_usage_ratio", "observability=true"),
    ("observability: false\nalarm_efa_flat_bytes_per_second: 20000\n", "alarm_efa_flat_bytes_per_second", "observ"),
    (
        "observability: false\nalarm_pod_network_kv_bytes_per_second: 20000000\n",
        "alarm_pod_network_kv_bytes_per_second",
        "only with observability=true",
    ),
    (
        "observability: false\nobservability_scrape_interval_seconds: 60\n",
        "observability_scrape_interval_seconds",
        "only with observability=true",
    ),
    (
        "observability: false\nalarm_kv_throughput_floor_gb_per_s: 2\n",
        "alarm_kv_throughput_floor_gb_per_s",
        "observability=true",
    ),
    (
        "serving_mode: aggregated\nalarm_kv_throughput_floor_gb_per_s: 2\n",
        "alarm_kv_throughput_floor_gb_per_s",
        "only with serving_mode disaggregated",
    ),
    # At its default value too: the user gave it.
    (
        f"gcs_fault_tolerance: false\ngcs_store_node_type: {catalog.DEFAULT_GCS_STORE_NODE_TYPE}\n",
        "gcs_store_node_type",
        "only with gcs_fault_tolerance=true",
    ),
    ("gcs_fault_tolerance: false\ngcs_store_node_type: cache.r7g.large\n", "gcs_store_node_type", "no GCS store"),
    (
        f"vpc_id: vpc-0123456789abcdef0\naccount: '{ACCOUNT}'\nregion: us-east-1\nvpc_cidr: 10.1.0.0/16\n",
        "vpc_cidr",
        "only without vpc_id",
    ),
    (
        f"vpc_id: vpc-0123456789abcdef0\naccount: '{ACCOUNT}'\nregion: us-east-1\nmax_azs: 3\n",
        "max_azs",
        "only without vpc_id",
    ),
    ("capacity_block_end_warning_hours: 48\n", "capacity_block_end_warning_hours", "only with gpu_capacity_block"),
    (
        "endpoint_api_keys_refresh_seconds: 30\n",
        "endpoint_api_keys_refresh_seconds",
        "only with endpoint_api_keys_secret_name",
    ),
    ("ray_worker_idle_timeout_seconds: 120\n", "ray_worker_idle_timeout_seconds", "where some side has a range"),
    ("serving_mode: aggregated\nprefix_cache_routing: true\n", "prefix_cache_routing", "only with serving_mode"),
]


@pytest.mark.parametrize(("text", "key", "said"), NO_EFFECT, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(NO_EFFECT)])
def test_a_setting_given_where_it_has_no_effect_is_refused(tmp_path: Path, text: str, key: str, said: str) -> None:
    err = refused(tmp_path, text)
    assert err.key == key and said in str(err), err


@pytest.mark.parametrize(
    "text",
    [
        "observability: false\n",  # the alarms' defaults are not the user's
        "observability: false\nalarm_email: null\n",  # none is nothing to drop
        "gcs_fault_tolerance: false\n",
        "alarm_email: oncall@example.com\nalarm_kv_throughput_floor_gb_per_s: 2\n"
        "observability_scrape_interval_seconds: 60\n",
        "gcs_store_node_type: cache.r7g.large\n",
        "capacity_block_end_warning_hours: 48\ngpu_capacity_block: true\ngpu_capacity_reservation_id: "
        "cr-0123456789abcdef0\ngpu_placement_group: false\n",
        f"{KEYS}endpoint_api_keys_refresh_seconds: 30\n",
        "ray_worker_idle_timeout_seconds: 120\ndecode_max_replicas: 2\ndecode_target_ongoing_requests: 4\n",
        "prefix_cache_routing: false\n",
        "serving_mode: aggregated\n",
    ],
)
def test_the_same_settings_where_they_act_are_accepted(tmp_path: Path, text: str) -> None:
    load(tmp_path, text)


# --- thresholds the hardware cannot reach -----------------------------------------------------------------
def test_a_kv_floor_above_the_efa_line_rate_is_refused_in_gb_per_s_not_gbps(tmp_path: Path) -> None:
    # g6.8xlarge's EFA is 25 Gbps: 3.125 GB/s. A floor of 25 read from "25 Gbps" would alarm whenever KV moves.
    err = refused(tmp_path, "alarm_kv_throughput_floor_gb_per_s: 25\n")
    assert err.key == "alarm_kv_throughput_floor_gb_per_s" and "at most 3.125 GB/s" in str(err), err
    assert load(tmp_path, "alarm_kv_throughput_floor_gb_per_s: 3.125\n").alarm_kv_throughput_floor_gb_per_s == 3.125
    refused(tmp_path, "alarm_kv_throughput_floor_gb_per_s: 3.2\n")
    # One engine pod's share of a p4d.24xlarge (400 Gbps, 4 pods at TP 2): 12.5 GB/s; at TP 8 the whole 50.
    tp2 = "gpu_instance_type: p4d.24xlarge\nprefill_tensor_parallel_size: 2\ndecode_tensor_parallel_size: 2\n"
    tp2 += "prefill_replicas: 4\ndecode_replicas: 4\n"
    assert "at most 12.5 GB/s" in str(refused(tmp_path, tp2 + "alarm_kv_throughput_floor_gb_per_s: 13\n"))
    tp8 = "gpu_instance_type: p4d.24xlarge\nprefill_tensor_parallel_size: 8\ndecode_tensor_parallel_size: 8\n"
    load(tmp_path, tp8 + "alarm_kv_throughput_floor_gb_per_s: 13\n")


def test_efa_and_pod_network_thresholds_beyond_the_nodes_line_rate_are_refused(tmp_path: Path) -> None:
    # Two g6.8xlarge at 25 Gbps receive at most 6.25e9 bytes/s over EFA.
    big = "alarm_pod_network_kv_bytes_per_second: 100000000000\n"
    err = refused(tmp_path, f"alarm_efa_flat_bytes_per_second: 6250000000\n{big}")
    assert err.key == "alarm_efa_flat_bytes_per_second" and "below 6250000000 bytes/s" in str(err), err
    # The pod network: two GPU nodes' 25 Gbps and three m7i.xlarge's 12.5 Gbps: 1.09375e10 bytes/s.
    err = refused(tmp_path, big)
    assert err.key == "alarm_pod_network_kv_bytes_per_second" and "below 10937500000 bytes/s" in str(err), err
    load(tmp_path, "alarm_pod_network_kv_bytes_per_second: 10937499999\n")


# --- the AMI release's driver ------------------------------------------------------------------------------
def test_an_ami_release_older_than_the_catalogs_is_refused(tmp_path: Path) -> None:
    pinned = catalog.GPU_AMI_RELEASE_VERSIONS["1.32"]
    err = refused(tmp_path, "kubernetes_version: '1.32'\ngpu_ami_release_version: 1.32.9-20250519\n")
    assert err.key == "gpu_ami_release_version" and f"{pinned} or later" in str(err), err
    assert str(catalog.IMAGE_MIN_NVIDIA_DRIVER) in str(err)
    load(tmp_path, f"kubernetes_version: '1.32'\ngpu_ami_release_version: {pinned}\n")
    load(tmp_path, "gpu_ami_release_version: 1.36.3-20260901\n")


# --- as the CDK CLI runs the app ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("model_id: Qwen/Qwen3-8B\nmodel_id: Qwen/Qwen3-4B\n", "model_id"),
        ("gcs_fault_tolerance: false\ngcs_store_node_type: cache.t4g.micro\n", "gcs_store_node_type"),
    ],
    ids=["duplicate", "no-effect"],
)
def test_app_py_ends_in_one_line(tmp_path: Path, text: str, key: str) -> None:
    file = tmp_path / "my-settings.yaml"
    file.write_text(text, encoding="utf-8")
    context: dict[str, Any] = {**PROJECT_CONTEXT, "settings_file": str(file)}
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps(context),
        "CDK_OUTDIR": str(tmp_path / "out"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    done = subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith(f"error: setting '{key}'"), done.stderr
