"""Warm GPU nodes: spare nodes within the GPU group's maximum, each held by a placeholder that a Ray worker
preempts; placed by the proof's model of kube-scheduler's priority and preemption, costed, refused in one line."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes_validate
import pytest

from serve_config import DECODE, GPU_RESOURCE
from serve_config.warm_nodes import WARM_NODE
from settings import Settings, SettingsError, settings_from, sizing
from settings.catalog import CLUSTER_AUTOSCALER
from settings.estimates import cost_summary
from settings.project import ROOT
from tests.conftest import PROJECT_CONTEXT, manifests, only, rayservice_from, synth
from tests.support import placement
from tests.support.cfn_lint import lint_errors
from tests.support.cluster import DEVICE_PLUGIN_DAEMONSETS, priority_classes, workloads
from tests.support.helm import rendered_releases

# Decode scales 1 -> 3: the GPU group 2 -> 4 nodes, one of the two above the minimum kept warm.
WARM = {"decode_max_replicas": 3, "decode_target_ongoing_requests": 8, "gpu_warm_nodes": 1}
GPU_NODEGROUP = {"AmiType": "AL2023_x86_64_NVIDIA"}
PLACEHOLDER = f"Deployment/{WARM_NODE}"
# cluster-autoscaler/config/flags/flags.go (cluster-autoscaler-1.34.5 to 1.36.1): the flag's default.
CA_CUTOFF_FLAG = "expendable-pods-priority-cutoff"
CA_DEFAULT_EXPENDABLE_CUTOFF = -10


def _warm_objects(template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    (priority_class,) = [m for m in manifests(template) if m["kind"] == "PriorityClass"]
    (deployment,) = [m for m in manifests(template) if m["kind"] == "Deployment" and m["metadata"]["name"] == WARM_NODE]
    return priority_class, deployment


def _decode_group(template: dict[str, Any]) -> dict[str, Any]:
    groups = rayservice_from(template)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    (group,) = [g for g in groups if g["groupName"] == DECODE]
    return copy.deepcopy(group)


def test_the_warm_node_is_in_the_gpu_groups_minimum_and_within_its_maximum() -> None:
    scaling = only(synth(**WARM), "AWS::EKS::Nodegroup", **GPU_NODEGROUP)["Properties"]["ScalingConfig"]
    # 2 serving nodes + 1 warm; the maximum stays prefill 1 + decode 3.
    assert scaling == {"MinSize": 3, "DesiredSize": 3, "MaxSize": 4}


def test_the_defaults_keep_no_warm_node(template: dict[str, Any]) -> None:
    assert not [m for m in manifests(template) if m["kind"] == "PriorityClass" or m["metadata"]["name"] == WARM_NODE]


@pytest.mark.parametrize(
    ("overrides", "allowed"),
    [
        ({"gpu_warm_nodes": 1}, "at most 0"),
        ({**WARM, "gpu_warm_nodes": 3}, "at most 2"),
        ({"gpu_warm_nodes": -1}, "0 to 16"),
    ],
    ids=["no-range", "above-the-maximum", "negative"],
)
def test_more_warm_nodes_than_the_maximum_holds_is_refused_in_one_line(overrides: dict[str, Any], allowed: str) -> None:
    with pytest.raises(SettingsError) as raised:
        settings_from({**PROJECT_CONTEXT, **overrides})
    assert raised.value.key == "gpu_warm_nodes"
    assert allowed in str(raised.value) and "\n" not in str(raised.value)


def test_the_placeholder_ranks_below_every_ray_pod_and_still_counts_for_cluster_autoscaler() -> None:
    """Every Ray pod names no class (priority 0, Kubernetes docs "Pod Priority and Preemption"), so it
    preempts the placeholder; Cluster Autoscaler treats a pod as expendable only strictly below its cutoff
    (core/utils/expendable.go IsExpendablePod: priority < cutoff), and an expendable pod neither triggers a
    scale-up nor keeps a node. The chart as rendered leaves the cutoff at the flag's default."""
    template = synth(**WARM)
    priority_class, deployment = _warm_objects(template)
    assert deployment["spec"]["template"]["spec"]["priorityClassName"] == priority_class["metadata"]["name"]
    cluster = rayservice_from(template)["spec"]["rayClusterConfig"]
    ray_templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    assert all("priorityClassName" not in t["spec"] for t in ray_templates)
    assert CA_DEFAULT_EXPENDABLE_CUTOFF <= priority_class["value"] < 0
    (ca,) = [o for o in rendered_releases(template, "1.36")[CLUSTER_AUTOSCALER.release] if o["kind"] == "Deployment"]
    (container,) = ca["spec"]["template"]["spec"]["containers"]
    assert not [arg for arg in container["command"] if CA_CUTOFF_FLAG in arg]
    assert priority_class["preemptionPolicy"] == "Never"
    assert priority_class["globalDefault"] is False


