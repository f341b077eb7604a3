"""What KubeRay 1.7.0 does to a RayService's Ray cluster and pods, and what a kubectl delete Job removes.

Only the paths that decide which spec the running pods were built from, read from
ray-project/kuberay at tag v1.7.0, ray-operator/controllers/ray/:
- rayservice_controller.go, constructRayClusterForRayService: a RayCluster gets the
  RayService's labels plus ray.io/originated-from-cr-name (and -crd), a copy of
  rayClusterConfig, and the annotation ray.io/kuberay-version.
- rayservice_controller.go, shouldUpdateCluster: under upgradeStrategy None the active
  cluster is rewritten in place (modifyRayCluster: spec, labels and annotations) when
  its kuberay-version annotation differs from the running operator's. A changed
  rayClusterConfig alone never touches it (new worker groups appended at the end
  aside, which this product never does).
- raycluster_controller.go, reconcilePods: missing pods are created from the
  RayCluster's current spec; running pods are left as they are (the RayCluster's own
  Recreate strategy is not set here, and it skips a KubeRay version change anyway,
  shouldRecreatePodsForUpgrade).
- common/pod.go, labelPod: a pod carries its template's labels plus KubeRay's ray.io
  labels (ray.io/node-type, ray.io/group and ray.io/cluster are not overridable).
A deleted RayCluster takes its pods with it (owner references); KubeRay then builds a
new one from the RayService's current spec.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ORIGINATED_FROM_CR_NAME = "ray.io/originated-from-cr-name"
KUBERAY_VERSION_ANNOTATION = "ray.io/kuberay-version"
KINDS = {"rayclusters.ray.io": "RayCluster", "rayclusters": "RayCluster", "pods": "Pod", "pod": "Pod"}


@dataclass
class Obj:
    kind: str
    name: str
    namespace: str
    labels: dict[str, str]
    # A RayCluster: its spec and annotations. A pod: its cluster, its group, and the template it was built from.
    spec: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    cluster: str = ""
    group: str = ""


@dataclass
class Cluster:
    """The objects of one namespace, and the version of the running operator."""

    operator_version: str
    objects: list[Obj] = field(default_factory=list)
    created: int = 0

    def of(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o.kind == kind]


def _templates(spec: Mapping[str, Any]) -> dict[str, tuple[dict[str, Any], int]]:
    """Group name -> (pod template, replicas); the head is group 'headgroup'."""
    found = {"headgroup": (spec["headGroupSpec"]["template"], 1)}
    for group in spec["workerGroupSpecs"]:
        found[group["groupName"]] = (group["template"], group.get("replicas", 1))
    return found


def _pod_labels(template: Mapping[str, Any], cluster: str, group: str) -> dict[str, str]:
    node_type = "head" if group == "headgroup" else "worker"
    labels = {
        "ray.io/is-ray-node": "yes",
        "ray.io/cluster": cluster,
        "ray.io/node-type": node_type,
        "ray.io/group": group,
        "ray.io/identifier": f"{cluster}-{node_type}",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    fixed = {"ray.io/node-type", "ray.io/group", "ray.io/cluster"}
    labels.update({k: v for k, v in (template.get("metadata") or {}).get("labels", {}).items() if k not in fixed})
    return labels


def _cluster_labels(rayservice: Mapping[str, Any]) -> dict[str, str]:
    labels = dict(rayservice["metadata"].get("labels") or {})
    labels[ORIGINATED_FROM_CR_NAME] = rayservice["metadata"]["name"]
    labels["ray.io/originated-from-crd"] = "RayService"
    return labels


def create_cluster(state: Cluster, rayservice: Mapping[str, Any]) -> Obj:
    """constructRayClusterForRayService, then reconcilePods."""
    state.created += 1
    cluster = Obj(
        "RayCluster",
        f"{rayservice['metadata']['name']}-{state.created}",
        rayservice["metadata"]["namespace"],
        _cluster_labels(rayservice),
        copy.deepcopy(rayservice["spec"]["rayClusterConfig"]),
        {KUBERAY_VERSION_ANNOTATION: state.operator_version},
    )
    state.objects.append(cluster)
    reconcile_pods(state, cluster)
    return cluster


def reconcile_pods(state: Cluster, cluster: Obj) -> None:
    """Pods a group lacks are made from the cluster's current spec; running ones stay as they are."""
    for group, (template, replicas) in _templates(cluster.spec).items():
        have = [p for p in state.of("Pod") if p.cluster == cluster.name and p.group == group]
        for index in range(len(have), replicas):
            state.objects.append(
                Obj(
                    "Pod",
                    f"{cluster.name}-{group}-{state.created}-{index}",
                    cluster.namespace,
                    _pod_labels(template, cluster.name, group),
                    copy.deepcopy(template),
                    cluster=cluster.name,
                    group=group,
                )
            )


