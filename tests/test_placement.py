"""The cluster comes up: every pod lands where it must and fits, on every Kubernetes version the settings accept."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from serve_config import DECODE, PREFILL
from settings import settings_from, sizing
from settings.catalog import (
    AWS_LOAD_BALANCER_CONTROLLER,
    EFA_DEVICE_PLUGIN,
    EXTERNAL_SECRETS,
    KUBERAY_OPERATOR,
    KUBERNETES_VERSIONS,
    NVIDIA_DEVICE_PLUGIN,
)
from tests.conftest import PROJECT_CONTEXT, rayservice_from, synth
from tests.support import placement
from tests.support.cluster import DEVICE_PLUGIN_DAEMONSETS, placed, workloads

# Tests that synthesize and render per version run in one xdist group: one process caches them.
pytestmark = pytest.mark.xdist_group("placement")

TOKEN = {"hf_token_secret_name": "prod/hf-token"}
NLB = {"internal_endpoint_cidrs": "10.0.0.0/8"}
KEYS = {"endpoint_api_keys_secret_name": "prod/llm-keys"}
VARIANTS = {"defaults": {}, "token": TOKEN, "nlb": NLB, "keys": KEYS, "everything": {**TOKEN, **NLB, **KEYS}}
SERVICE = "pd-llm"


def _cases() -> list[Any]:
    cases = [
        pytest.param({"kubernetes_version": v, **VARIANTS["everything"]}, id=f"{v}-everything")
        for v in KUBERNETES_VERSIONS
    ]
    cases += [pytest.param({"kubernetes_version": v}, id=f"{v}-defaults") for v in KUBERNETES_VERSIONS]
    cases += [pytest.param(VARIANTS[name], id=f"1.36-{name}") for name in ("token", "nlb", "keys")]
    return cases


def _group(result: placement.Placement, role: str) -> str:
    groups = {n.group for n in result.nodes if n.labels.get("role") == role}
    assert len(groups) == 1
    return groups.pop()


@pytest.mark.parametrize("overrides", _cases())
def test_every_pod_lands_where_it_must_and_fits(overrides: dict[str, Any]) -> None:
    result = placed(**overrides)
    assert result.failures == []
    system, gpu = _group(result, "system"), _group(result, "gpu-worker")
    gpu_nodes = {n.name for n in result.nodes if n.group == gpu}

    for daemonset in DEVICE_PLUGIN_DAEMONSETS:
        assert set(result.placed[daemonset]) == gpu_nodes, f"{daemonset} must run on every GPU node and nowhere else"

    # The OpenAI ingress's worker group is on the system nodes: no GPU node is pinned by it.
    on_system = [
        f"Deployment/{KUBERAY_OPERATOR.release}",
        f"{SERVICE}/head",
        f"{SERVICE}/ingress",
        "Deployment/coredns",
    ]
    if "hf_token_secret_name" in overrides:
        on_system += [f"Deployment/{EXTERNAL_SECRETS.release}", f"Deployment/{EXTERNAL_SECRETS.release}-webhook"]
    if "internal_endpoint_cidrs" in overrides:
        on_system.append(f"Deployment/{AWS_LOAD_BALANCER_CONTROLLER.release}")
    for name in on_system:
        assert result.placed[name] and result.groups_of(name) == {system}, name

    workers = result.placed[f"{SERVICE}/{PREFILL}"] + result.placed[f"{SERVICE}/{DECODE}"]
    assert sorted(workers) == sorted(gpu_nodes), "exactly one Ray worker per GPU node"
    assert set(result.placed[f"{SERVICE}/{PREFILL}"]).isdisjoint(result.placed[f"{SERVICE}/{DECODE}"])


SCALING = {"decode_max_replicas": 3, "decode_target_ongoing_requests": 8, **VARIANTS["everything"]}


def test_with_ray_autoscaler_the_head_holds_its_container_and_the_ingress_stays_on_system_nodes() -> None:
    result = placed(**SCALING)
    assert result.failures == []
    system = _group(result, "system")
    for name in (f"{SERVICE}/head", f"{SERVICE}/ingress"):
        assert result.placed[name] and result.groups_of(name) == {system}, name


def test_one_system_node_has_no_room_for_the_ingress_surge_pod_so_its_group_gets_none() -> None:
    """The reason for system_nodes_min's default of 2 (settings/sizing/upgrade.py, INGRESS_SURGE_SYSTEM_NODES): on
    one system node, with Ray's autoscaler, the ingress group at one pod more does not place; the stack then
    gives the group no room for it, so `make upgrade` never waits on a pod that cannot land."""
    one = {**SCALING, "system_nodes_min": 1}
    template = synth(**one)
    scaled = rayservice_from(template)
    (ingress,) = [g for g in scaled["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == "ingress"]
    assert ingress["maxReplicas"] == ingress["minReplicas"] == 1
    ingress["replicas"] = 2
    others = [w for w in workloads(template, "1.36") if w.source != "RayService"]
    result = placement.place(
        placement.nodes_from_template(template, "1.36"),
        [*others, *placement.ray_workloads(scaled)],
        DEVICE_PLUGIN_DAEMONSETS,
    )
    assert [f for f in result.failures if f.startswith(f"{SERVICE}/ingress replica 1 fits no node")], result.failures
    groups = rayservice_from(synth(**SCALING))["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert [g["maxReplicas"] for g in groups if g["groupName"] == "ingress"] == [2], "two system nodes: room"


BEFORE_135 = [v for v in KUBERNETES_VERSIONS if int(v.split(".")[1]) < 35]


@pytest.mark.parametrize("version", BEFORE_135)
def test_nvidia_device_plugin_needs_the_gpu_present_label_before_135(version: str) -> None:
    """Before 1.35 nodeadm does not label NVIDIA nodes: the node group's own label makes the plugin schedule.

    On the nodes the template creates, the plugin must run on every GPU node; on
    the same nodes without that label it runs nowhere, so the label is the reason.
    """
    assert BEFORE_135, "no Kubernetes version before 1.35 is offered: retire this test"
    template = synth(kubernetes_version=version)
    nvidia = f"DaemonSet/{NVIDIA_DEVICE_PLUGIN.release}"
    nodes = placement.nodes_from_template(template, version)
    gpu_nodes = sorted(n.name for n in nodes if n.labels.get("role") == "gpu-worker")
    assert gpu_nodes
    result = placement.place(nodes, workloads(template, version), DEVICE_PLUGIN_DAEMONSETS)
    assert sorted(result.placed[nvidia]) == gpu_nodes, result.failures

    stripped = placement.nodes_from_template(template, version)
    for node in stripped:
        node.labels.pop("nvidia.com/gpu.present", None)
    without = placement.place(stripped, workloads(template, version), DEVICE_PLUGIN_DAEMONSETS)
    assert without.placed[nvidia] == []
    assert any(f"{SERVICE}/{PREFILL}" in f and "nvidia.com/gpu" in f for f in without.failures), without.failures


def _mutated(mutate: Any) -> placement.Placement:
    template = synth()
    found = []
    for workload in workloads(template, "1.36"):
        spec = copy.deepcopy(workload.spec)
        mutate(workload.name, spec)
        found.append(placement.Workload(workload.name, workload.source, spec, workload.daemonset, workload.replicas))
    return placement.place(placement.nodes_from_template(template, "1.36"), found, DEVICE_PLUGIN_DAEMONSETS)


def test_a_missing_toleration_fails_naming_the_pod_and_the_node_group() -> None:
    def drop(name: str, spec: dict[str, Any]) -> None:
        if name == f"{SERVICE}/{DECODE}":
            spec["tolerations"] = []

    failures = _mutated(drop).failures
    assert any(f"{SERVICE}/{DECODE}" in f and "GpuNodes" in f and "not tolerated" in f for f in failures), failures


def test_a_wrong_node_selector_fails_naming_the_pod_and_the_node_group() -> None:
    def wrong(name: str, spec: dict[str, Any]) -> None:
        if name == f"Deployment/{KUBERAY_OPERATOR.release}":
            spec["nodeSelector"] = {"role": "sytem"}

    failures = _mutated(wrong).failures
    assert any("kuberay-operator" in f and "SystemNodes" in f and "nodeSelector role=sytem" in f for f in failures)


def test_a_request_too_large_fails_naming_the_pod_and_the_node_group() -> None:
    def greedy(name: str, spec: dict[str, Any]) -> None:
        if name == f"{SERVICE}/head":
            spec["containers"][0]["resources"]["requests"]["memory"] = "15Gi"

    failures = _mutated(greedy).failures
    assert any(f"{SERVICE}/head" in f and "SystemNodes" in f and "requests memory" in f for f in failures), failures


def test_device_plugin_on_a_system_node_is_caught() -> None:
    def everywhere(name: str, spec: dict[str, Any]) -> None:
        if name == f"DaemonSet/{EFA_DEVICE_PLUGIN.release}":
            spec.pop("nodeSelector", None)
            spec["affinity"] = {}
            spec["tolerations"] = [{"operator": "Exists"}]

    result = _mutated(everywhere)
    system = _group(result, "system")
    assert system in result.groups_of(f"DaemonSet/{EFA_DEVICE_PLUGIN.release}")


def test_allocatable_follows_nodeadm() -> None:
    # Hand calculation (FACTS, "Node allocatable"): 32 vCPUs reserve 60+10+5+5+28*2.5 = 150m;
    # 234 pods reserve 11*234+255 = 2829 MiB.
    assert placement.kube_reserved_cpu_millis(32) == 150
    assert placement.kube_reserved_cpu_millis(4) == 80
    assert placement.kube_reserved_memory(234) == 2829 * 2**20
    assert placement.kube_reserved_memory(58) == 893 * 2**20


@pytest.mark.parametrize(
    ("expression", "labels", "matches"),
    [
        ({"key": "a", "operator": "In", "values": ["x"]}, {"a": "x"}, True),
        ({"key": "a", "operator": "In", "values": ["x"]}, {}, False),
        ({"key": "a", "operator": "NotIn", "values": ["x"]}, {}, True),
        ({"key": "a", "operator": "NotIn", "values": ["x"]}, {"a": "x"}, False),
        ({"key": "a", "operator": "Exists"}, {"a": ""}, True),
        ({"key": "a", "operator": "DoesNotExist"}, {"a": ""}, False),
        ({"key": "a", "operator": "Gt", "values": ["3"]}, {"a": "4"}, True),
        ({"key": "a", "operator": "Lt", "values": ["3"]}, {"a": "4"}, False),
    ],
)
def test_every_affinity_operator(expression: dict[str, Any], labels: dict[str, str], matches: bool) -> None:
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [expression]}]
                }
            }
        }
    }
    assert placement.required_affinity_matches(spec, labels) is matches


# --- the CloudWatch observability add-on's pods ---------------------------------------
ADDON_DAEMONSETS = ("DaemonSet/cloudwatch-agent", "DaemonSet/fluent-bit")


@pytest.mark.parametrize("version", list(KUBERNETES_VERSIONS))
def test_the_observability_addons_pods_land_and_fit_at_the_system_groups_minimum(version: str) -> None:
    # The smallest minimum the settings take (the default is 2: room for the ingress's surge replica).
    result = placed(kubernetes_version=version, system_nodes_min=1)
    assert result.failures == []
    every_node = {n.name for n in result.nodes}
    gpu_nodes = {n.name for n in result.nodes if n.labels.get("role") == "gpu-worker"}
    assert len([n for n in result.nodes if n.labels.get("role") == "system"]) == 1, "the system group at its minimum"
    for daemonset in ADDON_DAEMONSETS:
        assert set(result.placed[daemonset]) == every_node, daemonset
    assert set(result.placed["DaemonSet/dcgm-exporter"]) == gpu_nodes
    assert len(result.placed["Deployment/amazon-cloudwatch-observability-controller-manager"]) == 1


def test_observability_off_runs_none_of_the_addons_pods() -> None:
    result = placed(observability="false")
    assert result.failures == []
    assert not any(name in result.placed for name in (*ADDON_DAEMONSETS, "DaemonSet/dcgm-exporter"))


# --- every GPU node count from the group's minimum to its maximum ------------------------
BOUNDED = {
    "decode-1-to-3": {"decode_max_replicas": 3, "decode_target_ongoing_requests": 8},
    "both-sides-everything": {
        "prefill_max_replicas": 2,
        "prefill_target_ongoing_requests": 1,
        "decode_max_replicas": 3,
        "decode_target_ongoing_requests": 8,
        **VARIANTS["everything"],
    },
}


@pytest.mark.parametrize("overrides", list(BOUNDED.values()), ids=list(BOUNDED))
def test_every_gpu_node_count_from_the_minimum_to_the_maximum_places(overrides: dict[str, Any]) -> None:
    """For every replica count of each side within its bounds, the GPU group at the nodes those replicas
    need (settings/sizing/root_volume.py gpu_nodes_for), with the Ray worker groups at those counts: every pod lands
    and fits, one Ray worker per GPU node, the sides apart, and the counts cover the group's MinSize to
    MaxSize as the template carries them."""
    template = synth(**overrides)
    settings = settings_from({**PROJECT_CONTEXT, **overrides})
    (gpu_group,) = [
        logical_id
        for logical_id, r in template["Resources"].items()
        if r["Type"] == "AWS::EKS::Nodegroup" and r["Properties"].get("Labels", {}).get("role") == "gpu-worker"
    ]
    scaling = template["Resources"][gpu_group]["Properties"]["ScalingConfig"]
    low, high = scaling["MinSize"], scaling["MaxSize"]
    assert (low, high) == sizing.gpu_node_bounds(settings) and high > low
    rayservice = rayservice_from(template)
    others = [w for w in workloads(template, "1.36") if w.source != "RayService"]
    covered = set()
    for prefill in range(settings.side_replicas(PREFILL), settings.side_max_replicas(PREFILL) + 1):
        for decode in range(settings.side_replicas(DECODE), settings.side_max_replicas(DECODE) + 1):
            count = sizing.gpu_nodes_for(settings, {PREFILL: prefill, DECODE: decode})
            covered.add(count)
            scaled = copy.deepcopy(rayservice)
            for group in scaled["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
                # The ingress group at its maximum: the surge replica's pod beside the ingress's own.
                group["replicas"] = {PREFILL: prefill, DECODE: decode}.get(group["groupName"], group["maxReplicas"])
            nodes = placement.nodes_from_template(template, "1.36", sizes={gpu_group: count})
            result = placement.place(nodes, [*others, *placement.ray_workloads(scaled)], DEVICE_PLUGIN_DAEMONSETS)
            at = f"{prefill} prefill + {decode} decode on {count} GPU nodes"
            assert result.failures == [], at
            gpu_nodes = {n.name for n in result.nodes if n.group == gpu_group}
            prefills, decodes = result.placed[f"{SERVICE}/{PREFILL}"], result.placed[f"{SERVICE}/{DECODE}"]
            assert (len(prefills), len(decodes)) == (prefill, decode), at
            assert sorted(prefills + decodes) == sorted(gpu_nodes), f"{at}: one Ray worker per GPU node"
            system = _group(result, "system")
            assert result.groups_of(f"{SERVICE}/head") == {system}, at
            assert len(result.placed[f"{SERVICE}/ingress"]) == 2, f"{at}: the ingress and its surge replica"
            assert result.groups_of(f"{SERVICE}/ingress") == {system}, at
    assert covered == set(range(low, high + 1))
