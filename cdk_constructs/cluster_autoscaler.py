"""Cluster Autoscaler for the GPU managed node group: the pinned chart, a least-privilege role through Pod Identity.

Read from kubernetes/autoscaler at the image tags in settings/catalog.py (cluster-autoscaler-1.32.7 to
-1.36.1 call the same AWS APIs): cloudprovider/aws/README.md, aws_wrapper.go, aws_manager.go,
auto_scaling_groups.go, aws_util.go, aws_sdk_provider.go.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import ArnFormat, Aws, Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs.helm import helm_release, pod_identity
from settings.catalog import CLUSTER_AUTOSCALER, HelmChartPin

SERVICE_ACCOUNT = "cluster-autoscaler"
# EKS tags a managed node group's Auto Scaling group for auto-discovery (EKS user guide, "Managed node
# groups": k8s.io/cluster-autoscaler/enabled and k8s.io/cluster-autoscaler/<cluster>, per the EKS best
# practices guide's Cluster Autoscaler policy) and with eks:cluster-name and eks:nodegroup-name, which
# Cluster Autoscaler itself reads to know a group is managed (aws_manager.go extractLabelsFromAsg,
# buildNodeFromTemplate). The chart's two default tags find this cluster's groups; the node group's
# name narrows them to the GPU group, so the system group keeps the size its settings give it.
DISCOVERY_TAGS = (
    "k8s.io/cluster-autoscaler/enabled",
    "k8s.io/cluster-autoscaler/{{ .Values.autoDiscovery.clusterName }}",
)
NODEGROUP_TAG = "eks:nodegroup-name"
CLUSTER_TAG = "eks:cluster-name"
# Every read the autoscaler makes of a managed node group's Auto Scaling group: aws_wrapper.go's
# getAutoscalingGroupsByNames/ByTags (DescribeAutoScalingGroups) and getLaunchTemplateData
# (DescribeLaunchTemplateVersions), auto_scaling_groups.go's isNodeGroupAvailable
# (DescribeScalingActivities), aws_util.go's GenerateEC2InstanceTypes (DescribeInstanceTypes, for
# --aws-use-static-instance-list=false, the default). None takes a resource-level permission.
# Left out: ec2:DescribeImages and ec2:GetInstanceTypesFromInstanceRequirements, called only together
# by getInstanceTypeFromInstanceRequirements for groups sized by instance requirements (this group
# names its instance type); autoscaling:DescribeLaunchConfigurations, called only for groups with a
# launch configuration (getInstanceTypeByLaunchConfigNames), while a managed node group's always has
# a launch template (EKS user guide, launch-templates).
DESCRIBE_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeScalingActivities",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
)
# Its only writes (auto_scaling_groups.go setAsgSizeNoLock and DeleteInstances): allowed on the GPU
# group's Auto Scaling group alone, by its tags.
SCALE_ACTIONS = ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup")
# The chart's own example requests (values.yaml comments); the pod runs on a system node.
RESOURCES = {"requests": {"cpu": "100m", "memory": "300Mi"}, "limits": {"memory": "300Mi"}}


def cluster_autoscaler_values(
    *,
    cluster_name: str,
    nodegroup_name: str,
    region: str,
    image_tag: str,
    system_node_labels: Mapping[str, str],
) -> dict[str, Any]:
    """The chart's values: AWS, auto-discovery of the one GPU group, the region, the image for the cluster's minor.

    awsRegion becomes AWS_REGION in the pod: the autoscaler then never asks the instance metadata
    service for its region (aws_sdk_provider.go getRegion), which pods cannot reach at hop limit 1.
    """
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        "autoDiscovery": {
            "clusterName": cluster_name,
            "tags": [*DISCOVERY_TAGS, f"{NODEGROUP_TAG}={nodegroup_name}"],
        },
        "image": {"tag": image_tag},
        "nodeSelector": dict(system_node_labels),
        "rbac": {"serviceAccount": {"name": SERVICE_ACCOUNT}},
        "resources": RESOURCES,
    }


class ClusterAutoscaler(Construct):
    """Cluster Autoscaler sizing one managed node group between its minimum and maximum.

    The autoscaler changes only the Auto Scaling group's desired capacity, within the group's own
    minimum and maximum (cloudprovider/aws/README.md); the node group's template keeps its desired
    size constant, so a deploy does not send it (cdk_constructs/gpu_nodes.py).

    Args:
        cluster: the cluster.
        nodegroup: the managed node group it sizes (and no other).
        min_nodes, max_nodes: that group's bounds; max_nodes must exceed min_nodes (else there is
            nothing to scale and the stack leaves the autoscaler out).
        image_tag: the autoscaler image for the cluster's Kubernetes minor
            (settings.catalog.CLUSTER_AUTOSCALER_IMAGE_TAGS).
        region: the cluster's region; default the stack's (a token in an environment-agnostic stack).
        system_node_labels: where the autoscaler's pod runs.
        pin: the chart; default settings.catalog.CLUSTER_AUTOSCALER (9.59.0, in kube-system).

    Attributes:
        release: the Helm release.
        role: the Pod Identity role of its service account.
        min_nodes, max_nodes: as given.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        nodegroup: eks.Nodegroup,
        min_nodes: int,
        max_nodes: int,
        image_tag: str,
        system_node_labels: Mapping[str, str],
        region: str | None = None,
        pin: HelmChartPin = CLUSTER_AUTOSCALER,
    ) -> None:
        super().__init__(scope, construct_id)
        if not 0 <= min_nodes < max_nodes:
            raise ValueError(f"Cluster Autoscaler needs 0 <= min_nodes < max_nodes, got {min_nodes} and {max_nodes}")
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        cfn = nodegroup.node.default_child
        assert isinstance(cfn, eks.CfnNodegroup)
        nodegroup_name = cfn.attr_nodegroup_name
        self.role = pod_identity(
            self, "PodIdentity", cluster=cluster, namespace=pin.namespace, service_account=SERVICE_ACCOUNT
        )
        self.role.add_to_policy(iam.PolicyStatement(actions=list(DESCRIBE_ACTIONS), resources=["*"]))
        # Labels and taints of a group at zero nodes come from here (aws_wrapper.go getManagedNodegroupInfo).
        self.role.add_to_policy(
            iam.PolicyStatement(actions=["eks:DescribeNodegroup"], resources=[nodegroup.nodegroup_arn])
        )
        # Any Auto Scaling group of this account and region, narrowed by the tags EKS puts on the GPU group's.
        # Partition, region and account as pseudo parameters even where the stack's environment names them, so
        # the ARN (and the acknowledgement of its wildcard, stacks/nag_acknowledgements.py) reads the same.
        asg_arn = Stack.of(self).format_arn(
            service="autoscaling",
            partition=Aws.PARTITION,
            region=Aws.REGION,
            account=Aws.ACCOUNT_ID,
            resource="autoScalingGroup",
            resource_name="*:autoScalingGroupName/*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=list(SCALE_ACTIONS),
                resources=[asg_arn],
                conditions={
                    "StringEquals": {
                        f"aws:ResourceTag/{CLUSTER_TAG}": cluster.cluster_name,
                        f"aws:ResourceTag/{NODEGROUP_TAG}": nodegroup_name,
                    }
                },
            )
        )
        values = cluster_autoscaler_values(
            cluster_name=cluster.cluster_name,
            nodegroup_name=nodegroup_name,
            region=region or Aws.REGION,
            image_tag=image_tag,
            system_node_labels=system_node_labels,
        )
        self.release = helm_release(self, "Release", cluster=cluster, pin=pin, values=values)
        # A pod admitted before its association exists never gets credentials; the role's policy comes first too.
        self.release.node.add_dependency(self.role, self.node.find_child("PodIdentityAssociation"))
