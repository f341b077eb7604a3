"""Cluster add-ons by Helm: KubeRay operator, NVIDIA and EFA device plugins."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.cluster import as_icluster
from cdk_constructs.helm import helm_release
from cdk_constructs.kubectl_job import kubectl_job
from settings.catalog import (
    EFA_DEVICE_PLUGIN,
    KUBERAY_CRDS,
    KUBERAY_OPERATOR,
    NVIDIA_DEVICE_PLUGIN,
    kuberay_crd_urls,
)

CRD_UPGRADER = "kuberay-crd-upgrader"


def kuberay_operator_values(system_node_labels: Mapping[str, str]) -> dict[str, Any]:
    return {"nodeSelector": dict(system_node_labels)}


def kuberay_crd_upgrade(system_node_labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """A ServiceAccount, its CRD-only RBAC and a Job that applies the pinned KubeRay CRDs server-side.

    The Job's name carries the chart version and a hash of its spec: a version
    bump makes a new Job (Job templates are immutable) and the provider prunes the old one.
    Server-side apply keeps no last-applied annotation, so 1 MB CRDs fit.
    """
    pin = KUBERAY_OPERATOR
    crd_names = [f"{name}.ray.io" for name in KUBERAY_CRDS]
    crds = {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"]}
    apply_args = ["apply", "--server-side", "--force-conflicts", f"--field-manager={CRD_UPGRADER}"]
    for url in kuberay_crd_urls(pin.version):
        apply_args += ["-f", url]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": CRD_UPGRADER, "namespace": pin.namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": CRD_UPGRADER},
            "rules": [
                {**crds, "resourceNames": crd_names, "verbs": ["get", "patch", "update"]},
                # create cannot be limited by name; a missing CRD is created.
                {**crds, "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": CRD_UPGRADER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CRD_UPGRADER},
            "subjects": [{"kind": "ServiceAccount", "name": CRD_UPGRADER, "namespace": pin.namespace}],
        },
        kubectl_job(
            name_prefix=f"kuberay-crds-{pin.version.replace('.', '-')}",
            namespace=pin.namespace,
            service_account=CRD_UPGRADER,
            args=apply_args,
            node_selector=system_node_labels,
        ),
    ]


def device_plugin_values(gpu_node_labels: Mapping[str, str], gpu_toleration: Mapping[str, str]) -> dict[str, Any]:
    """Both device plugins: only on GPU nodes, through the GPU taint."""
    return {"nodeSelector": dict(gpu_node_labels), "tolerations": [dict(gpu_toleration)]}


class ClusterAddons(Construct):
    """The three Helm releases the serving layer needs, each pinned in settings.catalog.

    Args:
        cluster: the cluster to install into.
        system_node_labels: where the KubeRay operator runs.
        gpu_node_labels: where the device plugins run.
        gpu_toleration: the toleration for the GPU nodes' taint.

    Attributes:
        kuberay_operator: the operator release, which also installs the ray.io CRDs.
        kuberay_crd_upgrade: the manifests that upgrade those CRDs when the version changes.
        nvidia_device_plugin, efa_device_plugin: the device plugin releases.
        releases: all three, for dependencies.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        system_node_labels: Mapping[str, str],
        gpu_node_labels: Mapping[str, str],
        gpu_toleration: Mapping[str, str],
    ) -> None:
        super().__init__(scope, construct_id)
        self.kuberay_operator = helm_release(
            self,
            "KubeRayOperator",
            cluster=cluster,
            pin=KUBERAY_OPERATOR,
            values=kuberay_operator_values(system_node_labels),
        )
        plugin_values = device_plugin_values(gpu_node_labels, gpu_toleration)
        self.nvidia_device_plugin = helm_release(
            self, "NvidiaDevicePlugin", cluster=cluster, pin=NVIDIA_DEVICE_PLUGIN, values=plugin_values
        )
        self.efa_device_plugin = helm_release(
            self, "EfaDevicePlugin", cluster=cluster, pin=EFA_DEVICE_PLUGIN, values=plugin_values
        )
        # One manifest per object, in order: the Job needs its account and RBAC.
        previous: Construct = self.kuberay_operator
        self.kuberay_crd_upgrade: list[eks.KubernetesManifest] = []
        for doc in kuberay_crd_upgrade(system_node_labels):
            manifest = eks.KubernetesManifest(
                self, f"KubeRayCrdUpgrade{doc['kind']}", cluster=as_icluster(cluster), manifest=[doc]
            )
            manifest.node.add_dependency(previous)
            self.kuberay_crd_upgrade.append(manifest)
            previous = manifest
        self.releases: tuple[eks.HelmChart, ...] = (
            self.kuberay_operator,
            self.nvidia_device_plugin,
            self.efa_device_plugin,
        )
