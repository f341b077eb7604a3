"""The node groups: the system nodes, the GPU nodes, their AMI, capacity and GPU groups."""

from __future__ import annotations

import re

from settings import catalog
from settings.model import TENSOR_PARALLEL_SIZES, Settings
from settings.rules.base import require
from settings.rules.bounds import span, within
from settings.sizing import GPU_ROOT_MAX_GIB, gpu_root_volume_floor, gpu_serving_node_bounds

_CAPACITY_RESERVATION = re.compile(r"^cr-[0-9a-f]{17}$")


def check_system_nodes(s: Settings) -> None:
    """The system node group: its type, size and volume."""
    system = catalog.INSTANCE_TYPES.get(s.system_instance_type)
    cpu_types = sorted(k for k, v in catalog.INSTANCE_TYPES.items() if not v.gpus)
    require(
        system is not None and system.gpus == 0,
        "system_instance_type",
        s.system_instance_type,
        f"an instance type without a GPU (the system nodes use the standard AL2023 AMI): {cpu_types}",
    )
    require(
        s.system_nodes_min >= 1,
        "system_nodes_min",
        s.system_nodes_min,
        "at least 1: the Ray head and the KubeRay operator must always have a node",
    )
    require(
        s.system_nodes_min <= s.system_nodes_desired <= s.system_nodes_max,
        "system_nodes_desired",
        (s.system_nodes_min, s.system_nodes_desired, s.system_nodes_max),
        "system_nodes_min <= system_nodes_desired <= system_nodes_max",
    )
    require(
        within("system_volume_gib", s.system_volume_gib),
        "system_volume_gib",
        s.system_volume_gib,
        f"{span('system_volume_gib')} (the ~20 GB serving image twice during an upgrade, plus the operators)",
    )


def check_gpu_nodes(s: Settings) -> None:
    """The GPU node group: its type, AZ, root volume and capacity reservation."""
    regions = sorted(catalog.REGION_AZS)
    gpu = catalog.INSTANCE_TYPES.get(s.gpu_instance_type)
    gpu_types = sorted(k for k, v in catalog.INSTANCE_TYPES.items() if v.gpus and v.efa_interfaces)
    require(
        gpu is not None and gpu.gpus >= 1 and gpu.efa_interfaces > 0,
        "gpu_instance_type",
        s.gpu_instance_type,
        f"an instance type with a GPU and EFA: {gpu_types}",
    )
    if s.gpu_availability_zone is not None:
        region = s.effective_region or ""
        azs = catalog.REGION_AZS.get(region, ())
        require(
            s.gpu_availability_zone in azs,
            "gpu_availability_zone",
            s.gpu_availability_zone,
            f"an AZ of region {region!r}: {list(azs)}" if azs else f"an AZ of one of {regions}",
        )
    if s.gpu_volume_gib is not None:
        floor, holds = gpu_root_volume_floor(s)
        require(
            floor <= s.gpu_volume_gib <= GPU_ROOT_MAX_GIB,
            "gpu_volume_gib",
            s.gpu_volume_gib,
            f"{floor} to {GPU_ROOT_MAX_GIB} on {s.gpu_instance_type} ({holds})",
        )
    if s.gpu_capacity_reservation_id is not None:
        require(
            bool(_CAPACITY_RESERVATION.match(s.gpu_capacity_reservation_id)),
            "gpu_capacity_reservation_id",
            s.gpu_capacity_reservation_id,
            "cr- and 17 hex digits",
        )
        require(
            not s.gpu_placement_group,
            "gpu_capacity_reservation_id",
            s.gpu_capacity_reservation_id,
            "a reservation cannot target the stack's new placement group; set gpu_placement_group=false",
        )


def check_gpu_ami_release(s: Settings) -> None:
    """An EKS optimized AMI release of the cluster's own minor version (EKS creates a node group on no other),
    no older than the catalog's: the image's CUDA needs an NVIDIA driver of IMAGE_MIN_NVIDIA_DRIVER or newer,
    which the pinned release ships, and an older release may not (amazon-eks-ami moved minors to it over time)."""
    pinned = catalog.GPU_AMI_RELEASE_VERSIONS[s.kubernetes_version]
    pattern = re.escape(s.kubernetes_version) + r"\.\d+-\d{8}"
    require(
        s.gpu_ami_release_version is None or re.fullmatch(pattern, s.gpu_ami_release_version) is not None,
        "gpu_ami_release_version",
        s.gpu_ami_release_version,
        f"an EKS optimized AL2023 NVIDIA AMI release for Kubernetes {s.kubernetes_version}: "
        f"{s.kubernetes_version}.<patch>-<YYYYMMDD>, e.g. {pinned}",
    )
    if s.gpu_ami_release_version is not None:
        require(
            _release_order(s.gpu_ami_release_version) >= _release_order(pinned),
            "gpu_ami_release_version",
            s.gpu_ami_release_version,
            f"{pinned} or later (the catalog's release, whose NVIDIA driver is {catalog.IMAGE_MIN_NVIDIA_DRIVER} or "
            f"newer as the image's CUDA needs; an older release may ship an older driver)",
        )


