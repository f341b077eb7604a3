"""After a deploy, every Ray pod runs the current rayClusterConfig, on every path KubeRay 1.7.0 takes.

The synthesized RayService and recreate Job, run through tests/kuberay_paths.py: a
change of the cluster spec, the same change with an operator upgrade (KubeRay then
rewrites the live RayCluster in place, labels included, and leaves its pods), the
operator upgrade alone, and a serve-only change.
"""

from __future__ import annotations

from typing import Any

import pytest

import serve_config
from serve_config import pod_templates
from tests.conftest import manifests, rayservice_from, synth
from tests.support import kuberay_paths
from tests.support.kuberay_paths import Cluster

# A change of rayClusterConfig (the image), and one of serveConfigV2 only.
CLUSTER_CHANGE = {"ray_image": "public.ecr.aws/deep-learning-containers/ray:serve-llm-cuda-v1.0"}
SERVE_CHANGE = {"max_model_len": "4096"}


def recreate_job(template: dict[str, Any]) -> dict[str, Any]:
    (job,) = [m for m in manifests(template) if m["kind"] == "Job" and m["metadata"]["name"].startswith("raycluster-")]
    return job


def deploy(
    before: dict[str, Any], after: dict[str, Any], *, operator_upgrade: bool, rewrite_at: int = 0
) -> tuple[Cluster, list[str]]:
    """A cluster running `before`'s RayService; then `after` is deployed. Returns the state and what was deleted.

    With an operator upgrade, the new operator's first reconcile rewrites the live
    RayCluster in place; `rewrite_at` puts it before the Job's first step (0), after
    its first (1), or after its last. The kubectl provider runs the Job only when its
    name changed (the name is a hash of its spec).
    """
    old, new = rayservice_from(before), rayservice_from(after)
    state = Cluster(operator_version="1.6.0")
    kuberay_paths.create_cluster(state, old)
    if operator_upgrade:
        state.operator_version = "1.7.0"
    job = recreate_job(after)
    runs = job["metadata"]["name"] != recreate_job(before)["metadata"]["name"]
    steps = kuberay_paths.job_steps(job) if runs else []
    deleted: list[str] = []
    for index in range(len(steps) + 1):
        if operator_upgrade and index == min(rewrite_at, len(steps)):
            kuberay_paths.operator_rewrites_in_place(state, new)
            kuberay_paths.reconcile(state, new)
        if index < len(steps):
            deleted += kuberay_paths.kubectl_delete(state, steps[index])
            # KubeRay answers a deletion at once: a missing cluster or pod is made again.
            kuberay_paths.reconcile(state, new)
    return state, deleted


def test_a_cluster_change_rebuilds_every_pod() -> None:
    after = synth(**CLUSTER_CHANGE)
    state, deleted = deploy(synth(), after, operator_upgrade=False)
    assert any(d.startswith("RayCluster/") for d in deleted)
    assert kuberay_paths.stale_pods(state, rayservice_from(after)) == []


@pytest.mark.parametrize("rewrite_at", [0, 1, 2], ids=["before the job", "between its steps", "after it"])
def test_an_operator_upgrade_with_a_cluster_change_rebuilds_every_pod(rewrite_at: int) -> None:
    """shouldUpdateCluster rewrites the cluster's labels to the new hash; the pods keep the old spec unless deleted."""
    after = synth(**CLUSTER_CHANGE)
    state, _ = deploy(synth(), after, operator_upgrade=True, rewrite_at=rewrite_at)
    assert kuberay_paths.stale_pods(state, rayservice_from(after)) == []


def test_the_in_place_path_leaves_stale_pods_without_the_job() -> None:
    """The path is real in the model: the rewritten cluster keeps pods built from the old spec."""
    old, new = rayservice_from(synth()), rayservice_from(synth(**CLUSTER_CHANGE))
    state = Cluster(operator_version="1.6.0")
    kuberay_paths.create_cluster(state, old)
    state.operator_version = "1.7.0"
    assert kuberay_paths.operator_rewrites_in_place(state, new)
    kuberay_paths.reconcile(state, new)
    (cluster,) = state.of("RayCluster")
    assert (
        cluster.labels[serve_config.CLUSTER_CONFIG_LABEL]
        == new["metadata"]["labels"][serve_config.CLUSTER_CONFIG_LABEL]
    )
    assert len(kuberay_paths.stale_pods(state, new)) == len(state.of("Pod")) == 4  # head, prefill, decode, ingress


@pytest.mark.parametrize("overrides", [{}, SERVE_CHANGE], ids=["operator upgrade alone", "serve-only change"])
def test_no_cluster_change_restarts_nothing(overrides: dict[str, Any]) -> None:
    before = synth()
    old = rayservice_from(before)
    state = Cluster(operator_version="1.6.0")
    kuberay_paths.create_cluster(state, old)
    pods = sorted(p.name for p in state.of("Pod"))
    state, deleted = deploy(before, synth(**overrides), operator_upgrade=not overrides)
    assert deleted == []
    assert sorted(p.name for p in state.of("Pod")) == pods


def test_every_ray_pod_carries_the_cluster_config_hash(rayservice: dict[str, Any]) -> None:
    config_hash = rayservice["metadata"]["labels"][serve_config.CLUSTER_CONFIG_LABEL]
    cluster = rayservice["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    assert [t["metadata"]["labels"][serve_config.CLUSTER_CONFIG_LABEL] for t in templates] == [config_hash] * 4


def test_the_hash_is_not_computed_over_itself(rayservice: dict[str, Any]) -> None:
    import copy

    config_hash = rayservice["metadata"]["labels"][serve_config.CLUSTER_CONFIG_LABEL]
    assert pod_templates.cluster_config_hash(rayservice) == config_hash
    relabelled = copy.deepcopy(rayservice)
    cluster = relabelled["spec"]["rayClusterConfig"]
    for template in [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]:
        template["metadata"]["labels"][serve_config.CLUSTER_CONFIG_LABEL] = "anything"
    assert pod_templates.cluster_config_hash(relabelled) == config_hash
    # Anything else in the pod templates does change it.
    cluster["headGroupSpec"]["template"]["metadata"]["labels"]["other"] = "x"
    assert pod_templates.cluster_config_hash(relabelled) != config_hash


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a!=1", {"a": "1"}, False),
        ("a,b!=2", {"b": "3"}, False),
        ("a,b!=2", {"a": "", "b": "3"}, True),
        ("!a", {"a": "1"}, False),
    ],
)
def test_selector_semantics(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert kuberay_paths.selector_matches(selector, labels) is matches
