"""What every managed node group shares: its launch template data and its IAM role."""

from __future__ import annotations

from typing import Any

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

LT = ec2.CfnLaunchTemplate
# The boundary of the MIME multipart user data EKS merges with its own NodeConfig.
MIME_BOUNDARY = "==PDINFERENCE=="

# What a node needs to join and pull images, nothing more: the VPC CNI gets
# its EC2 permissions through Pod Identity (cdk_constructs/cluster.py), not here.
NODE_MANAGED_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryPullOnly")


def node_role(scope: Construct, construct_id: str) -> iam.Role:
    """The instance role of a node group, with only NODE_MANAGED_POLICIES."""
    return iam.Role(
        scope,
        construct_id,
        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(name) for name in NODE_MANAGED_POLICIES],
    )


def node_launch_template_data(*, volume_gib: int, pods_reach_imds: bool, **extra: Any) -> LT.LaunchTemplateDataProperty:
    """Launch template data for an EKS managed node: IMDSv2 and an encrypted gp3 root.

    A hop limit of 1 keeps pods (one network hop further away than the host)
    from the node role's credentials; 2 lets them through. Typed structs, not
    plain dicts: jsii silently drops keys it does not know.
    """
    return LT.LaunchTemplateDataProperty(
        metadata_options=LT.MetadataOptionsProperty(
            http_endpoint="enabled",
            http_tokens="required",
            http_put_response_hop_limit=2 if pods_reach_imds else 1,
        ),
        block_device_mappings=[
            LT.BlockDeviceMappingProperty(
                device_name="/dev/xvda",
                ebs=LT.EbsProperty(
                    volume_size=volume_gib, volume_type="gp3", encrypted=True, delete_on_termination=True
                ),
            )
        ],
        **extra,
    )


def nodeadm_user_data(node_config_spec: dict[str, Any]) -> str:
    """MIME multipart user data carrying one nodeadm NodeConfig (node.eks.aws/v1alpha1).

    Managed node groups merge it with the NodeConfig EKS writes (cluster name,
    endpoint, CA), so it holds only what this stack adds (EKS user guide,
    "Customize managed nodes with launch templates", AL2023 user data).
    The launch template takes it base64-encoded (the caller wraps it in Fn::Base64).
    """
    import yaml

    document = yaml.safe_dump(
        {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": node_config_spec}, sort_keys=False
    )
    return (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"\n\n'
        f"--{MIME_BOUNDARY}\n"
        "Content-Type: application/node.eks.aws\n\n"
        f"---\n{document}"
        f"--{MIME_BOUNDARY}--\n"
    )
