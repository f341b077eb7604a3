"""Sizing: the GPU node's root volume and the GPU node count."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from settings.sizing.memory import SIDES

if TYPE_CHECKING:
    from settings.model import Settings


# --- The GPU node's root volume ----------------------------------------------------------------------
# The AL2023 EKS AMIs' root snapshot is 20 GiB (amazon-eks-ami templates/al2023/template.pkr.hcl,
# ami_block_device_mappings): the OS, the NVIDIA and EFA drivers, CUDA's user-space libraries.
AMI_ROOT_SNAPSHOT_GIB = 20
# systemd-journald keeps at most 10% of its filesystem, capped at 4 GiB (journald.conf(5), SystemMaxUse).
JOURNAL_MAX_GIB = 4
# On a type with instance store, nodeadm's localStorage RAID0 (amazon-eks-ami setup-local-disks)
# bind-mounts /var/lib/kubelet, /var/lib/containerd, /var/lib/soci-snapshotter-grpc and /var/log/pods
# onto the array before containerd and kubelet start: images, container layers, emptyDirs, pod logs
# and the model cache (a hostPath under the array) all live there. The root keeps the AMI, the
# journal and the rest of /var/log, /tmp and /opt: the snapshot, the journal's cap and 6 GiB of room.
GPU_ROOT_MIN_GIB_WITH_INSTANCE_STORE = AMI_ROOT_SNAPSHOT_GIB + JOURNAL_MAX_GIB + 6
# The default leaves room for AMIs that grow (each driver branch adds a few GB) and for node-level logs.
GPU_ROOT_GIB_WITH_INSTANCE_STORE = 50
# Without instance store the root also holds the ~20 GB serving image, a second copy while an
# upgrade pulls the next one, and the weights in the Hugging Face cache (16 GB for 8B in BF16, kept
# twice while downloading): 100 GiB at least, and 300 GiB by default leaves room for a model twice
# the default's size.
GPU_ROOT_MIN_GIB_WITHOUT_INSTANCE_STORE = 100
GPU_ROOT_GIB_WITHOUT_INSTANCE_STORE = 300
# EBS gp3's largest volume.
GPU_ROOT_MAX_GIB = 16384


def gpu_root_volume_gib(s: Settings) -> int:
    """The GPU nodes' root volume: the setting if given, else the default for the type's instance store."""
    if s.gpu_volume_gib is not None:
        return s.gpu_volume_gib
    if s.gpu_instance.instance_store_gb > 0:
        return GPU_ROOT_GIB_WITH_INSTANCE_STORE
    return GPU_ROOT_GIB_WITHOUT_INSTANCE_STORE


def gpu_root_volume_floor(s: Settings) -> tuple[int, str]:
    """(smallest root volume in GiB, what it holds) for the GPU instance type."""
    if s.gpu_instance.instance_store_gb > 0:
        return GPU_ROOT_MIN_GIB_WITH_INSTANCE_STORE, (
            f"the AMI's {AMI_ROOT_SNAPSHOT_GIB} GiB and the journal: kubelet, containerd and the model cache "
            f"live on its {s.gpu_instance.instance_store_gb} GB NVMe"
        )
    return GPU_ROOT_MIN_GIB_WITHOUT_INSTANCE_STORE, (
        "no instance store: the ~20 GB image twice during an upgrade, plus the model weights"
    )


# --- GPU nodes -----------------------------------------------------------------------------------------
def gpu_nodes_for(s: Settings, replicas: Mapping[str, int]) -> int:
    """GPU nodes that hold these replicas of each side, every side on nodes of its own (a node holds
    replicas_per_node of one side: its GPUs over the side's tensor-parallel size)."""
    return sum(math.ceil(replicas[side] / s.replicas_per_node(side)) for side in SIDES)


def gpu_serving_node_bounds(s: Settings) -> tuple[int, int]:
    """The GPU nodes the engine replicas need: (every side at its minimum, every side at its maximum)."""
    low = gpu_nodes_for(s, {side: s.side_replicas(side) for side in SIDES})
    high = gpu_nodes_for(s, {side: s.side_max_replicas(side) for side in SIDES})
    return low, high


def gpu_node_bounds(s: Settings) -> tuple[int, int]:
    """The GPU node group's (minimum, maximum): the serving nodes of every side's minimum plus the warm
    nodes, and the nodes of every side's maximum. Equal while no side has a range (or the warm nodes
    fill it); the minimum is also the group's first size. A warm node lies within the maximum: when a
    replica takes it, the group may grow by one to warm another (validate() refuses more warm nodes
    than the range holds)."""
    low, high = gpu_serving_node_bounds(s)
    return low + s.gpu_warm_nodes, high
