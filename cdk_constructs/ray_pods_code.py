"""The product's own Python for the Ray pods (ray_pods/), as a ConfigMap: no image build."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.cluster import as_icluster


class RayPodsCode(Construct):
    """One ConfigMap holding the ray_pods package, which every Ray pod mounts on its PYTHONPATH.

    A ConfigMap holds at most 1 MiB; the package is a few kilobytes.

    Args:
        cluster: the cluster.
        configmap: the ConfigMap (serve_config.endpoint_keys.ray_pods_configmap()), in the serving namespace.

    Attributes:
        manifest: the ConfigMap's manifest; the RayService must wait for it.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, cluster: eks.Cluster, configmap: Mapping[str, Any]
    ) -> None:
        super().__init__(scope, construct_id)
        self.manifest = eks.KubernetesManifest(
            self, "ConfigMap", cluster=as_icluster(cluster), manifest=[dict(configmap)]
        )
