"""Security invariants, asserted on the synthesized template."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    helm_releases,
    manifests,
    only,
    pod_identity_policy,
    rayservice_from,
    resources,
    synth,
    synth_leaks,
)
from tools.template_text import render

# The model token alone in the External Secrets role (the GCS store's token: tests/test_gcs_store.py).
TOKEN_SETTINGS = {
    "hf_token_secret_name": "prod/hf-token",
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "gcs_fault_tolerance": "false",
}
NLB_SETTINGS = {"internal_endpoint_cidrs": "10.0.0.0/8,192.168.10.0/24"}


def _launch_templates(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["Properties"]["LaunchTemplateData"] for r in resources(template, "AWS::EC2::LaunchTemplate").values()]


def test_every_node_imdsv2_hop_limit_1_and_encrypted_gp3(template: dict[str, Any]) -> None:
    assert len(resources(template, "AWS::EKS::Nodegroup")) == 2
    for group in resources(template, "AWS::EKS::Nodegroup").values():
        assert "LaunchTemplate" in group["Properties"]
    for data in _launch_templates(template):
        assert data["MetadataOptions"] == {
            "HttpEndpoint": "enabled",
            "HttpPutResponseHopLimit": 1,
            "HttpTokens": "required",
        }
        for disk in data["BlockDeviceMappings"]:
            assert disk["Ebs"]["Encrypted"] is True
            assert disk["Ebs"]["VolumeType"] == "gp3"


def test_pod_imds_access_raises_hop_limit_only_when_asked() -> None:
    for data in _launch_templates(synth(pod_imds_access="true")):
        assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
        assert data["MetadataOptions"]["HttpTokens"] == "required"


def _policy_names(role: dict[str, Any]) -> set[str]:
    return {render(arn).rsplit("/", 1)[-1] for arn in role["Properties"].get("ManagedPolicyArns", [])}


def test_node_roles_have_only_what_nodes_need(template: dict[str, Any]) -> None:
    node_roles = [
        (logical_id, r)
        for logical_id, r in resources(template, "AWS::IAM::Role").items()
        if "ec2.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    ]
    assert len(node_roles) == 2
    for logical_id, role in node_roles:
        assert _policy_names(role) == {"AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryPullOnly"}
        attached = [
            p
            for p in resources(template, "AWS::IAM::Policy").values()
            if {"Ref": logical_id} in p["Properties"].get("Roles", [])
        ]
        assert attached == []


def test_vpc_cni_uses_pod_identity_and_agent_is_installed(template: dict[str, Any]) -> None:
    only(template, "AWS::EKS::Addon", AddonName="eks-pod-identity-agent")
    cni = only(template, "AWS::EKS::Addon", AddonName="vpc-cni")["Properties"]
    (association,) = cni["PodIdentityAssociations"]
    assert association["ServiceAccount"] == "aws-node"
    role = template["Resources"][association["RoleArn"]["Fn::GetAtt"][0]]
    assert "pods.eks.amazonaws.com" in json.dumps(role["Properties"]["AssumeRolePolicyDocument"])
    assert _policy_names(role) == {"AmazonEKS_CNI_Policy"}


def test_secrets_envelope_encrypted_with_rotating_key(template: dict[str, Any]) -> None:
    cluster = only(template, "AWS::EKS::Cluster")["Properties"]
    key_id = cluster["EncryptionConfig"][0]["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    key = template["Resources"][key_id]
    assert key["Type"] == "AWS::KMS::Key"
    assert key["Properties"]["EnableKeyRotation"] is True


# What CloudWatch Logs calls on a log group's KMS key (CloudWatch Logs User Guide, "Encrypt log
# data in CloudWatch Logs using AWS KMS": its key policy statement names these as wildcards).
LOGS_KMS_ACTIONS = ("kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey",
                    "kms:DescribeKey")  # fmt: skip
LOGS_SERVICE = "logs.${AWS::Region}.amazonaws.com"
ACCOUNT_LOG_GROUP = "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:"


def _key_policy_allows(key: dict[str, Any], service: str, action: str, log_group_arn: str) -> bool:
    """Whether an Allow statement of the key's policy admits `service` calling `action` for this log group.

    Only what these statements use: a Service principal, action wildcards, and ArnLike/ArnEquals on
    the encryption context CloudWatch Logs sends (kms:EncryptionContext:aws:logs:arn); any other
    condition does not match.
    """
    for statement in key["Properties"]["KeyPolicy"]["Statement"]:
        principals = statement.get("Principal", {}).get("Service", [])
        principals = [principals] if not isinstance(principals, list) else principals
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if statement["Effect"] != "Allow" or service not in [render(p) for p in principals]:
            continue
        if not any(fnmatch.fnmatchcase(action, pattern) for pattern in actions):
            continue
        context = {"kms:EncryptionContext:aws:logs:arn": log_group_arn}
        conditions_hold = True
        for operator, clauses in statement.get("Condition", {}).items():
            for key_name, wanted in clauses.items():
                wanted_values = [render(w) for w in (wanted if isinstance(wanted, list) else [wanted])]
                if operator == "ArnLike":
                    ok = any(fnmatch.fnmatchcase(context.get(key_name, ""), w) for w in wanted_values)
                elif operator == "ArnEquals":
                    ok = context.get(key_name) in wanted_values
                else:
                    ok = False
                conditions_hold = conditions_hold and ok
        if conditions_hold:
            return True
    return False


def test_cloudwatch_logs_may_use_the_logs_key_for_the_stacks_log_groups(template: dict[str, Any]) -> None:
    """Without this statement, creating the KMS-encrypted log groups fails at deploy (no test of synth sees it)."""
    groups = resources(template, "AWS::Logs::LogGroup")
    (key_id,) = {g["Properties"]["KmsKeyId"]["Fn::GetAtt"][0] for g in groups.values()}
    key = template["Resources"][key_id]
    for logical_id, group in groups.items():
        name = render(group["Properties"].get("LogGroupName", {"Ref": logical_id}))
        for action in LOGS_KMS_ACTIONS:
            assert _key_policy_allows(key, LOGS_SERVICE, action, ACCOUNT_LOG_GROUP + name), (logical_id, action)
    # Only for this account's and region's log groups, and only for CloudWatch Logs.
    elsewhere = "arn:${AWS::Partition}:logs:${AWS::Region}:111122223333:log-group:theirs"
    assert not _key_policy_allows(key, LOGS_SERVICE, "kms:Decrypt", elsewhere)
    assert not _key_policy_allows(key, "s3.amazonaws.com", "kms:Decrypt", ACCOUNT_LOG_GROUP + "x")


def test_vpc_flow_logs(template: dict[str, Any]) -> None:
    flow_log = only(template, "AWS::EC2::FlowLog")["Properties"]
    assert flow_log["ResourceType"] == "VPC"
    assert flow_log["TrafficType"] == "ALL"


@pytest.mark.parametrize("overrides", [{}, NLB_SETTINGS, TOKEN_SETTINGS], ids=["defaults", "nlb", "token"])
def test_no_security_group_open_to_the_world(overrides: dict[str, str]) -> None:
    template = synth(**overrides)
    rules = [r["Properties"] for r in resources(template, "AWS::EC2::SecurityGroupIngress").values()]
    for group in resources(template, "AWS::EC2::SecurityGroup").values():
        rules.extend(group["Properties"].get("SecurityGroupIngress", []))
    assert rules, "no ingress rules at all: the check would be vacuous"
    for rule in rules:
        assert rule.get("CidrIp") != "0.0.0.0/0", rule
        assert rule.get("CidrIpv6") != "::/0", rule


def test_ray_dashboard_never_leaves_the_cluster(rayservice: dict[str, Any]) -> None:
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    assert not head.get("enableIngress", False)
    assert "serveService" not in rayservice["spec"]


def test_internal_nlb_only_serves_port_8000_to_listed_cidrs() -> None:
    template = synth(**NLB_SETTINGS)
    (service,) = [m for m in manifests(template) if m["kind"] == "Service" and m["spec"]["type"] == "LoadBalancer"]
    annotations = service["metadata"]["annotations"]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internal"
    assert service["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8", "192.168.10.0/24"]
    assert [p["port"] for p in service["spec"]["ports"]] == [8000]
    assert service["spec"]["selector"]["ray.io/group"] == "ingress"
    assert "aws-load-balancer-controller" in helm_releases(template)
    association = only(template, "AWS::EKS::PodIdentityAssociation", ServiceAccount="aws-load-balancer-controller")
    assert association["Properties"]["Namespace"] == "kube-system"


def test_no_nlb_by_default(template: dict[str, Any]) -> None:
    assert "aws-load-balancer-controller" not in helm_releases(template)
    # The one Service: the clients' ClusterIP on the ingress pods (tests/test_client_endpoint.py).
    assert [m["spec"]["type"] for m in manifests(template) if m["kind"] == "Service"] == ["ClusterIP"]


def test_token_synced_by_external_secrets_with_one_secret_policy() -> None:
    template = synth(**TOKEN_SETTINGS)
    policy = pod_identity_policy(template, "external-secrets")
    (statement,) = policy["PolicyDocument"]["Statement"]
    assert sorted(statement["Action"]) == ["secretsmanager:DescribeSecret", "secretsmanager:GetSecretValue"]
    assert render(statement["Resource"]).endswith(":secret:prod/hf-token-??????")
    kinds = {m["kind"]: m for m in manifests(template)}
    external = kinds["ExternalSecret"]
    assert external["spec"]["target"]["name"] == "hf-token"
    assert external["spec"]["data"] == [{"secretKey": "token", "remoteRef": {"key": "prod/hf-token"}}]
    assert kinds["SecretStore"]["spec"]["provider"]["aws"]["service"] == "SecretsManager"


def test_a_customer_managed_token_key_is_decryptable_through_secrets_manager_only() -> None:
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    template = synth(**TOKEN_SETTINGS, hf_token_kms_key_arn=key)
    policy = pod_identity_policy(template, "external-secrets")
    (decrypt,) = [s for s in policy["PolicyDocument"]["Statement"] if s["Action"] == "kms:Decrypt"]
    assert decrypt["Resource"] == key
    via = render(decrypt["Condition"]["StringEquals"]["kms:ViaService"])
    assert via == "secretsmanager.${AWS::Region}.amazonaws.com"
    # No other role in the stack may decrypt with it.
    grants = [
        s
        for p in resources(template, "AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if s.get("Resource") == key
    ]
    assert grants == [decrypt]


def test_token_value_never_reaches_template_or_assets(tmp_path: Path) -> None:
    """Synth as the CLI runs it, with a token in the environment: no file in cdk.out holds it."""
    token = "hf_" + "Zq7" * 12  # the shape of a real token, made up here
    env = {"HF_TOKEN": token, "HUGGING_FACE_HUB_TOKEN": token}
    assert synth_leaks(token, tmp_path, TOKEN_SETTINGS, env) == []


def test_ray_token_authentication_is_on_by_default(rayservice: dict[str, Any]) -> None:
    """KubeRay 1.7 makes the token Secret and sets RAY_AUTH_MODE/RAY_AUTH_TOKEN itself; we set neither."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token"}
    containers = [cluster["headGroupSpec"]["template"]["spec"]["containers"][0]] + [
        g["template"]["spec"]["containers"][0] for g in cluster["workerGroupSpecs"]
    ]
    assert not [e for c in containers for e in c.get("env", []) if e["name"].startswith("RAY_AUTH")]


def test_ray_token_authentication_can_be_turned_off() -> None:
    cluster = rayservice_from(synth(ray_token_auth="false"))["spec"]["rayClusterConfig"]
    assert "authOptions" not in cluster