def test_the_placeholder_holds_a_whole_gpu_node_with_the_workers_image_and_cache() -> None:
    template = synth(**WARM)
    _, deployment = _warm_objects(template)
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    worker = _decode_group(template)["template"]["spec"]
    (hold,) = pod["containers"]
    (engine,) = worker["containers"]
    assert hold["image"] == engine["image"]
    # Every GPU of a g6.8xlarge: one placeholder per node, and no other pod of its priority beside it.
    assert hold["resources"]["requests"][GPU_RESOURCE] == hold["resources"]["limits"][GPU_RESOURCE] == "1"
    assert (pod["nodeSelector"], pod["tolerations"]) == (worker["nodeSelector"], worker["tolerations"])
    assert pod["terminationGracePeriodSeconds"] == 0
    # The cache it fills is the one the workers read: the same hostPath, the same HF_HOME.
    (download,) = pod["initContainers"]
    assert pod["volumes"] == [v for v in worker["volumes"] if v["name"] == "model-cache"]
    assert download["volumeMounts"] == [m for m in engine["volumeMounts"] if m["name"] == "model-cache"]
    hf_home = [e for e in engine["env"] if e["name"] == "HF_HOME"]
    assert hf_home and hf_home[0] in download["env"]
    assert {"name": "MODEL_ID", "value": "Qwen/Qwen3-8B"} in download["env"]


def test_a_gated_models_token_reaches_the_download_from_the_synced_secret() -> None:
    template = synth(**WARM, hf_token_secret_name="prod/hf-token")
    _, deployment = _warm_objects(template)
    (download,) = deployment["spec"]["template"]["spec"]["initContainers"]
    (engine,) = _decode_group(template)["template"]["spec"]["containers"]
    token = [e for e in engine["env"] if e["name"] == "HF_TOKEN"]
    assert token and token[0] in download["env"]
    assert "prod/hf-token" not in json.dumps(deployment)
    # The Deployment waits for the ExternalSecret that makes the Secret.
    depends = [r for r in template["Resources"].values() if WARM_NODE in json.dumps(r.get("Properties", {}))]
    deployment_resource = [r for r in depends if '\\"Deployment\\"' in json.dumps(r["Properties"]["Manifest"])]
    (resource,) = deployment_resource
    secret_ids = [
        k for k, r in template["Resources"].items() if "ExternalSecret" in json.dumps(r.get("Properties", {}))
    ]
    assert set(secret_ids) & set(resource["DependsOn"])


def test_with_s3_weights_the_placeholder_pulls_only_the_image() -> None:
    """Ray downloads an s3:// source again at every engine start: a cache filled beforehand goes unread."""
    _, deployment = _warm_objects(synth(**WARM, model_source="s3://acme-models/approved/qwen3-8b"))
    pod = deployment["spec"]["template"]["spec"]
    assert "initContainers" not in pod and "volumes" not in pod


def _cluster(overrides: dict[str, Any]) -> tuple[dict[str, Any], list[placement.Node]]:
    template = synth(**overrides)
    return template, placement.nodes_from_template(template, "1.36")


def _place(template: dict[str, Any], nodes: list[placement.Node]) -> placement.Placement:
    return placement.place(
        nodes, workloads(template, "1.36"), DEVICE_PLUGIN_DAEMONSETS, priority_classes(template, "1.36")
    )


def _gpu_nodes_by_workload(result: placement.Placement) -> dict[str, list[str]]:
    gpu = {n.name for n in result.nodes if n.labels.get("role") == "gpu-worker"}
    return {w: sorted(n for n in nodes if n in gpu) for w, nodes in result.placed.items() if set(nodes) & gpu}


