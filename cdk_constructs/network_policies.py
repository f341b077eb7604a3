"""Who may reach the Ray pods: ingress denied in the serving namespace, then only the paths the service needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.cluster import as_icluster

_NAMESPACE_NAME = "kubernetes.io/metadata.name"


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _policy(name: str, namespace: str, pods: dict[str, Any], ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def serving_network_policies(
    *,
    namespace: str,
    ray_pod_labels: dict[str, str],
    operator_namespace: str,
    operator_pod_labels: dict[str, str],
    dashboard_port: int,
    serve_port: int,
    metrics_port: int,
    control_plane_cidrs: Sequence[str],
    load_balancer_cidrs: Sequence[str],
    gcs_store_port: int | None = None,
) -> list[dict[str, Any]]:
    """The NetworkPolicies of the serving namespace, as plain manifests (they are reviewed in review/)."""
    # Every Ray pod of this service: KubeRay adds ray.io/cluster to each.
    in_a_ray_cluster = [{"key": "ray.io/cluster", "operator": "Exists"}]
    ray_pods: dict[str, Any] = {"matchLabels": dict(ray_pod_labels), "matchExpressions": in_a_ray_cluster}
    head: dict[str, Any] = {
        "matchLabels": dict(ray_pod_labels) | {"ray.io/node-type": "head"},
        "matchExpressions": in_a_ray_cluster,
    }
    policies = [
        # Selecting every pod with no rule admits nothing, from anywhere.
        _policy("default-deny-ingress", namespace, {}, []),
        # Ray picks many of its ports at random (workers, object manager, NIXL's
        # side channel from 20000 up): between its own pods, any port.
        _policy("ray-cluster-internal", namespace, ray_pods, [{"from": [{"podSelector": ray_pods}]}]),
        # KubeRay deploys serveConfigV2 through the dashboard and labels the head
        # ray.io/serve=true only after GET /-/healthz on the serve port answers.
        _policy(
            "kuberay-operator-to-head",
            namespace,
            head,
            [
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {_NAMESPACE_NAME: operator_namespace}},
                            "podSelector": {"matchLabels": dict(operator_pod_labels)},
                        }
                    ],
                    "ports": _tcp(dashboard_port, serve_port),
                }
            ],
        ),
        # `kubectl get --raw .../pods/<pod>:<port>/proxy/metrics` (verify, bench)
        # arrives from the control plane's ENIs in the cluster's subnets.
        _policy(
            "metrics-from-control-plane",
            namespace,
            ray_pods,
            [{"from": [{"ipBlock": {"cidr": c}} for c in control_plane_cidrs], "ports": _tcp(metrics_port)}],
        ),
    ]
    if load_balancer_cidrs:
        # An NLB with IP targets does not keep the client's address for TCP: the
        # source is the NLB's own address in its subnets (its security group
        # checks the clients' CIDRs).
        policies.append(
            _policy(
                "serve-from-load-balancer",
                namespace,
                ray_pods,
                [{"from": [{"ipBlock": {"cidr": c}} for c in load_balancer_cidrs], "ports": _tcp(serve_port)}],
            )
        )
    if gcs_store_port is not None:
        policies.append(_workers_not_to_gcs_store(namespace, ray_pod_labels, gcs_store_port))
    return policies


def _workers_not_to_gcs_store(namespace: str, ray_pod_labels: dict[str, str], port: int) -> dict[str, Any]:
    """Only the head (and KubeRay's cleanup Job, built from it) reaches the GCS store: the worker pods, which
    run the model's code, may open any TCP port but the store's, anywhere, and any UDP. The store's security
    group admits every node (pods use their node's groups), and its port is not Ray's GCS port (6379)."""
    workers: dict[str, Any] = {
        "matchLabels": dict(ray_pod_labels),
        "matchExpressions": [{"key": "ray.io/node-type", "operator": "In", "values": ["worker"]}],
    }
    everything_but_the_store = [
        {"protocol": "TCP", "port": 1, "endPort": port - 1},
        {"protocol": "TCP", "port": port + 1, "endPort": 65535},
        {"protocol": "UDP"},
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "workers-not-to-gcs-store", "namespace": namespace},
        "spec": {"podSelector": workers, "policyTypes": ["Egress"], "egress": [{"ports": everything_but_the_store}]},
    }


class ServingNetworkPolicies(Construct):
    """Applies the serving namespace's NetworkPolicies, one manifest each.

    They take effect only where the VPC CNI enforces NetworkPolicies
    (cdk_constructs/cluster.py turns that on).

    Args:
        cluster: the cluster.
        policies: the manifests (serving_network_policies()).

    Attributes:
        manifests: one per policy; the stack makes them wait for the namespace.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, cluster: eks.Cluster, policies: Sequence[dict[str, Any]]
    ) -> None:
        super().__init__(scope, construct_id)
        self.manifests = [
            eks.KubernetesManifest(
                self, _construct_id(doc["metadata"]["name"]), cluster=as_icluster(cluster), manifest=[dict(doc)]
            )
            for doc in policies
        ]


def _construct_id(name: str) -> str:
    return "".join(part.title() for part in name.split("-"))
