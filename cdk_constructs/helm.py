"""How every Helm release and every Pod Identity in this stack is made, in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs.cluster import as_icluster, pod_identity_role
from settings.catalog import HelmChartPin


def helm_release(
    scope: Construct,
    construct_id: str,
    *,
    cluster: eks.Cluster,
    pin: HelmChartPin,
    values: Mapping[str, Any],
    wait: bool = False,
) -> eks.HelmChart:
    """The pinned chart under its fixed release name; its namespace is created unless it is kube-system.

    wait: return only once the release's pods are ready (helm --wait). Needed by
    charts that install fail-closed admission webhooks: until their pods serve,
    every object the webhook matches is refused. Default False (aws-cdk's default).
    """
    return eks.HelmChart(
        scope,
        construct_id,
        cluster=as_icluster(cluster),
        chart=pin.chart,
        repository=pin.repository,
        version=pin.version,
        release=pin.release,
        namespace=pin.namespace,
        create_namespace=pin.namespace != "kube-system",
        values=dict(values),
        wait=wait,
        timeout=Duration.minutes(10),
    )


def pod_identity(
    scope: Construct, construct_id: str, *, cluster: eks.Cluster, namespace: str, service_account: str
) -> iam.Role:
    """A role that only this service account gets, through an EKS Pod Identity association."""
    role = pod_identity_role(scope, f"{construct_id}Role")
    eks.CfnPodIdentityAssociation(
        scope,
        f"{construct_id}Association",
        cluster_name=cluster.cluster_name,
        namespace=namespace,
        service_account=service_account,
        role_arn=role.role_arn,
    )
    return role
