"""The system managed node group: KubeRay operator, Ray head, cluster add-ons."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.node_common import node_launch_template_data, node_role
from settings.catalog import DEFAULT_SYSTEM_INSTANCE_TYPE

SYSTEM_NODE_LABELS: Mapping[str, str] = {"role": "system"}


class SystemNodes(Construct):
    """A managed node group of general-purpose instances, labelled ``role: system``.

    Args:
        cluster: the cluster the nodes join.
        instance_type: default "m7i.xlarge".
        min_size / desired_size / max_size: default 1 / 2 / 3.
        volume_gib: root volume, gp3, encrypted; default 50.
        pods_reach_imds: IMDS hop limit 2 instead of 1; default False.

    Attributes:
        nodegroup: the managed node group.
        labels: the node labels, for nodeSelectors.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        instance_type: str = DEFAULT_SYSTEM_INSTANCE_TYPE,
        min_size: int = 1,
        desired_size: int = 2,
        max_size: int = 3,
        volume_gib: int = 50,
        pods_reach_imds: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        self.labels: Mapping[str, str] = dict(SYSTEM_NODE_LABELS)
        launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=node_launch_template_data(volume_gib=volume_gib, pods_reach_imds=pods_reach_imds),
        )
        self.role = node_role(self, "NodeRole")
        self.nodegroup = cluster.add_nodegroup_capacity(
            "SystemNodes",
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            instance_types=[ec2.InstanceType(instance_type)],
            min_size=min_size,
            desired_size=desired_size,
            max_size=max_size,
            labels=dict(self.labels),
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            launch_template_spec=eks.LaunchTemplateSpec(
                id=launch_template.ref, version=launch_template.attr_latest_version_number
            ),
            max_unavailable=1,
            node_role=self.role,
        )
