"""The serving layer: a namespace and the RayService that runs the P/D application."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.cluster import as_icluster


class LlmService(Construct):
    """Applies the RayService (ray.io/v1) in its own namespace.

    One manifest per Kubernetes object, so ``cdk diff`` replaces the smallest string.

    Args:
        cluster: the cluster, with KubeRay's CRDs installed before this applies
            (the stack adds that dependency).
        namespace: the namespace to create for the RayService.
        rayservice: the RayService manifest (serve_config.rayservice()).

    Attributes:
        namespace_manifest, rayservice_manifest: the two manifests.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        namespace: str,
        rayservice: Mapping[str, Any],
    ) -> None:
        super().__init__(scope, construct_id)
        self.namespace_manifest = eks.KubernetesManifest(
            self,
            "Namespace",
            cluster=as_icluster(cluster),
            manifest=[{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}],
        )
        self.rayservice_manifest = eks.KubernetesManifest(
            self,
            "RayService",
            cluster=as_icluster(cluster),
            manifest=[dict(rayservice)],
        )
        self.rayservice_manifest.node.add_dependency(self.namespace_manifest)
