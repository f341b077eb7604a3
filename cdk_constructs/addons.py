"""Cluster add-ons by Helm: KubeRay operator, NVIDIA and EFA device plugins."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.cluster import as_icluster
from settings.catalog import EFA_DEVICE_PLUGIN, KUBERAY_OPERATOR, NVIDIA_DEVICE_PLUGIN, HelmChartPin


def kuberay_operator_values(system_node_labels: Mapping[str, str]) -> dict[str, Any]:
    return {"nodeSelector": dict(system_node_labels)}


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
        nvidia_device_plugin, efa_device_plugin: the device plugin releases.
        releases: all three, for dependencies.
        values: release name -> the values given to it, for review and tests.
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
        self.values: dict[str, dict[str, Any]] = {}
        self.kuberay_operator = self._release(
            cluster, "KubeRayOperator", KUBERAY_OPERATOR, kuberay_operator_values(system_node_labels)
        )
        plugin_values = device_plugin_values(gpu_node_labels, gpu_toleration)
        self.nvidia_device_plugin = self._release(cluster, "NvidiaDevicePlugin", NVIDIA_DEVICE_PLUGIN, plugin_values)
        self.efa_device_plugin = self._release(cluster, "EfaDevicePlugin", EFA_DEVICE_PLUGIN, plugin_values)
        self.releases: tuple[eks.HelmChart, ...] = (
            self.kuberay_operator,
            self.nvidia_device_plugin,
            self.efa_device_plugin,
        )

    def _release(
        self, cluster: eks.Cluster, construct_id: str, pin: HelmChartPin, values: dict[str, Any]
    ) -> eks.HelmChart:
        self.values[pin.release] = values
        return eks.HelmChart(
            self,
            construct_id,
            cluster=as_icluster(cluster),
            chart=pin.chart,
            repository=pin.repository,
            version=pin.version,
            release=pin.release,
            namespace=pin.namespace,
            create_namespace=pin.namespace != "kube-system",
            values=values,
            timeout=Duration.minutes(10),
        )