def operator_rewrites_in_place(state: Cluster, rayservice: Mapping[str, Any]) -> bool:
    """shouldUpdateCluster's KubeRay-version path: modifyRayCluster copies spec, labels and annotations."""
    rewritten = False
    for cluster in state.of("RayCluster"):
        if cluster.annotations.get(KUBERAY_VERSION_ANNOTATION) != state.operator_version:
            cluster.spec = copy.deepcopy(rayservice["spec"]["rayClusterConfig"])
            cluster.labels = _cluster_labels(rayservice)
            cluster.annotations = {KUBERAY_VERSION_ANNOTATION: state.operator_version}
            rewritten = True
    return rewritten


def reconcile(state: Cluster, rayservice: Mapping[str, Any]) -> None:
    """The RayService has its cluster (a new one if it was deleted), and every cluster its pods."""
    if not state.of("RayCluster"):
        create_cluster(state, rayservice)
    for cluster in state.of("RayCluster"):
        reconcile_pods(state, cluster)


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """A kubectl --selector of equality and existence requirements (Kubernetes' labels.Parse).

    k=v and k==v: the label is v. k!=v: the label is absent or not v. k: present. !k: absent.
    """
    for requirement in (r.strip() for r in selector.split(",")):
        if "!=" in requirement:
            key, value = requirement.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in requirement:
            key, value = requirement.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif requirement.startswith("!"):
            if requirement[1:] in labels:
                return False
        elif " " in requirement or "(" in requirement:
            raise ValueError(f"set-based requirement not modelled: {requirement}")
        elif requirement not in labels:
            return False
    return True


def kubectl_delete(state: Cluster, args: list[str]) -> list[str]:
    """`kubectl delete TYPE[,TYPE] --namespace NS --selector S ...`: what it deletes (and what goes with it)."""
    assert args[0] == "delete", args
    kinds = [KINDS[t] for t in args[1].split(",")]
    namespace = args[args.index("--namespace") + 1]
    selector = args[args.index("--selector") + 1]
    doomed = [
        o
        for o in state.objects
        if o.kind in kinds and o.namespace == namespace and selector_matches(selector, o.labels)
    ]
    gone_clusters = {o.name for o in doomed if o.kind == "RayCluster"}
    # Owner references: a deleted RayCluster's pods go with it.
    doomed += [o for o in state.of("Pod") if o.cluster in gone_clusters and o not in doomed]
    state.objects = [o for o in state.objects if o not in doomed]
    return [f"{o.kind}/{o.name}" for o in doomed]


def job_steps(job: Mapping[str, Any]) -> list[list[str]]:
    """The kubectl commands of a Job's pod, in the order they run: init containers, then the container."""
    pod = job["spec"]["template"]["spec"]
    steps = []
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        assert container["command"] == ["kubectl"], container
        steps.append(list(container["args"]))
    assert len(pod["containers"]) == 1, "the containers of one pod run at the same time: order them as init containers"
    return steps


def stale_pods(state: Cluster, rayservice: Mapping[str, Any]) -> list[str]:
    """Pods not built from the RayService's current template for their group."""
    wanted = _templates(rayservice["spec"]["rayClusterConfig"])
    return [p.name for p in state.of("Pod") if p.spec != wanted[p.group][0]]


# --- NewCluster: the blue/green path (rayservice_controller.go, v1.7.0) -----------------------------
# The annotation KubeRay keeps the spec's hash in on each RayCluster it builds (utils/constant.go).
HASH_ANNOTATION = "ray.io/hash-without-replicas-and-workers-to-delete"
_GROUP_BOUNDS = ("replicas", "minReplicas", "maxReplicas")
_SCHEDULING_ONLY = ("tolerations", "schedulingGates")


def hash_without_replicas(cluster_config: Mapping[str, Any]) -> str:
    """rayClusterSpecForHashing then GenerateHashWithoutReplicasAndWorkersToDelete (utils/util.go): the
    spec less suspend and upgradeStrategy, the head's and each group's tolerations and schedulingGates,
    and each group's replicas, minReplicas, maxReplicas and scaleStrategy.workersToDelete."""
    spec = copy.deepcopy(dict(cluster_config))
    spec.pop("suspend", None)
    spec.pop("upgradeStrategy", None)
    head_pod = spec["headGroupSpec"]["template"].get("spec", {})
    for key in _SCHEDULING_ONLY:
        head_pod.pop(key, None)
    for group in spec.get("workerGroupSpecs", []):
        for key in _GROUP_BOUNDS:
            group.pop(key, None)
        group.get("scaleStrategy", {}).pop("workersToDelete", None)
        for key in _SCHEDULING_ONLY:
            group["template"].get("spec", {}).pop(key, None)
    return json.dumps(spec, sort_keys=True)


