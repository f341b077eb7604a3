"""Scaling: replica bounds and targets, queue bounds, the drain, the in-tree autoscaler.

Each check runs on the real artifact: the settings validation, the serve config as
synthesized, Ray Serve's own schema and Ray's own autoscaler parser.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

import serve_config
from serve_config.checks import kuberay_resources, problems
from settings import Settings, SettingsError, settings_from, sizing, validate
from tests.conftest import PROJECT_CONTEXT, rayservice_from, require_serve_deps, shared_file, synth
from tests.support.kuberay_schema import validation_errors
from tests.support.scaling import RANGE, SIDE_RANGES, deployed_rayservice, ray_cluster_of, serve_doc_of

pytestmark = pytest.mark.private_internals

serve = pytest.mark.serve
one_ray = pytest.mark.xdist_group("ray")
CRD = "kuberay-v1.7.0/ray.io_rayservices.yaml"

P5: dict[str, Any] = {
    "gpu_instance_type": "p5.48xlarge",
    "model_id": "meta-llama/Llama-3.3-70B-Instruct",
    "hf_token_secret_name": "prod/hf-token",
    "prefill_tensor_parallel_size": 8,
    "decode_tensor_parallel_size": 4,
    "decode_replicas": 2,
}


def _refusal(**overrides: Any) -> SettingsError:
    with pytest.raises(SettingsError) as err:
        validate(Settings(**overrides))
    return err.value


# --- Settings: one line naming the setting ------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        ({"decode_replicas": 2, "decode_max_replicas": 1}, "decode_max_replicas", "at least decode_replicas = 2"),
        ({"prefill_max_replicas": 0}, "prefill_max_replicas", "1 to 16"),
        ({"decode_max_replicas": 17}, "decode_max_replicas", "1 to 16"),
        ({"decode_target_ongoing_requests": 4}, "decode_target_ongoing_requests", "a fixed size scales toward nothing"),
        (
            {"prefill_max_replicas": 1, "prefill_target_ongoing_requests": 2},
            "prefill_target_ongoing_requests",
            "a fixed size",
        ),
        ({"decode_max_replicas": 3}, "decode_target_ongoing_requests", "set when decode_max_replicas > decode_"),
        ({"prefill_replicas": 0, "prefill_max_replicas": 2}, "prefill_replicas", "1 to 16"),
        ({**RANGE, "decode_target_ongoing_requests": 0}, "decode_target_ongoing_requests", "above 0 and at most 13"),
        ({**RANGE, "decode_target_ongoing_requests": 1e9}, "decode_target_ongoing_requests", "at most 13"),
        ({"typical_request_tokens": 16384}, "typical_request_tokens", "64 to max_model_len = 8192"),
        ({"backpressure_retry_after_seconds": 0}, "backpressure_retry_after_seconds", "1 to 3600"),
        ({"request_timeout_seconds": 5}, "request_timeout_seconds", "30 to 86400"),
        ({"ray_worker_idle_timeout_seconds": 1}, "ray_worker_idle_timeout_seconds", "10 to 86400"),
        # Two decode pods a p5 node at TP 4: a third replica needs a second node and leaves half of it idle.
        (
            {**P5, "decode_max_replicas": 3, "decode_target_ongoing_requests": 4},
            "decode_max_replicas",
            "leave 4 of a node's 8 GPUs idle at the maximum; fits: decode_max_replicas=4",
        ),
    ],
)
def test_bad_bounds_end_synth_in_one_line_naming_the_setting(overrides: dict[str, Any], key: str, allowed: str) -> None:
    err = _refusal(**overrides)
    assert err.key == key
    assert allowed in str(err)
    assert "\n" not in str(err)


def test_the_settings_come_from_the_command_line_too() -> None:
    s = settings_from({**PROJECT_CONTEXT, "decode_max_replicas": "3", "decode_target_ongoing_requests": "8"})
    assert (s.side_max_replicas("decode"), s.decode_target_ongoing_requests, s.autoscales("decode")) == (3, 8.0, True)
    assert not s.autoscales("prefill") and s.any_autoscaling


def test_a_max_equal_to_the_min_is_a_fixed_size() -> None:
    s = validate(Settings(decode_replicas=2, decode_max_replicas=2))
    assert not s.any_autoscaling and s.gpu_nodes_max == s.gpu_nodes == 3


def test_gpu_nodes_at_the_maximum() -> None:
    s = validate(Settings(**RANGE, prefill_max_replicas=2, prefill_target_ongoing_requests=2))
    assert (s.gpu_nodes, s.gpu_nodes_max) == (2, 5)


# --- Sizing: the bounds follow the engine -------------------------------------------------------
def test_the_admission_bound_is_what_the_kv_cache_holds_at_the_typical_length() -> None:
    s = validate(Settings())
    for side in ("prefill", "decode"):
        fits = sizing.kv_cache_tokens(s, side) // s.typical_request_tokens
        assert sizing.max_ongoing_requests(s, side) == fits
        assert sizing.max_queued_requests(s, side) == fits
    assert (sizing.max_ongoing_requests(s, "prefill"), sizing.max_ongoing_requests(s, "decode")) == (12, 13)
    # A shorter typical request: more at once, never past vLLM's max_num_seqs.
    short = validate(Settings(typical_request_tokens=64))
    assert sizing.max_ongoing_requests(short, "decode") == sizing.vllm_default_max_num_seqs(short) == 256


def test_the_ingress_passes_on_everything_decode_can_hold() -> None:
    s = validate(Settings(**RANGE))
    assert sizing.ingress_max_ongoing_requests(s) == 13 * 3 + 13


def test_the_drain_covers_the_longest_generation_and_prefills_kv_lease() -> None:
    s = validate(Settings())
    wait, timeout = sizing.graceful_shutdown(s, "decode")
    assert timeout > s.request_timeout_seconds
    wait, timeout = sizing.graceful_shutdown(s, "prefill")
    longest = sizing.prefill_seconds(s, s.max_model_len, mfu=sizing.PREFILL_MFU_RANGE[0])
    assert wait >= sizing.PREFILL_KV_LEASE_S + longest and timeout >= 2 * wait


# --- The serve config: num_replicas or autoscaling_config, bounded queues, the drain ---------------


def _args(rayservice: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    args: dict[str, Any] = app["args"]
    return args


def _options(rayservice: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The application's `deployments` list by name, with Serve's names shortened to their kind."""
    (app,) = serve_doc_of(rayservice)["applications"]
    kinds = {"Prefill:": "prefill", "Decode:": "decode", "LLMServer:": "aggregated"}
    found = {}
    for entry in app["deployments"]:
        kind = next((k for prefix, k in kinds.items() if entry["name"].startswith(prefix)), "ingress")
        found[kind] = {k: v for k, v in entry.items() if k != "name"}
    return found


