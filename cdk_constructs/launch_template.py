"""Launch template data shared by every node group."""

from __future__ import annotations

from typing import Any

from aws_cdk import aws_ec2 as ec2

LT = ec2.CfnLaunchTemplate


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
