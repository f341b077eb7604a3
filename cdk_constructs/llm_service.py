"""The serving layer: a namespace, the RayService that runs the P/D application, and what rolls its cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.cluster import as_icluster
from cdk_constructs.kubectl_job import kubectl_job
from serve_config import CLUSTER_CONFIG_LABEL, ORIGINATED_FROM_LABEL

RECREATOR = "raycluster-recreator"


def cluster_recreate(
    *,
    namespace: str,
    service_name: str,
    pod_labels: Mapping[str, str],
    config_hash: str,
    system_node_labels: Mapping[str, str],
) -> list[dict[str, Any]]:
    """A ServiceAccount, a Role that may only list and delete RayClusters and pods, and a Job named after the hash.

    Under upgradeStrategy None, KubeRay never rolls a change of rayClusterConfig
    out to the running cluster. The Job first deletes the RayCluster of this
    RayService that was built from another spec (its label differs); KubeRay then
    builds one from the current spec. Then it deletes the Ray pods built from
    another spec: when the operator's version changes, KubeRay 1.7.0 rewrites the
    live RayCluster in place, spec and labels alike, and leaves its pods as they
    are (rayservice_controller.go, shouldUpdateCluster); deleted, they are made
    again from the rewritten spec. In this order, an in-place rewrite before,
    between or after the two steps leaves no pod of the old spec. A cluster and
    pods built from the current spec carry the same hash, so the first deploy, an
    operator upgrade alone and a serve-only change delete nothing.

    pod_labels: the labels every Ray pod of this service carries (serve_config.pod_labels).
    """
    stale = f"{CLUSTER_CONFIG_LABEL}!={config_hash}"
    pods = ",".join([*(f"{k}={v}" for k, v in sorted(pod_labels.items())), "ray.io/is-ray-node=yes", stale])
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": RECREATOR, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": RECREATOR, "namespace": namespace},
            "rules": [
                {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["list", "delete"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": RECREATOR, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": RECREATOR},
            "subjects": [{"kind": "ServiceAccount", "name": RECREATOR, "namespace": namespace}],
        },
        kubectl_job(
            name_prefix="raycluster-recreate",
            namespace=namespace,
            service_account=RECREATOR,
            first=[_delete("rayclusters.ray.io", namespace, f"{ORIGINATED_FROM_LABEL}={service_name},{stale}")],
            args=_delete("pods", namespace, pods),
            node_selector=system_node_labels,
        ),
    ]


def ray_pod_labels(rayservice: Mapping[str, Any]) -> dict[str, str]:
    """The labels every Ray pod of the service carries, the config hash aside (the head's, as the workers')."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    shared = [{k: v for k, v in t["metadata"]["labels"].items() if k != CLUSTER_CONFIG_LABEL} for t in templates]
    if any(labels != shared[0] for labels in shared):
        raise ValueError(f"the Ray pod templates carry different labels: {shared}")
    return shared[0]


def _delete(resource: str, namespace: str, selector: str) -> list[str]:
    return ["delete", resource, "--namespace", namespace, "--selector", selector, "--ignore-not-found", "--wait=false"]


class LlmService(Construct):
    """Applies the RayService (ray.io/v1) in its own namespace, and, under upgradeStrategy None, rolls its Ray
    cluster when its spec changes.

    One manifest per Kubernetes object, so ``cdk diff`` replaces the smallest string.

    Args:
        cluster: the cluster, with KubeRay's CRDs installed before this applies
            (the stack adds that dependency).
        namespace: the namespace to create for the RayService.
        rayservice: the RayService manifest (serve_config.pod_templates.rayservice()), labelled
            with serve_config.CLUSTER_CONFIG_LABEL, its pod templates too.
        system_node_labels: where the recreate Job runs.
        namespace_labels: labels on the namespace (the load balancer controller's readiness-gate
            label where an NLB fronts the ingress). Default none.

    Attributes:
        namespace_manifest, rayservice_manifest: the two manifests.
        recreate_manifests: the recreate Job and its RBAC, applied after the RayService; none where the
            RayService's upgradeStrategy is not None (KubeRay's NewCluster rolls the cluster itself).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        namespace: str,
        rayservice: Mapping[str, Any],
        system_node_labels: Mapping[str, str],
        namespace_labels: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        metadata: dict[str, Any] = {"name": namespace}
        if namespace_labels:
            metadata["labels"] = dict(namespace_labels)
        self.namespace_manifest = eks.KubernetesManifest(
            self,
            "Namespace",
            cluster=as_icluster(cluster),
            manifest=[{"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}],
        )
        self.rayservice_manifest = eks.KubernetesManifest(
            self,
            "RayService",
            cluster=as_icluster(cluster),
            manifest=[dict(rayservice)],
        )
        self.rayservice_manifest.node.add_dependency(self.namespace_manifest)
        previous: Construct = self.rayservice_manifest
        self.recreate_manifests: list[eks.KubernetesManifest] = []
        if rayservice["spec"].get("upgradeStrategy", {}).get("type") != "None":
            # KubeRay rolls a changed rayClusterConfig out itself (NewCluster, its default).
            return
        for doc in cluster_recreate(
            namespace=namespace,
            service_name=rayservice["metadata"]["name"],
            pod_labels=ray_pod_labels(rayservice),
            config_hash=rayservice["metadata"]["labels"][CLUSTER_CONFIG_LABEL],
            system_node_labels=system_node_labels,
        ):
            manifest = eks.KubernetesManifest(
                self, f"RayClusterRecreate{doc['kind']}", cluster=as_icluster(cluster), manifest=[doc]
            )
            manifest.node.add_dependency(previous)
            self.recreate_manifests.append(manifest)
            previous = manifest
