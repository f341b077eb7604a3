"""The serving image held on every system node (serve_config/head_image.py), so a moved Ray head need not pull it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.cluster import as_icluster


class HeadImage(Construct):
    """Applies the DaemonSet that keeps the serving image on the system nodes.

    Args:
        cluster: the cluster.
        daemonset: the manifest (serve_config.head_image.head_image_daemonset()); no default.

    Attributes:
        manifest: its manifest; the stack makes it wait for the namespace and the node groups.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, cluster: eks.Cluster, daemonset: Mapping[str, Any]
    ) -> None:
        super().__init__(scope, construct_id)
        self.manifest = eks.KubernetesManifest(
            self, "DaemonSet", cluster=as_icluster(cluster), manifest=[dict(daemonset)]
        )
