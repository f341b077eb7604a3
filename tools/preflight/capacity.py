"""Capacity checks: the instance types and EFA, a capacity reservation, the GPU AZ's offering, the vCPU quotas."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from botocore.exceptions import ClientError

from settings import catalog, sizing
from tools.preflight.base import Account, Result, error_code, pages, quota_value


# --- instance types and EFA ----------------------------------------------------------
def efa(account: Account) -> list[Result]:
    settings = account.settings
    gpu_type, system_type = settings.gpu_instance_type, settings.system_instance_type
    described = {
        t["InstanceType"]: t
        for t in account.client("ec2").describe_instance_types(InstanceTypes=sorted({gpu_type, system_type}))[
            "InstanceTypes"
        ]
    }
    gpu, system = described.get(gpu_type), described.get(system_type)
    if gpu is None or system is None:
        missing = gpu_type if gpu is None else system_type
        return [Result("FAIL", "EFA", f"{missing} is not an instance type in {account.region}")]
    account.gpu_vcpus = gpu["VCpuInfo"]["DefaultVCpus"]
    account.system_vcpus = system["VCpuInfo"]["DefaultVCpus"]
    network = gpu.get("NetworkInfo", {})
    interfaces = network.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0)
    cards = network.get("MaximumNetworkCards", 1)
    if not network.get("EfaSupported"):
        efa_types = sorted(k for k, v in catalog.INSTANCE_TYPES.items() if v.gpus and v.efa_interfaces)
        return [Result("FAIL", "EFA", f"{gpu_type} does not support EFA", f"-c gpu_instance_type= one of {efa_types}")]
    spec = catalog.INSTANCE_TYPES[gpu_type]
    detail = (
        f"{gpu_type}: EFA supported, {interfaces} EFA interface(s), {cards} network card(s); the stack attaches "
        f"{spec.efa_interfaces} EFA interface(s), one per card"
    )
    # The launch template declares an EFA interface on every card of the table (cdk_constructs/gpu_nodes.py):
    # a card the type lacks fails the launch, a card the table lacks sits idle.
    if (spec.efa_interfaces, spec.network_cards) != (interfaces, cards):
        return [
            Result(
                "FAIL",
                "EFA",
                f"{detail}; settings/catalog.py says {spec.efa_interfaces} EFA interface(s) on "
                f"{spec.network_cards} card(s), EC2 says {interfaces} on {cards}",
                "correct INSTANCE_TYPES in settings/catalog.py",
            )
        ]
    # The instance store decides the NVMe RAID0 and the model cache (settings/catalog.py instance_store_gb).
    store = gpu.get("InstanceStorageInfo", {}).get("TotalSizeInGB", 0) if gpu.get("InstanceStorageSupported") else 0
    ours = (spec.efa_interfaces, spec.vcpus, spec.instance_store_gb)
    theirs = (interfaces, account.gpu_vcpus, store)
    if ours != theirs:
        return [
            Result(
                "WARN",
                "EFA",
                f"{detail}; settings/catalog.py says {ours[0]} interface(s), {ours[1]} vCPUs, {ours[2]} GB "
                f"instance store; EC2 says {theirs[0]}, {theirs[1]}, {theirs[2]}",
                "correct INSTANCE_TYPES in settings/catalog.py",
            )
        ]
    return [Result("PASS", "EFA", detail)]


LINUX = "Linux/UNIX"


def capacity_reservation(account: Account) -> list[Result]:
    settings = account.settings
    reservation_id = settings.gpu_capacity_reservation_id
    if reservation_id is None:
        return []
    try:
        found = account.client("ec2").describe_capacity_reservations(CapacityReservationIds=[reservation_id])
    except ClientError as err:
        if error_code(err).startswith("InvalidCapacityReservationId"):
            return [Result("FAIL", "capacity reservation", f"{reservation_id} does not exist in {account.region}")]
        raise
    r = found["CapacityReservations"][0]
    account.reservation_az = r["AvailabilityZone"]
    wanted_az = settings.gpu_availability_zone or r["AvailabilityZone"]
    problems = []
    # A Capacity Block is "scheduled" until its start: the nodes launch then (reported below).
    if r["State"] != "active" and not (settings.gpu_capacity_block and r["State"] == "scheduled"):
        problems.append(f"state {r['State']}")
    if r["InstanceType"] != settings.gpu_instance_type:
        problems.append(f"type {r['InstanceType']}, not {settings.gpu_instance_type}")
    if r["AvailabilityZone"] != wanted_az:
        problems.append(f"AZ {r['AvailabilityZone']}, not gpu_availability_zone {wanted_az}")
    if r.get("Tenancy", "default") != "default":
        problems.append(f"tenancy {r['Tenancy']} (the node group launches default tenancy)")
    # The AL2023 NVIDIA AMI is Linux/UNIX: a reservation for another platform never matches its instances.
    if r.get("InstancePlatform", LINUX) != LINUX:
        problems.append(f"platform {r['InstancePlatform']} (the nodes run {LINUX})")
    # Only instances launched into that cluster placement group use it (EC2 user guide, cr-cpg);
    # the stack launches into a placement group of its own, or none.
    if r.get("PlacementGroupArn"):
        problems.append(f"it is for the cluster placement group {r['PlacementGroupArn']}, which the nodes never join")
    # A Capacity Block needs MarketType capacity-block in the launch template (EKS user guide,
    # capacity-blocks-mng), which the stack writes only with gpu_capacity_block.
    block = r.get("ReservationType") == "capacity-block"
    if block and not settings.gpu_capacity_block:
        problems.append("a Capacity Block for ML: set -c gpu_capacity_block=true (market type capacity-block)")
    if settings.gpu_capacity_block and not block:
        problems.append("not a Capacity Block, and gpu_capacity_block is set: the launch would ask for one")
    available, total = r.get("AvailableInstanceCount", 0), r.get("TotalInstanceCount", 0)
    # Against the GPU group's maximum: a node Cluster Autoscaler adds later launches into the
    # reservation too, and one beyond it cannot (the group would stop short of its maximum).
    low, high = sizing.gpu_node_bounds(settings)
    nodes = f"the {high} GPU nodes" + (f" at their maximum (minimum {low})" if high > low else "")
    if account.deployed:
        # AvailableInstanceCount leaves out the running instances, the stack's own GPU nodes among them.
        if total < high:
            problems.append(f"{total} in all, fewer than {nodes}")
    elif available < high:
        problems.append(f"{available} available of {nodes}")
    if problems:
        return [
            Result(
                "FAIL",
                "capacity reservation",
                f"{reservation_id}: " + "; ".join(problems),
                "fix the reservation, or -c gpu_capacity_reservation_id=none",
            )
        ]
    detail = f"{reservation_id}: active, {available} x {r['InstanceType']} in {r['AvailabilityZone']}"
    if account.deployed:
        detail = (
            f"{reservation_id}: active, {total} x {r['InstanceType']} in {r['AvailabilityZone']}, {available} not "
            f"running; the deployed GPU nodes are counted among the rest"
        )
    end = r.get("EndDate")
    if settings.gpu_capacity_block:
        return [_capacity_block_window(detail, r.get("StartDate"), end, settings.capacity_block_end_warning_hours)]
    if end is not None and end - datetime.now(UTC) < timedelta(days=7):
        return [Result("WARN", "capacity reservation", f"{detail}; it ends {end:%Y-%m-%d %H:%M} UTC")]
    return [Result("PASS", "capacity reservation", detail)]


def _capacity_block_window(detail: str, start: datetime | None, end: datetime | None, warn_hours: int) -> Result:
    """A Capacity Block's start and end: at its end EC2 terminates its instances, the GPU nodes with them."""
    when = f"{start:%Y-%m-%d %H:%M} UTC" if start else "unknown"
    until = f"{end:%Y-%m-%d %H:%M} UTC" if end else "unknown"
    text = f"{detail}; Capacity Block from {when} to {until} (its end terminates the GPU nodes)"
    now = datetime.now(UTC)
    if end is None or end - now < timedelta(hours=warn_hours):
        return Result(
            "WARN",
            "capacity reservation",
            f"{text}; that is within capacity_block_end_warning_hours={warn_hours}",
            "extend the block or move to another before it ends",
        )
    if start is not None and start > now:
        return Result("WARN", "capacity reservation", f"{text}; the GPU nodes cannot launch before it starts")
    return Result("PASS", "capacity reservation", text)