def build_cluster(state: Cluster, rayservice: Mapping[str, Any]) -> Obj:
    """constructRayClusterForRayService with the hash annotation; no pods yet (a pending cluster's start)."""
    state.created += 1
    config = rayservice["spec"]["rayClusterConfig"]
    cluster = Obj(
        "RayCluster",
        f"{rayservice['metadata']['name']}-{state.created}",
        rayservice["metadata"]["namespace"],
        _cluster_labels(rayservice),
        copy.deepcopy(config),
        {KUBERAY_VERSION_ANNOTATION: state.operator_version, HASH_ANNOTATION: hash_without_replicas(config)},
    )
    state.objects.append(cluster)
    return cluster


def zero_downtime(rayservice: Mapping[str, Any]) -> bool:
    """isZeroDowntimeUpgradeEnabled: NewCluster, or no type at all (ENABLE_ZERO_DOWNTIME unset)."""
    kind = rayservice["spec"].get("upgradeStrategy", {}).get("type")
    return kind is None or kind == "NewCluster"


def should_prepare_new_cluster(rayservice: Mapping[str, Any], active: Obj | None, pending: Obj | None) -> bool:
    """shouldPrepareNewCluster: no cluster at all, or, under a zero-downtime strategy, a spec whose hash
    differs from the pending cluster's (if any) or else the active one's. (A partial match, worker groups
    appended at the end, is updated in place; this product never appends one.)"""
    if active is None and pending is None:
        return True
    current = pending if pending is not None else active
    assert current is not None
    if current.annotations.get(HASH_ANNOTATION) == hash_without_replicas(rayservice["spec"]["rayClusterConfig"]):
        return False
    return zero_downtime(rayservice)


def ready_to_promote(head_ready: bool, app_statuses: Mapping[str, str]) -> bool:
    """reconcileServe's isReady: the head pod ready, at least one Serve application, every one RUNNING
    (getAndCheckServeStatus); no worker is looked at."""
    return head_ready and bool(app_statuses) and all(status == "RUNNING" for status in app_statuses.values())


def deletion_delay_seconds(rayservice: Mapping[str, Any]) -> int:
    """cleanUpRayClusterInstance: an unreferenced RayCluster goes this long after it stopped being active
    (RayClusterDeletionDelayDuration, 60 s, unless spec.rayClusterDeletionDelaySeconds)."""
    return int(rayservice["spec"].get("rayClusterDeletionDelaySeconds", 60))


def _env_names(container: Mapping[str, Any]) -> set[str]:
    return {e["name"] for e in container.get("env") or []}


def gcs_fault_tolerance_problems(cluster: Mapping[str, Any], annotations: Mapping[str, str]) -> list[str]:
    """What KubeRay 1.7.0 refuses in a RayCluster spec about GCS fault tolerance (utils/validation.go,
    ValidateRayClusterSpec): each refusal's message, in its order; [] where it would reconcile.

    With gcsFaultToleranceOptions the password and address are the options' alone: no redis-password in
    the head's rayStartParams, no REDIS_PASSWORD or RAY_REDIS_ADDRESS on the head container, no
    external-storage-namespace annotation; never both the options and the old ray.io/ft-enabled
    annotation; and RAY_REDIS_ADDRESS without the options is refused too. The Redis backend takes no
    storage (validateGcsFaultToleranceBackend)."""
    head = cluster["headGroupSpec"]
    env = _env_names(head["template"]["spec"]["containers"][0])
    options = cluster.get("gcsFaultToleranceOptions")
    found = []
    if annotations.get("ray.io/ft-enabled") and options is not None:
        found.append("ray.io/ft-enabled annotation and GcsFaultToleranceOptions are both set")
    enabled = options is not None or annotations.get("ray.io/ft-enabled") == "true"
    if not enabled and "RAY_REDIS_ADDRESS" in env:
        found.append("RAY_REDIS_ADDRESS is set which implicitly enables GCS fault tolerance")
    if options is not None:
        if (head.get("rayStartParams") or {}).get("redis-password"):
            found.append("cannot set `redis-password` in rayStartParams")
        if "REDIS_PASSWORD" in env:
            found.append("cannot set `REDIS_PASSWORD` env var in head Pod")
        if "RAY_REDIS_ADDRESS" in env:
            found.append("cannot set `RAY_REDIS_ADDRESS` env var in head Pod")
        if annotations.get("ray.io/external-storage-namespace"):
            found.append("cannot set `ray.io/external-storage-namespace` annotation")
        if options.get("backend", "redis") == "redis" and options.get("storage") is not None:
            found.append("cannot set GcsFaultToleranceOptions.Storage when backend is 'redis'")
    if (head.get("rayStartParams") or {}).get("redis-username") or "REDIS_USERNAME" in env:
        found.append("cannot set redis username in rayStartParams or environment variables")
    return found
