"""A change to the Ray cluster: KubeRay 1.7's NewCluster where the GPU group's maximum holds a second
cluster, the recreate Job where it cannot; read through KubeRay's own paths (tests/support/kuberay_paths.py)
and placed on the template's nodes (tests/support/placement.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdk_constructs.gpu_nodes import GPU_NODE_LABELS
from serve_config import DASHBOARD_PORT
from settings import Settings, sizing
from tests.conftest import manifests, rayservice_from, synth
from tests.support import kuberay_paths, placement, reachability
from tests.support.cluster import DEVICE_PLUGIN_DAEMONSETS, priority_classes, workloads
from tests.support.kuberay_paths import Cluster
from tools import change_impact
from tools.change_impact import Impact

# Decode may grow to 3 replicas: 2 GPU nodes at the minimum, 4 at the maximum, room for a second cluster.
ROOM: dict[str, Any] = {"decode_max_replicas": 3, "decode_target_ongoing_requests": 8}
NLB = {"internal_endpoint_cidrs": "10.0.0.0/8"}
IMAGE = "public.ecr.aws/deep-learning-containers/ray:serve-llm-cuda-v1.0"


def recreate_jobs(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in manifests(template) if m["kind"] == "Job" and m["metadata"]["name"].startswith("raycluster-")]


def test_the_defaults_recreate_the_cluster_two_fixed_gpu_nodes_hold_no_second_one() -> None:
    template = synth()
    spec = rayservice_from(template)["spec"]
    assert spec["upgradeStrategy"] == {"type": "None"}
    assert "rayClusterDeletionDelaySeconds" not in spec
    assert len(recreate_jobs(template)) == 1


@pytest.mark.parametrize("extra", [{}, NLB], ids=["port-forward", "nlb"])
def test_with_room_for_a_second_cluster_kuberay_upgrades_by_new_cluster_and_keeps_the_old_one_for_its_drain(
    extra: dict[str, Any],
) -> None:
    """The old cluster outlives the switch by the probe's lag, the NLB's tail where there is one, and the
    longest request its ingress may still hold; KubeRay's default, 60 s, would cut a 10-minute stream."""
    template = synth(**ROOM, **extra)
    rayservice = rayservice_from(template)
    assert rayservice["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    assert kuberay_paths.zero_downtime(rayservice)
    cidrs = tuple(extra.values())
    s = Settings(decode_max_replicas=3, decode_target_ongoing_requests=8.0, internal_endpoint_cidrs=cidrs)
    delay = kuberay_paths.deletion_delay_seconds(rayservice)
    assert delay == sizing.cluster_deletion_delay_seconds(s) == (755 if extra else 625)
    assert delay >= sizing.readiness_lag_seconds() + s.request_timeout_seconds + sizing.ROUTER_UPDATE_ALLOWANCE_S
    if extra:
        assert delay >= sizing.readiness_lag_seconds() + sizing.ingress_prestop_seconds(s)
    assert recreate_jobs(template) == [], "KubeRay rolls the cluster itself: no Job may delete it"


def test_recreate_when_asked_for_even_with_room() -> None:
    template = synth(**ROOM, ray_cluster_upgrade="recreate")
    assert rayservice_from(template)["spec"]["upgradeStrategy"] == {"type": "None"}
    assert len(recreate_jobs(template)) == 1


def test_a_bad_upgrade_setting_is_refused_in_one_line() -> None:
    from settings import SettingsError, settings_from  # settings_from reads the context as the app does

    with pytest.raises(SettingsError) as refused:
        settings_from({"ray_cluster_upgrade": "blue-green"})
    assert str(refused.value).startswith("setting 'ray_cluster_upgrade'") and "'auto', 'recreate'" in str(refused.value)
    assert "\n" not in str(refused.value)


# What KubeRay does with each change, beside what the PR comment says of it.
CHANGES: dict[str, tuple[dict[str, Any], bool]] = {
    "the image": ({"ray_image": IMAGE}, True),
    "token auth off": ({"ray_token_auth": "false"}, True),
    "decode's maximum": ({"decode_max_replicas": 4}, False),
    "an engine setting": ({"max_model_len": 4096}, False),
}


@pytest.mark.serve
@pytest.mark.xdist_group("ray")  # the one Ray of a worker: Serve's controller code compares the serve configs
@pytest.mark.parametrize("name", list(CHANGES))
def test_kuberay_starts_a_second_cluster_exactly_when_the_pr_comment_says_a_new_ray_cluster(
    name: str, tmp_path: Path, local_ray: None
) -> None:
    change, new_cluster = CHANGES[name]
    before, after = synth(**ROOM), synth(**{**ROOM, **change})
    state = Cluster("v1.7.0")
    active = kuberay_paths.build_cluster(state, rayservice_from(before))
    prepares = kuberay_paths.should_prepare_new_cluster(rayservice_from(after), active, None)
    assert prepares is new_cluster
    found = change_impact.classify(before, after, [])
    assert (Impact.NEW_RAY_CLUSTER in {f.impact for f in found.findings}) is new_cluster, found.findings
    if new_cluster:
        assert found.blue_green
        said = change_impact.interruption(found, Settings(**{**ROOM, **change}))
        assert said.startswith("KubeRay starts a second Ray cluster beside the running one"), said
        # A further change while the second cluster starts replaces it; the same spec again does not.
        pending = kuberay_paths.build_cluster(state, rayservice_from(after))
        assert not kuberay_paths.should_prepare_new_cluster(rayservice_from(after), active, pending)


def test_kuberay_switches_only_once_the_one_app_runs_which_needs_both_sides() -> None:
    """getAndCheckServeStatus: every app RUNNING. The product runs one app whose RUNNING needs its every
    deployment healthy (prefill, decode and the ingress), so the old cluster serves until the new one's
    engines have loaded."""
    config = yaml.safe_load(rayservice_from(synth(**ROOM))["spec"]["serveConfigV2"])
    (app,) = config["applications"]
    assert not kuberay_paths.ready_to_promote(True, {app["name"]: "DEPLOYING"})
    assert not kuberay_paths.ready_to_promote(False, {app["name"]: "RUNNING"})
    assert kuberay_paths.ready_to_promote(True, {app["name"]: "RUNNING"})


@pytest.mark.parametrize("extra", [{}, NLB], ids=["port-forward", "nlb"])
def test_the_second_cluster_fits_beside_the_first_on_the_gpu_groups_maximum_and_the_system_nodes(
    extra: dict[str, Any],
) -> None:
    """The first cluster and everything else as they come up; then a second cluster at its minimum, named
    anew, as KubeRay builds it: every pod of it has a node, on the GPU group at its maximum and the system
    group at its desired size (nothing scales that group: Cluster Autoscaler sizes the GPU group alone)."""
    template = synth(**ROOM, **extra)
    version = "1.36"
    gpu_group = next(
        logical_id
        for logical_id, r in template["Resources"].items()
        if r["Type"] == "AWS::EKS::Nodegroup"
        and all(r["Properties"].get("Labels", {}).get(k) == v for k, v in GPU_NODE_LABELS.items())
    )
    high = template["Resources"][gpu_group]["Properties"]["ScalingConfig"]["MaxSize"]
    assert high == 4
    nodes = placement.nodes_from_template(template, version, at="desired", sizes={gpu_group: high})
    result = placement.place(
        nodes, workloads(template, version), DEVICE_PLUGIN_DAEMONSETS, priority_classes(template, version)
    )
    assert result.failures == []
    second = [
        dataclasses.replace(w, name=f"green/{w.name}")
        for w in placement.ray_workloads(rayservice_from(template), cluster_name="pd-llm-g7n4q")
    ]
    placement.place_more(result, second)
    assert result.failures == []
    gpu = {w.name for w in second if placement.pod_requests(w.spec).get("nvidia.com/gpu", 0.0) > 0}
    assert gpu == {"green/pd-llm/prefill", "green/pd-llm/decode"}
    assert all(result.groups_of(name) == {gpu_group} for name in gpu)


@pytest.mark.parametrize("extra", [{}, NLB], ids=["port-forward", "nlb"])
def test_the_new_clusters_ingress_probe_reaches_the_serving_head_and_its_own_under_the_network_policies(
    extra: dict[str, Any],
) -> None:
    """ray_pods/ingress_ready.py asks both heads' dashboards for their session: the synthesized
    NetworkPolicies must admit an ingress pod of either cluster to either head on the dashboard port, or
    a new cluster's ingress would never turn ready (and the old one's keep its last verdict)."""
    template = synth(**ROOM, **extra)
    rayservice = rayservice_from(template)
    pods = [
        dataclasses.replace(w, name=f"{color}/{w.name}")
        for color, name in (("blue", "pd-llm-b1u3e"), ("green", "pd-llm-g7n4q"))
        for w in placement.ray_workloads(rayservice, cluster_name=name)
    ]
    peers = {p.name: p for p in reachability.pod_peers(pods, "10.0.128.0/20")}
    policies = [m for m in manifests(template) if m["kind"] == "NetworkPolicy"]
    for source in ("blue", "green"):
        for head in ("blue", "green"):
            ingress, target = peers[f"{source}/pd-llm/ingress"], peers[f"{head}/pd-llm/head"]
            assert reachability.admits(policies, ingress, target, DASHBOARD_PORT), (source, head)