def test_at_the_minimum_the_placeholder_lands_alone_on_the_spare_node() -> None:
    template, nodes = _cluster(WARM)
    result = _place(template, nodes)
    assert result.failures == []
    on_gpu = _gpu_nodes_by_workload(result)
    serving = {node for name, placed in on_gpu.items() if name.startswith("pd-llm/") for node in placed}
    assert len(on_gpu[PLACEHOLDER]) == 1
    assert not set(on_gpu[PLACEHOLDER]) & serving
    assert result.preempted == []


def test_a_new_replica_preempts_the_placeholder_which_then_asks_for_a_node() -> None:
    """A scale-up: Ray's autoscaler adds a decode worker pod. It lands on the warm node by preemption; the
    placeholder is pending (what makes Cluster Autoscaler add a node), and lands on the node it adds."""
    template, nodes = _cluster(WARM)
    result = _place(template, nodes)
    warm_node = result.placed[PLACEHOLDER][0]
    group = _decode_group(template)
    new_replica = placement.Workload("pd-llm/decode", "RayService", group["template"]["spec"], replicas=1)
    placement.place_more(result, [new_replica])
    assert result.preempted == [(PLACEHOLDER, "pd-llm/decode", warm_node)]
    assert result.placed["pd-llm/decode"][-1] == warm_node
    assert result.placed[PLACEHOLDER] == []
    assert [f for f in result.failures if f.startswith(f"{PLACEHOLDER} replica 0 fits no node")]

    # Cluster Autoscaler's new node (the group at its maximum, 4): the placeholder lands there.
    gpu_group = next(n.group for n in nodes if n.labels.get("role") == "gpu-worker")
    grown = placement.nodes_from_template(template, "1.36", sizes={gpu_group: 4})
    again = _place(template, grown)
    placement.place_more(again, [new_replica])
    assert again.failures == []
    assert again.placed[PLACEHOLDER] and again.placed[PLACEHOLDER][0] not in again.placed["pd-llm/decode"]


def test_a_placeholder_of_the_ray_pods_priority_would_never_yield() -> None:
    """The proof's preemption takes only lower priorities: at priority 0 the new replica stays pending."""
    template, nodes = _cluster(WARM)
    classes = priority_classes(template, "1.36")
    classes[WARM_NODE] = placement.PriorityClass(0, preempts=False)
    result = placement.place(nodes, workloads(template, "1.36"), DEVICE_PLUGIN_DAEMONSETS, classes)
    group = _decode_group(template)
    placement.place_more(result, [placement.Workload("pd-llm/decode", "RayService", group["template"]["spec"])])
    assert result.preempted == []
    assert [f for f in result.failures if f.startswith("pd-llm/decode replica 0 fits no node")]


def test_the_warm_node_is_in_the_cost() -> None:
    s = settings_from({**PROJECT_CONTEXT, **WARM})
    assert cost_summary(s).startswith("~$6.70/h at the minimum (3 GPU nodes, 1 of them warm) to ~$8.72/h")
    output = synth(**WARM)["Outputs"]["EstimatedCostPerHour"]["Value"]
    assert output == cost_summary(s)


def test_the_operations_page_gives_the_budgets_plan_computes() -> None:
    """docs/operations.md's totals row, one column per case, is sizing's sum on the defaults."""
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    (row,) = [line for line in page.splitlines() if line.startswith("| **total** |")]
    cells = [cell.strip(" *") for cell in row.split("|")[2:-2]]
    s = Settings()
    expected = [sizing.scale_up_seconds(s, case) for case in (sizing.COLD_STANDARD_PULL, sizing.COLD, sizing.WARM)]
    assert cells == [f"{low / 60:.1f}-{high / 60:.1f} min" for low, high in expected]
    assert f"{sizing.seconds_before_any_pull(s)[0]:.0f}-{sizing.seconds_before_any_pull(s)[1]:.0f} s" in page


def test_cfn_lint_and_cdk_nag_are_clean_with_a_warm_node() -> None:
    # synth() runs cdk-nag's AwsSolutions checks; an unacknowledged finding stops it.
    template = synth(**WARM, hf_token_secret_name="prod/hf-token")
    assert lint_errors(template) == []


def test_the_placeholder_objects_pass_kubernetes_strict_schema() -> None:
    for obj in _warm_objects(synth(**WARM, hf_token_secret_name="prod/hf-token")):
        kubernetes_validate.validate(obj, Settings().kubernetes_version, strict=True)