def _release_order(release: str) -> tuple[str, int]:
    """A release's place in time: its date, then its Kubernetes patch."""
    version, _, date = release.partition("-")
    return date, int(version.rsplit(".", 1)[1])


def check_capacity_block(s: Settings) -> None:
    """A Capacity Block for ML is a capacity reservation launched with market type capacity-block."""
    require(
        not s.gpu_capacity_block or s.gpu_capacity_reservation_id is not None,
        "gpu_capacity_block",
        s.gpu_capacity_block,
        "set with gpu_capacity_reservation_id (the Capacity Block's reservation id, cr-...)",
    )
    require(
        within("capacity_block_end_warning_hours", s.capacity_block_end_warning_hours),
        "capacity_block_end_warning_hours",
        s.capacity_block_end_warning_hours,
        f"{span('capacity_block_end_warning_hours')} hours (a Capacity Block lasts at most 182 days)",
    )


# Tensor-parallel sizes a node's GPUs split into.


def check_tensor_parallel(s: Settings) -> None:
    """Every GPU of every GPU node serves, every pod holds whole EFA devices, and vLLM 0.26's
    NixlConnector accepts the pair (the rules read from its source, cited at each check)."""
    gpu = s.gpu_instance
    for side in ("prefill", "decode"):
        key, tp = f"{side}_tensor_parallel_size", s.tensor_parallel_size(side)
        fits = [t for t in TENSOR_PARALLEL_SIZES if t <= gpu.gpus and gpu.gpus % t == 0]
        require(tp in fits, key, tp, f"one of {fits}: a divisor of {s.gpu_instance_type}'s {gpu.gpus} GPUs")
        pods = gpu.gpus // tp
        # The EFA device plugin gives each device to one pod (EKS user guide, device-management-efa).
        whole = [t for t in fits if gpu.efa_interfaces % (gpu.gpus // t) == 0]
        require(
            gpu.efa_interfaces % pods == 0,
            key,
            tp,
            f"{s.gpu_instance_type} has {gpu.efa_interfaces} EFA device(s) for {gpu.gpus} GPUs: {pods} pods per node "
            f"cannot each hold whole EFA devices; use one of {whole}",
        )
        replicas = s.side_replicas(side)
        idle = (-replicas) % pods * tp
        other_sizes = [t for t in whole if (replicas * t) % gpu.gpus == 0]
        require(
            idle == 0,
            f"{side}_replicas",
            replicas,
            f"{replicas} replica(s) of {tp} GPU(s) leave {idle} of {s.gpu_instance_type}'s {gpu.gpus} GPUs idle on a "
            f"{side} node; fits: {side}_replicas={replicas + (-replicas) % pods}"
            + (f", or {side}_tensor_parallel_size={other_sizes[0]}" if other_sizes else ""),
        )
        # The GPU group grows by whole nodes: at the maximum every node it added must be full too.
        high = s.side_max_replicas(side)
        spare = (-high) % pods * tp
        require(
            spare == 0,
            f"{side}_max_replicas",
            high,
            f"{high} replica(s) of {tp} GPU(s) need {s.side_max_nodes(side)} {s.gpu_instance_type} node(s) and leave "
            f"{spare} of a node's {gpu.gpus} GPUs idle at the maximum; "
            f"fits: {side}_max_replicas={high + (-high) % pods}",
        )
    p, d = s.prefill_tensor_parallel_size, s.decode_tensor_parallel_size
    if s.serving_mode == "aggregated":
        require(p == d, "decode_tensor_parallel_size", d, f"equal to prefill_tensor_parallel_size {p} when aggregated")
        return
    # vllm/distributed/kv_transfer/kv_connector/utils.py, TransferTopology.tp_ratio: asserts divisibility.
    require(
        max(p, d) % min(p, d) == 0,
        "decode_tensor_parallel_size",
        d,
        f"a size that divides or is divided by prefill_tensor_parallel_size {p} (vLLM NixlConnector tp_ratio)",
    )
    # nixl/base_worker.py, _validate_remote_agent_handshake: with prefill TP > decode TP, a
    # prefill that replicates KV heads (TP > num_key_value_heads) is refused at the handshake.
    heads = s.model.kv_heads
    require(
        not (p > d and p > heads),
        "prefill_tensor_parallel_size",
        p,
        f"at most {heads} (the KV heads of {s.model_id}) when larger than decode_tensor_parallel_size {d} "
        "(vLLM NixlConnector refuses replicated KV heads from a larger prefill TP)",
    )


def check_warm_nodes(s: Settings) -> None:
    """Warm GPU nodes lie within the GPU group's maximum: the range the sides' maxima give it."""
    key, warm = "gpu_warm_nodes", s.gpu_warm_nodes
    require(within(key, warm), key, warm, f"{span(key)} spare GPU nodes")
    low, high = gpu_serving_node_bounds(s)
    require(
        low + warm <= high,
        key,
        warm,
        f"at most {high - low}: the GPU group's maximum ({high} nodes at every side's maximum replicas) less the "
        f"{low} its minimum replicas need; raise prefill_max_replicas or decode_max_replicas to keep a node warm",
    )
