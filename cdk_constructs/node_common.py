"""What every managed node group shares: its launch template data and its IAM role."""

from __future__ import annotations

from typing import Any

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

LT = ec2.CfnLaunchTemplate

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
