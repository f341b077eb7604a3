"""Warm GPU nodes: the placeholder pods that hold spare GPU nodes until a Ray worker preempts one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.cluster import as_icluster


class WarmGpuNodes(Construct):
    """Applies the placeholders' PriorityClass, then their Deployment, one manifest each.

    The GPU node group's minimum already counts the spare nodes (settings/sizing gpu_node_bounds);
    this only keeps them occupied and warm.

    Args:
        cluster: the cluster.
        manifests: the PriorityClass and the Deployment, in that order
            (serve_config.warm_nodes.warm_node_manifests()); no default.

    Attributes:
        priority_class, deployment: the two manifests; the Deployment waits for the PriorityClass,
            since the API server refuses a pod that names a class not yet there.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, cluster: eks.Cluster, manifests: Sequence[Mapping[str, Any]]
    ) -> None:
        super().__init__(scope, construct_id)
        priority_class, deployment = manifests
        self.priority_class = eks.KubernetesManifest(
            self, "PriorityClass", cluster=as_icluster(cluster), manifest=[dict(priority_class)]
        )
        self.deployment = eks.KubernetesManifest(
            self, "Deployment", cluster=as_icluster(cluster), manifest=[dict(deployment)]
        )
        self.deployment.node.add_dependency(self.priority_class)