# --- vCPU quotas ---------------------------------------------------------------------
def running_vcpus(account: Account) -> dict[str, int]:
    """The vCPUs of the region's pending and running On-Demand instances, by the code of the quota
    that counts them (settings/catalog.py vcpu_quota)."""
    used: dict[str, int] = {}
    for reservation in pages(
        account.client("ec2"),
        "describe_instances",
        "Reservations",
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}],
    ):
        for instance in reservation["Instances"]:
            if instance.get("InstanceLifecycle") == "spot":
                continue
            quota = catalog.vcpu_quota(instance["InstanceType"])
            if quota is None:
                continue
            cpu = instance.get("CpuOptions", {})
            used[quota.code] = used.get(quota.code, 0) + cpu.get("CoreCount", 0) * cpu.get("ThreadsPerCore", 1)
    return used


def _quota_of(instance_type: str) -> catalog.Quota:
    # Every type the settings accept has its quota: a test holds settings/catalog.py to it.
    quota = catalog.vcpu_quota(instance_type)
    if quota is None:
        raise LookupError(f"settings/catalog.py VCPU_QUOTA_BY_FAMILY_LETTERS has no quota for {instance_type}")
    return quota


def _quota_line(
    account: Account,
    quota: catalog.Quota,
    used: int,
    nodes: tuple[int, int],
    surge: int,
    vcpus: int,
    what: str,
    maximum_holds: str = "",
) -> Result:
    """nodes: the group's (minimum, maximum). The deploy needs the minimum; growing to the maximum,
    and a node group update on top of it, need the rest. maximum_holds: what else the maximum is for."""
    low, high = nodes
    limit = int(quota_value(account, quota))
    free = limit - used
    # A deployed group's nodes are among those in use; it is taken to run at its minimum.
    create = 0 if account.deployed else low * vcpus
    peak = (high - low) * vcpus + create
    update = surge * vcpus
    detail = (
        f"{quota.name} ({quota.code}): {limit} vCPUs, {used} in use; {what} need {create}"
        + (" more (already deployed)" if account.deployed else "")
        + (f", {peak - create} more to grow to their maximum of {high}{maximum_holds}" if high > low else "")
        + f", and an update {update} more"
    )
    ask = (
        f"aws service-quotas request-service-quota-increase --service-code {quota.service} "
        f"--quota-code {quota.code} --desired-value {used + peak + update} --region {account.region}"
    )
    if create > free:
        return Result("FAIL", quota.label, detail, ask)
    if peak > free:
        return Result("FAIL", quota.label, f"{detail} (scale-up would stop at {low + (free - create) // vcpus})", ask)
    if peak + update > free:
        return Result("WARN", quota.label, detail + " (a node group update would stall)", ask)
    return Result("PASS", quota.label, detail)


def vcpu_quotas(account: Account) -> list[Result]:
    settings = account.settings
    if not account.gpu_vcpus:
        return []  # the EFA check could not describe the types; it has said so
    used = running_vcpus(account)
    surge = catalog.NODE_UPDATE_SURGE_PER_AZ
    system_azs = settings.max_azs if settings.vpc_id is None else max(2, len(account.private_subnet_azs))
    gpu_quota, system_quota = _quota_of(settings.gpu_instance_type), _quota_of(settings.system_instance_type)
    return [
        _quota_line(
            account,
            gpu_quota,
            used.get(gpu_quota.code, 0),
            sizing.gpu_node_bounds(settings),
            surge,
            account.gpu_vcpus,
            "the GPU nodes",
            # A Ray cluster change starts a second cluster within the maximum (settings/sizing/upgrade.py).
            " (which also holds a blue/green upgrade's second cluster)" if sizing.blue_green(settings) else "",
        ),
        _quota_line(
            account,
            system_quota,
            used.get(system_quota.code, 0),
            (settings.system_nodes_desired, settings.system_nodes_desired),
            surge * system_azs,
            account.system_vcpus,
            "the system nodes",
        ),
    ]
