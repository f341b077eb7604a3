"""Ray's autoscaler can add a GPU worker pod for a pending engine replica, with the side's group at its
minimum or with no pod at all.

Ray LLM adds `accelerator_type:<GPU>: 0.001` to every bundle of an LLMConfig with an accelerator_type
(ray/llm/_internal/serve/engines/vllm/vllm_models.py, placement_bundles). Ray's autoscaler v1 (KubeRay
1.7's default) knows a group's resources only from the RayCluster
(ray/autoscaler/_private/kuberay/autoscaling_config.py) and learns CPU, GPU and memory alone from a
running pod (resource_demand_scheduler.py, _update_node_resources_from_runtime): a group that does not
declare the accelerator resource can satisfy no engine bundle, and never scales up.

Everything below is Ray's own code on the synthesized RayService: Serve's build of the application
gives each engine deployment's placement group (tests/test_scaling.py deployed_rayservice), KubeRay's autoscaler
config producer the node types, and Ray's ResourceDemandScheduler the pods to launch.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

import serve_config
from serve_config import pod_templates
from serve_config.checks import kuberay_resources, problems
from settings import Settings, SettingsError, validate
from tests.conftest import rayservice_from, require_serve_deps, synth
from tests.support.scaling import SIDE_RANGES, deployed_rayservice, ray_cluster_of, serve_doc_of

pytestmark = pytest.mark.private_internals

serve = pytest.mark.serve
one_ray = pytest.mark.xdist_group("ray")
HEAD = "headgroup"  # the head's node type in the config Ray derives (autoscaling_config.py _HEAD_GROUP_NAME)


class _RayPods:
    """What Ray's scheduler reads of its node provider: each node's kind, group and IP (KubeRay's
    provider, ray/autoscaler/_private/kuberay/node_provider.py, takes them from the pods' labels)."""

    def __init__(self, groups: dict[str, str]) -> None:
        self.groups = groups  # node id -> group name

    def node_tags(self, node_id: str) -> dict[str, str]:
        from ray.autoscaler.tags import (
            NODE_KIND_HEAD,
            NODE_KIND_WORKER,
            TAG_RAY_NODE_KIND,
            TAG_RAY_USER_NODE_TYPE,
        )

        group = self.groups[node_id]
        kind = NODE_KIND_HEAD if group == HEAD else NODE_KIND_WORKER
        return {TAG_RAY_NODE_KIND: kind, TAG_RAY_USER_NODE_TYPE: group}

    def internal_ip(self, node_id: str) -> str:
        return f"10.0.0.{sorted(self.groups).index(node_id) + 10}"


def _engine_placement_groups(doc: dict[str, Any]) -> dict[str, tuple[list[dict[str, float]], str]]:
    """Per side, the bundles and strategy Serve asks each of its replicas' placement groups for."""
    found = {}
    for name, info in deployed_rayservice(serve_doc_of(doc)).items():
        side = {"Prefill:": "prefill", "Decode:": "decode", "LLMServer:": "aggregated"}.get(name.split(":")[0] + ":")
        if side:
            config = info.replica_config
            found[side] = (config.placement_group_bundles, config.placement_group_strategy)
    return found


def _pending(bundles: list[dict[str, float]], strategy: str) -> Any:
    """A replica's placement group as the GCS reports it while none of its bundles is placed."""
    from ray._private.gcs_utils import PlacementGroupTableData
    from ray.core.generated.common_pb2 import Bundle, PlacementStrategy

    return PlacementGroupTableData(
        strategy=PlacementStrategy.Value(strategy),
        bundles=[Bundle(unit_resources=b) for b in bundles],
    )


def _runtime_resources(node_type: dict[str, Any], accelerator: str | None) -> dict[str, float]:
    """A running Ray pod's resources as its raylet reports them: the group's, and, on a GPU node, the
    accelerator the raylet detects (ray/_private/resource_and_label_spec.py)."""
    found = {k: float(v) for k, v in node_type["resources"].items()}
    if accelerator is not None:
        found[accelerator] = 1.0
    return found


def _launched(overrides: dict[str, Any], side: str, *, without: str | None = None) -> dict[str, int]:
    """The pods Ray's autoscaler launches for one pending replica of `side`, with each group's minimum of
    pods up and busy (each one's own resource and GPU taken by the replica it serves), or none of group
    `without`."""
    from ray.autoscaler._private.kuberay import autoscaling_config
    from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
    from ray.autoscaler._private.resource_demand_scheduler import ResourceDemandScheduler
    from ray.llm._internal.serve.core.configs.accelerators import format_ray_accelerator_resource

    doc = rayservice_from(synth(**overrides))
    cluster = copy.deepcopy(ray_cluster_of(doc))
    groups = {"head": HEAD}
    for group in cluster["spec"]["workerGroupSpecs"]:
        if group["groupName"] == without:
            # A group whose minimum is 0 (the settings refuse it; Ray's autoscaler would then add
            # this group's first pod only for the pending replica, not for the minimum).
            group["replicas"] = group["minReplicas"] = 0
        count = group["minReplicas"]
        groups.update({f"{group['groupName']}-{n}": group["groupName"] for n in range(count)})
    config = autoscaling_config._derive_autoscaling_config_from_ray_cr(cluster)
    node_types = config["available_node_types"]
    pods = _RayPods(groups)
    accelerator = format_ray_accelerator_resource(validate(Settings(**overrides)).gpu_instance.ray_accelerator_type)
    totals, unused = {}, {}
    for node, group in groups.items():
        ip = pods.internal_ip(node)
        totals[ip] = _runtime_resources(node_types[group], accelerator if group in serve_config.SIDES else None)
        busy = {group, "GPU", accelerator}
        unused[ip] = {k: (0.0 if k in busy else v) for k, v in totals[ip].items()}
    scheduler = ResourceDemandScheduler(
        pods,
        node_types,
        config["max_workers"],
        HEAD,
        config["upscaling_speed"],
    )
    bundles, strategy = _engine_placement_groups(doc)[side]
    to_launch, _ = scheduler.get_nodes_to_launch(
        nodes=list(groups),
        launching_nodes={},
        resource_demands=[],
        unused_resources_by_ip=unused,
        pending_placement_groups=[_pending(bundles, strategy)],
        max_resources_by_ip=totals,
        ensure_min_cluster_size=[],
        node_availability_summary=NodeAvailabilitySummary(node_availabilities={}),
    )
    return dict(to_launch)


@serve
@one_ray
@pytest.mark.parametrize("side", ["prefill", "decode"])
@pytest.mark.parametrize("pods", ["at its minimum", "at a minimum of 0"])
def test_a_pending_engine_replica_launches_one_pod_of_its_group(side: str, pods: str, local_ray: None) -> None:
    require_serve_deps()
    assert _launched(SIDE_RANGES, side, without=side if pods == "at a minimum of 0" else None) == {side: 1}


@serve
@one_ray
def test_the_aggregated_engine_launches_a_gpu_pod(local_ray: None) -> None:
    require_serve_deps()
    launched = _launched({**SIDE_RANGES, "serving_mode": "aggregated"}, "aggregated")
    assert sum(launched.values()) == 1 and set(launched) <= set(serve_config.SIDES), launched


@serve
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        SIDE_RANGES,
        {
            "gpu_instance_type": "p5.48xlarge",
            "prefill_tensor_parallel_size": 8,
            "decode_tensor_parallel_size": 8,
            "decode_max_replicas": 2,
            "decode_target_ongoing_requests": 8,
        },
    ],
    ids=["fixed", "ranges", "p5"],
)
def test_each_gpu_group_declares_its_accelerator_to_both_parsers(overrides: dict[str, Any]) -> None:
    """KubeRay's parser (strict JSON) and Ray's autoscaler's (first and last character dropped) both read the
    side's resource and the accelerator's; the ingress group declares neither."""
    require_serve_deps()
    from ray._common.utils import RESOURCE_CONSTRAINT_PREFIX
    from ray.autoscaler._private.kuberay import autoscaling_config
    from ray.llm._internal.serve.core.configs.accelerators import format_ray_accelerator_resource

    doc = rayservice_from(synth(**overrides))
    settings = validate(Settings(**overrides))
    accelerator = format_ray_accelerator_resource(settings.gpu_instance.ray_accelerator_type)
    assert accelerator.startswith(RESOURCE_CONSTRAINT_PREFIX)
    assert pod_templates.accelerator_resource(settings) == accelerator
    derived = autoscaling_config._derive_autoscaling_config_from_ray_cr(ray_cluster_of(doc))
    for group in doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        name, raw = group["groupName"], group["rayStartParams"]["resources"]
        expected = {name: 1, accelerator: 1} if name in serve_config.SIDES else {name: 1}
        assert kuberay_resources(raw) == expected
        assert autoscaling_config._get_custom_resources(group.get("resources", {}), group["rayStartParams"], name) == (
            expected
        )
        resources = derived["available_node_types"][name]["resources"]
        assert {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")} == expected
    assert problems(doc) == []


@pytest.mark.parametrize("key", ["prefill_replicas", "decode_replicas"])
def test_a_minimum_of_zero_is_refused_in_one_line_with_the_reason(key: str) -> None:
    overrides: dict[str, Any] = {key: 0}
    with pytest.raises(SettingsError) as raised:
        validate(Settings(**overrides))
    message = str(raised.value)
    assert raised.value.key == key and "\n" not in message
    assert "1 to 16" in message and "absent()" in message
