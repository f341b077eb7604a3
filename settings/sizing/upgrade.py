"""Sizing: a change to the Ray cluster, by blue/green or by recreate, and how long the old cluster stays; a change
that restarts replicas, with a surge replica where a side has room, and how long a side without one is down."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from settings.sizing.admission import (
    NLB_DEREGISTRATION_ALLOWANCE_S,
    NLB_DEREGISTRATION_PROPAGATION_S,
    graceful_shutdown,
)
from settings.sizing.root_volume import gpu_serving_node_bounds
from settings.sizing.scale_up import ENGINE_START_S, cold_start, gpu_image_pull_seconds

if TYPE_CHECKING:
    from settings.model import Settings

# The ingress pods' readiness probe (ray_pods/ingress_ready.py): KubeRay's timing for a RayService
# worker's probe (ray-operator/controllers/ray/utils/constant.go, v1.7.0: every 5 s, one failure turns
# it unready), with room in the timeout for the script's calls of at most 2 s each.
INGRESS_READINESS_PERIOD_S = 5
INGRESS_READINESS_TIMEOUT_S = 10
# From the probe's verdict to the Service's endpoints without the pod: the EndpointSlice controller and
# kube-proxy's sync (an allowance, unmeasured).
ENDPOINT_PROPAGATION_ALLOWANCE_S = 5


def holds_second_cluster(s: Settings) -> bool:
    """Whether the GPU group's maximum holds a second Ray cluster at every side's minimum beside the
    first at its own: the blue/green upgrade's room. A warm node's placeholder gives way to it (it is
    preempted like any engine's); where the first cluster has grown, the second waits for room (KubeRay
    1.7 has no timeout on a pending cluster) while the first keeps serving."""
    low, high = gpu_serving_node_bounds(s)
    return high >= 2 * low


def blue_green(s: Settings) -> bool:
    """KubeRay's NewCluster upgrade (a second cluster, then a switch), rather than the recreate Job."""
    return s.ray_cluster_upgrade == "auto" and holds_second_cluster(s)


def readiness_lag_seconds() -> int:
    """From KubeRay's switch to an old ingress pod's leaving the endpoints: the probe's next run (a
    period), its longest run (its timeout), then the endpoints' update."""
    return INGRESS_READINESS_PERIOD_S + INGRESS_READINESS_TIMEOUT_S + ENDPOINT_PROPAGATION_ALLOWANCE_S


def cluster_deletion_delay_seconds(s: Settings) -> int:
    """KubeRay's rayClusterDeletionDelaySeconds under NewCluster: how long the old cluster outlives the
    switch. Its ingress pods stop taking new requests once their probe sees the switch
    (readiness_lag_seconds); behind the internal NLB new connections may still reach them for the NLB's
    deregistration propagation; then the last request they took runs for up to the ingress's drain
    (request_timeout_seconds and the router allowance, graceful_shutdown). KubeRay's default, 60 s, would
    cut any stream longer than that."""
    delay = readiness_lag_seconds() + math.ceil(graceful_shutdown(s, "ingress")[1])
    if s.internal_endpoint_cidrs:
        delay += NLB_DEREGISTRATION_PROPAGATION_S + NLB_DEREGISTRATION_ALLOWANCE_S
    return delay


def engine_restart_seconds(
    s: Settings, *, new_weights: bool, image_pull: bool, gpu_nodes_only: bool = False
) -> tuple[float, float]:
    """One engine start on a node that already runs: the weights (from the node's cache, or downloaded for
    a new model), vLLM's start, and the image pull where the image is new to the node: a standard pull
    where a system node (the head) pulls it too, the GPU nodes' parallel pull where only they do."""
    start = cold_start(s)
    weights = start.first_download_seconds if new_weights else start.restart_seconds
    pull = gpu_image_pull_seconds(parallel=gpu_nodes_only) if image_pull else (0.0, 0.0)
    return weights + ENGINE_START_S[0] + pull[0], weights + ENGINE_START_S[1] + pull[1]


def engine_sides(s: Settings) -> tuple[str, ...]:
    """The engine deployments of the serving mode: prefill and decode, or the aggregated one."""
    return ("aggregated",) if s.serving_mode == "aggregated" else ("prefill", "decode")


def engine_bounds(s: Settings, side: str) -> tuple[int, int]:
    """(minimum, maximum) replicas of an engine deployment: a side's, or aggregated mode's one deployment,
    the sides summed."""
    if side == "aggregated":
        low = s.prefill_replicas + s.decode_replicas
        return low, s.side_max_replicas("prefill") + s.side_max_replicas("decode")
    return s.side_replicas(side), s.side_max_replicas(side)


def surge_room(s: Settings, side: str) -> bool:
    """Whether an engine deployment has room for a surge replica: its maximum above its minimum, so its GPU
    nodes (and the group's maximum) hold one replica more. Serve 2.58 stops an outdated replica before it
    starts a new one (serve/_private/deployment_state.py, the rolling update) unless the target stands above
    the replicas running, so a side kept serving through a restart needs that one more."""
    low, high = engine_bounds(s, side)
    return high > low


# The system nodes the ingress's surge pod needs (500m CPU, 4 GiB): beside the head, the operators and the
# ingress, one m7i.xlarge keeps about 360m and 1 GiB free with Ray's autoscaler on (the placement proof,
# tests/test_placement.py); a second node holds it.
INGRESS_SURGE_SYSTEM_NODES = 2


def ingress_surge_room(s: Settings) -> int:
    """Ingress pods beyond the ingress's replicas that its group may grow to: one where Ray's autoscaler runs (it
    starts the pod only while a replica waits for it) and the system group's minimum holds the pod, else none."""
    return 1 if s.any_autoscaling and s.system_nodes_min >= INGRESS_SURGE_SYSTEM_NODES else 0


def surge_minimum(s: Settings, side: str) -> int:
    """An engine deployment's minimum while `replica_surge` is on: one more where it has room."""
    low, _ = engine_bounds(s, side)
    return low + 1 if s.replica_surge and surge_room(s, side) else low