def test_on_the_defaults_each_side_is_fixed_with_bounded_queues(rayservice: dict[str, Any]) -> None:
    options = _options(rayservice)
    for side, ongoing in (("prefill", 12), ("decode", 13)):
        config = options[side]
        assert config["num_replicas"] == 1 and config["autoscaling_config"] is None
        assert (config["max_ongoing_requests"], config["max_queued_requests"]) == (ongoing, ongoing)
        assert config["backpressure_config"] == {"status_code": 503, "retry_after_s": 10}
    assert options["decode"]["graceful_shutdown_timeout_s"] == 605
    assert options["prefill"]["graceful_shutdown_wait_loop_s"] >= sizing.PREFILL_KV_LEASE_S
    assert serve_doc_of(rayservice)["http_options"] == {"request_timeout_s": 600}
    cluster = rayservice["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is False and "autoscalerOptions" not in cluster


def test_no_replica_or_queue_option_is_in_the_builders_args(rayservice: dict[str, Any]) -> None:
    """Serve hashes the args into every deployment's code version: a bound there would restart every replica."""
    moved = {"num_replicas", "autoscaling_config", "max_ongoing_requests", "max_queued_requests"}
    for args in (_args(rayservice), _args(rayservice_from(synth(**SIDE_RANGES)))):
        for side in ("prefill", "decode"):
            assert not moved & set(args[f"{side}_config"].get("deployment_config", {})), side
        assert set(args["ingress_deployment_config"]) == {"num_replicas", "ray_actor_options"}


def test_a_range_emits_autoscaling_config_and_never_num_replicas() -> None:
    options = _options(rayservice_from(synth(**SIDE_RANGES)))
    for side, (low, high, target) in {"prefill": (1, 2, 2), "decode": (1, 3, 8)}.items():
        config = options[side]
        assert config["num_replicas"] is None
        assert config["autoscaling_config"] == {
            "min_replicas": low,
            "max_replicas": high,
            "target_ongoing_requests": target,
        }
    assert options["decode"]["graceful_shutdown_timeout_s"] == 905
    # The ingress passes on everything decode holds at its maximum: three replicas and one queue.
    assert options["ingress"]["max_ongoing_requests"] == 13 * 3 + 13


def test_aggregated_mode_scales_its_one_deployment_over_the_sides_summed() -> None:
    doc = rayservice_from(synth(**SIDE_RANGES, serving_mode="aggregated"))
    assert _options(doc)["aggregated"]["autoscaling_config"] == {
        "min_replicas": 2,
        "max_replicas": 5,
        "target_ongoing_requests": 8,
    }
    (config,) = _args(doc)["llm_configs"]
    assert "deployment_config" not in config


def test_the_ingress_lives_on_the_ingress_group(rayservice: dict[str, Any]) -> None:
    ingress = _args(rayservice)["ingress_deployment_config"]
    assert ingress["num_replicas"] == 1
    assert ingress["ray_actor_options"]["resources"] == {serve_config.INGRESS_GROUP: 1}
    groups = {g["groupName"]: g for g in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    group = groups[serve_config.INGRESS_GROUP]
    assert group["template"]["spec"]["nodeSelector"] == {"role": "system"}
    assert "tolerations" not in group["template"]["spec"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 1)
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert serve_config.GPU_RESOURCE not in limits and serve_config.EFA_RESOURCE not in limits


@serve
@pytest.mark.parametrize("overrides", [{}, SIDE_RANGES, {**SIDE_RANGES, "serving_mode": "aggregated"}])
def test_serve_deploy_schema_accepts_every_deployment_config(overrides: dict[str, Any]) -> None:
    require_serve_deps()
    from ray.serve.schema import ServeDeploySchema

    doc = serve_doc_of(rayservice_from(synth(**overrides)))
    schema = ServeDeploySchema.model_validate(doc)
    assert schema.http_options.request_timeout_s == doc["http_options"]["request_timeout_s"]


@serve
@one_ray
def test_serve_runs_the_bounds_and_merges_no_1e9_target(local_ray: None) -> None:
    """Ray LLM deep-merges its defaults (target_ongoing_requests 1e9, max_ongoing_requests 1e9) into each
    deployment built without num_replicas; what Serve runs once the `deployments` list is applied is ours."""
    deployed = deployed_rayservice(serve_doc_of(rayservice_from(synth(**SIDE_RANGES))))
    (prefill,) = [i for n, i in deployed.items() if n.startswith("Prefill:")]
    (decode,) = [i for n, i in deployed.items() if n.startswith("Decode:")]
    (ingress,) = [i for n, i in deployed.items() if not n.startswith(("Prefill:", "Decode:"))]
    for info, (low, high, target, ongoing) in ((prefill, (1, 2, 2, 12)), (decode, (1, 3, 8, 13))):
        config = info.deployment_config
        scaling = config.autoscaling_config
        assert (scaling.min_replicas, scaling.max_replicas, scaling.target_ongoing_requests) == (low, high, target)
        assert (config.max_ongoing_requests, config.max_queued_requests) == (ongoing, ongoing)
        assert config.backpressure_config.retry_after_s == 10
    assert prefill.deployment_config.graceful_shutdown_wait_loop_s >= sizing.PREFILL_KV_LEASE_S
    assert decode.deployment_config.max_constructor_retry_count == 10
    config = ingress.deployment_config
    assert config.num_replicas == 1 and config.autoscaling_config is None
    assert config.max_ongoing_requests == 52 and config.max_queued_requests == 13
    assert ingress.replica_config.ray_actor_options["resources"] == {serve_config.INGRESS_GROUP: 1}


@serve
@one_ray
def test_under_the_surge_serve_runs_one_ingress_replica_more_on_the_ingress_group(local_ray: None) -> None:
    """`replica_surge` raises the ingress's count in the `deployments` list, over the builder's one: Serve runs
    two, each asking for the ingress group's resource, and the surge's own engine minimums."""
    deployed = deployed_rayservice(serve_doc_of(rayservice_from(synth(**SIDE_RANGES, replica_surge=True))))
    (ingress,) = [i for n, i in deployed.items() if not n.startswith(("Prefill:", "Decode:"))]
    assert ingress.deployment_config.num_replicas == 2 and ingress.deployment_config.autoscaling_config is None
    assert ingress.replica_config.ray_actor_options["resources"] == {serve_config.INGRESS_GROUP: 1}
    minimums = {n.split(":")[0]: i.deployment_config.autoscaling_config.min_replicas for n, i in deployed.items()
                if n.startswith(("Prefill:", "Decode:"))}  # fmt: skip
    assert minimums == {"Prefill": 2, "Decode": 2}


@serve
@one_ray
def test_serve_keeps_fixed_sizes_fixed(rayservice: dict[str, Any], local_ray: None) -> None:
    for name, info in deployed_rayservice(serve_doc_of(rayservice)).items():
        config = info.deployment_config
        assert config.autoscaling_config is None and config.num_replicas == 1, name
        assert config.max_ongoing_requests < 10**6 and config.max_queued_requests > 0, name


@serve
@one_ray
def test_serve_scales_the_aggregated_deployment(local_ray: None) -> None:
    deployed = deployed_rayservice(serve_doc_of(rayservice_from(synth(**SIDE_RANGES, serving_mode="aggregated"))))
    (engine,) = [i for i in deployed.values() if i.replica_config.placement_group_bundles]
    scaling = engine.deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas, scaling.target_ongoing_requests) == (2, 5, 8)


@serve
@pytest.mark.parametrize(
    "change",
    [
        {"decode_max_replicas": 4},
        {"decode_target_ongoing_requests": 4},
        {"typical_request_tokens": 1024},
        {"backpressure_retry_after_seconds": 30},
        {"request_timeout_seconds": 900},
    ],
    ids=["maximum", "target", "queue bounds", "retry-after", "drain"],
)
def test_a_changed_bound_keeps_every_deployments_code_version(change: dict[str, Any]) -> None:
    """Serve's own code version (what decides whether a replica restarts) is the same before and after."""
    require_serve_deps()
    from ray.serve._private.deploy_utils import get_app_code_version
    from ray.serve.schema import ServeApplicationSchema

    def version(overrides: dict[str, Any]) -> str:
        (app,) = serve_doc_of(rayservice_from(synth(**overrides)))["applications"]
        return str(get_app_code_version(ServeApplicationSchema.model_validate(app)))

    assert version(SIDE_RANGES) == version({**SIDE_RANGES, **change})


@serve
@one_ray
def test_turning_a_range_off_in_place_leaves_no_autoscaling_behind(local_ray: None) -> None:
    """Serve applies a redeployed `deployments` list on top of the options in force: a fixed side must
    clear the autoscaling_config a range left there."""
    from ray.serve._private.application_state import override_deployment_info
    from ray.serve.schema import ServeApplicationSchema

    ranged = deployed_rayservice(serve_doc_of(rayservice_from(synth(**SIDE_RANGES))))
    (fixed,) = serve_doc_of(rayservice_from(synth(decode_replicas=2)))["applications"]
    again = override_deployment_info(ranged, ServeApplicationSchema.model_validate(fixed))
    (decode,) = [i for n, i in again.items() if n.startswith("Decode:")]
    assert decode.deployment_config.autoscaling_config is None and decode.deployment_config.num_replicas == 2


# --- The Ray cluster: the in-tree autoscaler, its groups, both parsers, the hash -------------------


def test_a_range_turns_on_the_in_tree_autoscaler_with_each_groups_bounds() -> None:
    doc = rayservice_from(synth(**SIDE_RANGES, ray_worker_idle_timeout_seconds=120))
    cluster = doc["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"]["idleTimeoutSeconds"] == 120
    bounds = {g["groupName"]: (g["replicas"], g["minReplicas"], g["maxReplicas"]) for g in cluster["workerGroupSpecs"]}
    # The ingress group one pod more: its surge replica's (serve_config/deployments.py, ingress_surge_room).
    assert bounds == {"prefill": (1, 1, 2), "decode": (1, 1, 3), serve_config.INGRESS_GROUP: (1, 1, 2)}
    assert problems(doc) == []
    assert validation_errors(doc, shared_file(CRD)) == []


@serve
@pytest.mark.parametrize("overrides", [{}, SIDE_RANGES], ids=["fixed", "ranges"])
def test_rays_autoscaler_reads_each_groups_resource_and_bounds(overrides: dict[str, Any]) -> None:
    """Ray's autoscaler for KubeRay parses rayStartParams.resources with its own parser (drop the first and
    last character, strip backslashes, JSON), not KubeRay's: both must find exactly the side's resource."""
    require_serve_deps()
    from ray.autoscaler._private.kuberay import autoscaling_config

    doc = rayservice_from(synth(**overrides))
    groups = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    for group in groups:
        name, params = group["groupName"], group["rayStartParams"]
        # A GPU group declares its accelerator too (tests/test_scale_up.py).
        expected = {name: 1, "accelerator_type:L4": 1} if name in serve_config.SIDES else {name: 1}
        assert autoscaling_config._get_custom_resources(group.get("resources", {}), params, name) == expected
        assert kuberay_resources(params["resources"]) == expected
    derived = autoscaling_config._derive_autoscaling_config_from_ray_cr(ray_cluster_of(doc))
    for group in groups:
        node_type = derived["available_node_types"][group["groupName"]]
        assert node_type["resources"][group["groupName"]] == 1
        assert (node_type["min_workers"], node_type["max_workers"]) == (group["minReplicas"], group["maxReplicas"])
    assert (
        derived["idle_timeout_minutes"]
        == doc["spec"]["rayClusterConfig"].get("autoscalerOptions", {}).get("idleTimeoutSeconds", 60) / 60
    )


@serve
@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_a_pending_bundle_makes_rays_autoscaler_add_a_worker_of_exactly_its_group(side: str) -> None:
    """Ray's bin packing (resource_demand_scheduler.get_nodes_for) on the node types it derives from the
    RayCluster: a replica's pending bundle, as Ray LLM builds it, launches one pod of the side's group."""
    require_serve_deps()
    from ray.autoscaler._private.kuberay import autoscaling_config
    from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
    from ray.autoscaler._private.resource_demand_scheduler import _resource_based_utilization_scorer, get_nodes_for

    doc = rayservice_from(synth(**SIDE_RANGES))
    derived = autoscaling_config._derive_autoscaling_config_from_ray_cr(ray_cluster_of(doc))
    (bundle,) = _args(doc)[f"{side}_config"]["placement_group_config"]["bundles"]
    summary = NodeAvailabilitySummary(node_availabilities={})

    def scorer(node: dict[str, float], demands: list[dict[str, float]], _: str) -> Any:
        return _resource_based_utilization_scorer(node, demands, node_availability_summary=summary)

    existing = {g["groupName"]: g["minReplicas"] for g in doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    added, left = get_nodes_for(derived["available_node_types"], existing, "headgroup", 10, [bundle], scorer)
    assert dict(added) == {side: 1} and left == []
    # And the ingress replica, pending, would get an ingress pod: never a GPU worker. With every group at its
    # minimum, as under `make upgrade`'s surge, the ingress's surge replica gets its pod too (its group's maximum).
    ingress_bundle = {"CPU": 1, serve_config.INGRESS_GROUP: 1}
    for running in ({}, existing):
        added, left = get_nodes_for(derived["available_node_types"], running, "headgroup", 10, [ingress_bundle], scorer)
        assert dict(added) == {serve_config.INGRESS_GROUP: 1} and left == [], running


def test_a_changed_bound_keeps_the_cluster_hash_and_anything_else_changes_it() -> None:
    base = rayservice_from(synth(**SIDE_RANGES))
    wider = rayservice_from(synth(**{**SIDE_RANGES, "decode_max_replicas": 4}))
    label = serve_config.CLUSTER_CONFIG_LABEL
    assert wider["metadata"]["labels"][label] == base["metadata"]["labels"][label]
    assert wider["spec"]["rayClusterConfig"] != base["spec"]["rayClusterConfig"]
    # Turning the autoscaler on is a cluster change: the head gains its container.
    fixed = rayservice_from(synth())
    assert fixed["metadata"]["labels"][label] != base["metadata"]["labels"][label]
    idle = rayservice_from(synth(**{**SIDE_RANGES, "ray_worker_idle_timeout_seconds": 300}))
    assert idle["metadata"]["labels"][label] != base["metadata"]["labels"][label]


def test_without_the_autoscaler_a_new_fixed_count_still_rebuilds_the_cluster() -> None:
    """KubeRay never copies replica fields into a running RayCluster: a fixed count takes effect only
    through the recreate Job, so there the count stays in the hash."""
    label = serve_config.CLUSTER_CONFIG_LABEL
    one, two = rayservice_from(synth()), rayservice_from(synth(decode_replicas=2))
    assert one["metadata"]["labels"][label] != two["metadata"]["labels"][label]
