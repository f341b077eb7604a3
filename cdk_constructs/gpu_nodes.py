"""The EFA-enabled GPU managed node group, in one subnet and one cluster placement group."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import Fn
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.node_common import LT, node_launch_template_data, node_role, nodeadm_user_data
from settings.catalog import (
    DEFAULT_GPU_INSTANCE_TYPE,
    DEFAULT_KUBERNETES_VERSION,
    FAST_IMAGE_PULL_GATE,
    GPU_AMI_RELEASE_VERSIONS,
    INSTANCE_TYPES,
)

GPU_NODE_LABELS: Mapping[str, str] = {"role": "gpu-worker"}
# The NVIDIA device plugin chart (0.20.0) requires this label (or an NFD one) in its
# node affinity. nodeadm sets it on NVIDIA AMIs only from Kubernetes 1.35
# (amazon-eks-ami nodeadm/internal/kubelet/config.go); before that the plugin
# would schedule nowhere and no node would advertise nvidia.com/gpu.
GPU_PRESENT_LABEL: Mapping[str, str] = {"nvidia.com/gpu.present": "true"}
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "true"
# Cluster Autoscaler's GPU label on AWS (cloudprovider/aws/aws_cloud_provider.go, GPULabel). A node
# carrying it with no nvidia.com/gpu allocatable yet (the device plugin not registered) counts as
# unready rather than as a node the pending pod does not fit, so the autoscaler waits for it instead of
# adding another (processors/customresources/gpu_processor.go, FilterOutNodesWithUnreadyResources).
CA_GPU_LABEL = "k8s.amazonaws.com/accelerator"
# A resource the node template cannot know from the instance type: Cluster Autoscaler takes CPU,
# memory and nvidia.com/gpu from its instance table, and extended resources only from this tag prefix,
# on the ASG or, for a managed node group, on the node group itself (read through
# eks:DescribeNodegroup: cloudprovider/aws/aws_manager.go buildNodeFromTemplate,
# extractAllocatableResourcesFromTags; aws_wrapper.go getManagedNodegroupInfo).
CA_RESOURCE_TAG_PREFIX = "k8s.io/cluster-autoscaler/node-template/resources/"
EFA_RESOURCE = "vpc.amazonaws.com/efa"


# The instance families aws-cdk-lib 2.275's aws_eks_v2 takes for GPU types when it checks a node
# group's AMI type against its instance types (aws-eks-v2/lib/private/nodegroup.js,
# isGpuInstanceType). P5 is missing: with AL2023_X86_64_NVIDIA it throws
# AmiTypeDoesNotMatchInstanceArchitecture, so for such a type the node group's InstanceTypes
# is written as a property override, past that check (the AMI type stays explicit).
CDK_GPU_FAMILIES = frozenset({"p2", "p3", "p3dn", "p4de", "p4d", "g3s", "g3", "g4dn", "g4ad", "g5", "g5g", "g6", "g6e"})


def network_interface_layout(instance_type: str) -> list[tuple[int, int, str]]:
    """(network card index, device index, interface type) for every interface a GPU node gets.

    One card: one EFA-with-ENA interface, card 0 device 0. Several cards, where the type takes
    EFA-only interfaces, the EC2 User Guide's layout ("Maximize network bandwidth on Amazon EC2
    instances with multiple network cards"): card 0 device 0 the ENA interface (an EFA-only one
    cannot be primary), card 0 device 1 efa-only, every other card device 0 efa-only. Several
    cards where efa-only is unconfirmed: an EFA-with-ENA interface on device 0 of each card.
    One EFA per card, so the interfaces are as many as the type's EFA devices (settings/catalog.py).
    """
    spec = INSTANCE_TYPES[instance_type]
    cards = spec.efa_interfaces
    if cards <= 1:
        return [(0, 0, "efa")]
    if spec.efa_only:
        return [(0, 0, "interface"), (0, 1, "efa-only"), *((card, 0, "efa-only") for card in range(1, cards))]
    return [(card, 0, "efa") for card in range(cards)]


def gpu_toleration() -> dict[str, str]:
    """The toleration a pod needs to land on a GPU node."""
    return {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


class EfaGpuNodes(Construct):
    """GPU nodes with an EFA interface on every network card, tainted so only GPU pods land there.

    Args:
        cluster: the cluster the nodes join; its security group goes on the EFA
            interface, since interface security groups replace the ones EKS adds.
        vpc: the VPC of the EFA security group.
        subnet: the one subnet (and so one AZ) every EFA node shares.
        instance_type: an EFA-capable GPU type; default "g6.8xlarge".
        node_count: the group's minimum and first size; default 2 (one prefill, one decode).
        max_node_count: the group's maximum; default None (fixed at node_count). Above node_count the
            group is Cluster Autoscaler's to size (cdk_constructs/cluster_autoscaler.py): the nodes get
            CA_GPU_LABEL and the group a tag with the EFA devices a node brings (autoscaling_tags). The
            desired size stays node_count, in every case (see the comment at the node group).
        volume_gib: root volume, gp3, encrypted; default 300, for a type without
            instance store, whose root holds the image and the weights. With
            local_nvme_raid0 the root keeps only what nodeadm leaves there (the AMI,
            the journal): settings/sizing/root_volume.py gpu_root_volume_gib sizes it for the type.
        placement_group: put the nodes in a new cluster placement group; default True.
        capacity_reservation_id: launch into this EC2 capacity reservation; default None.
        capacity_block: that reservation is a Capacity Block for ML: the node group's capacity
            type CAPACITY_BLOCK and the launch template's market type capacity-block (EKS user
            guide, capacity-blocks-mng); default False.
        pods_reach_imds: IMDS hop limit 2 instead of 1; default False.
        local_nvme_raid0: assemble the instance store as RAID0 through nodeadm's
            localStorage (it holds kubelet's and containerd's state, the SOCI snapshotter's
            and the model cache); default False (types without instance store).
        ami_release_version: the EKS optimized AMI release the group runs (its releaseVersion);
            default the catalog's for the default Kubernetes version (GPU_AMI_RELEASE_VERSIONS).
            Every node's NodeConfig turns on nodeadm's FAST_IMAGE_PULL_GATE.

    Attributes:
        nodegroup, efa_security_group, placement_group (or None), launch_template,
        labels (for nodeSelectors).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        instance_type: str = DEFAULT_GPU_INSTANCE_TYPE,
        node_count: int = 2,
        max_node_count: int | None = None,
        volume_gib: int = 300,
        placement_group: bool = True,
        capacity_reservation_id: str | None = None,
        capacity_block: bool = False,
        pods_reach_imds: bool = False,
        local_nvme_raid0: bool = False,
        ami_release_version: str = GPU_AMI_RELEASE_VERSIONS[DEFAULT_KUBERNETES_VERSION],
    ) -> None:
        super().__init__(scope, construct_id)
        self.labels: Mapping[str, str] = dict(GPU_NODE_LABELS)
        self.min_size = node_count
        self.max_size = node_count if max_node_count is None else max_node_count
        if self.max_size < self.min_size:
            raise ValueError(f"max_node_count {self.max_size} is below node_count {self.min_size}")
        self.autoscaled = self.max_size > self.min_size
        node_labels = {**self.labels, **GPU_PRESENT_LABEL}
        if self.autoscaled:
            node_labels[CA_GPU_LABEL] = ca_accelerator_name(instance_type)

        # EFA's SRD traffic must be allowed to and from the group itself, in
        # both directions; nothing else is opened. With allow_all_outbound=False
        # CDK keeps the self egress rule (with True it would drop it silently).
        self.efa_security_group = ec2.SecurityGroup(
            self,
            "EfaSecurityGroup",
            vpc=vpc,
            description="EFA: all traffic to and from members of this group only",
            allow_all_outbound=False,
        )
        self.efa_security_group.connections.allow_internally(ec2.Port.all_traffic(), "EFA within the group")

        self.placement_group: ec2.CfnPlacementGroup | None = None
        extra: dict[str, Any] = {}
        if placement_group:
            self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
            extra["placement"] = LT.PlacementProperty(group_name=self.placement_group.ref)
        if capacity_reservation_id:
            extra["capacity_reservation_specification"] = LT.CapacityReservationSpecificationProperty(
                capacity_reservation_target=LT.CapacityReservationTargetProperty(
                    capacity_reservation_id=capacity_reservation_id
                )
            )
        if capacity_block:
            extra["instance_market_options"] = LT.InstanceMarketOptionsProperty(market_type="capacity-block")
        # The L2 LaunchTemplate cannot declare an EFA interface; the subnet
        # stays on the node group, never here.
        extra["network_interfaces"] = [
            LT.NetworkInterfaceProperty(
                device_index=device,
                network_card_index=card,
                interface_type=kind,
                delete_on_termination=True,
                groups=[cluster.cluster_security_group_id, self.efa_security_group.security_group_id],
            )
            for card, device, kind in network_interface_layout(instance_type)
        ]
        # SOCI's parallel pull and unpack for the serving image. Its state follows the RAID0 array
        # (setup-local-disks bind-mounts /var/lib/soci-snapshotter-grpc there unless disabledMounts
        # names SOCI), so the unpacked layers sit on the NVMe, not on the small root volume.
        node_config: dict[str, Any] = {"featureGates": {FAST_IMAGE_PULL_GATE: True}}
        if local_nvme_raid0:
            node_config["instance"] = {"localStorage": {"strategy": "RAID0"}}
        extra["user_data"] = Fn.base64(nodeadm_user_data(node_config))
        data = node_launch_template_data(volume_gib=volume_gib, pods_reach_imds=pods_reach_imds, **extra)
        self.launch_template = ec2.CfnLaunchTemplate(self, "LaunchTemplate", launch_template_data=data)

        self.role = node_role(self, "NodeRole")
        cdk_knows_gpu = instance_type.split(".")[0] in CDK_GPU_FAMILIES
        self.nodegroup = cluster.add_nodegroup_capacity(
            "GpuNodes",
            # aws-cdk would pick an AL2 GPU AMI for g6; AL2 has no 1.33+ AMIs.
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            # Pinned: otherwise each node launched takes the newest release, and one group could mix
            # NVIDIA drivers and nodeadm versions. The launch template names no image, so EKS picks
            # the AMI of this release and AMI type.
            release_version=ami_release_version,
            instance_types=[ec2.InstanceType(instance_type)] if cdk_knows_gpu else None,
            # DesiredSize is the minimum, with a range too. CreateNodegroup, which runs on the first
            # deploy and whenever a create-only property changes (instance type, capacity type,
            # subnet, AMI type, node role), takes all of the sizes or none (EKS API reference,
            # NodegroupScalingConfig). On an update CloudFormation passes DesiredSize on only when its
            # template value changes, so a constant one leaves Cluster Autoscaler's count alone; a new
            # minimum does change it and sets the group to that minimum (docs/operations.md, "Cluster Autoscaler").
            min_size=self.min_size,
            desired_size=self.min_size,
            max_size=self.max_size,
            labels=node_labels,
            tags=autoscaling_tags(instance_type) if self.autoscaled else None,
            taints=[eks.TaintSpec(key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE, effect=eks.TaintEffect.NO_SCHEDULE)],
            subnets=ec2.SubnetSelection(subnets=[subnet]),
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref, version=self.launch_template.attr_latest_version_number
            ),
            # Two fixed GPUs: replace one node at a time. A Capacity Block group is updated by EKS
            # only at desired size 0 (docs/hardware-and-models.md, "Capacity Blocks"): this setting
            # then never applies.
            max_unavailable=1,
            capacity_type=eks.CapacityType.CAPACITY_BLOCK if capacity_block else None,
            node_role=self.role,
        )
        cfn = self.nodegroup.node.default_child
        assert isinstance(cfn, eks.CfnNodegroup)
        if not cdk_knows_gpu:
            cfn.add_property_override("InstanceTypes", [instance_type])


def ca_accelerator_name(instance_type: str) -> str:
    """CA_GPU_LABEL's value: Cluster Autoscaler's name for the GPU (aws_cloud_provider.go availableGPUTypes
    spells them nvidia-<model>, e.g. nvidia-l4; the value only names the GPU in its metrics)."""
    return "nvidia-" + INSTANCE_TYPES[instance_type].gpu_model.lower()


def autoscaling_tags(instance_type: str) -> dict[str, str]:
    """The node group's tags for Cluster Autoscaler's node template when the group is at zero nodes.

    Only the EFA devices: labels and taints it reads from eks:DescribeNodegroup, and CPU, memory and
    GPUs from its instance table (cloudprovider/aws/aws_manager.go buildNodeFromTemplate).
    """
    return {CA_RESOURCE_TAG_PREFIX + EFA_RESOURCE: str(INSTANCE_TYPES[instance_type].efa_interfaces)}
